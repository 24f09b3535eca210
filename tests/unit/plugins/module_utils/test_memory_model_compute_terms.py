"""The compute terms of one component at a time, each where it is the largest, in bytes counted by hand.

The whole-graph figures (test_memory_model_cpu_compute.py: the real llama-server's CPU compute buffer) keep an
estimate within 1 MiB of the server, so a term that is not the peak of those models, or that is smaller than that
margin, could be wrong unnoticed. Here each term is made the peak by the choice of the dimensions, and the bytes
expected are the tensors llama.cpp's graph keeps alive at that node (src/llama-graph.cpp build_moe_ffn,
src/models/graph-context-mamba.cpp build_mamba2_layer), listed one by one, all F32 (4 bytes) but the argsort's
I32 expert ids (also 4 bytes).
"""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _compute_buffers as cbuf
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _kv_cache as kvc
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _memory_estimate as mest
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _model_facts as mfacts
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import Options

F32 = 4


def moe_facts(n_embd, n_expert, used, n_ff_exp, gated=False, bias=False):
    """One MoE block (block 0) of ``n_expert`` experts, ``used`` of them per token."""
    return mfacts.ModelFacts(architecture="test", block_count=1, n_embd=n_embd, n_vocab=100, context_length=None,
                         kv_blocks={}, n_expert=n_expert, expert_used_count=used, n_ff_exp=n_ff_exp,
                         experts_gated=gated, expert_probs_bias=bias,
                         expert_tensors_by_block={0: ["blk.0.ffn_up_exps.weight", "blk.0.ffn_down_exps.weight"]})


def weights(used, tokens):
    """ffn_moe_weights (the probabilities of the selected experts, get_rows) and ffn_moe_weights_norm, then
    ffn_moe_weights_sum and its clamp: 2 x [used, T] + 2 x [1, T]."""
    return 2 * used * tokens * F32 + 2 * tokens * F32


def test_the_routing_is_the_peak_of_many_experts_with_a_selection_bias():
    """128 experts, 2 used, a tiny FFN, a selection bias (exp_probs_b): the router's logits [128, T] (the
    probabilities are computed in place), ffn_moe_probs_biased [128, T] and the argsort [128, T] (I32), beside
    the normed input and the weights."""
    tokens, normed = 64, 1000
    facts = moe_facts(n_embd=16, n_expert=128, used=2, n_ff_exp=8, bias=True)
    logits = biased = argsort = 128 * tokens * F32
    assert cbuf._moe_peak(facts, tokens, normed) == normed + weights(2, tokens) + logits + biased + argsort
    unbiased = moe_facts(n_embd=16, n_expert=128, used=2, n_ff_exp=8)
    assert cbuf._moe_peak(unbiased, tokens, normed) == normed + weights(2, tokens) + logits + argsort


def test_gate_up_and_their_glu_of_gated_experts_are_the_peak():
    """8 experts, 4 used, n_ff_exp 64, gated (ffn_gate_exps): beside the argsort [8, T], ffn_moe_gate and
    ffn_moe_up [64, 4, T] and their product ffn_moe_swiglu [64, 4, T] (ggml_swiglu_split, not in place)."""
    tokens, normed = 32, 2048
    facts = moe_facts(n_embd=16, n_expert=8, used=4, n_ff_exp=64, gated=True)
    argsort = 8 * tokens * F32
    gate = up = glu = 64 * 4 * tokens * F32
    assert cbuf._moe_peak(facts, tokens, normed) == normed + weights(4, tokens) + argsort + gate + up + glu


def test_without_a_gate_the_activation_beside_down_s_output_is_the_peak():
    """The same experts without gate: ffn_moe_up [64, 4, T] takes its activation in place, and stays as down's
    input beside ffn_moe_down [n_embd, 4, T]."""
    tokens, normed = 32, 2048
    facts = moe_facts(n_embd=16, n_expert=8, used=4, n_ff_exp=64)
    argsort = 8 * tokens * F32
    activation, down = 64 * 4 * tokens * F32, 16 * 4 * tokens * F32
    assert cbuf._moe_peak(facts, tokens, normed) == normed + weights(4, tokens) + argsort + activation + down


