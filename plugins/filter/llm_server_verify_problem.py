# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: llm_server_verify_problem
short_description: Why a recreated ai-llm does not prove what was deployed
version_added: 0.1.0
author:
- ai_llm maintainers (@ai-llm)
description:
- Reads the result of M(ai_llm.moe_offload.llama_server_log), the GPU memory rows and the parity answers.
- A load error, a pattern that moved nothing, a placement the log does not prove, GPU memory far from the plan or a changed
  greedy answer each give one line; V("") when everything holds.
positional: _input, pattern, vram, parity, tolerance_mib, seed
options:
  _input:
    description: The registered result of M(ai_llm.moe_offload.llama_server_log).
    type: dict
    required: true
  pattern:
    description: The CPU pattern deployed.
    type: str
    default: ''
  vram:
    description: The rows of P(ai_llm.moe_offload.llm_server_vram_rows#filter).
    type: list
    elements: dict
  parity:
    description: The answers C(before) and C(after), each with C(tokens) and C(content).
    type: dict
  tolerance_mib:
    description: The GPU memory tolerance, for the message.
    type: int
    default: 0
  seed:
    description: The parity seed, for the message.
    type: int
"""

EXAMPLES = r"""
- name: Fail when the deploy is not proved
  ansible.builtin.fail:
    msg: "{{ problem }}"
  vars:
    problem: "{{ log | ai_llm.moe_offload.llm_server_verify_problem(pattern) }}"
  when: problem | length > 0
"""

RETURN = r"""
---
_value:
  description: The problem in one line, V("") when there is none.
  type: str
"""

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_proof import verification_problem


def llm_server_verify_problem(log, pattern="", vram=None, parity=None, tolerance_mib=0, seed=None):
    """Why the recreated server does not prove the deploy, ``""`` when it does."""
    return verification_problem(log, pattern, vram, parity, tolerance_mib, seed)


class FilterModule:
    """The filter llm_server_verify_problem of the llm_server role."""

    def filters(self):
        return {"llm_server_verify_problem": llm_server_verify_problem}
