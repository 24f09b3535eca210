"""The context and the caches (``_kv_cache``): row sizes, the cells of the full and the sliding-window cache, KV
bytes per block, the recurrent state, the logits buffer and the limits on the input. Each figure comes from
llama.cpp's source (cited beside it), from the GGUF metadata of Nemotron-3-Nano-30B-A3B (as tools/gguf_models.py
write_nemotron_nano_30b writes it) or, for Gemma 3 270M, from llama-server b10434 on an RPC device: 27/72/111/156
MiB of KV at ctx/slots 4096/1, 4096/4, 32768/1, 32768/4.
"""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _common as common
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _kv_cache as kvc
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _model_facts as mfacts
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import Options
from tests.helpers.memory_models import (
    NANO_ATTENTION, NANO_MAMBA, attention_model, decoder, decoder_header, f16, facts, facts_of, gemma3_270m, kv_mib,
    nano_facts, window)

NANO_FACTS = nano_facts()


def test_row_bytes_refuse_a_partial_block_and_an_unknown_type():
    with pytest.raises(mfacts.MemoryModelError) as info:
        kvc.row_bytes("q4_0", 33)
    assert str(info.value) == ("a KV row of 33 elements is not a multiple of the 32-element blocks of q4_0: llama.cpp "
                               "cannot use that cache type for this model")
    with pytest.raises(mfacts.MemoryModelError) as info:
        kvc.row_bytes("q6_k", 256)
    assert str(info.value) == ("unknown cache type 'q6_k' (llama-server knows bf16, f16, f32, iq4_nl, q4_0, q4_1, "
                               "q5_0, q5_1, q8_0)")


def test_mla_caches_only_the_compressed_k():
    """deepseek2 with *_mla keys: V is a view of K (llama-server logs V (f16): 0.00 MiB)."""
    mla = attention_model("deepseek2", attention__head_count_kv=1, attention__key_length=64,
                          attention__value_length=32, attention__key_length_mla=48, attention__value_length_mla=32)
    assert mla.kv_blocks == {0: (64, 0), 1: (64, 0)} and mla.mla is True
    assert sum(kvc.kv_cache_bytes(mla, Options(2000, 1)).values()) == 2 * 64 * 2 * 2048
    old = attention_model("deepseek2", attention__head_count_kv=4, attention__key_length=24,
                          attention__value_length=16)  # converted before MLA caching: K and V per head
    assert old.kv_blocks[0] == (96, 64) and old.mla is False


@pytest.mark.parametrize("meta", [
    dict(attention__key_length=-16, attention__value_length=-8),
    dict(attention__key_length=0, attention__value_length=0),
    dict(attention__head_count_kv=-2),
    dict(attention__head_count_kv=[-2, 2]),
    dict(embedding_length=-64),
])
def test_negative_or_zero_metadata_is_never_used(meta):
    facts = attention_model(**meta)
    assert facts.kv_blocks == {0: (32, 16), 1: (32, 16)}  # from the attn_k / attn_v shapes
    assert facts.n_embd == 64
    assert all(v > 0 for v in kvc.kv_cache_bytes(facts, Options(4096, 2)).values())


def test_nano_recurrent_state_is_2170880_bytes_per_block_and_sequence_and_the_logits_a_row_per_slot():
    """llama-memory-recurrent.cpp: r_l and s_l are F32 [n_embd_r, mem_size] and [n_embd_s, mem_size] with
    mem_size = max(1, n_seq_max) (llama-model.cpp create_memory); 47.62 MiB per sequence over the 23 blocks:
    ((4-1)*(4096+2*8*128) + 128*4096) * 4 bytes a block."""
    assert len(NANO_FACTS.recurrent_blocks) == 23
    assert kvc.recurrent_state_bytes(NANO_FACTS) == dict((b, 2170880) for b in NANO_MAMBA)
    assert common.mib(sum(kvc.recurrent_state_bytes(NANO_FACTS, 1).values())) == 47.62
    two = sum(kvc.recurrent_state_bytes(NANO_FACTS, 2).values())
    assert two == 2 * 23 * 2170880 and common.mib(two) == 95.23  # 95.234375 MiB (2 x 47.617)
    assert kvc.recurrent_state_bytes(NANO_FACTS, 3) == dict((b, 3 * 2170880) for b in NANO_MAMBA)
    assert kvc.recurrent_state_bytes(NANO_FACTS, 0) == dict((b, 2170880) for b in NANO_MAMBA)
    vocab = facts(n_vocab=131072)
    assert kvc.output_buffer_bytes(vocab) == kvc.output_buffer_bytes(vocab, 0) == 131072 * 4
    assert kvc.output_buffer_bytes(vocab, 3) == 3 * 131072 * 4


