"""The compute buffers (``_compute_buffers``): each term where it is the largest, and the whole graph against the
real llama-server.

Terms: each is made the peak by the choice of the dimensions, and the bytes expected are the tensors llama.cpp's
graph keeps alive at that node (src/llama-graph.cpp build_moe_ffn, build_attn, build_ffn,
src/models/graph-context-mamba.cpp build_mamba2_layer), listed one by one, all F32 (4 bytes) but the argsort's I32
expert ids (also 4 bytes).

Whole graph (``MEASURED``): llama-server b10435 (scripts/llama-cpp.sh, CPU backend) at ``-lv 4 -ngl 0``, the line
``sched_reserve:        CPU compute buffer size =     1.77 MiB`` for the tiny Nemotron-H MoE models of
tools/gguf_models.py (model A: the defaults; model B: n_embd 128, n_ff_exp 64, 16 experts, 4 used; model C:
n_embd 64, n_ff_exp 512, 16 experts, 8 used, where the routed experts' matrices are the biggest node), with
``-c CTX -np PARALLEL -ub UBATCH -b BATCH -fa on|off``. The estimate is what the role verifies the server
against (a logged buffer above it fails the deploy), so it must never be under, and it stays within 1 MiB of it
(llama.cpp prints two decimals), so a term that is not the peak of those models could be wrong unnoticed: hence
the terms one by one.
"""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _common as common
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _compute_buffers as cbuf
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _kv_cache as kvc
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _memory_estimate as mest
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _model_facts as mfacts
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import Options
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.model import read_model
from tools.gguf_models import write_tiny_nemotron_h_moe
from tests.helpers.memory_models import (
    F32, MEASURED, MIB, MODELS, T, attention_only, decoder, facts, facts_of, gemma3_270m,
    moe_facts, nano_facts, transformer, two_moe_blocks)

NANO_FACTS = nano_facts()


@pytest.fixture(scope="module")
def measured_facts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cpu-compute")
    found = {}
    for label, shape in MODELS.items():
        model = read_model(write_tiny_nemotron_h_moe(str(folder / (label + ".gguf")), **shape))
        found[label] = facts_of(model.metadata, model.tensors)
    return found


def test_compute_grows_with_context_op_offload_copy_slots_and_cache_layout():
    small = cbuf.compute_buffer_bytes(NANO_FACTS, Options(4096))
    large = cbuf.compute_buffer_bytes(NANO_FACTS, Options(262144))
    # the KQ mask: cells x tokens x f16
    assert large - small == (262144 - 4096) * 512 * 2
    copy = NANO_FACTS.expert_bytes_by_block()[1]
    with_copy = cbuf.compute_buffer_bytes(NANO_FACTS, Options(4096), cpu_expert_bytes_max=copy)
    assert with_copy - small == copy
    assert cbuf.compute_buffer_bytes(NANO_FACTS, Options(4096, op_offload=False), cpu_expert_bytes_max=copy) == small
    assert cbuf.compute_buffer_bytes(NANO_FACTS, Options(4096, ubatch=16), cpu_expert_bytes_max=copy) < small
    swa = gemma3_270m()  # on a sliding-window model only the full mask grows: the SWA mask stays 1024 cells
    base = cbuf.compute_buffer_bytes(swa, Options(4096, 1))
    assert cbuf.compute_buffer_bytes(swa, Options(8192, 1)) - base == (8192 - 4096) * 512 * 2
    assert cbuf.compute_buffer_bytes(swa, Options(4096, 1), blocks=[0], has_output=False) < base
    # -kvu: one stream of 2 x 2048 cells instead of two of 2048: the host holds the graph inputs, whose masks follow the
    # streams; so does the CPU buffer of a host without GPU.
    one, two, unified = Options(4096, 1), Options(4096, 2), Options(4096, 2, kv_unified=True)
    assert cbuf.host_compute_bytes(NANO_FACTS, two) != cbuf.host_compute_bytes(NANO_FACTS, one)
    assert cbuf.cpu_compute_bytes(NANO_FACTS, unified) > cbuf.cpu_compute_bytes(NANO_FACTS, two) > \
        cbuf.cpu_compute_bytes(NANO_FACTS, one)
    swa = transformer("gemma3", 6, attention__sliding_window=512)
    assert cbuf.host_compute_bytes(swa, Options(8192)) != cbuf.host_compute_bytes(swa, Options(8192, swa_full=True))
    host = mest.estimate(NANO_FACTS, unified)["host"]["compute"]
    assert host == cbuf.host_compute_bytes(NANO_FACTS, unified) != cbuf.host_compute_bytes(NANO_FACTS, two)


