"""The facts of a model (``_model_facts``): widths, heads and caches per block, the sliding-window layout of each
architecture's rules, recurrent state widths (Mamba-1 and -2, LFM2 short convolutions, RWKV), FFN and expert shapes,
the fallbacks to tensor shapes (with a warning) and metadata that is negative, zero or shaped wrong (a clear error
or a fallback, never a traceback). Figures from llama.cpp's hyperparameter loaders (cited beside each case) and the
GGUF metadata of Nemotron-3-Nano-30B-A3B.
"""
from __future__ import annotations

from collections import namedtuple

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _common as common
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _model_facts as mfacts
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import LLAMA_MAX_LAYERS
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._tensor_classes import classify_model
from tests.helpers.memory_models import (
    NANO_ATTENTION, NANO_MAMBA, T, decoder, decoder_header, f32, facts_of, gemma3_270m, kv_mib, mamba2_from_shapes,
    nano_facts, qkv_model, recurrent_model, transformer)

NANO_FACTS = nano_facts()


def test_metadata_fallback_to_tensor_shapes_with_warnings():
    facts = nano_facts(drop=("attention.key_length", "attention.value_length", "ssm.conv_kernel", "ssm.inner_size",
                             "ssm.state_size", "ssm.group_count", "embedding_length", "vocab_size"))
    assert facts.kv_blocks == NANO_FACTS.kv_blocks
    assert facts.recurrent_blocks == NANO_FACTS.recurrent_blocks
    assert (facts.n_embd, facts.n_vocab) == (2688, 131072)
    text = " ".join(facts.warnings)
    assert "attn_k/attn_v" in text and "ssm" in text and "embedding_length" in text and "vocabulary" in text


def test_wrongly_shaped_tensors_give_a_clear_error():
    tensors = [f32("token_embd.weight", 64, 32), f32("blk.0.attn_q.weight", 64, 64), f32("blk.0.attn_k.weight", 64),
               f32("blk.0.attn_v.weight", 64)]
    metadata = {"x.embedding_length": 64}
    with pytest.raises(mfacts.MemoryModelError, match="KV width"):
        mfacts.model_facts(metadata, tensors, classify_model("x", metadata, tensors))


def test_mamba1_has_no_groups():
    """Mamba-1 (jamba, mamba) writes no ssm.group_count: llama.cpp's n_group is 0, conv channels = d_inner."""
    facts = recurrent_model("jamba", {"ssm.conv_kernel": 4, "ssm.inner_size": 128, "ssm.state_size": 16},
                            [("ssm_in.weight", (64, 256)), ("ssm_x.weight", (128, 36))])
    assert facts.recurrent_blocks == {0: (3 * 128, 16 * 128)}
    mamba2 = recurrent_model("granitehybrid", {"ssm.conv_kernel": 4, "ssm.inner_size": 128, "ssm.state_size": 16,
                                               "ssm.group_count": 2}, [("ssm_in.weight", (64, 256))])
    assert mamba2.recurrent_blocks == {0: (3 * (128 + 2 * 2 * 16), 16 * 128)}


def test_recurrent_shapes_with_a_zero_group_count():
    """An ssm_norm of {64, 0} gives no group count: it is ignored (one group), never divided by."""
    facts = recurrent_model("nemotron_h", {"ssm.conv_kernel": -4}, [
        ("ssm_conv1d.weight", (4, 96)), ("ssm_out.weight", (64, 64)), ("ssm_norm.weight", (64, 0))])
    assert facts.recurrent_blocks == {0: (3 * 96, 16 * 64)}
    assert any("taken from the ssm tensor shapes" in w for w in facts.warnings)


