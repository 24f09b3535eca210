#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llm_server_result
short_description: Internal to the ai_llm.moe_offload.llm_server role - publish llm_server_result
version_added: 0.1.0
description:
  - Only the role M(ai_llm.moe_offload.llm_server) calls it; it is not meant to be called alone.
  - Sets the fact C(llm_server_result) from what the role's tasks registered - the status (V(changed),
    V(unchanged), V(failed), V(rolled_back), V(checked)), the one-line message and what runs. The role's README
    ("Result") lists every key.
  - With O(failed), in a rescue, says what went wrong instead (the fact C(_llm_server_failure), its C(cause) and
    whether to return to the last verified configuration).
  - This is an action plugin that runs on the controller.
author:
  - ai_llm maintainers (@ai-llm)
options:
  status:
    description: V(rolled_back) for the role's rollback entry point (it fails when nothing was returned to).
    type: str
    default: ''
  failed:
    description: Say what went wrong (C(ansible_failed_result)) instead of publishing the result.
    type: bool
    default: false
  during:
    description: With O(failed), V(return) when the return to a snapshot failed (the fact C(_llm_server_return_failure)).
    type: str
    choices: [deploy, return]
    default: deploy
extends_documentation_fragment:
  - ai_llm.moe_offload.info_module
  - ai_llm.moe_offload.controller_module
"""

EXAMPLES = r"""
- name: Publish what this run did as llm_server_result
  ai_llm.moe_offload.llm_server_result:
"""

RETURN = r"""
ansible_facts:
  description: C(llm_server_result) (or, with O(failed), C(_llm_server_failure)).
  returned: success
  type: dict
  sample: {llm_server_result: {status: unchanged, changed: false, message: "ai-llm serves ..."}}
"""
