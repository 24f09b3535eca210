# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The compute buffers llama.cpp reserves on each GPU and on the host: an upper estimate from the model's facts.

``compute_buffer_bytes`` (one GPU), ``host_compute_bytes`` (the host beside GPUs) and ``cpu_compute_bytes`` (a host
without GPU) take the ``_model_facts.ModelFacts`` and the ``_plan_options.Options``; the terms below (graph inputs,
attention, feed-forward, routed experts, Mamba) follow llama-graph.cpp. docs/memory-model.md has the formulas.
Standard library only: this runs on target hosts (Python >= 3.9).
"""

from __future__ import annotations

from dataclasses import dataclass

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._kv_cache import (
    CacheCells, cache_cells, cache_type, head_dims, pad)

OP_OFFLOAD_MIN_BATCH = 32  # CUDA offloads an op on host weights to the GPU from this many tokens on

# llama-context.cpp llama_context::sched_reserve reserves the graph of one worst-case micro-batch
# (llama_context::graph_reserve). ggml-backend.cpp ggml_backend_sched_split_graph gives each device a copy of every
# graph input its nodes read (the hidden state, positions, KQ masks, KV row indices), allocated when its split
# starts, and keeps the graph inputs themselves on the CPU backend. ggml-alloc.c ggml_gallocr_alloc_graph_impl
# hands a tensor's memory back after its last consumer ran, and computes element-wise ops (ggml_op_can_inplace)
# in the memory of an input that has no other consumer. A device's compute buffer is therefore its input copies
# plus the tensors alive at the worst node of its blocks. The estimate takes, for each kind of block, the tensors
# llama-graph.cpp has alive at that block's worst node, and counts a freed tensor as a hole that a larger one
# cannot reuse, so it is never under what the allocator reserves.

F32 = 4
I32 = 4
I64 = 8


@dataclass(frozen=True)
class GraphShape:
    """The micro-batch the compute buffers are reserved for (llama_context::sched_reserve): ``tokens`` (n_ubatch,
    rounded up to a multiple of the slots by llama_context::graph_reserve), ``seqs`` (one per slot), ``outputs``
    (llama-server asks for one logits row per slot: n_outputs_max) and the caches' ``cells``."""

    tokens: int
    seqs: int
    outputs: int
    cells: CacheCells


def graph_shape(facts, options):
    """The ``GraphShape`` llama.cpp reserves the compute buffers for with ``options``."""
    cells = cache_cells(facts, options)
    seqs = max(1, options.parallel)
    tokens = pad(min(cells.ubatch, cells.n_ctx), seqs)
    return GraphShape(tokens, seqs, min(seqs, tokens), cells)


# Architectures whose graph keeps only the output rows (inp_out_ids) before the last block's feed-forward part:
# src/models/<arch>.cpp has ``if (il == n_layer - 1 && inp_out_ids)`` without further conditions (llama.cpp b10435).
# The others (nemotron_h, gpt-oss, deepseek2, qwen3next, gemma4...) run the whole micro-batch through it.
OUTPUT_ROWS_ARCHS = frozenset((
    "afmoe", "apertus", "arcee", "arctic", "arwkv7", "baichuan", "bailingmoe", "bailingmoe2", "bitnet", "bloom",
    "chameleon", "chatglm", "codeshell", "cohere2", "command-r", "dbrx", "deci", "deepseek", "dots1", "ernie4_5-moe",
    "exaone", "exaone-moe", "exaone4", "falcon", "falcon-h1", "gemma", "gemma2", "gemma3", "glm4", "glm4moe", "gpt2",
    "gptneox", "granite", "granitehybrid", "graniteswitch", "grok", "grovemoe", "hunyuan-moe", "hunyuan_vl",
    "internlm2", "jais", "jais2", "jamba", "kimi-linear", "laguna", "lfm2", "llama", "llama4", "maincoder", "mamba",
    "mellum", "minicpm3", "minimax-m2", "minimax-m3", "mistral3", "mpt", "muse-glimmer", "nanbeige", "nemotron",
    "olmo", "olmo2", "olmoe", "openelm", "orion", "pangu-embedded", "phi2", "phi3", "plamo", "plamo2", "plamo3", "plm",
    "qwen", "qwen2", "qwen2moe", "qwen2vl", "qwen3", "qwen3moe", "qwen3vl", "qwen3vlmoe", "refact", "rwkv6",
    "rwkv6qwen2", "rwkv7", "seed_oss", "smallthinker", "smollm3", "stablelm", "starcoder", "starcoder2", "talkie",
    "xverse"))