def test_down_s_output_beside_the_sum_of_the_experts_is_the_peak_of_a_wide_model():
    """n_embd 256, 4 experts of width 8, 2 used: ffn_moe_down [256, 2, T] (weighted in place) beside the first
    add of the experts' views, ffn_moe_out [256, T]."""
    tokens, normed = 16, 512
    facts = moe_facts(n_embd=256, n_expert=4, used=2, n_ff_exp=8)
    down, out = 256 * 2 * tokens * F32, 256 * tokens * F32
    assert cbuf._moe_peak(facts, tokens, normed) == normed + weights(2, tokens) + down + out
    assert cbuf._moe_peak(facts, tokens, normed, experts_here=False) == normed + weights(2, tokens) + down + out


def test_experts_computed_elsewhere_leave_the_router_and_down_s_output():
    """``experts_here=False`` (the products run on another device): this device routes and receives
    ffn_moe_down [n_embd, used, T]. 64 experts, 8 used, n_embd 16: the argsort [64, T] beside down's output is
    larger than the logits with the argsort, and larger than down's output beside the sum."""
    tokens, normed = 32, 100
    facts = moe_facts(n_embd=16, n_expert=64, used=8, n_ff_exp=512, gated=True)
    argsort, down = 64 * tokens * F32, 16 * 8 * tokens * F32
    assert cbuf._moe_peak(facts, tokens, normed, experts_here=False) == normed + weights(8, tokens) + argsort + down


@pytest.mark.parametrize("gated, live", [(True, 3 * 64 * 4 * 32 * F32), (False, (64 + 16) * 4 * 32 * F32)])
def test_a_device_computing_another_device_s_experts_holds_copies_of_its_inputs(gated, live):
    """``routed_here=False``: the copies of the normed input [n_embd, T] and of the argsort [n_expert, T] that
    the scheduler brings to the device of the experts, then gate, up and their GLU (gated), or the activation
    beside down's output [n_embd, 4, T] (without gate). The weights stay with the router."""
    tokens = 32
    facts = moe_facts(n_embd=16, n_expert=8, used=4, n_ff_exp=64, gated=gated)
    copies = 16 * tokens * F32 + 8 * tokens * F32
    assert cbuf._moe_peak(facts, tokens, 0, routed_here=False) == copies + live


def ssm_facts(d_inner, n_group, d_state, n_head, n_embd=32):
    return mfacts.ModelFacts(architecture="test", block_count=1, n_embd=n_embd, n_vocab=100, context_length=None,
                         kv_blocks={}, recurrent_blocks={0: (0, 0)},
                         ssm={"d_conv": 4, "d_inner": d_inner, "d_state": d_state, "n_group": n_group,
                              "n_head": n_head})


def shape(tokens, seqs):
    return cbuf.GraphShape(tokens, seqs, seqs, None)


def test_mamba2_the_convolution_is_the_peak_of_wide_groups():
    """d_inner 32, 4 groups of d_state 16 (xBC: 32 + 2 x 4 x 16 = 160 wide), 4 heads, 64 tokens of one sequence.
    Beside the residual [32, T] and ssm_in's output (z [32, T], xBC [160, T], dt [4, T]): the conv states of the
    sequence [3, 160], their concatenation with xBC [160, 3 + T] and ggml_ssm_conv's output [160, T]."""
    tokens = 64
    facts = ssm_facts(d_inner=32, n_group=4, d_state=16, n_head=4)
    residual, in_proj = 32 * tokens * F32, (32 + 160 + 4) * tokens * F32
    states, concat, conv = 3 * 160 * F32, 160 * (3 + tokens) * F32, 160 * tokens * F32
    assert cbuf._ssm_peak(facts, shape(tokens, 1)) == residual + in_proj + states + concat + conv