@pytest.mark.parametrize("model, tokens, normed, where, live", [
    # 128 experts, 2 used, a tiny FFN, a selection bias (exp_probs_b): the router's logits [128, T] (the
    # probabilities are computed in place), ffn_moe_probs_biased [128, T] and the argsort [128, T] (I32)
    (dict(n_embd=16, n_expert=128, used=2, n_ff_exp=8, bias=True), 64, 1000, {}, 3 * 128 * 64 * F32),
    (dict(n_embd=16, n_expert=128, used=2, n_ff_exp=8), 64, 1000, {}, 2 * 128 * 64 * F32),  # no bias: no biased copy
    # 8 experts, 4 used, n_ff_exp 64, gated (ffn_gate_exps): beside the argsort [8, T], ffn_moe_gate and ffn_moe_up
    # [64, 4, T] and their product ffn_moe_swiglu [64, 4, T] (ggml_swiglu_split, not in place)
    (dict(n_embd=16, n_expert=8, used=4, n_ff_exp=64, gated=True), 32, 2048, {}, (8 + 3 * 64 * 4) * 32 * F32),
    # the same without gate: ffn_moe_up [64, 4, T] takes its activation in place, and stays as down's input beside
    # ffn_moe_down [n_embd, 4, T]
    (dict(n_embd=16, n_expert=8, used=4, n_ff_exp=64), 32, 2048, {}, (8 + 64 * 4 + 16 * 4) * 32 * F32),
    # n_embd 256, 4 experts of width 8, 2 used: ffn_moe_down [256, 2, T] (weighted in place) beside the first add of
    # the experts' views, ffn_moe_out [256, T], whether the experts are computed here or not
    (dict(n_embd=256, n_expert=4, used=2, n_ff_exp=8), 16, 512, {}, (256 * 2 + 256) * 16 * F32),
    (dict(n_embd=256, n_expert=4, used=2, n_ff_exp=8), 16, 512, {"experts_here": False}, (256 * 2 + 256) * 16 * F32),
    # experts computed on another device: this one routes and receives ffn_moe_down [n_embd, used, T]; 64 experts,
    # 8 used, n_embd 16: the argsort [64, T] beside down's output is larger than the logits with the argsort, and
    # larger than down's output beside the sum
    (dict(n_embd=16, n_expert=64, used=8, n_ff_exp=512, gated=True), 32, 100, {"experts_here": False},
     (64 + 16 * 8) * 32 * F32),
    # a device computing another device's experts (routed_here=False) holds the copies of the normed input
    # [n_embd, T] and of the argsort [n_expert, T] the scheduler brings it, then gate, up and their GLU (gated), or
    # the activation beside down's output [n_embd, 4, T] (without gate); the weights stay with the router
    (dict(n_embd=16, n_expert=8, used=4, n_ff_exp=64, gated=True), 32, 0, {"routed_here": False},
     (16 + 8 + 3 * 64 * 4) * 32 * F32),
    (dict(n_embd=16, n_expert=8, used=4, n_ff_exp=64), 32, 0, {"routed_here": False},
     (16 + 8 + (64 + 16) * 4) * 32 * F32),
])
def test_the_largest_node_of_the_experts_beside_the_normed_input_and_the_weights(model, tokens, normed, where, live):
    # ffn_moe_weights (the selected experts' probabilities, get_rows), ffn_moe_weights_norm, ffn_moe_weights_sum
    # and its clamp: 2 x [used, T] + 2 x [1, T], where the experts are routed
    weights = 2 * model["used"] * tokens * F32 + 2 * tokens * F32 if where.get("routed_here", True) else 0
    assert cbuf._moe_peak(moe_facts(**model), tokens, normed, **where) == normed + weights + live


