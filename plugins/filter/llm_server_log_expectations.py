# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: llm_server_log_expectations
short_description: The buffers llama-server's log must show for a planned deploy
version_added: 0.1.0
author:
- ai_llm maintainers (@ai-llm)
description:
- From the result of M(ai_llm.moe_offload.moe_offload_plan), the options O(ai_llm.moe_offload.llama_server_log#module:expect_model_buffers),
  O(ai_llm.moe_offload.llama_server_log#module:expect_kv_buffers), O(ai_llm.moe_offload.llama_server_log#module:expect_rs_buffers)
  and O(ai_llm.moe_offload.llama_server_log#module:expect_compute_buffers), each a dict of MiB per buffer type.
- On GPUs, each device's model, KV and recurrent-state buffer as planned and its compute buffer at most as planned; on a
  host without GPU, the C(CPU) KV, recurrent-state and compute buffers. llama-server prints these lines at its default
  verbosity, so they prove a deploy without the per-tensor lines.
- Empty dicts when the server does not run as planned (no plan, O(settings) with C(extra_args), or C(n_gpu_layers) under
  V(99) or V(auto)).
positional: _input, topology, settings, expected_tensors
options:
  _input:
    description: The registered result of M(ai_llm.moe_offload.moe_offload_plan).
    type: dict
    required: true
  topology:
    description: The host's GPU topology (V(cpu) for none).
    type: str
    required: true
  settings:
    description: The role's checked settings (C(extra_args), C(n_gpu_layers), C(log_verbosity)).
    type: dict
    required: true
  expected_tensors:
    description:
      - The tensors the placement moves to host memory. Returned as C(expect_tensors) where the log can show them - on
        GPUs always, on a host without GPU only from C(log_verbosity) V(5) (every tensor is in host memory there, and
        no buffer line tells a moved tensor from a mapped one); C(null) otherwise.
    type: list
    elements: str
"""

EXAMPLES = r"""
- name: Prove the buffers at the default verbosity
  ai_llm.moe_offload.llama_server_log:
    container: ai-llm
    expect_model_buffers: "{{ expectations.expect_model_buffers }}"
  vars:
    expectations: "{{ plan | ai_llm.moe_offload.llm_server_log_expectations('single', settings) }}"
"""

RETURN = r"""
---
_value:
  description: C(expect_model_buffers), C(expect_kv_buffers), C(expect_rs_buffers), C(expect_compute_buffers),
    C(expect_tensors).
  type: dict
  sample: {"expect_model_buffers": {"CUDA0": 1369.2}, "expect_kv_buffers": {"CUDA0": 192.0},
           "expect_rs_buffers": {"CUDA0": 95.23}, "expect_compute_buffers": {"CUDA0": 1170.0},
           "expect_tensors": ["blk.1.ffn_down_exps.weight"]}
"""

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_proof import log_expectations


def llm_server_log_expectations(plan, topology, settings, expected_tensors=None):
    """The expectations of llama_server_log for a planned deploy."""
    return log_expectations(plan, topology, settings, expected_tensors)


class FilterModule:
    """The filter llm_server_log_expectations of the llm_server role."""

    def filters(self):
        return {"llm_server_log_expectations": llm_server_log_expectations}
