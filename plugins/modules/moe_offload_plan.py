#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: moe_offload_plan
short_description: Decide where llama-server keeps each MoE block's experts so that a model fits the GPUs and the host
version_added: 0.1.0
description:
  - Sizes, from the GGUF header, the GPUs' free memory and the host's available memory, what llama-server
    allocates on each GPU and in host memory. It counts the weights, the KV cache (full, sliding-window and
    chunked caches, MLA), the recurrent state, the compute buffers, the output buffer and safety margins. It then
    decides whether routed expert weights must move to host memory or to another GPU, and which ones.
  - Weights, KV cache, recurrent state and the output buffer are exact. The compute buffers are an upper estimate.
    See the collection's C(docs/memory-model.md).
  - In O(mode=auto) nothing moves when everything fits with the margin. Otherwise the experts of just enough MoE
    blocks move, lowest block index first (the blocks C(--n-cpu-moe N) would move). When even all experts on the
    CPU do not fit, the module fails with how many MiB are missing and what to lower.
  - With two or more GPUs it compares serving from the GPU with the most free memory, splitting the layers across
    all of them (C(--tensor-split) in proportion to free memory), and that split with the experts of chosen blocks
    placed on a chosen GPU (RV(device_overrides)). It keeps the plan with the fewest expert bytes in host memory,
    and on a tie the one with fewer overrides, then the single GPU.
  - Every returned pattern is proved against the model's tensor list. RV(pattern) moves exactly the routed
    experts of RV(cpu_expert_layers) to the CPU, each RV(device_overrides) item exactly the experts of its blocks.
  - With O(host) it also checks that the host holds what stays in host memory and fails with the MiB missing.
  - With O(gpus=[]) (a CPU host) it plans for the CPU. Modes V(auto) and V(all) pin every routed expert to the CPU
    buffer with a proved pattern, V(none) moves nothing, and only host memory is checked.
  - With O(pattern) it checks a given pattern against the same tensor list (the verdict of
    M(ai_llm.moe_offload.gguf_info)'s O(ai_llm.moe_offload.gguf_info#module:pattern)) and sizes the plan with it.
  - It predicts the decode and prompt speed (tokens per second) of every placement it weighs (RV(speed),
    RV(candidates)). Decode is bound by memory bandwidth. Each device reads its dense weights whole and
    C(n_expert_used / n_expert) of each routed-expert tensor, plus the KV cache of a full slot and the recurrent
    state. Experts in host memory are read by the CPU at the host's bandwidth. Each graph split adds a fixed cost.
    A fixed overhead per graph evaluation (graph build, sampling) is added to each token. A prompt micro-batch of
    32 tokens or more copies the host's experts over PCIe (llama.cpp's op offload). A prompt micro-batch also
    computes its matrix products, 2 FLOP per weight element per token (the routed experts for
    C(n_expert_used / n_expert)), on the device that holds or receives the weights, at that device's compute rate.
  - The rates are the GPUs' datasheet peak bandwidth (or O(gpu_bytes_per_second)), the host's (O(host_bytes_per_second),
    O(calibration), the probe of M(ai_llm.moe_offload.host_info), or an assumed 40 GB/s), PCIe
    (O(pcie_bytes_per_second)), the split cost (O(calibration) or an assumed 100 microseconds) and the overhead
    (O(calibration) or an assumed 0, which folds it into the host's bandwidth). The compute rates are the GPUs'
    datasheet peak FP16 dense tensor throughput (or O(gpu_flops_per_second)) and the host's
    (O(host_flops_per_second), O(calibration) or an assumed 100 GFLOP/s). Uncalibrated figures compare placements;
    calibrated on the host they predict its speed.
  - O(goal=speed) keeps, among the placements that fit the context and the slots, the one with the highest
    predicted decode speed. Besides the placements O(goal=fit) weighs, it weighs, on each set of GPUs where the
    whole model does not fit, the most layers that fit with every expert beside its layer (C(-ngl) below all, what
    users ran before C(--override-tensor)), and when even every expert in host memory does not fit, the most layers
    that fit with every expert there. The first blocks then stay on the host with their KV cache and recurrent
    state, and the CPU computes them (RV(n_gpu_layers)).
author:
  - ai_llm maintainers (@ai-llm)
options:
  gguf:
    description:
      - The model, a path to its C(.gguf) file (any shard of a split model), or the registered result of
        M(ai_llm.moe_offload.gguf_info) (or its RV(ai_llm.moe_offload.gguf_info#module:model) key).
      - A M(ai_llm.moe_offload.gguf_info) result is not read again from the file.
    type: raw
    required: true
  gpus:
    description:
      - The registered result of M(ai_llm.moe_offload.gpu_info), or a list of dicts with C(name),
        C(memory_total_mib) and C(memory_free_mib) (and optionally C(index), C(uuid)).
      - The GPU memory a process tree holds (C(memory_held_by_pid_mib), from
        O(ai_llm.moe_offload.gpu_info#module:pid)) counts as free. It is the running server's, which a new
        configuration replaces.
      - An empty list is a CPU host.
    type: raw
    required: true
  gpu_devices:
    description: Plan only with these GPUs (C(nvidia-smi) indices), the ones the container gets.
    type: list
    elements: int
  host:
    description:
      - The registered result of M(ai_llm.moe_offload.host_info), or a dict with C(memory_available_mib) (and
        optionally C(memory_total_mib), C(memory_held_by_pid_mib), C(cgroup)).
      - Without it, host memory is not checked.
    type: raw
  ctx_size:
    description: The total context of the server (C(-c)), in tokens, shared by the slots.
    type: int
    required: true
  parallel:
    description: The number of slots (C(-np)). Each slot holds its own recurrent state and sliding-window cache.
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
    description:
      - The memory to leave free on each GPU beyond the CUDA context, as C(--fit) leaves its C(--fit-target) beyond
        the context it created before it reads the free memory. The plan takes the context off each GPU's free
        memory first (see O(cuda_context) and RV(devices)).
    type: int
    default: 1024
  host_margin_mib:
    description: The host memory to keep for the server process itself (binary, libraries, CUDA runtime).
    type: int
    default: 1024
  mode:
    description:
      - V(auto) moves just enough experts, V(all) moves every routed expert, V(none) moves nothing, V(layers)
        moves the experts of O(cpu_expert_layers).
    type: str
    default: auto
    choices: [auto, all, none, layers]
  cpu_expert_layers:
    description:
      - With O(mode=layers), a count of MoE blocks (taken lowest index first) or a list of block indices.
    type: raw
  pattern:
    description:
      - A regex of the tensors to keep in host memory (C(--override-tensor PATTERN=CPU)), checked against every
        tensor of the model and sized instead of O(mode)'s choice. Give it with O(mode=auto) only.
      - A pattern that cannot be used (invalid, or holding V(,) or V(=)) fails the module. One that moves other
        tensors than the routed experts is sized as it is, and RV(pattern_check) says so.
    type: str
  gpu_index:
    description: With several GPUs, serve from this one only (its index in O(gpus)).
    type: int
  split:
    description:
      - With several GPUs, V(auto) splits the layers across all of them in proportion to their free memory.
        A list gives the shares (C(--tensor-split)). V(none) serves from the GPU with the most free memory.
      - By default both are compared.
    type: raw
  experts_per_gpu:
    description:
      - With several GPUs, also try the split with the experts of chosen blocks on a chosen GPU
        (RV(device_overrides)).
    type: bool
    default: true
  ubatch:
    description: The micro-batch size (C(-ub)). The compute buffers and the sliding-window caches grow with it.
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
  swa_full:
    description: A full-size cache for the sliding-window layers too (C(--swa-full)).
    type: bool
    default: false
  mmap:
    description:
      - Whether the server maps the file (no C(--no-mmap)). Host-resident weights then live in the page cache;
        with V(false) a CUDA build keeps them in pinned (locked) host memory.
    type: bool
    default: true
  op_offload:
    description:
      - Whether the server offloads operations on host-resident experts to the GPU for large batches
        (llama.cpp's default). This reserves room for one block's CPU-resident experts in the GPU compute
        buffer. Set V(false) when the server runs with C(--no-op-offload).
    type: bool
    default: true
  n_gpu_layers:
    description:
      - The layers llama-server offloads to the GPUs (C(-ngl)), counting the blocks and the output layer. llama.cpp
        offloads the last ones, so the first blocks stay on the host with their KV cache and recurrent state.
      - Omitted, or more than the model's blocks, for every layer; then O(goal=speed) may choose fewer.
    type: int
  goal:
    description:
      - What to keep among the placements that fit. V(fit) keeps the fewest expert bytes in host memory (then the
        fewest overrides, then one GPU). V(speed) keeps the highest predicted decode speed (RV(speed)).
    type: str
    default: fit
    choices: [fit, speed]
  gpu_bytes_per_second:
    description:
      - The memory bandwidth of GPUs in bytes per second, by the name C(nvidia-smi) prints (V(NVIDIA RTX A5500)).
        It replaces the collection's table of datasheet peak figures for those names.
      - A GPU neither here nor in the table counts 500 GB/s.
    type: dict
  host_bytes_per_second:
    description:
      - The host's effective memory bandwidth in bytes per second, for the experts the CPU reads from host memory.
      - Without it, the planner uses O(calibration), then the C(memory_bandwidth_mb_per_s) of O(host) (from
        M(ai_llm.moe_offload.host_info) with O(ai_llm.moe_offload.host_info#module:bandwidth_probe)), then an
        assumed 40 GB/s.
    type: float
  gpu_flops_per_second:
    description:
      - The compute rate of GPUs in floating-point operations per second, by the name C(nvidia-smi) prints. It
        replaces the collection's table of datasheet peak FP16 dense tensor figures for those names.
      - A GPU neither here nor in the table counts 50 TFLOP/s.
    type: dict
  host_flops_per_second:
    description:
      - The host's effective compute rate in floating-point operations per second, for the matrix products the
        CPU computes in a prompt micro-batch.
      - Without it, the planner uses O(calibration), then an assumed 100 GFLOP/s.
    type: float
  pcie_bytes_per_second:
    description: The host-to-GPU copy bandwidth in bytes per second. The default 25 GB/s is PCIe 4.0 x16.
    type: float
  calibration:
    description:
      - Figures fitted to a measured speed on this host. C(host_bytes_per_second) is the host's effective
        bandwidth, C(split_seconds) the cost of one graph split, C(token_seconds) the fixed overhead of one graph
        evaluation, C(host_flops_per_second) the host's compute rate (from the measured prompt speed), and
        C(measured) (free form) what they were measured on. Any figure may be left out, but not all.
      - The predicted figures are then marked C(calibrated), the prompt figure C(prompt_calibrated) when
        C(host_flops_per_second) is given.
    type: dict
  cuda_context:
    description:
      - The CUDA context measured on this host's GPUs after a start (the llm_server role records it in
        C(verification.json)), each C(name) (as C(nvidia-smi) prints it), C(context_mib) and C(uuid) or C(index).
      - A GPU with a measurement of the same card (the same uuid, or without uuids the same index, and the same name)
        counts it; any other counts its card's published figure, or an assumed 555 MiB for a card without one.
      - Only plans for CUDA count a context.
    type: list
    elements: dict
extends_documentation_fragment:
  - ai_llm.moe_offload.info_module
attributes:
  action:
    support: partial
    details: With a M(ai_llm.moe_offload.gguf_info) result as O(gguf) it plans on the controller; with a path the module
      reads the file on the host.
    description: Runs on the controller when it can.
notes:
  - Memory is in MiB (2^20 bytes). Per-device figures follow llama.cpp's layer split, and the output layer
    sits on the last GPU.
  - The token embedding stays in host memory as llama.cpp keeps it there.
  - Device names (C(CUDA0), C(CUDA1)) number the GPUs of RV(gpu_devices) in that order, as CUDA inside the container
    sees them with E(CUDA_DEVICE_ORDER=PCI_BUS_ID) and only those GPUs visible.
seealso:
  - module: ai_llm.moe_offload.gpu_info
  - module: ai_llm.moe_offload.host_info
  - module: ai_llm.moe_offload.gguf_info
"""

EXAMPLES = r"""
- name: Read the GPUs, counting the running server's memory as free
  ai_llm.moe_offload.gpu_info:
    pid: "{{ server_pid | default(omit) }}"
  register: gpu

- name: Read the host memory
  ai_llm.moe_offload.host_info:
  register: host

- name: Plan Nemotron-3-Nano at 32K context and 2 slots
  ai_llm.moe_offload.moe_offload_plan:
    gguf: /srv/models/Nemotron-3-Nano-30B-A3B-Q4_K_M-00001-of-00006.gguf
    gpus: "{{ gpu }}"
    host: "{{ host }}"
    ctx_size: 32768
    parallel: 2
  register: plan

- name: Show the plan
  ansible.builtin.debug:
    msg: >-
      {{ plan.reason }} -ot '{{ plan.override_tensor }}'; on other GPUs:
      {{ plan.device_overrides | map(attribute='pattern') | zip(plan.device_overrides | map(attribute='device'))
         | map('join', '=') | join(',') }}

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

- name: Check and size a hand-written pattern
  ai_llm.moe_offload.moe_offload_plan:
    gguf: /srv/models/Nemotron-3-Nano-30B-A3B-Q4_K_M-00001-of-00006.gguf
    gpus: "{{ gpu }}"
    ctx_size: 32768
    pattern: 'blk\.(1|3|5)\.ffn_.*_exps\.weight'
"""

RETURN = r"""
offload:
  description: Whether any tensor moves to host memory.
  returned: success
  type: bool
  sample: true
pattern:
  description: The regex of the tensors to keep in host memory, V("") when none move.
  returned: success
  type: str
  sample: 'blk\.[13]\.ffn_.*_exps\.weight'
override_tensor:
  description: The C(--override-tensor) item for the host (C(PATTERN=CPU)), V("") when none move.
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
device_overrides:
  description:
    - The experts placed on another GPU than their layers', one item per GPU, each pattern proved to match exactly
      the experts of its blocks. Empty when no expert changes GPU.
  returned: success
  type: list
  elements: dict
  contains:
    pattern:
      description: The regex (it holds neither V(,) nor V(=)).
      type: str
    device:
      description: The llama.cpp device (C(CUDA<n>), see RV(devices)).
      type: str
    gpu_index:
      description: The C(nvidia-smi) index of that GPU.
      type: int
    blocks:
      description: The blocks whose experts go there.
      type: list
      elements: int
    tensors:
      description: The tensors the pattern matches.
      type: list
      elements: str
  sample: [{"pattern": 'blk\.(7|9)\.ffn_.*_exps\.weight', "device": CUDA1, "gpu_index": 1, "blocks": [7, 9],
            "tensors": ["blk.7.ffn_down_exps.weight", "blk.7.ffn_up_exps.weight", "blk.9.ffn_down_exps.weight",
                        "blk.9.ffn_up_exps.weight"]}]
devices:
  description:
    - The llama.cpp device name of each GPU of the plan, in order, with the card's C(nvidia-smi) index, UUID, name
      and PCI bus id (C(pci_bus_id), normalized to C(0000:01:00.0); V(null) when the GPUs given have none).
    - With PCI bus ids the GPUs are in PCI bus order, the order of CUDA with C(CUDA_DEVICE_ORDER=PCI_BUS_ID); the
      proof checks each device of llama-server's log against the card given here.
    - C(cuda_context_mib) is the CUDA context the plan took off the GPU's free memory before the margin, and
      C(cuda_context_source) where it comes from, V(measured) (O(cuda_context)), V(table) (a published figure for
      the card) or V(assumed).
  returned: success
  type: list
  elements: dict
  sample: [{"device": CUDA0, "index": 0, "uuid": GPU-8d4f3c2a-61b7-4e0a-9f35-2c7e1d9a4b60, "name": NVIDIA RTX A5500,
            "pci_bus_id": "0000:01:00.0", "cuda_context_mib": 555, "cuda_context_source": assumed}]
memory:
  description:
    - What the plan allocates on each GPU (in the order used) and in host memory, in MiB.
    - A GPU's C(free_mib) is what C(nvidia-smi) shows free, plus what the running server holds, less the CUDA
      context (RV(devices)); C(free_after_mib) is C(free_mib) less C(total_mib).
    - C(host.available_mib) and C(host.free_after_mib) are V(null) without O(host). C(host.pinned) is V(true)
      when the weights in host memory are pinned (C(--no-mmap) on CUDA).
  returned: always
  type: dict
  sample:
    gpus:
      - {index: 0, name: NVIDIA RTX A5500, free_mib: 24148, held_by_pid_mib: 0, model_mib: 21009.47, kv_mib: 192.0,
         recurrent_mib: 95.23, compute_mib: 1163.0, margin_mib: 1024.0, total_mib: 23483.7, free_after_mib: 664.3}
    host: {model_mib: 2362.5, kv_mib: 0.0, recurrent_mib: 0.0, output_mib: 1.0, compute_mib: 2.5, margin_mib: 1024.0,
           total_mib: 3390.0, available_mib: 60211.4, free_after_mib: 56821.4, mmap: true, pinned: false}
fits:
  description: Whether every GPU keeps C(free_after_mib) >= 0 in RV(memory), and the host too when O(host) is given.
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
  description: V(single) (one GPU), V(split) (layers across several GPUs with RV(tensor_split)) or V(cpu) (no GPU).
  returned: success
  type: str
  sample: single
n_gpu_layers:
  description:
    - The C(-ngl) the plan is sized for, V(null) for every layer. A count when O(n_gpu_layers) gave fewer layers
      than the model has, or when O(goal=speed) found fewer layers on the GPUs the fastest placement that fits.
  returned: success
  type: int
  sample: null
tensor_split:
  description: The C(--tensor-split) value for a split placement, V("") otherwise.
  returned: success
  type: str
  sample: "0.605,0.395"
visible_devices:
  description:
    - Derived from RV(gpu_devices) - the E(CUDA_VISIBLE_DEVICES) / E(NVIDIA_VISIBLE_DEVICES) value that exposes
      those GPUs, UUIDs when known.
  returned: success
  type: str
  sample: GPU-8d4f3c2a-61b7-4e0a-9f35-2c7e1d9a4b60
gpu_devices:
  description: The indices of the GPUs the plan uses, in llama.cpp's device order.
  returned: success
  type: list
  elements: int
  sample: [0]
pattern_check:
  description:
    - The proof for RV(pattern) - for the plan's own pattern that it matches exactly the experts of
      RV(cpu_expert_layers); for O(pattern) the verdict M(ai_llm.moe_offload.gguf_info) gives.
    - C(matched) counts the routed-expert tensors it moves, C(tensors) lists them, C(missed) lists the routed
      experts it leaves, C(non_expert) the other tensors it moves.
  returned: success
  type: dict
  sample: {ok: true, matched: 4, tensors: [blk.1.ffn_down_exps.weight, blk.1.ffn_up_exps.weight,
           blk.3.ffn_down_exps.weight, blk.3.ffn_up_exps.weight], missed: [], non_expert: [],
           verdict: "ok: moves exactly the 4 routed-expert tensors and nothing else"}
kv_cache:
  description:
    - How llama.cpp lays out the model's memory (C(layout) - V(kv), V(iswa), V(hybrid), V(hybrid_iswa),
      V(recurrent) or V(none)) and the cells of each cache. C(cells) and C(swa_cells) are per stream, with
      C(streams) streams.
  returned: success
  type: dict
  sample: {layout: iswa, cells: 4096, streams: 1, full_blocks: [5, 11, 17], swa_blocks: [0, 1, 2, 3, 4, 6, 7],
           swa_cells: 1024, window: 512, window_kind: standard, reused_blocks: [], recurrent_blocks: []}
reason:
  description: The decision in plain words (also the failure message).
  returned: always
  type: str
  sample: "The routed experts of 2 of the 23 MoE blocks (1, 3) go to host memory: ..."
speed:
  description:
    - The predicted speed of the chosen placement. C(decode_tokens_per_second) is for one slot whose cache is full
      (C(terms.context_tokens) tokens). C(prompt_tokens_per_second) is for micro-batches of C(terms.ubatch_tokens)
      tokens, memory and compute.
    - C(from) names the terms and where each rate comes from. C(calibrated) is V(true) when O(calibration) gave the
      host's bandwidth, the split cost or the overhead in use. C(prompt_calibrated) is V(true) when it gave the
      host's compute rate.
    - C(terms) holds the bytes read per decoded token and per prompt micro-batch on each GPU (in RV(devices) order)
      and on the host, the bytes copied over PCIe, the graph splits and the FLOP of a prompt micro-batch on each GPU
      and on the host.
  returned: success
  type: dict
  sample:
    decode_tokens_per_second: 117.3
    prompt_tokens_per_second: 3682.0
    from: "decode reads per token GPU 0 1.91 GB at 768 GB/s (datasheet peak of NVIDIA RTX A5500), host 0.04 GB
      at 40 GB/s (assumed), 8 graph splits at 100 us (assumed), 0 us overhead a graph evaluation (assumed), at a
      context of 16384 tokens; prompt: micro-batches of 512 tokens, 0.36 GB copied over PCIe each at 25 GB/s
      (default (PCIe 4.0 x16)), computing GPU 0 3.07e+03 GFLOP at 136.4 TFLOP/s (datasheet peak of NVIDIA RTX A5500)"
    calibrated: false
    prompt_calibrated: false
    terms: {decode_gpu_bytes: [1910000000], decode_host_bytes: 40000000, decode_splits: 8, ubatch_tokens: 512,
            prompt_gpu_bytes: [19200000000], prompt_host_bytes: 0, prompt_pcie_bytes: 360000000, prompt_splits: 10,
            context_tokens: 16384, prompt_gpu_flops: [3070000000000], prompt_host_flops: 0}
goal:
  description: The O(goal) the placement was chosen by.
  returned: success
  type: str
  sample: fit
candidates:
  description:
    - Every placement the planner weighed, the chosen one with C(chosen) V(true). Each has its GPUs, its
      C(tensor_split), the blocks whose experts are in host memory, the blocks whose experts are on another GPU
      (C(device_override_blocks)), its RV(n_gpu_layers), whether it fits, the MiB of experts in host memory and
      its RV(speed) (without C(terms)).
  returned: success
  type: list
  elements: dict
  sample:
    - {placement: single, gpu_devices: [0], tensor_split: "", cpu_expert_layers: [1, 3], device_override_blocks: [],
       n_gpu_layers: null, fits: true, host_expert_mib: 1076.2, chosen: true,
       speed: {decode_tokens_per_second: 117.3, prompt_tokens_per_second: 3682.0, from: "...", calibrated: false}}
n_ctx:
  description: The context llama.cpp allocates (O(ctx_size) padded to 256, per slot).
  returned: success
  type: int
  sample: 32768
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_request import (
    ARGUMENT_SPEC,
    MUTUALLY_EXCLUSIVE,
    run,
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, mutually_exclusive=MUTUALLY_EXCLUSIVE, supports_check_mode=True)
    result, warnings = run(module.params)
    for warning in warnings:
        module.warn(warning)
    if result.pop("failed", False):
        module.fail_json(**result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