def _attention_blocks(facts, blocks=None):
    return [b for b in sorted(facts.kv_blocks) + list(facts.kv_reused) if blocks is None or b in blocks]


def _rotations(facts, cache_type_k, cache_type_v):
    """llama-kv-cache.cpp llama_kv_cache::llama_kv_cache: a quantized K (V) cache with head sizes that are multiples
    of 64 rotates Q and K (V and the attention output) with a Hadamard matrix (attn_rot_k, attn_rot_v). Returns
    the sides of the two rotation matrices (build_input_k_rot: the largest power of two from 64 that divides
    the K head size; build_input_v_rot: 64), 0 when there is none."""
    head_k, head_v = head_dims(facts)
    k_side = v_side = 0
    if not facts.mla and cache_type(cache_type_k)[0] > 1 and head_k and head_k % 64 == 0:
        k_side = 64
        while head_k % (2 * k_side) == 0:
            k_side *= 2
    if not facts.mla and cache_type(cache_type_v)[0] > 1 and head_v and head_v % 64 == 0:
        v_side = 64
    return k_side, v_side


def _cache_inputs(facts, shape, flash_attn, sliding, rotations=(0, 0)):
    """The graph inputs of one KV cache: the KQ mask, ``n_kv x n_tokens`` in F16 with flash attention and F32
    without (llama-graph.cpp build_attn_inp_kq_mask), the I64 rows K and V are written to
    (llama-kv-cache.cpp llama_kv_cache::build_input_k_idxs / build_input_v_idxs: one per token, one per token and
    V element when the V cache is transposed; MLA writes no V) and the F32 rotation matrices."""
    cells = shape.cells.swa_cells if sliding else shape.cells.cells
    mask = cells * shape.tokens * (2 if flash_attn else F32)
    widest_v = max([v for _k, v in facts.kv_blocks.values()] + [0])
    v_rows = 0 if (facts.mla or not widest_v) else (1 if flash_attn else widest_v)
    return mask + shape.tokens * I64 * (1 + v_rows) + sum(side * side * F32 for side in rotations)


def _input_bytes(facts, shape, flash_attn, blocks=None, has_output=True, rotations=(0, 0)):
    """The graph inputs the nodes of ``blocks`` read, with the hidden state they start from (the token embeddings,
    or the previous device's output): inp_pos (llm_graph_context::build_inp_pos), the inputs of each cache its
    attention blocks use, s_copy of the recurrent state
    (build_rs_inp) and inp_out_ids on the output device."""
    total = facts.n_embd * shape.tokens * F32
    attention = _attention_blocks(facts, blocks)
    if attention:
        total += shape.tokens * I32
        for cache in _caches(facts, attention):
            total += _cache_inputs(facts, shape, flash_attn, cache == "swa", rotations)
    if any(blocks is None or b in blocks for b in facts.recurrent_blocks):
        total += shape.seqs * I32
    if has_output:
        total += shape.outputs * I32
    return total


def _caches(facts, attention):
    """The caches (``"full"``, ``"swa"``) the attention blocks ``attention`` read."""
    swa = facts.swa_blocks
    return set("swa" if b in swa else "full" for b in attention)


