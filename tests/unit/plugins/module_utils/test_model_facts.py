"""The facts of a model (``_model_facts``): widths, heads and caches per block, sliding-window layouts, recurrent
state widths, FFN and expert shapes, the fallbacks to tensor shapes (with a warning) and metadata that is negative,
zero or shaped wrong (a clear error or a fallback, never a traceback). Figures from llama.cpp's hyperparameter
loaders (cited beside each case) and the GGUF metadata of Nemotron-3-Nano-30B-A3B.
"""
from __future__ import annotations

from collections import namedtuple

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _common as common
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _model_facts as mfacts
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import LLAMA_MAX_LAYERS
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._tensor_classes import classify_model
from tests.helpers.memory_models import (
    NANO_ATTENTION, NANO_MAMBA, T, decoder_header, f32, facts_of, kv_mib, nano_facts,
    qkv_model, recurrent_model, transformer)

EMBD = [f32("token_embd.weight", 64, 32)]
SSM = {"x.embedding_length": 64, "x.ssm.conv_kernel": -4}  # a negative conv_kernel is none: ssm.* is missing
NO_SSM_TENSORS = ("the recurrent blocks lack x.ssm.conv_kernel/inner_size/state_size and the ssm_conv1d/ssm_out "
                  "tensors to read them from")
NO_KV_WIDTH = ("block 0 is an attention block but neither the metadata (%s.attention.head_count_kv, key_length, "
               "value_length) nor attn_k/attn_v tensors give its KV width")


@pytest.mark.parametrize("md, tensors, message", [
    ({"x.embedding_length": 64}, EMBD + [f32("blk.1000000.attn_q.weight", 64, 64)],
     "1000001 blocks is implausible (llama.cpp loads at most %d): check x.block_count and the blk.N tensor names"
     % LLAMA_MAX_LAYERS),
    ({}, [f32("blk.0.attn_q.weight", 64, 64)],
     "x.embedding_length is missing and there is no token_embd/output tensor to read it from"),
    ({"x.embedding_length": 64}, [f32("token_embd.weight", 64)],  # the width, but no vocabulary
     "the vocabulary size is unknown: no tokenizer.ggml.tokens, no x.vocab_size and no token_embd/output tensor"),
    # no head count, and attn_k/attn_v of one dimension: no shape to read a width from
    ({"x.embedding_length": 64}, EMBD + [f32("blk.0.attn_q.weight", 64, 64), f32("blk.0.attn_k.weight", 64),
                                         f32("blk.0.attn_v.weight", 64)], NO_KV_WIDTH % "x"),
    # the KV head count, but no query head count (whose share of the width it is) and no attn_k/attn_v
    ({"x.embedding_length": 64, "x.attention.head_count_kv": 2}, EMBD + [f32("blk.0.attn_qkv.weight", 64, 128)],
     NO_KV_WIDTH % "x"),
    (SSM, EMBD + [f32("blk.0.ssm_conv1d.weight", 4), f32("blk.0.ssm_out.weight", 64, 64)], NO_SSM_TENSORS),
    (SSM, EMBD + [f32("blk.0.ssm_out.weight", 64, 64)], NO_SSM_TENSORS),
    (SSM, EMBD + [f32("blk.0.ssm_conv1d.weight", 4, 64), f32("blk.0.ssm_out.weight", 64, 64)],  # no room for a state
     "the recurrent blocks lack x.ssm.* metadata and the ssm tensor shapes do not give a state size (conv channels "
     "64, inner size 64)"),
])
def test_facts_the_metadata_and_the_shapes_cannot_give_are_refused(md, tensors, message):
    with pytest.raises(mfacts.MemoryModelError) as info:
        mfacts.model_facts(md, tensors, classify_model("x", md, tensors))
    assert str(info.value) == message


