#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: moe_offload_plan
short_description: Decide which MoE experts llama-server must keep in host memory so that a model fits the GPUs
version_added: 0.1.0
description:
  - Sizes, from the GGUF header and the GPUs' free memory, what llama-server allocates on each GPU. The weights,
    the KV cache (attention layers only), the recurrent state (Mamba layers), the compute buffer and a safety
    margin are counted. It then decides whether routed expert weights must move to host memory and which ones.
  - Weights, KV cache and recurrent state are exact, the compute buffer is an estimate. See the collection's
    C(docs/memory-model.md).
  - In O(mode=auto) nothing moves when everything fits with the margin. Otherwise the experts of just enough MoE
    blocks move, lowest block index first (the blocks C(--n-cpu-moe N) would move). When even all experts on the
    CPU do not fit, the module fails with how many MiB are missing and what to lower.
  - The returned RV(pattern) is proved to match exactly the routed experts of RV(cpu_expert_layers) among the
    model's tensors.
  - With two or more GPUs it compares serving from the GPU with the most free memory with splitting the layers
    across all of them (C(--tensor-split) in proportion to free memory). It picks the one that needs the fewest
    experts on the CPU, or the single GPU on a tie.
author:
  - ai_llm maintainers (@ai-llm)
options:
  gguf:
    description:
      - The model, a path to its C(.gguf) file (any shard of a split model), or the registered result of
        M(ai_llm.moe_offload.gguf_info).
    type: raw
    required: true
  gpus:
    description:
      - The registered result of M(ai_llm.moe_offload.gpu_info), or a list of dicts with C(name),
        C(memory_total_mib) and C(memory_free_mib) (and optionally C(index), C(uuid)).
    type: raw
    required: true
  ctx_size:
    description: The total context of the server (C(-c)), in tokens, shared by the slots.
    type: int
    required: true
  parallel:
    description: The number of slots (C(-np)). Each slot holds its own recurrent state.
    type: int
    default: 1
  cache_type_k:
    description: The type of the K cache (C(-ctk)).
    type: str
    default: f16
    choices: [f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1]
  cache_type_v:
    description: The type of the V cache (C(-ctv)). A quantized V cache needs flash attention.
    type: str
    default: f16
    choices: [f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1]
  margin_mib:
    description: The memory to leave free on each GPU for the driver and the CUDA context, as C(--fit) does.
    type: int
    default: 1024
  mode:
    description:
      - V(auto) moves just enough experts, V(all) moves every routed expert, V(none) moves nothing, V(layers)
        moves the experts of O(cpu_moe_layers).
    type: str
    default: auto
    choices: [auto, all, none, layers]
  cpu_moe_layers:
    description:
      - With O(mode=layers), a count of MoE blocks (taken lowest index first) or a list of block indices.
    type: raw
  gpu_index:
    description: With several GPUs, serve from this one only (its index in O(gpus)).
    type: int
  split:
    description:
      - With several GPUs, V(auto) splits the layers across all of them in proportion to their free memory.
        A list gives the shares (C(--tensor-split)). V(none) serves from the GPU with the most free memory.
      - By default both are compared.
    type: raw
  ubatch:
    description: The micro-batch size (C(-ub)). The compute buffer grows with it.
    type: int
    default: 512
  flash_attn:
    description: Flash attention (C(-fa)). V(auto) counts as on, as llama.cpp enables it on CUDA.
    type: str
    default: auto
    choices: ['on', 'off', auto]
  kv_unified:
    description: One KV stream shared by all slots (C(-kvu)). Otherwise one stream per slot, as C(-np N) gives.
    type: bool
    default: false
  mmap:
    description: Whether the server maps the file (no C(--no-mmap)). This only changes how host memory is reported.
    type: bool
    default: true
  op_offload:
    description:
      - Whether the server offloads operations on host-resident experts to the GPU for large batches
        (llama.cpp's default). This reserves room for one block's CPU-resident experts in the GPU compute
        buffer. Set V(false) when the server runs with C(--no-op-offload).
    type: bool
    default: true
extends_documentation_fragment:
  - ai_llm.moe_offload.info_module
notes:
  - Memory is in MiB (2^20 bytes). Per-device figures follow llama.cpp's layer split, and the output layer
    sits on the last GPU.
  - The token embedding stays in host memory as llama.cpp keeps it there.
seealso:
  - module: ai_llm.moe_offload.gpu_info
  - module: ai_llm.moe_offload.gguf_info
"""

EXAMPLES = r"""
- name: Read the GPUs
  ai_llm.moe_offload.gpu_info:
  register: gpu

- name: Plan Nemotron-3-Nano at 32K context and 2 slots
  ai_llm.moe_offload.moe_offload_plan:
    gguf: /srv/models/Nemotron-3-Nano-30B-A3B-Q4_K_M-00001-of-00006.gguf
    gpus: "{{ gpu }}"
    ctx_size: 32768
    parallel: 2
  register: plan

- name: Show the plan
  ansible.builtin.debug:
    msg: "{{ plan.reason }} -ot '{{ plan.override_tensor }}'"

- name: How much VRAM do all experts on the CPU need with a q8_0 KV cache on a 12 GB card?
  ai_llm.moe_offload.moe_offload_plan:
    gguf: /srv/models/Nemotron-3-Nano-30B-A3B-Q4_K_M-00001-of-00006.gguf
    gpus:
      - name: RTX 3060
        memory_total_mib: 12288
        memory_free_mib: 11804
    ctx_size: 65536
    cache_type_k: q8_0
    cache_type_v: q8_0
    mode: all
"""

RETURN = r"""
offload:
  description: Whether any routed expert moves to host memory.
  returned: success
  type: bool
  sample: true
pattern:
  description: The regex of the tensors to move, V("") when none move.
  returned: success
  type: str
  sample: 'blk\.[13]\.ffn_.*_exps\.weight'
override_tensor:
  description: The full C(--override-tensor) value (C(PATTERN=CPU)), V("") when none move.
  returned: success
  type: str
  sample: 'blk\.[13]\.ffn_.*_exps\.weight=CPU'
cpu_expert_layers:
  description: The block indices whose routed experts move to host memory.
  returned: success
  type: list
  elements: int
  sample: [1, 3]
n_cpu_moe:
  description: The C(--n-cpu-moe) value that moves the same experts, V(null) when none does.
  returned: success
  type: int
  sample: 4
memory:
  description: What the plan allocates on each GPU (in the order used) and on the host, in MiB.
  returned: always
  type: dict
  sample:
    gpus:
      - {index: 0, name: NVIDIA RTX A5500, free_mib: 24148, model_mib: 21009.47, kv_mib: 192.0,
         recurrent_mib: 95.23, compute_mib: 1163.0, margin_mib: 1024.0, total_mib: 23483.7, free_after_mib: 664.3}
    host: {model_mib: 2362.5, output_mib: 1.0, mmap: true}
fits:
  description: Whether every GPU keeps C(free_after_mib) >= 0 in RV(memory).
  returned: always
  type: bool
  sample: true
vram_saved_mib:
  description: The GPU memory this plan needs less than the same placement with no offload.
  returned: success
  type: float
  sample: 1076.2
headroom:
  description:
    - The largest C(ctx_size) (at this O(parallel)) and the largest C(parallel) (at this O(ctx_size)) that fit,
      with this plan (C(this_plan)) and with all experts on the CPU (C(all_experts_on_cpu)).
    - C(ctx_size_capped_at) is the limit of the search (the training context, or O(ctx_size) if larger).
  returned: success
  type: dict
  sample:
    this_plan: {max_ctx_size: 135680, max_parallel: 15, ctx_size_capped_at: 1048576}
    all_experts_on_cpu: {max_ctx_size: 1048576, max_parallel: 256, ctx_size_capped_at: 1048576}
placement:
  description: V(single) (one GPU) or V(split) (layers across several GPUs with RV(tensor_split)).
  returned: success
  type: str
  sample: single
tensor_split:
  description: The C(--tensor-split) value for a split placement, V("") otherwise.
  returned: success
  type: str
  sample: "0.605,0.395"
visible_devices:
  description: The GPUs to expose (E(CUDA_VISIBLE_DEVICES) / E(NVIDIA_VISIBLE_DEVICES)), UUIDs when known.
  returned: success
  type: str
  sample: GPU-8d4f3c2a-61b7-4e0a-9f35-2c7e1d9a4b60
gpu_indices:
  description: The indices of the GPUs the plan uses.
  returned: success
  type: list
  elements: int
  sample: [0]
pattern_check:
  description: The proof that RV(pattern) matches exactly the experts of RV(cpu_expert_layers).
  returned: success
  type: dict
  sample: {ok: true, matched: 4, verdict: "ok: the pattern matches exactly the 4 routed expert tensors"}
reason:
  description: The decision in plain words (also the failure message).
  returned: always
  type: str
  sample: "The routed experts of 2 of the 23 MoE blocks (1, 3) go to host memory: ..."
n_ctx:
  description: The context llama.cpp allocates (O(ctx_size) padded to 256).
  returned: success
  type: int
  sample: 32768
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import CACHE_TYPES, OFFLOAD_MODES
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_plan import PlanError, load_facts, plan


def main():
    module = AnsibleModule(
        argument_spec=dict(
            gguf=dict(type="raw", required=True),
            gpus=dict(type="raw", required=True),
            ctx_size=dict(type="int", required=True),
            parallel=dict(type="int", default=1),
            cache_type_k=dict(type="str", default="f16", choices=sorted(CACHE_TYPES)),
            cache_type_v=dict(type="str", default="f16", choices=sorted(CACHE_TYPES)),
            margin_mib=dict(type="int", default=1024),
            mode=dict(type="str", default="auto", choices=list(OFFLOAD_MODES)),
            cpu_moe_layers=dict(type="raw"),
            gpu_index=dict(type="int"),
            split=dict(type="raw"),
            ubatch=dict(type="int", default=512),
            flash_attn=dict(type="str", default="auto", choices=["on", "off", "auto"]),
            kv_unified=dict(type="bool", default=False),
            mmap=dict(type="bool", default=True),
            op_offload=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    params = dict(module.params)
    gguf = params.pop("gguf")
    gpus = params.pop("gpus")
    layers = params["cpu_moe_layers"]
    if isinstance(layers, str) and layers.strip().isdigit():
        params["cpu_moe_layers"] = int(layers)
    elif isinstance(layers, list):
        try:
            params["cpu_moe_layers"] = [int(b) for b in layers]
        except (TypeError, ValueError):
            module.fail_json(msg="cpu_moe_layers must be a count or a list of block indices, got %r" % (layers,))
    try:
        result = plan(load_facts(gguf), gpus, **params)
    except PlanError as exc:
        details = dict((k, v) for k, v in exc.details.items() if k in ("memory", "fits", "headroom", "reason"))
        details.setdefault("fits", False)
        module.fail_json(msg=str(exc), **details)
    for warning in result.pop("warnings"):
        module.warn(warning)
    result.pop("mode", None)
    result.pop("flash_attn", None)
    result.pop("parallel", None)
    result.pop("op_offload", None)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