@pytest.mark.parametrize("ssm, reason", [
    ([("ssm_conv1d.weight", (4,)), ("ssm_out.weight", (64, 64))], "ssm_conv1d/ssm_out"),
    ([("ssm_out.weight", (64, 64))], "ssm_conv1d/ssm_out"),
    ([("ssm_conv1d.weight", (4, 64)), ("ssm_out.weight", (64, 64))], "state size"),
])
def test_recurrent_shapes_that_give_no_state(ssm, reason):
    with pytest.raises(mfacts.MemoryModelError, match=reason):
        recurrent_model("nemotron_h", {"ssm.conv_kernel": -4}, ssm)


def test_implausible_block_count_is_refused():
    tensors = [f32("token_embd.weight", 64, 32), f32("blk.1000000.attn_q.weight", 64, 64)]
    layout = classify_model("x", {}, tensors)
    with pytest.raises(mfacts.MemoryModelError) as error:
        mfacts.model_facts({"x.embedding_length": 64}, tensors, layout)
    assert str(error.value) == ("1000001 blocks is implausible (llama.cpp loads at most %d): check x.block_count and "
                                "the blk.N tensor names" % LLAMA_MAX_LAYERS)


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
    tensors = [f32("token_embd.weight", 64, 512), f32("output.weight", 64, 512)]
    for b in range(2):
        p = "blk.%d." % b
        tensors += [f32(p + "attn_qkv.weight", 64, 128), f32(p + "attn_output.weight", 64, 64),
                    f32(p + "ffn_gate_inp.weight", 64, 4), f32(p + "ffn_up_exps.weight", 64, 32, 4),
                    f32(p + "ffn_gate_exps.weight", 64, 32, 4), f32(p + "ffn_down_exps.weight", 32, 64, 4),
                    f32(p + "ffn_up_shexp.weight", 64, 96), f32(p + "ffn_down_shexp.weight", 96, 64)]
        if b == 1:
            tensors.append(f32(p + "ffn_gate_shexp.weight", 64, 96))
    a = "qwen2moe."
    md = {"general.architecture": "qwen2moe", a + "block_count": 2, a + "embedding_length": 64,
          a + "attention.head_count": 4, a + "attention.head_count_kv": 2, a + "attention.key_length": 16,
          a + "attention.value_length": 16, a + "expert_count": 4, a + "expert_used_count": 2, a + "vocab_size": 512}
    found = mfacts.model_facts(md, tensors, classify_model("qwen2moe", md, tensors))
    assert found.shexp == {0: 96, 1: 96} and found.shexp_gated == frozenset({1})
    assert found.q_width == {0: 64, 1: 64}


def test_routed_experts_with_a_gate_projection_are_gated():
    """llama.cpp's build_moe_ffn multiplies a gate (ffn_gate_exps, or the gate half of ffn_gate_up_exps) with up
    when the model has one (Qwen3-MoE, gpt-oss); Nemotron-H's experts have up and down only (relu squared)."""
    assert NANO_FACTS.experts_gated is False
    for gate in ("ffn_gate_exps", "ffn_gate_up_exps"):
        md, tensors = decoder_header("qwen3moe", 1, 64, 4, 2, 16, experts=4, n_ff=32)
        if gate == "ffn_gate_up_exps":
            tensors = [t for t in tensors if "ffn_up_exps" not in t.name]
        tensors.append(f32("blk.0.%s.weight" % gate, 64, 32, 4))
        assert facts_of(md, tensors).experts_gated is True


def test_the_facts_mark_the_routed_experts_and_count_the_used_ones_and_the_selection_bias():
    """Each tensor's facts say whether it is a routed expert (the layout's list); the experts used per token and
    a selection bias (blk.N.exp_probs_b.bias, llama.cpp's exp_probs_b) come with them."""
    assert NANO_FACTS.expert_used_count == 6 and NANO_FACTS.expert_probs_bias is False
    experts = set(t.name for t in NANO_FACTS.tensors if t.expert)
    assert experts == set(n for names in NANO_FACTS.expert_tensors_by_block.values() for n in names)
    assert len(experts) == 2 * 23 and all(".ffn_up_exps." in n or ".ffn_down_exps." in n for n in experts)
    md, tensors = decoder_header("deepseek2", 1, 64, 4, 2, 16, experts=4, n_ff=32)
    biased = facts_of(md, tensors + [f32("blk.0.exp_probs_b.bias", 4)])
    assert biased.expert_probs_bias is True and biased.expert_used_count == 2