def test_mamba2_the_scan_is_the_peak_of_a_large_state():
    """d_inner 64, 1 group of d_state 128 (xBC 320 wide), 4 heads, 8 tokens: beside ssm_in's output, the conv
    output [320, T], dt [4, T], ggml_ssm_scan's output (y [64, T] and the final states [128, 64] of the sequence)
    and x * D [64, T]."""
    tokens = 8
    facts = ssm_facts(d_inner=64, n_group=1, d_state=128, n_head=4)
    residual, in_proj = 32 * tokens * F32, (64 + 320 + 4) * tokens * F32
    conv, dt, scan, x_d = 320 * tokens * F32, 4 * tokens * F32, (64 * tokens + 128 * 64) * F32, 64 * tokens * F32
    assert cbuf._ssm_peak(facts, shape(tokens, 1)) == residual + in_proj + conv + dt + scan + x_d


def test_the_host_computes_its_experts_under_32_tokens_even_with_op_offload():
    """CUDA's op offload takes the host-resident experts' products from 32 tokens on (ggml-cuda.cu
    ggml_backend_cuda_device_offload_op, min_batch_size 32); a 16-token micro-batch leaves them to the host,
    which then holds the copies of the normed input and of the argsort, gate, up and their GLU."""
    facts = moe_facts(n_embd=16, n_expert=8, used=4, n_ff_exp=64, gated=True)
    host = cbuf.host_compute_bytes(facts, Options(256, 1, ubatch=16, batch=16), cpu_expert_blocks=[0])
    without = cbuf.host_compute_bytes(facts, Options(256, 1, ubatch=16, batch=16))
    embedding_rows = 16 * 16 * F32  # the largest node of a host without expert products
    experts = 16 * 16 * F32 + 8 * 16 * F32 + 3 * 64 * 4 * 16 * F32
    assert host - without == experts - embedding_rows
    assert cbuf.host_compute_bytes(facts, Options(256, 1, ubatch=16, batch=16, op_offload=False), cpu_expert_blocks=[0]) == host
    assert cbuf.host_compute_bytes(facts, Options(256, 1, ubatch=32, batch=32), cpu_expert_blocks=[0]) == \
        cbuf.host_compute_bytes(facts, Options(256, 1, ubatch=32, batch=32))
    assert cbuf.host_compute_bytes(facts, Options(256, 1, ubatch=16, batch=16), cpu_expert_blocks=[5]) == without


def test_the_host_inputs_hold_the_rotation_matrices_of_a_quantized_cache():
    """llama-kv-cache.cpp: a quantized K cache of head size 128 adds attn_rot_k [128, 128] (the largest power of
    two from 64 that divides the head size), a quantized V cache attn_rot_v [64, 64]; F32, graph inputs, so on
    the host."""
    facts = mfacts.ModelFacts(architecture="test", block_count=1, n_embd=128, n_vocab=100, context_length=None,
                          kv_blocks={0: (128, 128)}, n_head={0: 1}, kv_heads={0: 1})
    plain = cbuf.host_compute_bytes(facts, Options(256))
    assert cbuf.host_compute_bytes(facts, Options(256, cache_type_v="q8_0")) - plain == 64 * 64 * F32
    assert cbuf.host_compute_bytes(facts, Options(256, cache_type_k="q8_0")) - plain == 128 * 128 * F32
    assert cbuf.host_compute_bytes(facts, Options(256, cache_type_k="q4_0", cache_type_v="q4_0")) - plain == \
        (128 * 128 + 64 * 64) * F32
    unnamed = mfacts.ModelFacts(architecture="test", block_count=1, n_embd=128, n_vocab=100, context_length=None,
                            kv_blocks={0: (128, 128)})  # no KV head count: one KV head, of 128
    assert cbuf.host_compute_bytes(unnamed, Options(256, cache_type_k="q8_0")) - cbuf.host_compute_bytes(unnamed, Options(256)) == \
        128 * 128 * F32