def test_model_facts_keep_the_layout_the_path_the_warnings_and_count_the_vocabulary_tokens():
    """The vocabulary is the tokenizer's token list (llama.cpp's n_vocab = its length), before ``vocab_size`` and
    the embedding's shape; the tensor classes and the layout's and reader's warnings are kept; the path is "" when
    none is given."""
    md, tensors = decoder_header("llama", 2, 64, 4, 2, 16)
    tensors.append(f32("blk.7.attn_q.weight", 64, 64))  # a block past block_count: the layout warns
    md["tokenizer.ggml.tokens"] = ["t%d" % i for i in range(77)]
    layout = classify_model("llama", md, tensors)
    assert layout.warnings
    found = mfacts.model_facts(md, tensors, layout, warnings=["from the reader"])
    assert found.n_vocab == 77 and found.path == ""
    assert found.tensor_class == layout.tensor_class and found.tensor_class["blk.0.attn_q.weight"] == "attention"
    assert found.warnings[0] == "from the reader" and all(w in found.warnings for w in layout.warnings)
    md.pop("tokenizer.ggml.tokens")
    assert mfacts.model_facts(dict(md, **{"llama.vocab_size": 300}), tensors, layout).n_vocab == 300


def test_shared_experts_with_a_gate_are_gated_per_block_and_attention_without_q_counts_the_heads():
    """Qwen2-MoE's shared expert (llama.cpp: ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp of {n_embd, n_ff_shexp})
    is gated; Nemotron-H's (up and down only) is not. A block without ``attn_q`` (fused ``attn_qkv``) has a Q of
    n_head x key_length."""
    md, tensors = decoder_header("qwen2moe", 2, 64, 4, 2, 16, experts=4, n_ff=32)
    tensors = [t for t in tensors if ".attn_q." not in t.name] + [f32("blk.1.ffn_gate_shexp.weight", 64, 96)]
    for b in range(2):
        tensors += [f32("blk.%d.attn_qkv.weight" % b, 64, 128), f32("blk.%d.ffn_up_shexp.weight" % b, 64, 96),
                    f32("blk.%d.ffn_down_shexp.weight" % b, 96, 64)]
    found = facts_of(md, tensors)
    assert found.shexp == {0: 96, 1: 96} and found.shexp_gated == frozenset({1})
    assert found.q_width == {0: 64, 1: 64}


def test_the_facts_mark_the_routed_experts_their_gate_the_used_ones_and_the_selection_bias():
    """Each tensor's facts say whether it is a routed expert (the layout's list); the experts used per token and
    a selection bias (blk.N.exp_probs_b.bias, llama.cpp's exp_probs_b) come with them. llama.cpp's build_moe_ffn
    multiplies a gate (ffn_gate_exps, or the gate half of ffn_gate_up_exps) with up when the model has one
    (Qwen3-MoE, gpt-oss); Nemotron-H's experts have up and down only (relu squared)."""
    for gate in ("ffn_gate_exps", "ffn_gate_up_exps"):
        md, tensors = decoder_header("qwen3moe", 1, 64, 4, 2, 16, experts=4, n_ff=32)
        if gate == "ffn_gate_up_exps":
            tensors = [t for t in tensors if "ffn_up_exps" not in t.name]
        tensors.append(f32("blk.0.%s.weight" % gate, 64, 32, 4))
        assert facts_of(md, tensors).experts_gated is True
    nano = nano_facts()  # built in the test, not at import, so that mutants of model_facts reach it
    assert nano.experts_gated is False
    assert nano.expert_used_count == 6 and nano.expert_probs_bias is False
    experts = set(t.name for t in nano.tensors if t.expert)
    assert experts == set(n for names in nano.expert_tensors_by_block.values() for n in names)
    assert len(experts) == 2 * 23 and all(".ffn_up_exps." in n or ".ffn_down_exps." in n for n in experts)
    md, tensors = decoder_header("deepseek2", 1, 64, 4, 2, 16, experts=4, n_ff=32)
    biased = facts_of(md, tensors + [f32("blk.0.exp_probs_b.bias", 4)])
    assert biased.expert_probs_bias is True and biased.expert_used_count == 2


LENGTHS = {"llama.attention.key_length": 16, "llama.attention.value_length": 16}


