# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: llm_server_missing_gpus
short_description: The chosen GPUs a host does not have
version_added: 0.1.0
author:
- ai_llm maintainers (@ai-llm)
description:
- The indices of O(chosen) that M(ai_llm.moe_offload.gpu_info) does not list; none on a host without GPU.
positional: _input, chosen
options:
  _input:
    description: The registered result of M(ai_llm.moe_offload.gpu_info).
    type: dict
    required: true
  chosen:
    description: The chosen GPUs (C(llm_server_gpu_devices)).
    type: list
    elements: int
"""

EXAMPLES = r"""
- name: Find the chosen GPUs the host lacks
  ansible.builtin.set_fact:
    missing: "{{ gpus | ai_llm.moe_offload.llm_server_missing_gpus([0, 1]) }}"
"""

RETURN = r"""
---
_value:
  description: The missing indices.
  type: list
  elements: int
"""

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_placement import missing_gpus


def llm_server_missing_gpus(gpu_info, chosen=None):
    """The chosen GPUs (llm_server_gpu_devices) the host does not have."""
    return missing_gpus(gpu_info, chosen or [])


class FilterModule:
    """The filter llm_server_missing_gpus of the llm_server role."""

    def filters(self):
        return {"llm_server_missing_gpus": llm_server_missing_gpus}