@pytest.mark.parametrize("d_inner, n_group, d_state, tokens, live", [
    # the convolution is the peak of wide groups (xBC: 32 + 2 x 4 x 16 = 160 wide): the conv states of the sequence
    # [3, 160], their concatenation with xBC [160, 3 + T] and ggml_ssm_conv's output [160, T]
    (32, 4, 16, 64, (3 * 160 + 160 * (3 + 64) + 160 * 64) * F32),
    # the scan is the peak of a large state (xBC 320 wide): the conv output [320, T], dt [4, T], ggml_ssm_scan's
    # output (y [64, T] and the final states [128, 64] of the sequence) and x * D [64, T]
    (64, 1, 128, 8, (320 * 8 + 4 * 8 + 64 * 8 + 128 * 64 + 64 * 8) * F32),
])
def test_the_mamba2_peak_beside_the_residual_and_ssm_in_s_output(d_inner, n_group, d_state, tokens, live):
    """4 heads, one sequence; the residual [32, T] and ssm_in's output (z [d_inner, T], xBC, dt [4, T])."""
    f = facts(block_count=1, n_embd=32, n_vocab=100, recurrent_blocks={0: (0, 0)},
              ssm={"d_conv": 4, "d_inner": d_inner, "d_state": d_state, "n_group": n_group, "n_head": 4})
    residual, in_proj = 32 * tokens * F32, (2 * d_inner + 2 * n_group * d_state + 4) * tokens * F32
    assert cbuf._ssm_peak(f, cbuf.GraphShape(tokens, 1, 1, None)) == residual + in_proj + live


def test_host_experts_under_32_tokens_are_computed_on_the_host_and_experts_moved_to_another_gpu_there():
    """CUDA's op offload takes the host-resident experts' products from 32 tokens on (ggml-cuda.cu
    ggml_backend_cuda_device_offload_op, min_batch_size 32); a 16-token micro-batch leaves them to the host,
    which then holds the copies of the normed input and of the argsort, gate, up and their GLU."""
    facts = moe_facts(n_embd=16, n_expert=8, used=4, n_ff_exp=64, gated=True)

    def host(tokens, blocks=(), **kw):
        return cbuf.host_compute_bytes(facts, Options(256, 1, ubatch=tokens, batch=tokens, **kw), blocks)
    embedding_rows = 16 * 16 * F32  # the largest node of a host without expert products
    experts = 16 * 16 * F32 + 8 * 16 * F32 + 3 * 64 * 4 * 16 * F32
    assert host(16, [0]) - host(16) == experts - embedding_rows
    assert host(16, [0], op_offload=False) == host(16, [0]) and host(32, [0]) == host(32) and host(16, [5]) == host(16)
    # At -ub 16 (under CUDA's op-offload minimum of 32, ggml-cuda.cu min_batch_size) the GPU reserves no copy of block
    # 0's host-resident experts and only routes them, and the host computes them; block 1's experts are on the GPU and
    # it computes them: its peak stays the device's. At -ub 32 the GPU computes every block's experts, the host-resident
    # ones from a copy of the largest block's weights (3 x 16 x 64 x 8 F32).
    facts = two_moe_blocks()
    small, large, copy = Options(256, 1, ubatch=16), Options(256, 1, ubatch=32), 3 * 16 * 64 * 8 * F32
    result = mest.estimate(facts, small, cpu_tensors=facts.expert_tensors_by_block[0])
    gpu = result["gpus"][0]["compute"]
    assert gpu == cbuf.compute_buffer_bytes(facts, small, remote_expert_blocks=[0])
    assert gpu > cbuf.compute_buffer_bytes(facts, small, remote_expert_blocks=[0, 1])
    on_host = cbuf.host_compute_bytes(facts, small, cpu_expert_blocks=[0])
    assert result["host"]["compute"] == on_host > cbuf.host_compute_bytes(facts, small)
    cpu = facts.expert_tensors_by_block[0] + facts.expert_tensors_by_block[1]
    gpu = mest.estimate(facts, large, cpu_tensors=cpu)["gpus"][0]["compute"]
    assert gpu == cbuf.compute_buffer_bytes(facts, large, cpu_expert_bytes_max=copy)
    assert gpu > cbuf.compute_buffer_bytes(facts, large, cpu_expert_bytes_max=copy, remote_expert_blocks=[0, 1])
    # ``-ot ...=CUDA1`` on block 0's experts, whose layer is on GPU 0: GPU 1 computes their products (the foreign expert
    # blocks of its compute buffer) from copies of the normed input [16, T] and of the argsort [8, T], with gate, up and
    # their GLU [64, 4, T]; the routing stays with the layer.
    facts = two_moe_blocks()
    moved = dict((n, 1) for n in facts.expert_tensors_by_block[0])
    result = mest.estimate(facts, Options(256, 1), split=[1, 1], n_devices=2, device_tensors=moved)
    assert result["devices_by_block"] == [0, 0] and result["output_device"] == 1
    assert result["gpus"][1]["compute"] == cbuf.compute_buffer_bytes(
        facts, Options(256, 1), [], True, foreign_expert_blocks=[0])
    foreign = cbuf.compute_buffer_bytes(facts, Options(256, 1), [], False, foreign_expert_blocks=[0])
    assert foreign - cbuf.compute_buffer_bytes(facts, Options(256, 1), [], False) == (16 + 8 + 3 * 64 * 4) * 256 * F32


