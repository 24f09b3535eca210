# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: llm_server_result
short_description: Assemble llm_server_result, the one result of the llm_server role
version_added: 0.1.0
author:
- ai_llm maintainers (@ai-llm)
description:
- Builds the status (V(changed), V(unchanged), V(failed), V(rolled_back), V(checked)), the one-line message and what runs
  from what the role's phases registered. The role's README ("Result") lists every key.
positional: _input
options:
  _input:
    description: What the phases registered (the role's C(result.yml) names them).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Publish the result
  ansible.builtin.set_fact:
    llm_server_result: "{{ parts | ai_llm.moe_offload.llm_server_result }}"
"""

RETURN = r"""
---
_value:
  description: C(llm_server_result).
  type: dict
"""

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_result import build


def llm_server_result(parts):
    """``llm_server_result`` from what the phases registered."""
    return build(parts)


class FilterModule:
    """The filter llm_server_result of the llm_server role."""

    def filters(self):
        return {"llm_server_result": llm_server_result}