@pytest.mark.parametrize("md, model, kv_heads, width, q_width, warnings", [
    # hparams.n_head_kv_arr = hparams.n_head_arr before the optional head_count_kv is read; with key and value
    # lengths the metadata is complete, so attn_k/attn_v's shapes are not needed
    (LENGTHS, dict(attn_k=64), 4, 64, 64, []),
    # without key_length n_embd_head_k is n_embd / n_head in integers: 100 / 8 = 12 per head (a fused attn_qkv)
    ({"llama.attention.head_count_kv": 2}, dict(heads=8, attn=("attn_qkv", 148), n_embd=100), 2, 24, 96, []),
    # attn_q's shape gives the Q projection: 96 wide, not 4 heads x 16
    (dict(LENGTHS, **{"llama.attention.head_count_kv": 2}), dict(attn=("attn_q", 96)), 2, 32, 96, []),
    # without attn_q and key_length the head size is the K width per KV head, in integers (30 / 4 = 7)
    ({"llama.attention.head_count_kv": 4}, dict(attn=("attn_qkv", 128), attn_k=30), 4, 30, 28,
     ["KV widths of blocks 0 taken from the attn_k/attn_v tensor shapes (metadata incomplete)"]),
    # one query head and no attn_q: a Q of one head, n_embd wide
    ({"llama.attention.head_count_kv": 1}, dict(heads=1, attn=("attn_qkv", 192)), 1, 64, 64, []),
])
def test_the_kv_heads_and_widths_and_the_q_width_of_an_attention_block(md, model, kv_heads, width, q_width, warnings):
    found = qkv_model(md, **model)
    assert (found.kv_heads, found.kv_blocks, found.q_width) == ({0: kv_heads}, {0: (width, width)}, {0: q_width})
    assert found.warnings == warnings


def test_tensors_without_a_type_and_a_model_without_an_architecture_name():
    """``model_facts`` takes any objects with a name, a shape and a size (``type_id`` is optional), and a model
    whose header names no architecture keeps an empty name."""
    Bare = namedtuple("Bare", "name shape nbytes")
    tensors = [Bare("token_embd.weight", (64, 512), 4 * 64 * 512), Bare("blk.0.ffn_up.weight", (64, 128), 4 * 64 * 128)]
    found = mfacts.model_facts({}, tensors, classify_model("", {}, tensors))
    assert found.architecture == ""
    assert [(t.name, t.type_id, t.shape) for t in found.tensors] == [
        ("token_embd.weight", None, (64, 512)), ("blk.0.ffn_up.weight", None, (64, 128))]


def test_an_up_projection_twice_as_wide_as_down_s_input_holds_the_gate_too():
    """Phi-3 (llama.cpp src/llama-model.cpp, LLM_ARCH_PHI3): ``ffn_up`` of {n_embd, 2 * n_ff} and no ``ffn_gate``,
    the gate and up halves split in the graph; ``ffn_down`` of {n_ff, n_embd}. Up as wide as down's input is a
    plain up projection; up and gate tensors make a gated FFN."""
    def ffn(up, gate=False):
        md, tensors = decoder_header("phi3", 2, 64, 4, 2, 16, n_ff=128, gate=gate)  # ffn_down {128, 64}
        found = facts_of(md, [f32(t.name, 64, up) if ".ffn_up." in t.name else t for t in tensors])
        return found.ffn, found.ffn_fused, found.ffn_gated

    assert ffn(256) == ({0: 256, 1: 256}, frozenset({0, 1}), frozenset())
    assert ffn(128) == ({0: 128, 1: 128}, frozenset(), frozenset())
    assert ffn(256, gate=True) == ({0: 256, 1: 256}, frozenset(), frozenset({0, 1}))


@pytest.mark.parametrize("period, blocks, dense_first, sliding", [
    # il % 4 < 3: the last block of every period keeps a full cache; il % 1 < 0 never holds: no block slides;
    # period 0: every block slides
    (4, 8, False, {0, 1, 2, 4, 5, 6}), (6, 12, False, {0, 1, 2, 3, 4, 6, 7, 8, 9, 10}), (2, 5, False, {0, 2, 4}),
    (1, 3, False, set()), (0, 3, False, {0, 1, 2}), (4, 0, False, set()),
    # il % 4 != 0: the first block of every period keeps a full cache
    (4, 8, True, {1, 2, 3, 5, 6, 7}), (2, 5, True, {1, 3}), (1, 3, True, set()), (0, 3, True, {0, 1, 2})])
