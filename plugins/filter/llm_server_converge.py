# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: llm_server_converge
short_description: Decide whether ai-llm must be recreated, verified or waited for, and why
version_added: 0.1.0
author:
- ai_llm maintainers (@ai-llm)
description:
- Compares what M(ai_llm.moe_offload.llm_server_service_info) found (the container, its configuration label, C(/health),
  the API key in force, the last verification) with what M(ai_llm.moe_offload.llm_server_config) wrote.
- Recreates when the files changed, when the container is missing, stopped, paused or crash-looping, when it was created
  from another configuration, when the key is not in force, or when a verified configuration stopped answering. Verifies
  without a recreate a configuration that runs but was never verified.
- The role M(ai_llm.moe_offload.llm_server) uses it; its logic is in the collection's C(_deploy_converge).
positional: _input, config, key_changed, verify_always, container_name
options:
  _input:
    description: The registered result of M(ai_llm.moe_offload.llm_server_service_info).
    type: dict
    required: true
  config:
    description: The registered result of M(ai_llm.moe_offload.llm_server_config).
    type: dict
    required: true
  key_changed:
    description: Whether the API key file changed in this run.
    type: bool
    default: false
  verify_always:
    description: Verify even when nothing changed.
    type: bool
    default: false
  container_name:
    description: The container's name, for the reason.
    type: str
    default: ai-llm
"""

EXAMPLES = r"""
- name: Decide
  ansible.builtin.set_fact:
    converge: "{{ service | ai_llm.moe_offload.llm_server_converge(config) }}"
"""

RETURN = r"""
---
_value:
  description: C(recreate), C(verify), C(wait) (booleans) and C(reason) (one line, empty when nothing is done).
  type: dict
"""

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_decision import decide


def llm_server_converge(service, config, key_changed=False, verify_always=False, container_name="ai-llm"):
    """Whether ai-llm must be recreated, verified or waited for, and why."""
    return decide(service or {}, config or {}, bool(key_changed), bool(verify_always), container_name)


class FilterModule:
    """The filter llm_server_converge of the llm_server role."""

    def filters(self):
        return {"llm_server_converge": llm_server_converge}