@pytest.mark.parametrize("name, n, expected", [
    ("f16", 256, 512), ("f32", 256, 1024), ("bf16", 256, 512), ("q8_0", 32, 34), ("q8_0", 256, 272),
    ("q4_0", 32, 18), ("q4_0", 256, 144), ("q4_1", 256, 160), ("iq4_nl", 256, 144), ("q5_0", 256, 176),
    ("q5_1", 256, 192), ("q8_0", 0, 0), ("f16", 1, 2)])
def test_row_bytes_are_ggml_row_size(name, n, expected):
    """ggml.c type_traits: f16 1 element in 2 bytes, q8_0 32 in 34 (block_q8_0), q4_0 32 in 18 (block_q4_0)."""
    assert kvc.row_bytes(name, n) == expected


@pytest.mark.parametrize("ctx, parallel, unified, expected", [
    (1, 1, False, (256, 256, 1)), (256, 1, False, (256, 256, 1)),
    (257, 1, False, (512, 512, 1)),  # n_ctx = GGML_PAD(n_ctx, 256)
    (513, 2, False, (1024, 512, 2)),  # n_ctx 768 -> n_ctx_seq pad(384) = 512 -> n_ctx 1024
    (1000, 3, False, (1536, 512, 3)),  # measured on llama-server b10434: 1.88 MiB, not 1.25
    (1024, 4, False, (1024, 256, 4)),
    (1025, 4, False, (2048, 512, 4)),  # 1280 / 4 = 320 cells a slot, padded to 512: 4 x 512
    (512, 3, False, (768, 256, 3)),  # 512 / 3 = 170, padded to 256
    (3000, 3, False, (3072, 1024, 3)), (4100, 2, False, (4608, 2304, 2)), (32768, 2, False, (32768, 16384, 2)),
    (4096, 0, False, (4096, 4096, 1)),
    (1025, 4, True, (1280, 1280, 1)),  # a unified cache: one stream of n_ctx
    (257, 8, True, (512, 512, 1)), (3000, 3, True, (3072, 3072, 1)), (4095, 5, True, (4096, 4096, 1)),
])
def test_context_cells_pad_the_context_and_every_slot_to_256(ctx, parallel, unified, expected):
    """llama-context.cpp llama_context::llama_context: n_ctx = GGML_PAD(n_ctx, 256); without kv_unified
    n_ctx_seq = GGML_PAD(n_ctx / n_seq_max, 256) and n_ctx = n_ctx_seq * n_seq_max."""
    assert kvc.context_cells(ctx, parallel, unified) == expected


@pytest.mark.parametrize("args, expected", [
    ((4096,), 512), ((100,), 100), ((4096, 4096), 2048), ((4096, 1024, 600), 600), ((300, 512, 256), 256),
    ((4096, 0), 1), ((512, 512, 512), 512)])
def test_micro_batch_is_min_of_ubatch_batch_and_context(args, expected):
    """llama-context.cpp: n_batch = min(n_ctx, n_batch) (default 2048), n_ubatch = min(n_batch, n_ubatch) (512)."""
    assert kvc.micro_batch(*args) == expected