def test_swa_pattern_is_llama_cpp_set_swa_pattern(period, blocks, dense_first, sliding):
    """src/llama-hparams.cpp llama_hparams::set_swa_pattern(n_pattern, dense_first): is_swa = n_pattern == 0 ||
    il % n_pattern < n_pattern - 1, or il % n_pattern != 0 with dense_first; dense_first is off unless asked for."""
    assert mfacts.swa_pattern(period, blocks, dense_first=dense_first) == frozenset(sliding)
    if not dense_first:
        assert mfacts.swa_pattern(period, blocks) == frozenset(sliding)


@pytest.mark.parametrize("arch, blocks, meta, expected", [
    ("gemma3", 12, {"attention__sliding_window": 512},
     ("standard", 512, {0, 1, 2, 3, 4, 6, 7, 8, 9, 10}, "set_swa_pattern(6) of gemma3")),
    ("smallthinker", 8, {"attention__sliding_window": 1024},  # window key > 0 switches on a fixed 4096
     ("standard", 4096, {1, 2, 3, 5, 6, 7}, "set_swa_pattern(4, dense_first) of smallthinker")),
    ("llama4", 8, {"attention__sliding_window": 1024},  # chunks of 8192 whatever the key says
     ("chunked", 8192, {0, 1, 2, 4, 5, 6}, "set_swa_pattern(4) of llama4")),
    ("llama4", 8, {"attention__sliding_window_pattern": 2},
     ("chunked", 8192, {0, 2, 4, 6}, "set_swa_pattern(2) from llama4.attention.sliding_window_pattern of llama4")),
    ("gemma2", 4, {}, ("standard", 4096, {0, 2}, "set_swa_pattern(2) of gemma2")),  # n_swa 4096 without the key
    ("gemma2", 4, {"attention__sliding_window": 1024}, ("standard", 1024, {0, 2}, "set_swa_pattern(2) of gemma2")),
    ("cohere2", 8, {"attention__sliding_window": 4096},
     ("standard", 4096, {0, 1, 2, 4, 5, 6}, "set_swa_pattern(4) of cohere2")),
    ("olmo2", 8, {"attention__sliding_window": 4096},
     ("standard", 4096, {0, 1, 2, 4, 5, 6}, "set_swa_pattern(4) of olmo2")),
    ("exaone4", 64, {}, ("standard", 4096, set(range(64)) - set(range(3, 64, 4)), "set_swa_pattern(4) of exaone4")),
    ("gemma3n", 10, {"attention__sliding_window": 512},
     ("standard", 512, {0, 1, 2, 3, 5, 6, 7, 8}, "set_swa_pattern(5) of gemma3n")),
    ("cohere2", 6, {"attention__sliding_window": 2048, "attention__sliding_window_pattern": 3},
     ("standard", 2048, {0, 1, 3, 4}, "set_swa_pattern(3) from cohere2.attention.sliding_window_pattern of cohere2")),
    ("cohere2", 4, {"attention__sliding_window": 2048, "attention__sliding_window_pattern": 0},
     ("standard", 2048, {0, 1, 2, 3}, "set_swa_pattern(0) from cohere2.attention.sliding_window_pattern of cohere2")),
    ("cohere2", 4, {"attention__sliding_window": 2048, "attention__sliding_window_pattern": -1},
     ("standard", 2048, {0, 1, 2}, "set_swa_pattern(4) of cohere2")),  # a negative period is ignored
    ("gemma4", 3, {"attention__sliding_window": 128, "attention__sliding_window_pattern": [True, False, True]},
     ("standard", 128, {0, 2}, "gemma4.attention.sliding_window_pattern of gemma4")),
    ("mymodel", 3, {"attention__sliding_window": 64, "attention__sliding_window_pattern": [0, 1, 1]},
     ("standard", 64, {1, 2}, "mymodel.attention.sliding_window_pattern of mymodel")),
])
def test_sliding_window_layout_of_each_rule(arch, blocks, meta, expected):
    """src/models/<arch>.cpp: the window (n_swa) and load_swa_pattern(ml, period, dense_first) of each architecture;
    a per-layer pattern key gives the sliding layers, an integer key the period."""
    got = transformer(arch, blocks, **meta).sliding_window
    assert got == mfacts.SlidingWindow(expected[0], expected[1], frozenset(expected[2]), expected[3])