def _attention_bytes(facts, block, tokens):
    """Bytes of Q, K, V and of the heads' output of one attention block for ``tokens`` rows."""
    k, v = facts.kv_blocks.get(block, (0, 0))  # a block reading another's cache projects only Q
    heads = facts.n_head.get(block) or 1
    hkv = facts.kv_heads.get(block) or 1
    q = facts.q_width.get(block) or heads * k // hkv
    out = heads * k if facts.mla else (heads * v // hkv if v else q)  # MLA: the latent output of every head
    return q * tokens * F32, k * tokens * F32, v * tokens * F32, out * tokens * F32


def _attention_peak(facts, block, shape, flash_attn, rotations=(0, 0)):
    """llm_graph_context::build_attn with a KV cache. The graph computes Q (projection, rotation, and with a
    quantized K cache its Hadamard product), then V, then K (added together: "so that they are not reordered"), and
    writes K and V into the cache (ggml_set_rows). The normed input lives until K's projection. Flash attention:
    the rotated Q beside the heads' output (n_head x head_dim_v). Without it: the KQ scores of every head over the
    cache's cells (ggml_soft_max_ext works in place), allocated beyond the region the projections used, their
    product with V and its contiguous copy. Then the
    output projection beside the heads' output (and its Hadamard product with a quantized V cache). MLA absorbs Q
    into the latent space of the one cached K head."""
    tokens = shape.tokens
    embd = facts.n_embd * tokens * F32
    q, k, v, out = _attention_bytes(facts, block, tokens)
    if facts.mla:
        heads = facts.n_head.get(block) or 1
        q_attn = heads * (k // tokens // F32) * tokens * F32
        phases = [embd + q + 2 * q_attn + 2 * k]
    else:
        q_attn = q
        v_rot = v if rotations[1] else 0
        phases = [embd + 2 * q, embd + q + k + v + v_rot, q + v + v_rot + 2 * k]
    project = max(phases)
    phases += [q_attn + out, out + embd]
    if rotations[1]:
        phases.append(2 * out)
    if not flash_attn:  # the scores do not fit in what the projections freed: they go after it
        cells = shape.cells.swa_cells if block in facts.swa_blocks else shape.cells.cells
        scores = cells * tokens * (facts.n_head.get(block) or 1) * F32
        phases += [project + scores, scores + 2 * out]
    return max(phases)


def _ffn_live(width, gated, fused, tokens):
    """The activations alive at a feed-forward's worst node (llm_graph_context::build_ffn): with a gate, gate, up
    and their GLU product (ggml_swiglu_split / ggml_geglu_split, not in place); with a fused gate+up projection,
    its output and the GLU half; otherwise up, whose activation (gelu, silu, relu, relu squared) runs in place."""
    size = width * tokens * F32
    if gated:
        return 3 * size
    if fused:
        return size + size // 2
    return size


def _moe_peak(facts, tokens, normed, routed_here=True, experts_here=True):
    """llm_graph_context::build_moe_ffn for ``tokens`` rows; ``normed``: the room of its normed input. Routing: the
    router's logits with their probabilities in place, the biased copy (exp_probs_b) and the argsort of every
    expert, whose top-k view selects the experts up to down. The weights of the selected experts and their sum.
    Then the experts' activations (``_ffn_live`` of n_ff_exp x n_expert_used), down's input beside its output
    (n_embd x n_expert_used) and the first of the adds that sum the experts. ``routed_here=False``: a device that
    only computes the expert products of another device's block holds copies of the normed input and of the
    argsort, the activations and down. ``experts_here=False``: the experts' products run elsewhere (host-resident
    experts without op offload, experts placed on another device); this device routes and gets down's output."""
    embd = facts.n_embd * tokens * F32
    used = max(1, facts.expert_used_count)
    router = max(facts.n_expert, used) * tokens * F32
    act = facts.n_ff_exp * used * tokens * F32
    down = facts.n_embd * used * tokens * F32
    live = _ffn_live(facts.n_ff_exp * used, facts.experts_gated, False, tokens)
    if not routed_here:
        return embd + router + max(live, act + down)
    weights = 2 * used * tokens * F32 + 2 * tokens * F32
    routing = (2 + int(facts.expert_probs_bias)) * router
    if not experts_here:
        return normed + weights + max(routing, router + down, down + embd)
    return normed + weights + max(routing, router + live, router + act + down, down + embd)


def _ssm_peak(facts, shape):
    """llm_build_mamba_base::build_mamba2_layer: ssm_in's output (z, xBC and dt) lives until z is made contiguous.
    Beside it: the conv states of the batch (build_rs), their concatenation with xBC and ggml_ssm_conv's output;
    then that output, dt, ggml_ssm_scan's y and final states and x * D (y + x * D is added in place); then y, the
    contiguous z and their GLU product."""
    s = facts.ssm
    tokens, seqs = shape.tokens, shape.seqs
    embd = facts.n_embd * tokens * F32
    conv_dim = s["d_inner"] + 2 * s["n_group"] * s["d_state"]
    in_proj = (2 * s["d_inner"] + 2 * s["n_group"] * s["d_state"] + s["n_head"]) * tokens * F32
    states = (s["d_conv"] - 1) * conv_dim * seqs * F32
    conv_x = conv_dim * (tokens + (s["d_conv"] - 1) * seqs) * F32
    xbc = conv_dim * tokens * F32
    inner = s["d_inner"] * tokens * F32
    scan = inner + s["d_state"] * s["d_inner"] * seqs * F32
    return embd + in_proj + max(states + conv_x + xbc, xbc + s["n_head"] * tokens * F32 + scan + inner,
                                scan + 2 * inner)


def _block_parts(facts, block, shape, flash_attn=True, rotations=(0, 0), experts_here=True, hybrid=False):
    """The tensors alive at the worst node of one block, ``(attention, the rest)``: the residual stream beside the
    largest working set of its attention and of its other parts (dense FFN, routed experts, shared experts beside
    the routed experts' sum, Mamba); 0 for a part the block does not have.

    After attention the feed-forward parts start with a hole where the heads' output was (the residual is
    allocated beside it): their normed input fills it when it is as large, else both count. On the last block of
    an ``OUTPUT_ROWS_ARCHS`` model they see only the output rows. ``experts_here=False``: the routed experts'
    products of this block run elsewhere (``_moe_peak``). ``hybrid``: the device holds blocks of different kinds;
    the state rows of a later recurrent block are made early (build_rs) and can hold a region another kind of
    block freed. Attention and a dense FFN make few, large tensors, so such a part also counts one hole, smaller
    than its largest tensor (else the allocator, which tries the holes first, ggml-alloc.c ggml_dyn_tallocr_alloc,
    would have put that tensor there); the routed experts' and Mamba's many small tensors fill it."""
    embd = facts.n_embd * shape.tokens * F32
    parts = [(0, 0)]
    tokens = shape.tokens
    normed = embd
    attention = 0
    if block in facts.kv_blocks or block in facts.kv_reused:
        sizes = _attention_bytes(facts, block, tokens)
        attention = embd + _attention_peak(facts, block, shape, flash_attn, rotations)
        attention += max(sizes + (embd,)) if hybrid else 0
        normed = sizes[3] if sizes[3] >= embd else sizes[3] + embd
    if block == facts.block_count - 1 and facts.architecture in OUTPUT_ROWS_ARCHS:
        tokens = shape.outputs
        normed = max(normed - embd, 0) + facts.n_embd * tokens * F32
    rows = facts.n_embd * tokens * F32
    if block in facts.ffn:
        live = _ffn_live(facts.ffn[block], block in facts.ffn_gated, block in facts.ffn_fused, tokens)
        parts.append((normed + live, max(facts.ffn[block] * tokens * F32, rows)))
    if block in facts.expert_tensors_by_block and facts.n_ff_exp:
        parts.append((_moe_peak(facts, tokens, normed, experts_here=experts_here), 0))
    if block in facts.shexp:
        live = _ffn_live(facts.shexp[block], block in facts.shexp_gated, False, tokens)
        parts.append((normed + rows + live, max(facts.shexp[block] * tokens * F32, rows)))
    if block in facts.recurrent_blocks and facts.ssm:
        ssm = facts.ssm
        in_proj = 2 * ssm["d_inner"] + 2 * ssm["n_group"] * ssm["d_state"] + ssm["n_head"]
        parts.append((_ssm_peak(facts, shape), in_proj * shape.tokens * F32))
    rest = max(peak + (hole if hybrid else 0) for peak, hole in parts)
    return attention, embd + rest if rest else 0


def block_peak(facts, block, shape, flash_attn=True, rotations=(0, 0), experts_here=True, hybrid=False):
    """The tensors alive at the worst node of one block (``_block_parts``)."""
    return max(_block_parts(facts, block, shape, flash_attn, rotations, experts_here, hybrid))


def _block_kind(facts, block):
    return (block in facts.kv_blocks or block in facts.kv_reused, block in facts.ffn,
            block in facts.expert_tensors_by_block, block in facts.recurrent_blocks)


def _output_peak(facts, shape):
    """After the last block: the residual stream, the output norm and the logits (n_vocab x n_outputs)."""
    return 2 * facts.n_embd * shape.tokens * F32 + facts.n_vocab * shape.outputs * F32


def _expert_tokens(facts, shape, block):
    """The rows the routed experts of ``block`` compute."""
    last = block == facts.block_count - 1 and facts.architecture in OUTPUT_ROWS_ARCHS
    return shape.outputs if last else shape.tokens


def compute_buffer_bytes(facts, options, blocks=None, has_output=True, cpu_expert_bytes_max=0, *,
                         foreign_expert_blocks=(), copies=1, remote_expert_blocks=(), host_blocks=(),
                         host_attention=()):
    """An upper estimate of one device's compute buffer (see the notes above and docs/memory-model.md).

    ``blocks``: the blocks on this device (all by default); ``has_output``: the output layer is on it;
    ``foreign_expert_blocks``: blocks of another device whose experts this device holds (it computes their
    products); ``remote_expert_blocks``: blocks of this device whose experts' products run elsewhere (on the host
    without op offload, or on another device); ``copies``: the input copies of a pipeline-parallel graph
    (llama.cpp keeps 4 on several GPUs without tensor overrides, ggml-backend.cpp GGML_SCHED_MAX_COPIES, and
    never frees them). With op offload, CUDA computes the products of host-resident experts from 32 tokens on and
    copies each weight in as the input of a split of its own: the room of the largest host-resident block's experts is added (``cpu_expert_bytes_max``).
    ``host_blocks``: blocks that ``-ngl`` leaves on the host whose matrix products this device computes (op
    offload): their worst nodes count among the peaks. ``host_attention``: ``(block, cache bytes)`` of attention
    blocks left on the host whose attention the scheduler may run here (ggml-backend.cpp
    ggml_backend_sched_split_graph gives an op without weights the backend of its neighbours): the block's K and V
    cache come in as split inputs beside its attention's worst node, and its cache's mask is an input.
    """
    shape = graph_shape(facts, options)
    flash_attn = options.flash
    rotations = _rotations(facts, options.cache_type_k, options.cache_type_v)
    blocks = set(range(facts.block_count)) if blocks is None else set(blocks)
    remote = set(remote_expert_blocks)
    hybrid = len(set(_block_kind(facts, b) for b in blocks)) > 1

    # The input copies stay for the device's whole graph: a mask freed after the last attention block that reads
    # it leaves a region the next tensors do not always fit in.
    peaks = [_moe_peak(facts, _expert_tokens(facts, shape, b), 0, routed_here=False)
             for b in foreign_expert_blocks if b in facts.expert_tensors_by_block and facts.n_ff_exp]
    peaks += [block_peak(facts, b, shape, flash_attn, rotations, b not in remote, hybrid) for b in blocks]
    peaks += [block_peak(facts, b, shape, flash_attn, rotations, True, hybrid) for b in host_blocks]
    peaks += [cache + _attention_peak(facts, b, shape, flash_attn, rotations) for b, cache in host_attention]
    if has_output:
        peaks.append(_output_peak(facts, shape))
    offload_copy = cpu_expert_bytes_max if (options.op_offload and shape.tokens >= OP_OFFLOAD_MIN_BATCH) else 0
    inputs = _input_bytes(facts, shape, flash_attn, blocks | set(b for b, _cache in host_attention), has_output,
                          rotations)
    return copies * inputs + max(peaks + [0]) + offload_copy


def host_compute_bytes(facts, options, cpu_expert_blocks=(), copies=1, host_blocks=()):
    """The host's compute buffer beside GPUs (CUDA_Host memory on a CUDA build). The scheduler keeps every graph
    input on the CPU backend (ggml-backend.cpp ggml_backend_sched_backend_id_from_cur, GGML_TENSOR_FLAG_INPUT):
    the token ids and the embeddings input (llm_graph_context::build_inp_embd), the positions, each cache's KQ mask
    and row indices, s_copy and inp_out_ids, ``copies`` times in a pipeline-parallel graph. token_embd stays on the
    host, so the embedding rows are looked up there; when the GPU does not compute the host-resident experts (no op
    offload, or micro-batches under 32 tokens) the host computes their products from copies of the normed input
    and of the expert ids. The blocks ``-ngl`` leaves on the host (``host_blocks``) are computed there as on a
    host without GPU: their worst nodes count among the peaks."""
    shape = graph_shape(facts, options)
    rotations = _rotations(facts, options.cache_type_k, options.cache_type_v)
    inputs = shape.tokens * I32 + _input_bytes(facts, shape, options.flash, rotations=rotations)
    work = [facts.n_embd * shape.tokens * F32]
    if host_blocks:
        hybrid = len(set(_block_kind(facts, b) for b in range(facts.block_count))) > 1
        work += [block_peak(facts, b, shape, options.flash, rotations, True, hybrid) for b in host_blocks]
    if facts.n_ff_exp and not (options.op_offload and shape.tokens >= OP_OFFLOAD_MIN_BATCH):
        work += [_moe_peak(facts, _expert_tokens(facts, shape, b), 0, routed_here=False) for b in cpu_expert_blocks
                 if b in facts.expert_tensors_by_block]
    return copies * inputs + max(work)


def cpu_compute_bytes(facts, options):
    """The compute buffer of a host without GPU: one CPU buffer holds the graph inputs, the embedding rows and the
    worst node of every block and of the output layer; blocks of different kinds count their holes, as on a
    device (``_block_parts``)."""
    shape = graph_shape(facts, options)
    flash_attn = options.flash
    rotations = _rotations(facts, options.cache_type_k, options.cache_type_v)
    hybrid = len(set(_block_kind(facts, b) for b in range(facts.block_count))) > 1
    peaks = [block_peak(facts, b, shape, flash_attn, rotations, True, hybrid) for b in range(facts.block_count)]
    return shape.tokens * I32 + _input_bytes(facts, shape, flash_attn, rotations=rotations) \
        + facts.n_embd * shape.tokens * F32 + max(peaks + [_output_peak(facts, shape)])