@pytest.mark.parametrize("size, ctx, parallel, kw, swa_cells", [
    (None, 4096, 1, {}, 0), (None, 1000, 3, {"ubatch": 128}, 0),  # no sliding window: no SWA cells
    (None, 300, 2, {"kv_unified": True}, 0),
    (512, 4096, 1, {}, 1024),  # pad(min(4096, 512 + 512), 256)
    (500, 4096, 1, {}, 1024),  # 1012 -> 1024
    (513, 4096, 1, {}, 1280),  # 1025 -> 1280
    (512, 4096, 1, {"ubatch": 256}, 768), (512, 4096, 1, {"ubatch": 1024}, 1536),
    (512, 4096, 1, {"ubatch": 1024, "batch": 256}, 768),  # n_ubatch <= n_batch
    (512, 4096, 3, {}, 1024),  # per stream: min(1536, 1024)
    (512, 4096, 3, {"kv_unified": True}, 2048),  # n_swa * n_seq_max + n_ubatch with a unified cache
    (512, 4096, 0, {"kv_unified": True}, 1024),
    (4096, 4096, 1, {}, 4096),  # never more than the full cache
    (512, 300, 1, {}, 512),  # n_ubatch = 300: min(512, 812)
    (512, 4096, 3, {"swa_full": True}, 1536),  # --swa-full: as many as the full cache
    (512, 4096, 2, {"swa_full": True, "kv_unified": True}, 4096),
])
def test_cache_cells(size, ctx, parallel, kw, swa_cells):
    """llama-kv-cache-iswa.cpp llama_kv_cache_iswa: size_swa = GGML_PAD(min(size_base, n_swa * (unified ?
    n_seq_max : 1) + n_ubatch), 256); size_base with swa_full."""
    cells = kvc.cache_cells(facts(sliding_window=size and window(size, {0})), Options(ctx, parallel, **kw))
    full = kvc.context_cells(ctx, parallel, kw.get("kv_unified", False))
    assert cells == kvc.CacheCells(*full, swa_cells, kvc.micro_batch(ctx, kw.get("ubatch", 512), kw.get("batch", 2048)))


@pytest.mark.parametrize("options, per_cell, cells", [
    (Options(4096), 512 + 512, 4096), (Options(4096, cache_type_k="q8_0", cache_type_v="q8_0"), 272 + 272, 4096),
    (Options(4096, cache_type_k="q4_0", cache_type_v="q4_0"), 144 + 144, 4096),
    (Options(4096, cache_type_k="f32", cache_type_v="f32"), 2048, 4096),
    (Options(4096, cache_type_k="q8_0"), 272 + 512, 4096), (Options(4096, cache_type_v="q4_0"), 512 + 144, 4096),
    (Options(4096, cache_type_k="bf16", cache_type_v="q8_0"), 512 + 272, 4096),
    # 2 streams of 16384 cells: the bytes of 1 stream of 32768, 192.00 MiB over the 6 blocks as llama-server b10435
    # logged it for Nano at -c 32768 -np 2
    (Options(32768, 2), 1024, 32768),
    (Options(1025, 4), 1024, 2048),  # 4 streams of 512 cells, not 1025 nor 1280
    (Options(1025, 4, kv_unified=True), 1024, 1280),
])
def test_nano_kv_bytes_per_cell_cache_type_and_padded_slot(options, per_cell, cells):
    """llama-kv-cache.cpp llama_kv_cache: per attention block K [n_embd_k_gqa = 256, kv_size, n_stream] of type_k
    and V [256, kv_size, n_stream] of type_v; f16 gives 6 x 1024 = 6144 bytes a token."""
    assert kvc.kv_cache_bytes(NANO_FACTS, options) == dict((b, per_cell * cells) for b in NANO_ATTENTION)


SLIDING = dict(kv_blocks={0: (64, 64), 1: (64, 64)}, sliding_window=window(512, {0}))
V_32_128 = dict(kv_blocks={0: (64, 32), 1: (64, 128)})
MLA = dict(kv_blocks={0: (576, 0), 1: (576, 0)}, mla=True)