@pytest.mark.parametrize("arch, blocks, meta, warnings", [
    # no window key: llama.cpp keeps every layer full; it slides on found_swa && n_swa > 0 only
    ("gemma3", 6, {}, []), ("gemma3", 6, {"attention__sliding_window": 0}, []), ("olmo2", 8, {}, []),
    ("qwen3moe", 4, {}, []), ("gemma3", 6, {"attention__sliding_window": -512}, []),
    # found_swa && n_swa == 0: no chunking; exaone4 slides only with 64 blocks
    ("llama4", 8, {"attention__sliding_window": 0}, []), ("exaone4", 8, {}, []),
    ("exaone4", 30, {"attention__sliding_window": 4096}, []), ("phi3", 4, {"attention__sliding_window": 2047}, []),
    ("cohere2", 4, {"attention__sliding_window": 2048, "attention__sliding_window_pattern": [0, 0, 0, 0]}, []),
    ("mymodel", 4, {"attention__sliding_window": -64, "attention__sliding_window_pattern": [1, 1, 1, 0]}, []),
    ("mymodel", 4, {"attention__sliding_window": 0}, []),  # an unknown architecture: no window, nothing to warn of
    ("mymodel", 4, {"attention__sliding_window": 256},
     ["mymodel.attention.sliding_window is 256 but llama.cpp's layer pattern for mymodel is not known here: every "
      "attention block is sized for the full context (an over-estimate)"]),
    ("gemma4", 4, {"attention__sliding_window": 1024},
     ["gemma4 uses a sliding window of 1024 but its sliding_window_pattern is missing: every attention block is "
      "sized for the full context (an over-estimate)"]),
])
def test_no_sliding_window_sizes_every_block_for_the_full_context(arch, blocks, meta, warnings):
    facts_ = transformer(arch, blocks, **meta)
    assert facts_.sliding_window is None and facts_.memory == "kv" and facts_.warnings == warnings
    assert kv_mib(facts_, 4096) == common.mib(blocks * 4096 * 2 * 32 * 2)


@pytest.mark.parametrize("pattern", [[1, 0, "x", 1], [1, 0, 1, 1, 0], [1, 0, 1]])
def test_a_pattern_that_is_not_one_flag_per_block_is_refused(pattern):
    with pytest.raises(mfacts.MemoryModelError) as info:
        transformer("gemma4", 4, attention__sliding_window=64, attention__sliding_window_pattern=pattern)
    assert str(info.value) == ("gemma4.attention.sliding_window_pattern has %d entries, not one flag for each of the 4 "
                               "blocks" % len(pattern))


SSM_WARNING = ("nemotron_h_moe.ssm.* metadata missing: d_conv=4 d_inner=4096 d_state=128 n_group=8 taken from the ssm "
               "tensor shapes")