def test_head_count_kv_defaults_to_head_count():
    """llama.cpp: ``hparams.n_head_kv_arr = hparams.n_head_arr`` before the optional head_count_kv is read; with
    key and value lengths the metadata is complete, so attn_k/attn_v's shapes are not needed."""
    found = qkv_model({"llama.attention.key_length": 16, "llama.attention.value_length": 16}, attn_k=64)
    assert found.kv_heads == {0: 4} and found.kv_blocks == {0: (64, 64)} and found.warnings == []


def test_the_head_size_is_n_embd_over_the_heads_rounded_down():
    """Without key_length llama.cpp's n_embd_head_k is n_embd / n_head in integers: 100 / 8 = 12 per head, 2 KV
    heads: 24 wide (a fused attn_qkv, so no attn_k shape to read)."""
    found = qkv_model({"llama.attention.head_count_kv": 2}, heads=8, attn=("attn_qkv", 148), n_embd=100)
    assert found.kv_blocks == {0: (24, 24)} and found.q_width == {0: 96}


def test_the_q_width_is_attn_q_s_shape_else_the_heads_times_the_k_head_size():
    """attn_q's shape gives the Q projection (96 wide here, not 4 heads x 16); without attn_q and key_length the
    head size is the K width per KV head, in integers (30 / 4 = 7)."""
    md = {"llama.attention.head_count_kv": 2, "llama.attention.key_length": 16, "llama.attention.value_length": 16}
    assert qkv_model(md, attn=("attn_q", 96)).q_width == {0: 96}
    fallback = qkv_model({"llama.attention.head_count_kv": 4}, attn=("attn_qkv", 128), attn_k=30)
    assert fallback.kv_blocks == {0: (30, 30)} and fallback.q_width == {0: 28}
    assert fallback.warnings == ["KV widths of blocks 0 taken from the attn_k/attn_v tensor shapes (metadata "
                                 "incomplete)"]


def test_an_attention_block_without_any_kv_width_is_refused():
    with pytest.raises(mfacts.MemoryModelError) as info:
        qkv_model({"llama.attention.head_count_kv": 2}, heads=None, attn=("attn_qkv", 128))
    assert str(info.value) == ("block 0 is an attention block but neither the metadata (llama.attention."
                               "head_count_kv, key_length, value_length) nor attn_k/attn_v tensors give its KV width")


def test_tensors_without_a_type_and_a_model_without_an_architecture_name():
    """``model_facts`` takes any objects with a name, a shape and a size (``type_id`` is optional), and a model
    whose header names no architecture keeps an empty name."""
    Bare = namedtuple("Bare", "name shape nbytes")
    tensors = [Bare("token_embd.weight", (64, 512), 4 * 64 * 512), Bare("blk.0.ffn_up.weight", (64, 128), 4 * 64 * 128)]
    found = mfacts.model_facts({}, tensors, classify_model("", {}, tensors))
    assert found.architecture == ""
    assert [(t.name, t.type_id, t.shape) for t in found.tensors] == [
        ("token_embd.weight", None, (64, 512)), ("blk.0.ffn_up.weight", None, (64, 128))]


def test_the_expert_width_comes_from_the_down_experts_when_the_metadata_lacks_it():
    """``expert_feed_forward_length`` (1856 in Nano), else ``ne[0]`` of ``ffn_down_exps`` ({n_ff_exp, n_embd,
    n_expert} in llama.cpp's nemotron_h_moe tensors)."""
    assert NANO_FACTS.n_ff_exp == 1856
    assert nano_facts(drop=("expert_feed_forward_length",)).n_ff_exp == 1856


