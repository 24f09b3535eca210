#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llm_server_rollback_info
short_description: Internal to the ai_llm.moe_offload.llm_server role - check and read the host for a rollback
version_added: 0.1.0
description:
  - Only the role M(ai_llm.moe_offload.llm_server) calls it (its C(rollback) entry point); it is not meant to be
    called alone.
  - Checks the role's variables on the controller into its settings as M(ai_llm.moe_offload.llm_server_prepare) does,
    without needing the model, then reads what ai-llm runs and what its project directory holds with
    M(ai_llm.moe_offload.llm_server_service_info) (the container, its configuration label, C(/health), the snapshots);
    no GPU, no model, no plan.
  - This is an action plugin that runs on the controller; it changes nothing on the host.
author:
  - ai_llm maintainers (@ai-llm)
extends_documentation_fragment:
  - ai_llm.moe_offload.checked_settings
  - ai_llm.moe_offload.info_module
  - ai_llm.moe_offload.controller_module
seealso:
  - module: ai_llm.moe_offload.llm_server_service_info
"""

EXAMPLES = r"""
- name: Check the variables and read what ai-llm runs and its snapshots
  ai_llm.moe_offload.llm_server_rollback_info:
  register: prepared
"""

RETURN = r"""
settings:
  description: The role's checked settings, as M(ai_llm.moe_offload.llm_server_prepare) returns them.
  returned: success
  type: dict
service:
  description: The result of M(ai_llm.moe_offload.llm_server_service_info).
  returned: success
  type: dict
"""
