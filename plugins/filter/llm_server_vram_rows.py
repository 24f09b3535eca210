# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: llm_server_vram_rows
short_description: The GPU memory ai-llm took against the plan, per GPU
version_added: 0.1.0
author:
- ai_llm maintainers (@ai-llm)
description:
- For each GPU of O(_input), the memory used after the recreate minus the memory used without ai-llm, against the plan's
  total without the margin it keeps free; V(ok) within O(tolerance_mib).
positional: _input, baseline, after, plan_memory, tolerance_mib
options:
  _input:
    description: The GPUs the container got (nvidia-smi indices).
    type: list
    elements: int
    required: true
  baseline:
    description: RV(ai_llm.moe_offload.gpu_info#module:gpus) read without ai-llm.
    type: list
    elements: dict
  after:
    description: RV(ai_llm.moe_offload.gpu_info#module:gpus) read with ai-llm running.
    type: list
    elements: dict
  plan_memory:
    description: RV(ai_llm.moe_offload.moe_offload_plan#module:memory).
    type: dict
  tolerance_mib:
    description: The allowed difference, in MiB.
    type: int
    default: 1024
"""

EXAMPLES = r"""
- name: Compare
  ansible.builtin.set_fact:
    vram: "{{ [0] | ai_llm.moe_offload.llm_server_vram_rows(before.gpus, after.gpus, plan.memory) }}"
"""

RETURN = r"""
---
_value:
  description: One row per GPU, C(index), C(planned_mib), C(used_mib), C(ok).
  type: list
  elements: dict
"""

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_proof import vram_rows


def llm_server_vram_rows(devices, baseline, after, plan_memory, tolerance_mib=1024):
    """Per GPU: the memory ai-llm took against the plan."""
    return vram_rows(devices, baseline, after, plan_memory, tolerance_mib)


class FilterModule:
    """The filter llm_server_vram_rows of the llm_server role."""

    def filters(self):
        return {"llm_server_vram_rows": llm_server_vram_rows}