@pytest.mark.parametrize("estimate", [cbuf.compute_buffer_bytes, cbuf.host_compute_bytes, cbuf.cpu_compute_bytes])
@pytest.mark.parametrize("side", ["cache_type_k", "cache_type_v"])
def test_an_unknown_cache_type_is_named_by_every_compute_estimate(estimate, side):
    """The rotation matrices depend on the cache type; a name llama-server does not know is not taken for f16."""
    facts = mfacts.ModelFacts(architecture="test", block_count=1, n_embd=128, n_vocab=100, context_length=None,
                          kv_blocks={0: (128, 128)}, n_head={0: 1}, kv_heads={0: 1})
    assert estimate(facts, Options(256)) == estimate(facts, Options(256, cache_type_k="f16", cache_type_v="f16"))
    with pytest.raises(mfacts.MemoryModelError, match=r"^unknown cache type 'q9' \(llama-server knows bf16, f16, f32, "):
        estimate(facts, Options(256, **{side: "q9"}))


def two_moe_blocks():
    """Two blocks of routed experts only (8 of 64, 4 used, gated, n_embd 16): the experts are each block's peak."""
    names = dict((b, ["blk.%d.ffn_%s_exps.weight" % (b, kind) for kind in ("gate", "up", "down")]) for b in (0, 1))
    tensors = tuple(mfacts.TensorFacts(n, 16 * 64 * 8 * F32, b, 0, (16, 64, 8), True) for b in (0, 1) for n in names[b])
    return mfacts.ModelFacts(architecture="test", block_count=2, n_embd=16, n_vocab=100, context_length=None,
                         kv_blocks={}, n_expert=8, expert_used_count=4, n_ff_exp=64, experts_gated=True,
                         tensors=tensors, expert_tensors_by_block=names)


def test_under_32_tokens_only_the_blocks_of_host_experts_leave_their_products_to_the_host():
    """At -ub 16 (under CUDA's op-offload minimum of 32) the GPU only routes block 0, whose experts are in host
    memory; block 1's experts are on the GPU and it computes them: its peak stays the device's."""
    facts = two_moe_blocks()
    cpu = facts.expert_tensors_by_block[0]
    gpu = mest.estimate(facts, Options(256, 1, ubatch=16), cpu_tensors=cpu)["gpus"][0]
    assert gpu["compute"] == cbuf.compute_buffer_bytes(facts, Options(256, 1, ubatch=16), remote_expert_blocks=[0])
    assert gpu["compute"] > cbuf.compute_buffer_bytes(facts, Options(256, 1, ubatch=16), remote_expert_blocks=[0, 1])


def test_from_32_tokens_the_gpu_computes_the_host_experts_from_a_copy():
    """At -ub 32 the GPU computes every block's experts, the host-resident ones from a copy of the largest block's
    weights (3 x 16 x 64 x 8 F32)."""
    facts = two_moe_blocks()
    cpu = facts.expert_tensors_by_block[0] + facts.expert_tensors_by_block[1]
    gpu = mest.estimate(facts, Options(256, 1, ubatch=32), cpu_tensors=cpu)["gpus"][0]
    assert gpu["compute"] == cbuf.compute_buffer_bytes(facts, Options(256, 1, ubatch=32), cpu_expert_bytes_max=3 * 16 * 64 * 8 * F32)
    assert gpu["compute"] > cbuf.compute_buffer_bytes(facts, Options(256, 1, ubatch=32),
                                                      cpu_expert_bytes_max=3 * 16 * 64 * 8 * F32,
                                                      remote_expert_blocks=[0, 1])


def test_without_a_q_width_q_is_the_heads_times_the_k_head_size():
    """8 query heads over 2 KV heads of K width 64 (32 a head): Q is 8 x 32 wide, F32 for 3 tokens."""
    facts = mfacts.ModelFacts(architecture="test", block_count=1, n_embd=64, n_vocab=100, context_length=None,
                          kv_blocks={0: (64, 64)}, n_head={0: 8}, kv_heads={0: 2})
    assert cbuf._attention_bytes(facts, 0, 3) == (8 * 32 * 3 * F32, 64 * 3 * F32, 64 * 3 * F32, 8 * 32 * 3 * F32)