def test_an_up_projection_twice_as_wide_as_down_s_input_holds_the_gate_too():
    """Phi-3 (llama.cpp src/llama-model.cpp, LLM_ARCH_PHI3): ``ffn_up`` of {n_embd, 2 * n_ff} and no ``ffn_gate``,
    the gate and up halves split in the graph; ``ffn_down`` of {n_ff, n_embd}. Up as wide as down's input is a
    plain up projection; up and gate tensors make a gated FFN."""
    def ffn(up, down, gate=None):
        tensors = [f32("token_embd.weight", 64, 512), f32("output.weight", 64, 512)]
        for b in range(2):
            p = "blk.%d." % b
            tensors += [f32(p + "attn_q.weight", 64, 64), f32(p + "attn_k.weight", 64, 32),
                        f32(p + "attn_v.weight", 64, 32), f32(p + "attn_output.weight", 64, 64),
                        f32(p + "ffn_up.weight", 64, up), f32(p + "ffn_down.weight", down, 64)]
            if gate:
                tensors.append(f32(p + "ffn_gate.weight", 64, gate))
        md = {"general.architecture": "phi3", "phi3.block_count": 2, "phi3.embedding_length": 64,
              "phi3.attention.head_count": 4, "phi3.attention.head_count_kv": 2, "phi3.vocab_size": 512}
        found = mfacts.model_facts(md, tensors, classify_model("phi3", md, tensors))
        return found.ffn, found.ffn_fused, found.ffn_gated

    assert ffn(256, 128) == ({0: 256, 1: 256}, frozenset({0, 1}), frozenset())
    assert ffn(128, 128) == ({0: 128, 1: 128}, frozenset(), frozenset())
    assert ffn(256, 128, gate=256) == ({0: 256, 1: 256}, frozenset(), frozenset({0, 1}))


@pytest.mark.parametrize("period, blocks, dense_first, sliding", [
    (4, 8, False, {0, 1, 2, 4, 5, 6}),  # il % 4 < 3: the last block of every period keeps a full cache
    (6, 12, False, {0, 1, 2, 3, 4, 6, 7, 8, 9, 10}),
    (2, 5, False, {0, 2, 4}),
    (1, 3, False, set()),  # il % 1 < 0 never holds: no block slides
    (0, 3, False, {0, 1, 2}),  # period 0: every block slides
    (4, 0, False, set()),
    (4, 8, True, {1, 2, 3, 5, 6, 7}),  # il % 4 != 0: the first block of every period keeps a full cache
    (2, 5, True, {1, 3}),
    (1, 3, True, set()),
    (0, 3, True, {0, 1, 2}),
])
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
    ("olmo2", 8, {"attention__sliding_window": 4096}, ("standard", 4096, {0, 1, 2, 4, 5, 6}, "set_swa_pattern(4) of olmo2")),
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


@pytest.mark.parametrize("arch, blocks, meta", [
    ("gemma3", 6, {}),  # no window key: llama.cpp keeps every layer full
    ("gemma3", 6, {"attention__sliding_window": 0}),  # found_swa && n_swa > 0 only
    ("olmo2", 8, {}),
    ("qwen3moe", 4, {}),
    ("gemma3", 6, {"attention__sliding_window": -512}),
    ("llama4", 8, {"attention__sliding_window": 0}),  # found_swa && n_swa == 0: no chunking
    ("exaone4", 8, {}),  # exaone4 slides only with 64 blocks
    ("exaone4", 30, {"attention__sliding_window": 4096}),
    ("phi3", 4, {"attention__sliding_window": 2047}),
    ("cohere2", 4, {"attention__sliding_window": 2048, "attention__sliding_window_pattern": [0, 0, 0, 0]}),
    ("mymodel", 4, {"attention__sliding_window": -64, "attention__sliding_window_pattern": [1, 1, 1, 0]}),
    ("mymodel", 4, {"attention__sliding_window": 0}),  # an unknown architecture: no window, nothing to warn of
])
def test_no_sliding_window(arch, blocks, meta):
    facts_ = transformer(arch, blocks, **meta)
    assert facts_.sliding_window is None and facts_.memory == "kv" and facts_.warnings == []