def test_the_host_inputs_hold_the_rotation_matrices_of_a_quantized_cache():
    """llama-kv-cache.cpp: a quantized K cache of head size 128 adds attn_rot_k [128, 128] (the largest power of
    two from 64 that divides the head size), a quantized V cache attn_rot_v [64, 64]; F32 graph inputs: on the
    host, in the input copies of a device's graph and in a CPU host's buffer."""
    f = facts(block_count=1, n_embd=128, kv_blocks={0: (128, 128)}, n_head={0: 1}, kv_heads={0: 1})
    unnamed = facts(block_count=1, n_embd=128, kv_blocks={0: (128, 128)})  # no KV head count: one KV head, of 128
    host, k8 = cbuf.host_compute_bytes, dict(cache_type_k="q8_0")
    for model, estimate, caches, rotations in [
            (f, host, dict(cache_type_v="q8_0"), 64 * 64), (f, host, k8, 128 * 128),
            (f, host, dict(cache_type_k="q4_0", cache_type_v="q4_0"), 128 * 128 + 64 * 64),
            (f, cbuf.compute_buffer_bytes, k8, 128 * 128), (f, cbuf.cpu_compute_bytes, k8, 128 * 128),
            (unnamed, host, k8, 128 * 128)]:
        assert estimate(model, Options(256, **caches)) - estimate(model, Options(256)) == rotations * F32


@pytest.mark.parametrize("estimate", [cbuf.compute_buffer_bytes, cbuf.host_compute_bytes, cbuf.cpu_compute_bytes])
@pytest.mark.parametrize("side", ["cache_type_k", "cache_type_v"])
def test_an_unknown_cache_type_is_named_by_every_compute_estimate(estimate, side):
    """The rotation matrices depend on the cache type; a name llama-server does not know is not taken for f16."""
    f = facts(block_count=1, n_embd=128, kv_blocks={0: (128, 128)}, n_head={0: 1}, kv_heads={0: 1})
    assert estimate(f, Options(256)) == estimate(f, Options(256, cache_type_k="f16", cache_type_v="f16"))
    with pytest.raises(mfacts.MemoryModelError,
                       match=r"^unknown cache type 'q9' \(llama-server knows bf16, f16, f32, "):
        estimate(f, Options(256, **{side: "q9"}))


V_256 = dict(n_embd=128, kv_blocks={0: (64, 256)}, n_head={0: 4}, kv_heads={0: 4})