def test_mla_attention_works_in_the_latent_space_of_the_cached_head():
    """MLA (deepseek2 with *_mla keys; flash attention): beside the normed input [64, T] and Q [192, T], Q absorbed
    into the latent space of the one cached head, 4 heads x 32 (the product and its copy), and the latent K
    [32, T] twice (its projection and its normed, rotated copy)."""
    facts = mfacts.ModelFacts(architecture="test", block_count=1, n_embd=64, n_vocab=100, context_length=None,
                          kv_blocks={0: (32, 0)}, n_head={0: 4}, kv_heads={0: 1}, q_width={0: 192}, mla=True)
    tokens = 8
    normed, q, q_latent, k = 64 * tokens * F32, 192 * tokens * F32, 4 * 32 * tokens * F32, 32 * tokens * F32
    assert cbuf._attention_peak(facts, 0, shape(tokens, 1), True) == normed + q + 2 * q_latent + 2 * k


def test_a_quantized_v_cache_adds_v_s_hadamard_product_beside_the_projections():
    """Q, K and V beside the normed input [128, T], and with a quantized V cache of head size 64 V's product with
    attn_rot_v [256, T] (4 KV heads of 64 values, 16 of keys)."""
    facts = mfacts.ModelFacts(architecture="test", block_count=1, n_embd=128, n_vocab=100, context_length=None,
                          kv_blocks={0: (64, 256)}, n_head={0: 4}, kv_heads={0: 4})
    tokens = 8
    normed, q, k, v = 128 * tokens * F32, 64 * tokens * F32, 64 * tokens * F32, 256 * tokens * F32
    assert cbuf._attention_peak(facts, 0, shape(tokens, 1), True, (0, 64)) == normed + q + k + v + v
    assert cbuf._attention_peak(facts, 0, shape(tokens, 1), True) == normed + q + k + v  # f16 V: no product


def test_a_block_without_attention_is_another_kind_and_one_reading_another_s_cache_is_not():
    """A device holding blocks of different kinds counts the holes of each (``hybrid``): Nemotron-NAS (deci)
    skips attention in some blocks with a dense FFN in all, and Gemma 3n's last blocks read the cache of an
    earlier block (kv_reused): they are attention blocks like it."""
    facts = mfacts.ModelFacts(architecture="test", block_count=3, n_embd=64, n_vocab=100, context_length=None,
                          kv_blocks={0: (64, 64)}, kv_reused=(2,), ffn={0: 256, 1: 256, 2: 256})
    assert cbuf._block_kind(facts, 0) != cbuf._block_kind(facts, 1)
    assert cbuf._block_kind(facts, 2) == cbuf._block_kind(facts, 0)


def test_head_counts_default_to_one_and_a_block_reading_another_s_cache_projects_no_k_or_v():
    """Facts given without head counts (one head, one KV head): Q is the K width; block 1 reads block 0's cache
    (kv_reused): its K and V are not projected. Without flash attention the scores of the one head span the
    cache's cells, after the projections."""
    facts = mfacts.ModelFacts(architecture="test", block_count=2, n_embd=64, n_vocab=100, context_length=None,
                          kv_blocks={0: (64, 32)}, kv_reused=(1,))
    assert cbuf._attention_bytes(facts, 0, 2) == (64 * 2 * F32, 64 * 2 * F32, 32 * 2 * F32, 32 * 2 * F32)
    assert cbuf._attention_bytes(facts, 1, 2) == (0, 0, 0, 0)
    cells = kvc.CacheCells(256, 256, 1, 0, 2)
    peak = cbuf._attention_peak(facts, 0, cbuf.GraphShape(2, 1, 1, cells), False)
    flash = cbuf._attention_peak(facts, 0, cbuf.GraphShape(2, 1, 1, cells), True)
    assert peak == max(flash, 64 * 2 * F32 + 64 * 2 * F32 + 64 * 2 * F32 + 32 * 2 * F32 + 256 * 2 * F32)