@pytest.mark.parametrize("model, options, block_bytes", [
    # a sliding block's cells: pad(512 + 512, 256) a stream, 512 x 2 + 512 a unified stream
    (SLIDING, Options(8192, 2), (2 * 64 * 2 * 1024 * 2, 2 * 64 * 2 * 4096 * 2)),
    (SLIDING, Options(8192, 2, kv_unified=True), (2 * 64 * 2 * 1536, 2 * 64 * 2 * 8192)),
    # n_embd_v_gqa = !v_trans ? n_embd_v_gqa(il) : n_embd_v_gqa_max() (v_trans without flash attention, the default)
    (V_32_128, Options(256), ((64 + 32) * 2 * 256, (64 + 128) * 2 * 256)),
    (V_32_128, Options(256, flash_attn=False), ((64 + 128) * 2 * 256, (64 + 128) * 2 * 256)),
    # llama_kv_cache: has_v = !is_mla, with or without flash attention; K (kv_lora_rank + rope dims) of the K type
    (MLA, Options(512), (576 * 2 * 512,) * 2),
    (MLA, Options(512, flash_attn=False), (576 * 2 * 512,) * 2),
    (MLA, Options(512, cache_type_k="q8_0"), (576 // 32 * 34 * 512,) * 2),
])
def test_kv_bytes_of_each_block(model, options, block_bytes):
    """llama-kv-cache.cpp llama_kv_cache: one KV head of each block's widths, f16."""
    assert kvc.kv_cache_bytes(facts(kv_heads={0: 1, 1: 1}, **model), options) == dict(enumerate(block_bytes))


@pytest.mark.parametrize("widths, side, refused, head, other, other_bytes", [
    ((32, 64), "k", "q8_0", 16, "v", (64 + 68) * 512),  # head_k 16, head_v 32: a q8_0 V cache fits
    ((64, 48), "v", "q4_0", 24, "k", (36 + 96) * 512),  # head_k 32, head_v 24: a q4_0 K cache fits
])
def test_the_head_size_must_be_whole_blocks_of_the_cache_type(widths, side, refused, head, other, other_bytes):
    """llama-context.cpp llama_init_from_model refuses a K (V) cache type whose block does not divide
    n_embd_head_k (n_embd_head_v): "K cache type q8_0 with block size 32 does not divide n_embd_head_k=16"
    (llama-server b10435); the head size is the first attention block's width over its KV heads."""
    f = facts(kv_blocks={0: widths}, kv_heads={0: 2})
    with pytest.raises(mfacts.MemoryModelError) as info:
        kvc.kv_cache_bytes(f, Options(512, **{"cache_type_" + side: refused}))
    assert str(info.value) == (
        "%s cache type %s with block size 32 does not divide the head size %d (n_embd_head_%s): a head is not a "
        "multiple of its blocks, and llama.cpp refuses to create the context; use another cache_type_%s"
        % (side.upper(), refused, head, side, side))
    assert kvc.kv_cache_bytes(f, Options(512, **{"cache_type_" + other: refused})) == {0: other_bytes}


@pytest.mark.parametrize("name, value", [("ctx_size", 0), ("ctx_size", True), ("ctx_size", 1.5), ("parallel", 0),
                                         ("parallel", -1), ("ubatch", 0), ("ubatch", None)])
def test_validate_context_wants_whole_numbers_from_1(name, value):
    args = {"ctx_size": 4096, "parallel": 1, "ubatch": 512}
    args[name] = value
    with pytest.raises(mfacts.MemoryModelError) as info:
        kvc.validate_context(args["ctx_size"], args["parallel"], args["ubatch"])
    assert str(info.value) == "%s must be a whole number >= 1, got %r" % (name, value)


def test_validate_context_needs_a_padded_context_cell_per_slot_and_pad_rounds_up():
    assert kvc.validate_context(1, 1, 1) is None
    assert kvc.validate_context(256, 256) is None and kvc.validate_context(257, 512) is None
    with pytest.raises(mfacts.MemoryModelError) as info:
        kvc.validate_context(256, 257)
    assert str(info.value) == "ctx_size 256 cannot hold 257 parallel slots"
    assert [kvc.pad(v, 256) for v in (0, 1, 255, 256, 257, 512)] == [0, 256, 256, 256, 512, 512]


@pytest.mark.parametrize("ctx, parallel, measured", [(4096, 1, 27.0), (4096, 4, 72.0), (32768, 1, 111.0),
                                                     (32768, 4, 156.0)])
def test_gemma3_270m_kv_as_llama_server_allocates_it(ctx, parallel, measured):
    facts = gemma3_270m()
    assert facts.memory == "iswa"
    assert sorted(set(range(18)) - facts.swa_blocks) == [5, 11, 17]  # set_swa_pattern(6)
    assert facts.sliding_window.window == 512
    assert kv_mib(facts, ctx, parallel) == measured


def test_the_sliding_windows_of_gemma3_gpt_oss_llama4_and_gemma4():
    facts = gemma3_270m()
    per_cell = 256 * 2 * 2  # K + V, one KV head of 256, f16
    # llama_kv_cache_iswa: size_swa = pad(min(size_base, n_swa * (unified ? n_seq_max : 1) + n_ubatch), 256)
    assert kvc.cache_cells(facts, Options(4096, 4, kv_unified=True)).swa_cells == 2560
    assert kv_mib(facts, 4096, 4, kv_unified=True) == common.mib((3 * 4096 + 15 * 2560) * per_cell)
    # --swa-full: the sliding blocks get a full cache too, as large as the full blocks' cache
    assert kv_mib(facts, 32768, 1, swa_full=True) == kv_mib(facts, 32768, 4, swa_full=True) == 576.0
    # gpt-oss: set_swa_pattern(2), even blocks slide; 128 + 512 tokens padded to 768 cells. llama4: chunked attention of
    # 8192 tokens (its layout: test_model_facts), 8192 + 512 cells.
    facts = decoder("gpt-oss", 4, 64, 8, 2, 16, experts=4, attention__sliding_window=128)
    assert facts.memory == "iswa" and sorted(facts.swa_blocks) == [0, 2]
    kv = kvc.kv_cache_bytes(facts, Options(8192, 2))
    per_cell = 2 * 16 * 2 * 2
    assert kv[0] == kv[2] == 768 * 2 * per_cell and kv[1] == kv[3] == 4096 * 2 * per_cell
    assert not facts.dense and facts.expert_blocks == [0, 1, 2, 3]
    llama4 = decoder("llama4", 8, 64, 8, 2, 16, experts=4)
    assert kvc.cache_cells(llama4, Options(32768, 1)).swa_cells == 8704
    assert kvc.cache_cells(llama4, Options(4096, 1)).swa_cells == 4096
    # gemma4-style key_length_swa; without flash attention every V row is n_embd_v_gqa_max() wide (llama-kv-cache.cpp
    # [TAG_V_CACHE_VARIABLE]).
    facts = decoder("gemma4", 2, 64, 4, 2, 32, attention__sliding_window=128, attention__key_length_swa=16,
                    attention__value_length_swa=16, attention__sliding_window_pattern=[True, False])
    assert facts.kv_blocks == {0: (32, 32), 1: (64, 64)}
    fa = kvc.kv_cache_bytes(facts, Options(1024, 1, flash_attn=True))
    no_fa = kvc.kv_cache_bytes(facts, Options(1024, 1, flash_attn=False))
    assert fa[1] == no_fa[1] == (64 + 64) * 2 * 1024
    assert fa[0] == (32 + 32) * 2 * 768 and no_fa[0] == (32 + 64) * 2 * 768  # pad(128 + 512, 256) cells


def test_a_hybrid_with_a_sliding_window_keeps_both_caches_and_an_embedding_model_none():
    """A hybrid (recurrent + attention) with SWA uses llama_memory_hybrid_iswa: the same two caches."""
    md, tensors = decoder_header("myhybrid", 4, 64, 4, 2, 16, shortconv__l_cache=3, attention__sliding_window=128,
                                 attention__sliding_window_pattern=[0, 1, 0, 0])
    tensors = [t for t in tensors if not t.name.startswith(("blk.0.attn", "blk.2.attn"))]  # blocks 0 and 2: LFM2
    facts = facts_of(md, tensors + [f16("blk.%d.shortconv.in_proj.weight" % b, 64, 192) for b in (0, 2)])
    assert facts.memory == "hybrid_iswa" and facts.swa_blocks == {1} and sorted(facts.kv_blocks) == [1, 3]
    assert facts.recurrent_blocks == {0: (128, 0), 2: (128, 0)}
    kv = kvc.kv_cache_bytes(facts, Options(8192, 1))
    assert kv[1] == 64 * 2 * 768 and kv[3] == 64 * 2 * 8192
    facts = decoder("gemma-embedding", 6, 64, 4, 2, 16, attention__sliding_window=512)
    assert facts.memory == "none" and facts.kv_blocks == {} and kvc.kv_cache_bytes(facts, Options(4096)) == {}