@pytest.mark.parametrize("arch, window, warning", [
    ("mymodel", 256, "mymodel.attention.sliding_window is 256 but llama.cpp's layer pattern for mymodel is not known "
                     "here: every attention block is sized for the full context (an over-estimate)"),
    ("gemma4", 1024, "gemma4 uses a sliding window of 1024 but its sliding_window_pattern is missing: every attention "
                     "block is sized for the full context (an over-estimate)"),
])
def test_a_window_without_a_known_layout_is_sized_full_with_a_warning(arch, window, warning):
    facts_ = transformer(arch, 4, attention__sliding_window=window)
    assert facts_.sliding_window is None and facts_.memory == "kv" and facts_.warnings == [warning]
    assert kv_mib(facts_, 4096) == common.mib(4 * 4096 * 2 * 32 * 2)


def test_a_pattern_that_is_not_one_flag_per_block_is_refused():
    with pytest.raises(mfacts.MemoryModelError) as info:
        transformer("gemma4", 4, attention__sliding_window=64, attention__sliding_window_pattern=[1, 0, "x", 1])
    assert str(info.value) == ("gemma4.attention.sliding_window_pattern has 4 entries, not one flag for each of the 4 "
                               "blocks")
    for pattern in ([1, 0, 1, 1, 0], [1, 0, 1]):
        with pytest.raises(mfacts.MemoryModelError, match="has %d entries, not one flag for each of the 4 blocks" % len(pattern)):
            transformer("gemma4", 4, attention__sliding_window=64, attention__sliding_window_pattern=pattern)


def test_nano_attention_blocks_cache_two_kv_heads_of_128():
    """Nano's GGUF metadata: 6 attention blocks, 2 KV heads, head dim 128: n_embd_k_gqa = n_embd_v_gqa = 256."""
    assert NANO_FACTS.kv_blocks == dict((b, (256, 256)) for b in NANO_ATTENTION)
    assert NANO_FACTS.kv_heads == dict((b, 2) for b in NANO_ATTENTION)
    assert NANO_FACTS.n_head == dict((b, 32) for b in NANO_ATTENTION)
    assert NANO_FACTS.memory == "hybrid" and NANO_FACTS.sliding_window is None and NANO_FACTS.kv_reused == ()
    assert (NANO_FACTS.n_embd, NANO_FACTS.n_vocab, NANO_FACTS.context_length) == (2688, 131072, 1048576)
    assert NANO_FACTS.warnings == []


@pytest.mark.parametrize("drop, warnings", [
    ((), []),
    (("ssm.conv_kernel", "ssm.inner_size", "ssm.state_size", "ssm.group_count"),
     ["nemotron_h_moe.ssm.* metadata missing: d_conv=4 d_inner=4096 d_state=128 n_group=8 taken from the ssm tensor "
      "shapes"]),
])
def test_nano_recurrent_state_widths_from_the_metadata_or_the_tensor_shapes(drop, warnings):
    """llama_hparams::n_embd_r() = (d_conv - 1) * (d_inner + 2 * n_group * d_state) = 3 * (4096 + 2048) = 18432 and
    n_embd_s() = d_state * d_inner = 524288 F32 elements per Mamba block; without the ssm.* metadata from
    ssm_conv1d {d_conv, d_inner + 2 * n_group * d_state}, ssm_out {d_inner, n_embd}, ssm_norm {., n_group}."""
    got = nano_facts(drop=drop)
    assert got.recurrent_blocks == dict((b, (18432, 524288)) for b in NANO_MAMBA)
    assert got.ssm == {"d_conv": 4, "d_inner": 4096, "d_state": 128, "n_group": 8, "n_head": 64}
    assert got.warnings == warnings