@pytest.mark.parametrize("drop, warnings", [
    ((), []),
    (("ssm.conv_kernel", "ssm.inner_size", "ssm.state_size", "ssm.group_count"), [SSM_WARNING]),
    (("expert_feed_forward_length",), []),
    (("attention.key_length", "attention.value_length", "ssm.conv_kernel", "ssm.inner_size", "ssm.state_size",
      "ssm.group_count", "embedding_length", "vocab_size", "expert_feed_forward_length"),
     ["nemotron_h_moe.embedding_length missing: 2688 taken from the embedding tensor",
      "vocabulary size missing: 131072 taken from the embedding tensor",
      "KV widths of blocks 5, 12, 19, 26, 33, 42 taken from the attn_k/attn_v tensor shapes (metadata incomplete)",
      SSM_WARNING]),
])
def test_nano_facts_from_the_metadata_or_the_tensor_shapes(drop, warnings):
    """Nano's GGUF metadata: 2 KV heads of 128 (n_embd_k_gqa = n_embd_v_gqa = 256) in 6 attention blocks;
    llama_hparams::n_embd_r() = (d_conv - 1) * (d_inner + 2 * n_group * d_state) = 3 * (4096 + 2048) = 18432 and
    n_embd_s() = d_state * d_inner = 524288 F32 elements per Mamba block; without the ssm.* metadata from
    ssm_conv1d {d_conv, d_inner + 2 * n_group * d_state}, ssm_out {d_inner, n_embd}, ssm_norm {., n_group}; without
    expert_feed_forward_length n_ff_exp is ne[0] of ffn_down_exps {n_ff_exp, n_embd, n_expert}."""
    got = nano_facts(drop=drop)
    assert got.kv_blocks == dict((b, (256, 256)) for b in NANO_ATTENTION)
    assert got.kv_heads == dict((b, 2) for b in NANO_ATTENTION) and got.n_head == dict((b, 32) for b in NANO_ATTENTION)
    assert got.memory == "hybrid" and got.sliding_window is None and got.kv_reused == ()
    assert got.recurrent_blocks == dict((b, (18432, 524288)) for b in NANO_MAMBA)
    assert got.ssm == {"d_conv": 4, "d_inner": 4096, "d_state": 128, "n_group": 8, "n_head": 64}
    assert (got.n_embd, got.n_vocab, got.context_length, got.n_ff_exp) == (2688, 131072, 1048576, 1856)
    assert got.warnings == warnings


@pytest.mark.parametrize("group_count, r", [
    (None, 3 * 4096), (-1, 3 * 4096), (0, 3 * 4096), (1, 3 * (4096 + 256)), (2, 3 * (4096 + 2 * 2 * 128))])
def test_the_conv_state_counts_the_groups_given(group_count, r):
    """Mamba-1 (jamba, mamba) writes no ssm.group_count: llama.cpp's n_group is 0 (conv channels = d_inner), and
    never negative."""
    got = nano_facts(drop=("ssm.group_count",), **({} if group_count is None else {"ssm.group_count": group_count}))
    assert got.recurrent_blocks[0] == (r, 524288)


@pytest.mark.parametrize("meta, widths", [
    ({}, (2 * 64, 64 * 16)), ({"token_shift_count": -1}, (2 * 64, 64 * 16)),  # token_shift_count defaults to 2
    ({"token_shift_count": 1}, (64, 64 * 16)), ({"token_shift_count": 0}, (0, 64 * 16))])
def test_rwkv_state_is_token_shift_count_times_n_embd_and_n_embd_times_head_size(meta, widths):
    """llama_hparams::n_embd_r() = token_shift_count * n_embd, n_embd_s() = n_embd * wkv_head_size."""
    rwkv = recurrent_model("rwkv7", dict(meta, **{"wkv.head_size": 16}), [("time_mix_key.weight", (64, 64))])
    assert rwkv.recurrent_blocks == {0: widths}


def test_the_memory_kind_follows_the_blocks():
    """llama-model.cpp create_memory: a KV cache, an iSWA pair, a hybrid, or none for embedding models."""
    assert transformer("qwen3", 2).memory == "kv"
    assert transformer("gemma3", 6, attention__sliding_window=512).memory == "iswa"
    assert transformer("bert", 2).memory == "none" and transformer("bert", 2).kv_blocks == {}
    only = recurrent_model("mamba", {"ssm.conv_kernel": 4, "ssm.inner_size": 128, "ssm.state_size": 16},
                           [("ssm_in.weight", (64, 256))])
    assert only.memory == "recurrent" and only.recurrent_blocks == {0: (3 * 128, 16 * 128)}


@pytest.mark.parametrize("arch, blocks, meta, owners", [
    ("qwen3", 4, {"attention__shared_kv_layers": 1}, 3), ("qwen3", 4, {"attention__shared_kv_layers": 0}, 4),
    ("qwen3", 4, {"attention__shared_kv_layers": 4}, 4), ("qwen3", 4, {"attention__shared_kv_layers": -1}, 4),
    ("gemma3n", 30, {"attention__sliding_window": 512}, 20),  # gemma3n: blocks from 20 on own no cache
    ("gemma4", 6, {"attention__sliding_window": 64, "attention__shared_kv_layers": 2,
                   "attention__sliding_window_pattern": [True] * 5 + [False]}, 4),
])
def test_shared_kv_layers_own_no_cache(arch, blocks, meta, owners):
    """llama_hparams::has_kv: blocks from n_layer - shared_kv_layers on read an earlier block's cache."""
    got = transformer(arch, blocks, **meta)
    assert sorted(got.kv_blocks) == list(range(owners)) and got.kv_reused == tuple(range(owners, blocks))