@pytest.mark.parametrize("model, tokens, flash, rotations, live", [
    # MLA (deepseek2 with *_mla keys; flash attention): beside the normed input [64, T] and Q [192, T], Q absorbed
    # into the latent space of the one cached head, 4 heads x 32 (the product and its copy), and the latent K
    # [32, T] twice (its projection and its normed, rotated copy); without head counts one head
    (dict(kv_blocks={0: (32, 0)}, n_head={0: 4}, kv_heads={0: 1}, q_width={0: 192}, mla=True), 8, True, (0, 0),
     64 + 192 + 2 * 4 * 32 + 2 * 32),
    (dict(kv_blocks={0: (32, 0)}, q_width={0: 192}, mla=True), 8, True, (0, 0), 64 + 192 + 2 * 32 + 2 * 32),
    # Q, K and V beside the normed input [128, T], and with a quantized V cache of head size 64 V's product with
    # attn_rot_v [256, T] (4 KV heads of 64 values, 16 of keys); none with an f16 V
    (V_256, 8, True, (0, 64), 128 + 64 + 64 + 2 * 256),
    (V_256, 8, True, (0, 0), 128 + 64 + 64 + 256),
    # a K wider than the input: Q, V, V's product, 2 x K
    (dict(n_embd=16, kv_blocks={0: (256, 64)}, n_head={0: 4}, kv_heads={0: 4}), 8, True, (0, 16),
     256 + 2 * 64 + 2 * 256),
    # without flash attention 8 query heads over one KV head of K 16 and V 256, 256 cells: the KQ scores of every
    # head [256, T, 8] beside the heads' output [8 x 256, T] and its contiguous copy outgrow the projections
    (dict(kv_blocks={0: (16, 256)}, n_head={0: 8}, kv_heads={0: 1}), 2, False, (0, 0), 256 * 8 + 2 * 8 * 256),
    # no head counts: one head, one KV head, Q as wide as K; the scores of the one head over the 256 cells come
    # after the projections (the normed input [64, T], Q, K and V)
    (dict(kv_blocks={0: (64, 32)}), 2, False, (0, 0), 64 + 64 + 64 + 32 + 256),
])
def test_the_largest_node_of_an_attention_block(model, tokens, flash, rotations, live):
    """``live``: the F32 elements a token keeps at that node."""
    f = facts(block_count=1, **model)
    shape = cbuf.GraphShape(tokens, 1, 1, kvc.CacheCells(256, 256, 1, 0, tokens))
    assert cbuf._attention_peak(f, 0, shape, flash, rotations) == live * tokens * F32


def test_block_kinds_head_counts_and_a_block_reading_another_s_cache_projects_no_k_or_v():
    """A device holding blocks of different kinds counts the holes of each (``hybrid``): Nemotron-NAS (deci)
    skips attention in some blocks with a dense FFN in all, and Gemma 3n's last blocks read the cache of an
    earlier block (kv_reused): they are attention blocks like it."""
    f = facts(block_count=3, kv_blocks={0: (64, 64)}, kv_reused=(2,), ffn={0: 256, 1: 256, 2: 256})
    assert cbuf._block_kind(f, 0) != cbuf._block_kind(f, 1)
    assert cbuf._block_kind(f, 2) == cbuf._block_kind(f, 0)
    # Without a Q width Q is the heads times the K head size: 8 query heads over 2 KV heads of K width 64 (32 a head)
    # for 3 tokens; facts given without head counts (one head, one KV head): Q is the K width; block 1 reads block 0's
    # cache (kv_reused): its K and V are not projected.
    eight = facts(block_count=1, kv_blocks={0: (64, 64)}, n_head={0: 8}, kv_heads={0: 2})
    assert cbuf._attention_bytes(eight, 0, 3) == (8 * 32 * 3 * F32, 64 * 3 * F32, 64 * 3 * F32, 8 * 32 * 3 * F32)
    f = facts(kv_blocks={0: (64, 32)}, kv_reused=(1,))
    assert cbuf._attention_bytes(f, 0, 2) == (64 * 2 * F32, 64 * 2 * F32, 32 * 2 * F32, 32 * 2 * F32)
    assert cbuf._attention_bytes(f, 1, 2) == (0, 0, 0, 0)


