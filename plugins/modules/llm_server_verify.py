#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llm_server_verify
short_description: Internal to the ai_llm.moe_offload.llm_server role - prove what ai-llm serves
version_added: 0.1.0
description:
  - Only the role M(ai_llm.moe_offload.llm_server) calls it; it is not meant to be called alone.
  - Waits for C(/health) 200 on the host (M(ai_llm.moe_offload.llm_server_health), in pieces of a few seconds with a
    line of progress between them) and proves the API key is in force.
  - Given O(plan), proves the deploy on the controller - the tensors and buffers llama-server's log shows
    (M(ai_llm.moe_offload.llama_server_log), expectations from the plan), the GPU memory ai-llm took against the plan
    (M(ai_llm.moe_offload.gpu_info) against O(gpu_baseline)), the same greedy answer of C(/completion) as
    O(parity_before) - then measures the speed (C(llm_server_speed_check)) and fails with the first problem.
  - This is an action plugin that runs on the controller.
author:
  - ai_llm maintainers (@ai-llm)
options:
  engine:
    description: The container engine.
    type: str
    choices: [podman, docker]
    default: podman
  settings:
    description:
      - The role's checked settings (the container, C(/health)'s URL and timeout, the proof's tolerances,
        verbosity, parity prompt, speed check); the API key comes from C(llm_server_api_key).
    type: dict
    required: true
  plan:
    description: The result of M(ai_llm.moe_offload.moe_offload_plan) the deploy was placed from.
    type: dict
  placement:
    description: The placement deployed (its pattern, topology, GPUs and the tensors the log must show moved).
    type: dict
  service:
    description: The host as the prepare step read it (RV(ai_llm.moe_offload.llm_server_prepare#module:service)); the
      speed measured is compared with the last verified one it holds.
    type: dict
  gpu_baseline:
    description: RV(ai_llm.moe_offload.gpu_info#module:gpus) read without ai-llm; no GPU memory rows without it.
    type: dict
  parity_before:
    description: The C(/completion) answer of the old configuration (a registered M(ansible.builtin.uri) result).
    type: dict
extends_documentation_fragment:
  - ai_llm.moe_offload.info_module
  - ai_llm.moe_offload.controller_module
seealso:
  - module: ai_llm.moe_offload.llm_server_health
  - module: ai_llm.moe_offload.llama_server_log
"""

EXAMPLES = r"""
- name: Wait for /health 200, then prove the placement
  ai_llm.moe_offload.llm_server_verify:
    settings: "{{ prepared.settings }}"
    engine: podman
    plan: "{{ prepared.plan }}"
    placement: "{{ prepared.placement }}"
  register: verify
"""

RETURN = r"""
healthy:
  description: Without O(plan), whether C(/health) answered 200 (and the key is in force), as
    M(ai_llm.moe_offload.llm_server_health) returns it, with its other keys.
  returned: without O(plan)
  type: bool
health:
  description: Given O(plan), the wait's result (M(ai_llm.moe_offload.llm_server_health)'s C(healthy), C(seconds), C(cause), C(auth)...).
  returned: given O(plan)
  type: dict
log:
  description: Given O(plan), the result of M(ai_llm.moe_offload.llama_server_log).
  returned: given O(plan), once ai-llm serves
  type: dict
vram:
  description: Given O(plan) and O(gpu_baseline), per GPU C(index), C(planned_mib), C(used_mib), C(ok).
  returned: given O(plan), once ai-llm serves
  type: list
  elements: dict
parity:
  description: Given O(plan), the answers C(before) and C(after), each C(tokens) and C(content).
  returned: given O(plan), once ai-llm serves
  type: dict
parity_note:
  description: Why there was no baseline for the parity check, V("") when there was.
  returned: given O(plan)
  type: str
speed:
  description:
    - Given O(plan) and the role's C(llm_server_speed_check), the benchmark's medians
      C(decode_tokens_per_second) and C(prompt_tokens_per_second), C(runs), and C(prompt_tokens) and
      C(predicted_tokens) as the server counted them (C(timings.prompt_n), C(timings.predicted_n)).
    - Given O(plan), also C(previous) (the last verified configuration's C(speed), V(null) without one) and
      C(decode_ratio) and C(prompt_ratio) against it (V(null) without one).
  returned: given O(plan), once ai-llm serves
  type: dict
  sample: {decode_tokens_per_second: 20.1, prompt_tokens_per_second: 410.5, runs: 3, prompt_tokens: 512,
           predicted_tokens: 128, previous: null, decode_ratio: null, prompt_ratio: null}
verified:
  description: Whether the log, the GPU memory and the answers prove the deploy.
  returned: given O(plan), once ai-llm serves
  type: bool
"""