@pytest.mark.parametrize("group_count, r", [(None, 3 * 4096), (-1, 3 * 4096), (0, 3 * 4096), (1, 3 * (4096 + 256))])
def test_the_conv_state_counts_the_groups_given(group_count, r):
    """n_group is 0 without ssm.group_count (Mamba-1 has no groups) and never negative."""
    got = nano_facts(drop=("ssm.group_count",), **({} if group_count is None else {"ssm.group_count": group_count}))
    assert got.recurrent_blocks[0] == (r, 524288)


@pytest.mark.parametrize("meta, widths", [
    ({}, (2 * 64, 64 * 16)),  # token_shift_count defaults to 2
    ({"token_shift_count": -1}, (2 * 64, 64 * 16)),
    ({"token_shift_count": 1}, (64, 64 * 16)),
    ({"token_shift_count": 0}, (0, 64 * 16)),
])
def test_rwkv_state_is_token_shift_count_times_n_embd_and_n_embd_times_head_size(meta, widths):
    """llama_hparams::n_embd_r() = token_shift_count * n_embd, n_embd_s() = n_embd * wkv_head_size."""
    rwkv = recurrent_model("rwkv7", dict(meta, **{"wkv.head_size": 16}), [("time_mix_key.weight", (64, 64))])
    assert rwkv.recurrent_blocks == {0: widths}


def test_the_memory_kind_follows_the_blocks():
    """llama-model.cpp create_memory: a KV cache, an iSWA pair, a hybrid, or none for embedding models."""
    assert transformer("qwen3", 2).memory == "kv"
    assert transformer("gemma3", 6, attention__sliding_window=512).memory == "iswa"
    assert transformer("bert", 2).memory == "none" and transformer("bert", 2).kv_blocks == {}
    mamba = [f32("token_embd.weight", 64, 32), f32("blk.0.ssm_in.weight", 64, 256)]
    md = {"mamba.embedding_length": 64, "mamba.ssm.conv_kernel": 4, "mamba.ssm.inner_size": 128,
          "mamba.ssm.state_size": 16}
    only = mfacts.model_facts(md, mamba, classify_model("mamba", md, mamba))
    assert only.memory == "recurrent" and only.recurrent_blocks == {0: (3 * 128, 16 * 128)}


def test_shared_kv_layers_own_no_cache():
    """llama_hparams::has_kv: blocks from n_layer - shared_kv_layers on read an earlier block's cache."""
    got = transformer("qwen3", 4, attention__shared_kv_layers=1)
    assert sorted(got.kv_blocks) == [0, 1, 2] and got.kv_reused == (3,)
    for shared in (0, 4, -1):
        assert sorted(transformer("qwen3", 4, attention__shared_kv_layers=shared).kv_blocks) == [0, 1, 2, 3]


@pytest.mark.parametrize("embedding", ["token_embd.weight", "output.weight"])
def test_missing_embedding_and_vocabulary_are_read_from_token_embd_else_output(embedding):
    tensors = [f32(embedding, 64, 500), f32("blk.0.attn_k.weight", 64, 32),
               f32("blk.0.attn_v.weight", 64, 32), f32("blk.0.attn_q.weight", 64, 64)]
    got = mfacts.model_facts({}, tensors, classify_model("x", {}, tensors))
    assert (got.n_embd, got.n_vocab) == (64, 500)
    assert got.warnings[:2] == ["x.embedding_length missing: 64 taken from the embedding tensor",
                                "vocabulary size missing: 500 taken from the embedding tensor"]
    assert got.kv_blocks == {0: (32, 32)}


def test_a_one_dimensional_embedding_gives_the_width_but_no_vocabulary():
    one_dim = [f32("token_embd.weight", 64)]
    got = mfacts.model_facts({"x.vocab_size": 500}, one_dim, classify_model("x", {}, one_dim))
    assert (got.n_embd, got.n_vocab) == (64, 500)