def test_mla_writes_no_v_rows_into_the_cache_and_pipeline_copies_multiply_the_device_inputs():
    """llama-kv-cache.cpp build_input_k_idxs / build_input_v_idxs: one I64 row index a token for K; MLA caches no
    V, so none for V, with or without flash attention (the KQ mask: F16, or F32 without)."""
    mla = facts(kv_blocks={0: (64, 0)}, mla=True)
    shape = cbuf.GraphShape(8, 1, 1, kvc.CacheCells(256, 256, 1, 0, 8))
    assert cbuf._cache_inputs(mla, shape, True, False) == 256 * 8 * 2 + 8 * 8
    assert cbuf._cache_inputs(mla, shape, False, False) == 256 * 8 * F32 + 8 * 8
    # ggml-backend.cpp GGML_SCHED_MAX_COPIES: a pipeline-parallel graph keeps 4 copies of each split's inputs.
    f = attention_only(n_vocab=100)
    inputs = 64 * 512 * 4 + 512 * 4 + 512 * 512 * 2 + 512 * 8 * 2 + 4
    assert cbuf.compute_buffer_bytes(f, Options(512), copies=4) - cbuf.compute_buffer_bytes(f, Options(512)) == \
        3 * inputs


def test_cpu_compute_buffer_holds_the_graph_inputs_the_embedding_rows_and_the_worst_node():
    """512 tokens, one slot, 512 cells: the token ids (I32), the embeddings input (n_embd F32 rows), inp_pos (I32),
    the KQ mask (cells x tokens, F16 with flash attention, F32 without: build_attn_inp_kq_mask), the K and V row
    indices (I64 a token; a token and V element with the transposed V), inp_out_ids (I32 an output), the embedding
    rows, then the larger of the output node (residual, norm, n_vocab logits) and the block's attention node."""
    f = attention_only()
    inputs = 512 * 4 + 64 * 512 * 4 + 512 * 4 + 512 * 512 * 2 + 512 * 8 * 2 + 1 * 4
    output = 2 * 64 * 512 * 4 + 1000000 * 1 * 4
    assert cbuf.cpu_compute_bytes(f, Options(512)) == inputs + 64 * 512 * 4 + output
    no_fa_inputs = 512 * 4 + 64 * 512 * 4 + 512 * 4 + 512 * 512 * 4 + 512 * 8 * (1 + 64) + 4
    scores = 512 * 512 * 4 * 4  # cells x tokens x heads, F32
    projections = 64 * 512 * 4 + 2 * 256 * 512 * 4  # normed input beside Q and its rotation
    attention = 64 * 512 * 4 + projections + scores
    assert cbuf.cpu_compute_bytes(f, Options(512, flash_attn=False)) == no_fa_inputs + 64 * 512 * 4 + attention
    # The CPU buffer of a host without GPU is what the host keeps beside a GPU without host-resident experts (inputs and
    # embedding rows) plus the worst node of every block and of the output layer.
    tokens = 512
    output = 2 * 2688 * tokens * 4 + 131072 * 4
    host = cbuf.host_compute_bytes(NANO_FACTS, Options(4096, 2))
    shape = cbuf.graph_shape(NANO_FACTS, Options(4096, 2))
    worst = max([cbuf.block_peak(NANO_FACTS, b, shape, True, (0, 0), True, True) for b in range(52)] + [output])
    assert cbuf.cpu_compute_bytes(NANO_FACTS, Options(4096, 2)) == host + worst
    # with every block on one device the GPU's buffer is the inputs and the worst node; the host adds the token ids
    # and the embedding rows it looks up (512 tokens: 512 x 4 + 2688 x 512 x 4 bytes)
    gpu = cbuf.compute_buffer_bytes(NANO_FACTS, Options(4096))
    assert cbuf.cpu_compute_bytes(NANO_FACTS, Options(4096)) - gpu == 512 * 4 + 2688 * 512 * 4


