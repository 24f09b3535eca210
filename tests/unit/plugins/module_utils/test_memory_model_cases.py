"""Memory model cases beyond the first shapes: per-slot context padding, MLA caches, recurrent kinds beyond Mamba-2, and
metadata that is negative, zero or shaped wrong (a clear error or a fallback, never a traceback)."""
from __future__ import annotations

from collections import namedtuple

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _kv_cache as kvc
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import LLAMA_MAX_LAYERS
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _memory_estimate as mest
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _model_facts as mfacts
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import Options
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._tensor_classes import classify_model

T = namedtuple("T", "name shape nbytes type_id")


def f32(name, *shape):
    n = 1
    for d in shape:
        n *= d
    return T(name, tuple(shape), 4 * n, 0)


def attention_model(arch="qwen3moe", blocks=2, **meta):
    tensors = [f32("token_embd.weight", 64, 32), f32("output.weight", 64, 32)]
    for b in range(blocks):
        tensors += [f32("blk.%d.attn_q.weight" % b, 64, 64), f32("blk.%d.attn_k.weight" % b, 64, 32),
                    f32("blk.%d.attn_v.weight" % b, 64, 16), f32("blk.%d.ffn_up_exps.weight" % b, 64, 32, 4)]
    metadata = {arch + ".block_count": blocks, arch + ".embedding_length": 64, arch + ".attention.head_count": 4,
                arch + ".attention.head_count_kv": 2, arch + ".attention.key_length": 16,
                arch + ".attention.value_length": 8}
    metadata.update(dict((arch + "." + k.replace("__", "."), v) for k, v in meta.items()))
    metadata = dict((k, v) for k, v in metadata.items() if v is not None)
    return mfacts.model_facts(metadata, tensors, classify_model(arch, metadata, tensors))


@pytest.mark.parametrize("ctx, parallel, unified, n_ctx, cells, streams", [
    (513, 2, False, 1024, 512, 2),    # llama.cpp: n_ctx 768 -> n_ctx_seq pad(384) = 512 -> n_ctx 1024
    (1000, 3, False, 1536, 512, 3),   # measured on llama-server b10434: 1.88 MiB, not 1.25
    (4100, 2, False, 4608, 2304, 2),
    (1300, 3, False, 1536, 512, 3),
    (1, 1, False, 256, 256, 1),
    (4095, 5, True, 4096, 4096, 1),
    (32768, 2, False, 32768, 16384, 2),
])
def test_every_slot_is_padded_to_256(ctx, parallel, unified, n_ctx, cells, streams):
    assert kvc.context_cells(ctx, parallel, unified) == (n_ctx, cells, streams)


def test_kv_bytes_use_the_padded_slots():
    facts = attention_model()
    assert facts.kv_blocks == {0: (32, 16), 1: (32, 16)}  # key_length != value_length
    kv = kvc.kv_cache_bytes(facts, Options(1000, 3))
    assert sum(kv.values()) == 2 * (32 + 16) * 2 * 1536
    assert mest.estimate(facts, Options(513, 2, backend="rpc"))["n_ctx"] == 1024


