#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llm_server_placement
short_description: Choose where ai-llm's weights go and refuse what cannot be deployed
version_added: 0.1.0
description:
  - Takes the pattern of C(--override-tensor) from the inventory (C(llm_server_moe_offload_pattern), checked against
    every tensor of the model by M(ai_llm.moe_offload.gguf_info)), from the plan of
    M(ai_llm.moe_offload.moe_offload_plan) (on every host; a host without GPU plans its host memory), or from the
    model (modes V(auto) and V(all) when there is no plan).
  - Refuses, before anything changes, an inventory pattern that matches nothing or moves non-expert tensors and a
    plan that does not fit (unless C(llm_server_moe_offload_force)), chosen GPUs the host lacks, a context beyond the
    model's training context, and a pattern from the plan or the model that cannot be deployed (the same rules as a
    user's pattern).
  - Returns the pattern and its source, the device overrides, the tensors llama-server's log must show moved, the
    GPUs the container gets and the tensor split.
  - This is an action plugin that runs on the controller only; the role M(ai_llm.moe_offload.llm_server) uses it.
author:
  - ai_llm maintainers (@ai-llm)
options:
  settings:
    description: The checked settings (M(ai_llm.moe_offload.llm_server_inputs)).
    type: dict
    required: true
  model:
    description: The registered result of M(ai_llm.moe_offload.gguf_info).
    type: dict
    required: true
  plan:
    description: The registered result of M(ai_llm.moe_offload.moe_offload_plan) (skipped or V(null) without GPU).
    type: dict
  gpus:
    description: The registered result of M(ai_llm.moe_offload.gpu_info).
    type: dict
  missing_gpus:
    description: The chosen GPUs (C(llm_server_gpu_devices)) the host does not have.
    type: list
    elements: int
    default: []
extends_documentation_fragment:
  - ai_llm.moe_offload.info_module
  - ai_llm.moe_offload.controller_module
seealso:
  - module: ai_llm.moe_offload.moe_offload_plan
"""

EXAMPLES = r"""
- name: Choose the pattern
  ai_llm.moe_offload.llm_server_placement:
    settings: "{{ settings }}"
    model: "{{ model }}"
    plan: "{{ plan | default(none) }}"
    gpus: "{{ gpus }}"
  register: placement
"""

RETURN = r"""
pattern:
  description: The pattern of the tensors that go to host memory, V("") when none.
  returned: success
  type: str
  sample: 'blk\.(1|4)\.ffn_.*_exps\.weight'
pattern_source:
  description: V(inventory), V(plan), V(model) or V(none).
  returned: success
  type: str
  sample: plan
tensor_overrides:
  description: The device overrides (C(PATTERN=DEVICE)) placed before the pattern in the one C(-ot) argument.
  returned: success
  type: list
  elements: str
  sample: []
expected_tensors:
  description: The tensors llama-server's log must show overridden.
  returned: success
  type: list
  elements: str
  sample: [blk.1.ffn_down_exps.weight, blk.1.ffn_up_exps.weight]
gpu_devices:
  description: The GPUs the container gets (nvidia-smi indices), V([]) without GPU.
  returned: success
  type: list
  elements: int
  sample: [0]
tensor_split:
  description: The C(--tensor-split) value of a split placement, V("") otherwise.
  returned: success
  type: str
  sample: ""
topology:
  description: The host's GPU topology (M(ai_llm.moe_offload.gpu_info)).
  returned: success
  type: str
  sample: single
"""