def test_graph_shape_slots_and_output_rows_and_the_logits_only_on_the_output_device():
    """llama_context::graph_reserve: n_tokens a multiple of n_seqs; one output row per slot (n_outputs_max).
    src/models/qwen3moe.cpp: ``if (il == n_layer - 1 && inp_out_ids)`` keeps only the output rows before the last
    block's feed-forward part, so its experts compute ``outputs`` rows; nemotron-h.cpp runs the whole micro-batch
    through every block."""
    shape = cbuf.graph_shape(facts(), Options(1536, 3, ubatch=100, batch=300))
    assert (shape.tokens, shape.seqs, shape.outputs) == (102, 3, 3)
    assert shape.cells == kvc.cache_cells(facts(), Options(1536, 3, ubatch=100, batch=300))
    small = cbuf.graph_shape(facts(), Options(256, 1, ubatch=4))
    assert (small.tokens, small.seqs, small.outputs) == (4, 1, 1)
    tensors = [T("blk.%d.ffn_up_exps.weight" % b, (64, 32, 4), 64 * 32 * 4 * 4, 0) for b in range(3)]
    tensors += [T("token_embd.weight", (64, 32), 64 * 32 * 4, 0)]
    for arch, last_rows in (("qwen3moe", "outputs"), ("nemotron_h_moe", "tokens")):
        md = {"general.architecture": arch, arch + ".block_count": 3, arch + ".embedding_length": 64,
              arch + ".expert_count": 4, arch + ".expert_used_count": 2}
        moe = facts_of(md, tensors)
        shape = cbuf.graph_shape(moe, Options(4096, 1, kv_unified=False, ubatch=512, batch=2048, swa_full=False))
        assert (shape.tokens, shape.outputs) == (512, 1)
        assert [cbuf._expert_tokens(moe, shape, b) for b in range(3)] == [512, 512, getattr(shape, last_rows)]
    # The output layer runs on the device that holds ``output.weight`` (llama-model.cpp: dev_output); the logits,
    # n_vocab x n_outputs floats, are in that device's compute buffer and in no other's.
    vocab = 1000000
    llama = decoder("llama", 1, 64, 4, 2, 16, n_vocab=vocab, n_ff=128)
    shape = cbuf.graph_shape(llama, Options(4096, 64, kv_unified=False, ubatch=512, batch=2048, swa_full=False))
    logits = vocab * shape.outputs * 4
    with_output = cbuf.compute_buffer_bytes(llama, Options(4096, 64, ubatch=512), has_output=True)
    without = cbuf.compute_buffer_bytes(llama, Options(4096, 64, ubatch=512), has_output=False)
    assert shape.outputs == 64 and with_output >= logits > without
    # llm_graph_context::build_ffn: up, gate and the activation of the whole micro-batch live together
    dense = decoder("llama", 2, 256, 4, 4, 64, n_ff=4096, gate=True)
    assert cbuf.compute_buffer_bytes(dense, Options(4096), has_output=False) >= 3 * 4096 * 512 * 4


@pytest.mark.parametrize("model, ctx, parallel, ubatch, batch, flash_attn, logged", MEASURED)
def test_the_cpu_compute_estimate_is_never_under_the_server_and_within_1_mib(
        measured_facts, model, ctx, parallel, ubatch, batch, flash_attn, logged):
    options = Options(ctx, parallel, ubatch=ubatch, batch=batch, flash_attn=flash_attn)
    estimate = cbuf.cpu_compute_bytes(measured_facts[model], options) / MIB
    assert logged - 0.005 <= estimate <= logged + 1.0, (estimate, logged)


@pytest.mark.parametrize("ctx, measured", [(4096, 21.52), (32768, 49.52)])
def test_gemma3_compute_is_never_under_what_llama_server_reserves(ctx, measured):
    """llama-server b10434 on an RPC device reserved 21.52 / 49.52 MiB of compute for Gemma 3 270M at 4096/1 and
    32768/1, the dense FFN (up, gate and activation of 2048 x 512 floats, llm_graph_context::build_ffn) and both
    KQ masks (llm_graph_input_attn_kv_iswa) included."""
    predicted = common.mib(cbuf.compute_buffer_bytes(gemma3_270m(), Options(ctx, 1)))
    assert measured <= predicted <= measured * 1.1