def test_quantized_cache_rows():
    facts = attention_model(attention__key_length=64, attention__value_length=64)
    kv = kvc.kv_cache_bytes(facts, Options(4096, 1, cache_type_k="q8_0", cache_type_v="q4_0"))
    assert sum(kv.values()) == 2 * (128 // 32 * 34 + 128 // 32 * 18) * 4096
    with pytest.raises(mfacts.MemoryModelError, match="not a multiple"):
        kvc.kv_cache_bytes(attention_model(), Options(4096, 1, cache_type_k="q8_0", cache_type_v="q8_0"))  # 16-wide V rows
    with pytest.raises(mfacts.MemoryModelError, match="needs flash attention"):
        mest.estimate(facts, Options(4096, 1, cache_type_k="q8_0", cache_type_v="q8_0", flash_attn="off"))


def test_mla_caches_only_the_compressed_k():
    """deepseek2 with *_mla keys: V is a view of K (llama-server logs V (f16): 0.00 MiB)."""
    facts = attention_model("deepseek2", attention__head_count_kv=1, attention__key_length=64,
                            attention__value_length=32, attention__key_length_mla=48,
                            attention__value_length_mla=32)
    assert facts.kv_blocks == {0: (64, 0), 1: (64, 0)} and facts.mla is True
    assert sum(kvc.kv_cache_bytes(facts, Options(2000, 1)).values()) == 2 * 64 * 2 * 2048
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


def test_wrongly_shaped_tensors_give_a_clear_error():
    tensors = [f32("token_embd.weight", 64, 32), f32("blk.0.attn_q.weight", 64, 64), f32("blk.0.attn_k.weight", 64),
               f32("blk.0.attn_v.weight", 64)]
    metadata = {"x.embedding_length": 64}
    with pytest.raises(mfacts.MemoryModelError, match="KV width"):
        mfacts.model_facts(metadata, tensors, classify_model("x", metadata, tensors))


def mamba_model(arch, meta, ssm_tensors):
    tensors = [f32("token_embd.weight", 64, 32)] + [f32("blk.0." + n, *s) for n, s in ssm_tensors]
    metadata = dict((arch + "." + k, v) for k, v in meta.items())
    metadata[arch + ".embedding_length"] = 64
    return mfacts.model_facts(metadata, tensors, classify_model(arch, metadata, tensors))


def test_mamba1_has_no_groups():
    """Mamba-1 (jamba, mamba) writes no ssm.group_count: llama.cpp's n_group is 0, conv channels = d_inner."""
    facts = mamba_model("jamba", {"ssm.conv_kernel": 4, "ssm.inner_size": 128, "ssm.state_size": 16},
                        [("ssm_in.weight", (64, 256)), ("ssm_x.weight", (128, 36))])
    assert facts.recurrent_blocks == {0: (3 * 128, 16 * 128)}
    mamba2 = mamba_model("granitehybrid", {"ssm.conv_kernel": 4, "ssm.inner_size": 128, "ssm.state_size": 16,
                                           "ssm.group_count": 2}, [("ssm_in.weight", (64, 256))])
    assert mamba2.recurrent_blocks == {0: (3 * (128 + 2 * 2 * 16), 16 * 128)}


def test_lfm2_short_convolutions_and_rwkv():
    lfm2 = mamba_model("lfm2moe", {"shortconv.l_cache": 3}, [("shortconv.in_proj.weight", (64, 192))])
    assert lfm2.recurrent_blocks == {0: (64 * 2, 0)}
    rwkv = mamba_model("rwkv7", {"wkv.head_size": 16, "token_shift_count": 2}, [("time_mix_key.weight", (64, 64))])
    assert rwkv.recurrent_blocks == {0: (2 * 64, 64 * 16)}
    assert sum(kvc.recurrent_state_bytes(rwkv, 3).values()) == (128 + 1024) * 4 * 3


def test_recurrent_shapes_with_a_zero_group_count():
    """An ssm_norm of {64, 0} used to divide by zero; it is ignored (one group)."""
    facts = mamba_model("nemotron_h", {"ssm.conv_kernel": -4}, [
        ("ssm_conv1d.weight", (4, 96)), ("ssm_out.weight", (64, 64)), ("ssm_norm.weight", (64, 0))])
    assert facts.recurrent_blocks == {0: (3 * 96, 16 * 64)}
    assert any("taken from the ssm tensor shapes" in w for w in facts.warnings)


@pytest.mark.parametrize("ssm, reason", [
    ([("ssm_conv1d.weight", (4,)), ("ssm_out.weight", (64, 64))], "ssm_conv1d/ssm_out"),
    ([("ssm_conv1d.weight", (4, 64)), ("ssm_out.weight", (64, 64))], "state size"),
])
def test_recurrent_shapes_that_give_no_state(ssm, reason):
    with pytest.raises(mfacts.MemoryModelError, match=reason):
        mamba_model("nemotron_h", {"ssm.conv_kernel": -4}, ssm)


def test_implausible_block_count_is_refused():
    tensors = [f32("token_embd.weight", 64, 32), f32("blk.1000000.attn_q.weight", 64, 64)]
    layout = classify_model("x", {}, tensors)
    with pytest.raises(mfacts.MemoryModelError) as error:
        mfacts.model_facts({"x.embedding_length": 64}, tensors, layout)
    assert str(error.value) == ("1000001 blocks is implausible (llama.cpp loads at most %d): check x.block_count and "
                                "the blk.N tensor names" % LLAMA_MAX_LAYERS)
