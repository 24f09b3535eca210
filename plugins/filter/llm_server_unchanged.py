# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: llm_server_unchanged
short_description: Tell whether a deploy has nothing to do, before it takes the lock
version_added: 0.1.0
author:
- ai_llm maintainers (@ai-llm)
description:
- From one read of the host by M(ai_llm.moe_offload.llm_server_service_info), without the lock, tells whether the host
  already runs and serves this configuration, verified, with its snapshot kept.
- True only when the project directory has no lock file (no other deploy under way), C(.env), the compose file and
  the API key file are byte for byte what M(ai_llm.moe_offload.llm_server_config) and the role would write (the same
  rendering, compared by SHA-256 and the role's block of C(.env)), the container runs that configuration and answers,
  the last verification is of it and, with rollbacks, the last snapshot too.
- Anything else is a change - the role then takes the lock, reads the host again under it and goes on as before.
- The role M(ai_llm.moe_offload.llm_server) uses it; its logic is in the collection's C(_deploy_converge) and
  C(_deploy_disk).
positional: _input, settings, placement, api_key
options:
  _input:
    description: The registered result of M(ai_llm.moe_offload.llm_server_service_info) (with its C(disk)).
    type: dict
    required: true
  settings:
    description: The role's checked settings.
    type: dict
    required: true
  placement:
    description: The result of the role's placement (the pattern, the GPUs, the split).
    type: dict
    required: true
  api_key:
    description: The API key the configuration has, empty for none.
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Tell whether the run has anything to do
  ansible.builtin.set_fact:
    unchanged: "{{ service | ai_llm.moe_offload.llm_server_unchanged(settings, placement) }}"
"""

RETURN = r"""
---
_value:
  description:
  - C(unchanged) (a boolean); when true, C(config) (what M(ai_llm.moe_offload.llm_server_config) returns when it writes
    nothing) and C(converge) (what P(ai_llm.moe_offload.llm_server_converge#filter) decides); when false, C(reason).
  type: dict
"""

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_decision import unchanged


def llm_server_unchanged(service, settings, placement, api_key=""):
    """Whether a deploy has nothing to do (``_deploy_converge.unchanged``)."""
    return unchanged(service or {}, settings or {}, placement or {}, api_key or "")


class FilterModule:
    """The filter llm_server_unchanged of the llm_server role."""

    def filters(self):
        return {"llm_server_unchanged": llm_server_unchanged}