@pytest.mark.parametrize("embedding, md, vocab_warnings", [
    (f32("token_embd.weight", 64, 500), {}, ["vocabulary size missing: 500 taken from the embedding tensor"]),
    (f32("output.weight", 64, 500), {}, ["vocabulary size missing: 500 taken from the embedding tensor"]),
    (f32("token_embd.weight", 64), {"x.vocab_size": 500}, []),  # one dimension: the width but no vocabulary
])
def test_missing_embedding_and_vocabulary_are_read_from_token_embd_else_output(embedding, md, vocab_warnings):
    tensors = [embedding, f32("blk.0.attn_k.weight", 64, 32), f32("blk.0.attn_v.weight", 64, 32),
               f32("blk.0.attn_q.weight", 64, 64)]
    got = mfacts.model_facts(md, tensors, classify_model("x", md, tensors))
    assert (got.n_embd, got.n_vocab, got.kv_blocks) == (64, 500, {0: (32, 32)})
    assert got.warnings == ["x.embedding_length missing: 64 taken from the embedding tensor"] + vocab_warnings + [
        "KV widths of blocks 0 taken from the attn_k/attn_v tensor shapes (metadata incomplete)"]


def test_unknown_tensor_sizes_are_counted_as_zero_with_a_warning():
    tensors = [f32("token_embd.weight", 64, 500)] + [T("blk.0.ffn_up.%d.weight" % e, (64, 8), None, 99)
                                                     for e in range(4)]
    md = {"x.embedding_length": 64, "x.vocab_size": 500}
    got = mfacts.model_facts(md, tensors, classify_model("x", md, tensors))
    assert [t.nbytes for t in got.tensors] == [64 * 500 * 4, 0, 0, 0, 0]
    assert ("4 tensor(s) of unknown type counted as 0 bytes (blk.0.ffn_up.0.weight, blk.0.ffn_up.1.weight, "
            "blk.0.ffn_up.2.weight): the weights are underestimated") in got.warnings


@pytest.mark.parametrize("channels, norm, n_group, d_state", [
    (64 + 2 * 2, (32, 2), 2, 1),  # d_state 1 is the smallest state there is, not a missing one
    (64 + 2 * 2 * 16, (32, 2), 2, 16),
    (64 + 2 * 2 * 16 + 3, (32, 2), 2, 16),  # channels that do not divide: (channels - d_inner) // (2 * n_group)
    (64 + 2 * 16, (64, 0), 1, 16),  # an ssm_norm of {64, 0} gives no group count: one group, never divided by
])
def test_the_ssm_widths_from_the_shapes_are_whole_counts(channels, norm, n_group, d_state):
    """Without ssm.* metadata (a negative conv_kernel is none) the shapes of src/llama-model.cpp LLM_ARCH_MAMBA2
    give them: ssm_conv1d {d_conv, d_inner + 2 * n_group * d_state}, ssm_out {d_inner, n_embd}, ssm_norm
    {d_inner / n_group, n_group}."""
    facts = recurrent_model("mamba2", {"ssm.conv_kernel": -4}, [
        ("ssm_conv1d.weight", (4, channels)), ("ssm_out.weight", (64, 64)), ("ssm_norm.weight", norm)])
    assert facts.ssm["d_state"] == d_state and isinstance(facts.ssm["d_state"], int)
    assert facts.recurrent_blocks == {0: (3 * (64 + 2 * n_group * d_state), d_state * 64)}
    assert facts.warnings == ["vocabulary size missing: 32 taken from the embedding tensor",
                              "mamba2.ssm.* metadata missing: d_conv=4 d_inner=64 d_state=%d n_group=%d taken from "
                              "the ssm tensor shapes" % (d_state, n_group)]