def test_unknown_tensor_sizes_are_counted_as_zero_with_a_warning():
    tensors = [f32("token_embd.weight", 64, 500)] + [T("blk.0.ffn_up.%d.weight" % e, (64, 8), None, 99)
                                                     for e in range(4)]
    md = {"x.embedding_length": 64, "x.vocab_size": 500}
    got = mfacts.model_facts(md, tensors, classify_model("x", md, tensors))
    assert [t.nbytes for t in got.tensors] == [64 * 500 * 4, 0, 0, 0, 0]
    assert ("4 tensor(s) of unknown type counted as 0 bytes (blk.0.ffn_up.0.weight, blk.0.ffn_up.1.weight, "
            "blk.0.ffn_up.2.weight): the weights are underestimated") in got.warnings


def test_facts_without_embedding_width_or_vocabulary_are_refused():
    tensors = [f32("blk.0.attn_q.weight", 64, 64)]
    with pytest.raises(mfacts.MemoryModelError) as info:
        mfacts.model_facts({}, tensors, classify_model("x", {}, tensors))
    assert str(info.value) == "x.embedding_length is missing and there is no token_embd/output tensor to read it from"
    one_dim = [f32("token_embd.weight", 64)]
    with pytest.raises(mfacts.MemoryModelError) as info:
        mfacts.model_facts({"x.embedding_length": 64}, one_dim, classify_model("x", {}, one_dim))
    assert str(info.value) == ("the vocabulary size is unknown: no tokenizer.ggml.tokens, no x.vocab_size and no "
                               "token_embd/output tensor")


@pytest.mark.parametrize("channels, d_state", [(64 + 2 * 2, 1), (64 + 2 * 2 * 16, 16), (64 + 2 * 2 * 16 + 3, 16)])
def test_the_state_size_from_the_shapes_is_a_whole_count_from_1(channels, d_state):
    """conv channels = d_inner + 2 * n_group * d_state (llama-model.cpp: ssm_conv1d {d_conv, d_inner + 2*ng*d_state}):
    d_state 1 is the smallest state there is, not a missing one, and channels that do not divide give
    (channels - d_inner) // (2 * n_group), never a fraction."""
    facts = mamba2_from_shapes(channels)
    assert facts.ssm["d_state"] == d_state and isinstance(facts.ssm["d_state"], int)
    assert facts.recurrent_blocks == {0: (3 * (64 + 4 * d_state), d_state * 64)}


def test_shapes_that_leave_no_room_for_a_state_are_refused_with_the_shapes():
    with pytest.raises(mfacts.MemoryModelError) as raised:
        mamba2_from_shapes(64)
    assert str(raised.value) == ("the recurrent blocks lack mamba2.ssm.* metadata and the ssm tensor shapes do not "
                                 "give a state size (conv channels 64, inner size 64)")


@pytest.mark.parametrize("ctx, parallel, measured", [(4096, 1, 27.0), (4096, 4, 72.0), (32768, 1, 111.0),
                                                     (32768, 4, 156.0)])
def test_gemma3_270m_kv_as_llama_server_allocates_it(ctx, parallel, measured):
    facts = gemma3_270m()
    assert facts.memory == "iswa"
    assert sorted(set(range(18)) - facts.swa_blocks) == [5, 11, 17]  # set_swa_pattern(6)
    assert facts.sliding_window.window == 512
    assert kv_mib(facts, ctx, parallel) == measured


def test_gemma3n_late_blocks_reuse_earlier_caches():
    """llama_hparams::has_kv: gemma3n's blocks from 20 on own no cache."""
    facts = decoder("gemma3n", 30, 64, 4, 2, 16, attention__sliding_window=512)
    assert sorted(facts.kv_blocks) == list(range(20)) and facts.kv_reused == tuple(range(20, 30))
    shared = decoder("gemma4", 6, 64, 4, 2, 16, attention__sliding_window=64, attention__shared_kv_layers=2,
                     attention__sliding_window_pattern=[True] * 5 + [False])
    assert sorted(shared.kv_blocks) == [0, 1, 2, 3]
