"""The rules of the memory model whose mistakes run a user's GPU out of memory: the bytes of a KV cell per cache type,
the padding of every slot's context, the recurrent state, the sliding-window layouts and the cells of their caches,
where the layers go, the limits on the input; each figure comes from llama.cpp's source (cited beside it) or from
the GGUF metadata of Nemotron-3-Nano-30B-A3B (as tools/gguf_models.py write_nemotron_nano_30b writes it)."""
from __future__ import annotations

from collections import namedtuple

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _common as common
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _compute_buffers as cbuf
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _kv_cache as kvc
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _memory_estimate as mest
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _model_facts as mfacts
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import Options
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._tensor_classes import classify_model

T = namedtuple("T", "name shape nbytes type_id")
MIB = 1 << 20
NANO = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"  # Nano's block kinds: M Mamba-2, E MoE, * attention
NANO_ATTENTION = [5, 12, 19, 26, 33, 42]
NANO_MAMBA = [b for b, c in enumerate(NANO) if c == "M"]


def f32(name, *shape):
    n = 1
    for d in shape:
        n *= d
    return T(name, tuple(shape), 4 * n, 0)


def nano_facts(drop=(), **extra):
    """Metadata and tensor shapes of Nemotron-3-Nano-30B-A3B (its GGUF metadata): hidden 2688, vocab 131072,
    32 heads, 2 KV heads of 128, 128 experts (6 used) of 1856, Mamba inner 4096, state 128, 8 groups, conv 4."""
    a = "nemotron_h_moe."
    md = {"general.architecture": "nemotron_h_moe", a + "block_count": 52, a + "embedding_length": 2688,
          a + "context_length": 1048576, a + "attention.head_count": 32,
          a + "attention.head_count_kv": [2 if c == "*" else 0 for c in NANO],
          a + "feed_forward_length": [1856 if c == "E" else 0 for c in NANO], a + "attention.key_length": 128,
          a + "attention.value_length": 128, a + "ssm.conv_kernel": 4, a + "ssm.inner_size": 4096,
          a + "ssm.state_size": 128, a + "ssm.group_count": 8, a + "ssm.time_step_rank": 64,
          a + "expert_count": 128, a + "expert_used_count": 6, a + "expert_feed_forward_length": 1856,
          a + "vocab_size": 131072}
    for key in drop:
        md.pop(a + key)
    md.update(dict((a + k, v) for k, v in extra.items()))
    ts = [f32("token_embd.weight", 2688, 131072)]
    for i, c in enumerate(NANO):
        p = "blk.%d." % i
        ts.append(f32(p + "attn_norm.weight", 2688))
        if c == "M":
            ts += [f32(p + "ssm_in.weight", 2688, 2 * 4096 + 2 * 8 * 128 + 64), f32(p + "ssm_conv1d.weight", 4, 6144),
                   f32(p + "ssm_norm.weight", 512, 8), f32(p + "ssm_out.weight", 4096, 2688)]
        elif c == "*":
            ts += [f32(p + "attn_q.weight", 2688, 4096), f32(p + "attn_k.weight", 2688, 256),
                   f32(p + "attn_v.weight", 2688, 256), f32(p + "attn_output.weight", 4096, 2688)]
        else:
            ts += [f32(p + "ffn_gate_inp.weight", 2688, 128), f32(p + "ffn_up_exps.weight", 2688, 1856, 128),
                   f32(p + "ffn_down_exps.weight", 1856, 2688, 128), f32(p + "ffn_up_shexp.weight", 2688, 3712),
                   f32(p + "ffn_down_shexp.weight", 3712, 2688)]
    ts += [f32("output_norm.weight", 2688), f32("output.weight", 2688, 131072)]
    return mfacts.model_facts(md, ts, classify_model("nemotron_h_moe", md, ts))


@pytest.fixture(scope="module")
def nano():
    return nano_facts()


def facts(**kw):
    """A ``ModelFacts`` given as plain numbers (what ``model_facts`` hands the formulas)."""
    base = dict(architecture="test", block_count=2, n_embd=64, n_vocab=1000, context_length=None, kv_blocks={})
    base.update(kw)
    return mfacts.ModelFacts(**base)


def window(size, blocks, kind="standard"):
    return mfacts.SlidingWindow(kind, size, frozenset(blocks), "test")


def transformer(arch, blocks, **meta):
    """A decoder with attention (4 heads, 2 KV heads of 16) in every block, as a GGUF header gives it."""
    tensors = [f32("token_embd.weight", 64, 512), f32("output.weight", 64, 512)]
    for b in range(blocks):
        p = "blk.%d." % b
        tensors += [f32(p + "attn_q.weight", 64, 64), f32(p + "attn_k.weight", 64, 32),
                    f32(p + "attn_v.weight", 64, 32), f32(p + "attn_output.weight", 64, 64),
                    f32(p + "ffn_up.weight", 64, 128), f32(p + "ffn_down.weight", 128, 64)]
    md = {"general.architecture": arch, arch + ".block_count": blocks, arch + ".embedding_length": 64,
          arch + ".attention.head_count": 4, arch + ".attention.head_count_kv": 2,
          arch + ".attention.key_length": 16, arch + ".attention.value_length": 16, arch + ".vocab_size": 512}
    md.update(dict((arch + "." + k.replace("__", "."), v) for k, v in meta.items()))
    return mfacts.model_facts(md, tensors, classify_model(arch, md, tensors))


def test_model_facts_keep_the_layout_the_path_the_warnings_and_count_the_vocabulary_tokens():
    """The vocabulary is the tokenizer's token list (llama.cpp's n_vocab = its length), before ``vocab_size`` and
    the embedding's shape; the tensor classes and the layout's and reader's warnings are kept; the path is "" when
    none is given."""
    tensors = [f32("token_embd.weight", 64, 512), f32("output.weight", 64, 512)]
    for b in range(2):
        p = "blk.%d." % b
        tensors += [f32(p + "attn_q.weight", 64, 64), f32(p + "attn_k.weight", 64, 32), f32(p + "attn_v.weight", 64, 32),
                    f32(p + "attn_output.weight", 64, 64), f32(p + "ffn_up.weight", 64, 128),
                    f32(p + "ffn_down.weight", 128, 64)]
    tensors.append(f32("blk.7.attn_q.weight", 64, 64))  # a block past block_count: the layout warns
    md = {"general.architecture": "llama", "llama.block_count": 2, "llama.embedding_length": 64,
          "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2,
          "tokenizer.ggml.tokens": ["t%d" % i for i in range(77)]}
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


def test_routed_experts_with_a_gate_projection_are_gated(nano):
    """llama.cpp's build_moe_ffn multiplies a gate (ffn_gate_exps, or the gate half of ffn_gate_up_exps) with up
    when the model has one (Qwen3-MoE, gpt-oss); Nemotron-H's experts have up and down only (relu squared)."""
    assert nano.experts_gated is False
    for gate in ("ffn_gate_exps", "ffn_gate_up_exps"):
        tensors = [f32("token_embd.weight", 64, 512), f32("blk.0.ffn_gate_inp.weight", 64, 4),
                   f32("blk.0.%s.weight" % gate, 64, 32, 4), f32("blk.0.ffn_down_exps.weight", 32, 64, 4)]
        if gate == "ffn_gate_exps":
            tensors.append(f32("blk.0.ffn_up_exps.weight", 64, 32, 4))
        md = {"general.architecture": "qwen3moe", "qwen3moe.block_count": 1, "qwen3moe.embedding_length": 64,
              "qwen3moe.expert_count": 4, "qwen3moe.expert_used_count": 2, "qwen3moe.vocab_size": 512}
        assert mfacts.model_facts(md, tensors, classify_model("qwen3moe", md, tensors)).experts_gated is True


def test_the_facts_mark_the_routed_experts_and_count_the_used_ones_and_the_selection_bias(nano):
    """Each tensor's facts say whether it is a routed expert (the layout's list); the experts used per token and
    a selection bias (blk.N.exp_probs_b.bias, llama.cpp's exp_probs_b) come with them."""
    assert nano.expert_used_count == 6 and nano.expert_probs_bias is False
    experts = set(t.name for t in nano.tensors if t.expert)
    assert experts == set(n for names in nano.expert_tensors_by_block.values() for n in names)
    assert len(experts) == 2 * 23 and all(".ffn_up_exps." in n or ".ffn_down_exps." in n for n in experts)
    tensors = [f32("token_embd.weight", 64, 512), f32("blk.0.ffn_gate_inp.weight", 64, 4),
               f32("blk.0.exp_probs_b.bias", 4), f32("blk.0.ffn_up_exps.weight", 64, 32, 4),
               f32("blk.0.ffn_down_exps.weight", 32, 64, 4)]
    md = {"general.architecture": "deepseek2", "deepseek2.block_count": 1, "deepseek2.embedding_length": 64,
          "deepseek2.expert_count": 4, "deepseek2.expert_used_count": 2, "deepseek2.vocab_size": 512}
    biased = mfacts.model_facts(md, tensors, classify_model("deepseek2", md, tensors))
    assert biased.expert_probs_bias is True and biased.expert_used_count == 2


def qkv_model(md_extra=(), heads=4, attn=("attn_q", 64), attn_k=None, n_embd=64):
    """One attention block: ``attn`` (a tensor and its width: attn_q, or attn_qkv), attn_k/attn_v of width
    ``attn_k`` when given, attn_output; llama metadata (``heads`` query heads) with ``md_extra``."""
    name, width = attn
    tensors = [f32("token_embd.weight", n_embd, 512), f32("blk.0.%s.weight" % name, n_embd, width),
               f32("blk.0.attn_output.weight", n_embd, n_embd)]
    if attn_k:
        tensors += [f32("blk.0.attn_k.weight", n_embd, attn_k), f32("blk.0.attn_v.weight", n_embd, attn_k)]
    md = {"general.architecture": "llama", "llama.block_count": 1, "llama.embedding_length": n_embd,
          "llama.attention.head_count": heads, "llama.vocab_size": 512}
    md.update(md_extra)
    md = dict((k, v) for k, v in md.items() if v is not None)
    return mfacts.model_facts(md, tensors, classify_model("llama", md, tensors))


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
    assert nano_facts().n_ff_exp == 1856
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


# --------------------------------------------------------------------------- set_swa_pattern

@pytest.mark.parametrize("period, blocks, sliding", [
    (4, 8, {0, 1, 2, 4, 5, 6}),  # il % 4 < 3: the last block of every period keeps a full cache
    (6, 12, {0, 1, 2, 3, 4, 6, 7, 8, 9, 10}),
    (2, 5, {0, 2, 4}),
    (1, 3, set()),  # il % 1 < 0 never holds: no block slides
    (0, 3, {0, 1, 2}),  # period 0: every block slides
    (4, 0, set()),
])
def test_swa_pattern_without_dense_first_is_llama_cpp_set_swa_pattern(period, blocks, sliding):
    """src/llama-hparams.cpp llama_hparams::set_swa_pattern(n_pattern, dense_first=false):
    is_swa = n_pattern == 0 || il % n_pattern < n_pattern - 1; dense_first is off unless asked for."""
    assert mfacts.swa_pattern(period, blocks) == frozenset(sliding)
    assert mfacts.swa_pattern(period, blocks, False) == frozenset(sliding)


@pytest.mark.parametrize("period, blocks, sliding", [
    (4, 8, {1, 2, 3, 5, 6, 7}),  # il % 4 != 0: the first block of every period keeps a full cache
    (2, 5, {1, 3}),
    (1, 3, set()),
    (0, 3, {0, 1, 2}),
])
def test_swa_pattern_dense_first(period, blocks, sliding):
    """set_swa_pattern(n_pattern, dense_first=true): is_swa = n_pattern == 0 || il % n_pattern != 0."""
    assert mfacts.swa_pattern(period, blocks, dense_first=True) == frozenset(sliding)


# --------------------------------------------------------------------------- sliding-window layouts

@pytest.mark.parametrize("arch, blocks, meta, expected", [
    ("gemma3", 12, {"attention__sliding_window": 512},
     ("standard", 512, {0, 1, 2, 3, 4, 6, 7, 8, 9, 10}, "set_swa_pattern(6) of gemma3")),
    ("smallthinker", 8, {"attention__sliding_window": 1024},  # window key > 0 switches on a fixed 4096
     ("standard", 4096, {1, 2, 3, 5, 6, 7}, "set_swa_pattern(4, dense_first) of smallthinker")),
    ("llama4", 8, {"attention__sliding_window": 1024},  # chunks of 8192 whatever the key says
     ("chunked", 8192, {0, 1, 2, 4, 5, 6}, "set_swa_pattern(4) of llama4")),
    ("gemma2", 4, {}, ("standard", 4096, {0, 2}, "set_swa_pattern(2) of gemma2")),  # n_swa 4096 without the key
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
    ("gemma3", 6, {"attention__sliding_window": 0}),  # found_swa && n_swa > 0 only
    ("gemma3", 6, {"attention__sliding_window": -512}),
    ("llama4", 8, {"attention__sliding_window": 0}),  # found_swa && n_swa == 0: no chunking
    ("exaone4", 8, {}),  # exaone4 slides only with 64 blocks
    ("phi3", 4, {"attention__sliding_window": 2047}),
    ("cohere2", 4, {"attention__sliding_window": 2048, "attention__sliding_window_pattern": [0, 0, 0, 0]}),
    ("mymodel", 4, {"attention__sliding_window": -64, "attention__sliding_window_pattern": [1, 1, 1, 0]}),
    ("mymodel", 4, {"attention__sliding_window": 0}),  # an unknown architecture: no window, nothing to warn of
])
def test_no_sliding_window(arch, blocks, meta):
    facts_ = transformer(arch, blocks, **meta)
    assert facts_.sliding_window is None and facts_.memory == "kv" and facts_.warnings == []


def test_an_unknown_architecture_with_a_window_but_no_pattern_is_sized_full_with_a_warning():
    facts_ = transformer("mymodel", 4, attention__sliding_window=256)
    assert facts_.sliding_window is None
    assert facts_.warnings == [
        "mymodel.attention.sliding_window is 256 but llama.cpp's layer pattern for mymodel is not known here: every "
        "attention block is sized for the full context (an over-estimate)"]


def test_a_rule_without_period_and_without_pattern_is_sized_full_with_a_warning():
    facts_ = transformer("gemma4", 4, attention__sliding_window=1024)
    assert facts_.sliding_window is None and facts_.memory == "kv"
    assert facts_.warnings == [
        "gemma4 uses a sliding window of 1024 but its sliding_window_pattern is missing: every attention block is "
        "sized for the full context (an over-estimate)"]


def test_a_pattern_that_is_not_one_flag_per_block_is_refused():
    with pytest.raises(mfacts.MemoryModelError) as info:
        transformer("gemma4", 4, attention__sliding_window=64, attention__sliding_window_pattern=[1, 0, "x", 1])
    assert str(info.value) == ("gemma4.attention.sliding_window_pattern has 4 entries, not one flag for each of the 4 "
                               "blocks")
    with pytest.raises(mfacts.MemoryModelError, match="has 5 entries, not one flag for each of the 4 blocks"):
        transformer("gemma4", 4, attention__sliding_window=64, attention__sliding_window_pattern=[1, 0, 1, 1, 0])


# --------------------------------------------------------------------------- the facts of Nemotron-3-Nano

def test_nano_attention_blocks_cache_two_kv_heads_of_128(nano):
    """Nano's GGUF metadata: 6 attention blocks, 2 KV heads, head dim 128: n_embd_k_gqa = n_embd_v_gqa = 256."""
    assert nano.kv_blocks == dict((b, (256, 256)) for b in NANO_ATTENTION)
    assert nano.kv_heads == dict((b, 2) for b in NANO_ATTENTION)
    assert nano.n_head == dict((b, 32) for b in NANO_ATTENTION)
    assert nano.memory == "hybrid" and nano.sliding_window is None and nano.kv_reused == ()
    assert (nano.n_embd, nano.n_vocab, nano.context_length) == (2688, 131072, 1048576)
    assert nano.warnings == []


def test_nano_recurrent_state_widths(nano):
    """llama_hparams::n_embd_r() = (d_conv - 1) * (d_inner + 2 * n_group * d_state) = 3 * (4096 + 2048) = 18432 and
    n_embd_s() = d_state * d_inner = 524288 F32 elements per Mamba block."""
    assert nano.recurrent_blocks == dict((b, (18432, 524288)) for b in NANO_MAMBA)
    assert nano.ssm == {"d_conv": 4, "d_inner": 4096, "d_state": 128, "n_group": 8, "n_head": 64}


def test_nano_recurrent_state_is_2170880_bytes_per_block_and_sequence(nano):
    """llama-memory-recurrent.cpp: r_l and s_l are F32 [n_embd_r, mem_size] and [n_embd_s, mem_size] with
    mem_size = max(1, n_seq_max) (llama-model.cpp create_memory); 47.62 MiB per sequence over the 23 blocks."""
    assert kvc.recurrent_state_bytes(nano) == dict((b, 2170880) for b in NANO_MAMBA)
    assert kvc.recurrent_state_bytes(nano, 3) == dict((b, 3 * 2170880) for b in NANO_MAMBA)
    assert kvc.recurrent_state_bytes(nano, 0) == dict((b, 2170880) for b in NANO_MAMBA)


def test_the_ssm_widths_come_from_the_tensor_shapes_when_the_metadata_lacks_them():
    """ssm_conv1d {d_conv, d_inner + 2 * n_group * d_state}, ssm_out {d_inner, n_embd}, ssm_norm {., n_group}."""
    got = nano_facts(drop=("ssm.conv_kernel", "ssm.inner_size", "ssm.state_size", "ssm.group_count"))
    assert got.recurrent_blocks == dict((b, (18432, 524288)) for b in NANO_MAMBA)
    assert got.ssm == {"d_conv": 4, "d_inner": 4096, "d_state": 128, "n_group": 8, "n_head": 64}
    assert got.warnings == ["nemotron_h_moe.ssm.* metadata missing: d_conv=4 d_inner=4096 d_state=128 n_group=8 "
                            "taken from the ssm tensor shapes"]


@pytest.mark.parametrize("group_count, r", [(None, 3 * 4096), (-1, 3 * 4096), (0, 3 * 4096), (1, 3 * (4096 + 256))])
def test_the_conv_state_counts_the_groups_given(group_count, r):
    """n_group is 0 without ssm.group_count (Mamba-1 has no groups) and never negative."""
    got = nano_facts(drop=("ssm.group_count",), **({} if group_count is None else {"ssm.group_count": group_count}))
    assert got.recurrent_blocks[0] == (r, 524288)


def rwkv(**meta):
    tensors = [f32("token_embd.weight", 64, 32), f32("blk.0.time_mix_key.weight", 64, 64)]
    md = {"rwkv7.embedding_length": 64, "rwkv7.wkv.head_size": 16}
    md.update(dict(("rwkv7." + k, v) for k, v in meta.items()))
    return mfacts.model_facts(md, tensors, classify_model("rwkv7", md, tensors)).recurrent_blocks


@pytest.mark.parametrize("meta, widths", [
    ({}, (2 * 64, 64 * 16)),  # token_shift_count defaults to 2
    ({"token_shift_count": -1}, (2 * 64, 64 * 16)),
    ({"token_shift_count": 1}, (64, 64 * 16)),
    ({"token_shift_count": 0}, (0, 64 * 16)),
])
def test_rwkv_state_is_token_shift_count_times_n_embd_and_n_embd_times_head_size(meta, widths):
    """llama_hparams::n_embd_r() = token_shift_count * n_embd, n_embd_s() = n_embd * wkv_head_size."""
    assert rwkv(**meta) == {0: widths}


# --------------------------------------------------------------------------- the bytes of a KV row

@pytest.mark.parametrize("name, n, expected", [
    ("f16", 256, 512), ("f32", 256, 1024), ("bf16", 256, 512),
    ("q8_0", 32, 34), ("q8_0", 256, 272), ("q4_0", 32, 18), ("q4_0", 256, 144), ("q8_0", 0, 0), ("f16", 1, 2)])
def test_row_bytes_are_ggml_row_size(name, n, expected):
    """ggml.c type_traits: f16 1 element in 2 bytes, q8_0 32 in 34 (block_q8_0), q4_0 32 in 18 (block_q4_0)."""
    assert kvc.row_bytes(name, n) == expected


def test_row_bytes_refuse_a_partial_block_and_an_unknown_type():
    with pytest.raises(mfacts.MemoryModelError) as info:
        kvc.row_bytes("q4_0", 33)
    assert str(info.value) == ("a KV row of 33 elements is not a multiple of the 32-element blocks of q4_0: llama.cpp "
                               "cannot use that cache type for this model")
    with pytest.raises(mfacts.MemoryModelError) as info:
        kvc.row_bytes("q6_k", 256)
    assert str(info.value) == ("unknown cache type 'q6_k' (llama-server knows bf16, f16, f32, iq4_nl, q4_0, q4_1, "
                               "q5_0, q5_1, q8_0)")


def test_pad_and_mib():
    assert [kvc.pad(v, 256) for v in (0, 1, 255, 256, 257, 512)] == [0, 256, 256, 256, 512, 512]
    assert common.mib(MIB) == 1.0 and common.mib(6144 * 32768) == 192.0 and common.mib(23 * 2170880) == 47.62
    assert common.mib(MIB + 5243) == 1.01 and common.mib(MIB + 5242) == 1.0


# --------------------------------------------------------------------------- context, slots and cells

@pytest.mark.parametrize("ctx, parallel, unified, expected", [
    (256, 1, False, (256, 256, 1)),
    (257, 1, False, (512, 512, 1)),  # n_ctx = GGML_PAD(n_ctx, 256)
    (1024, 4, False, (1024, 256, 4)),
    (1025, 4, False, (2048, 512, 4)),  # 1280 / 4 = 320 cells a slot, padded to 512: 4 x 512
    (512, 3, False, (768, 256, 3)),  # 512 / 3 = 170, padded to 256
    (4096, 0, False, (4096, 4096, 1)),
    (1025, 4, True, (1280, 1280, 1)),  # a unified cache: one stream of n_ctx
    (257, 8, True, (512, 512, 1)),
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


def test_cache_cells_without_a_sliding_window_have_no_swa_cells():
    assert kvc.cache_cells(facts(), Options(4096)) == kvc.CacheCells(4096, 4096, 1, 0, 512)
    assert kvc.cache_cells(facts(), Options(1000, 3, ubatch=128)) == kvc.CacheCells(1536, 512, 3, 0, 128)
    assert kvc.cache_cells(facts(), Options(300, 2, kv_unified=True)) == kvc.CacheCells(512, 512, 1, 0, 300)


@pytest.mark.parametrize("size, ctx, parallel, kw, swa_cells", [
    (512, 4096, 1, {}, 1024),  # pad(min(4096, 512 + 512), 256)
    (500, 4096, 1, {}, 1024),  # 1012 -> 1024
    (513, 4096, 1, {}, 1280),  # 1025 -> 1280
    (512, 4096, 1, {"ubatch": 256}, 768),
    (512, 4096, 1, {"ubatch": 1024, "batch": 256}, 768),  # n_ubatch <= n_batch
    (512, 4096, 3, {}, 1024),  # per stream: min(1536, 1024)
    (512, 4096, 3, {"kv_unified": True}, 2048),  # n_swa * n_seq_max + n_ubatch with a unified cache
    (512, 4096, 0, {"kv_unified": True}, 1024),
    (4096, 4096, 1, {}, 4096),  # never more than the full cache
    (512, 300, 1, {}, 512),  # n_ubatch = 300: min(512, 812)
    (512, 4096, 3, {"swa_full": True}, 1536),  # --swa-full: as many as the full cache
    (512, 4096, 2, {"swa_full": True, "kv_unified": True}, 4096),
])
def test_swa_cells(size, ctx, parallel, kw, swa_cells):
    """llama-kv-cache-iswa.cpp llama_kv_cache_iswa: size_swa = GGML_PAD(min(size_base, n_swa * (unified ?
    n_seq_max : 1) + n_ubatch), 256); size_base with swa_full."""
    cells = kvc.cache_cells(facts(sliding_window=window(size, {0})), Options(ctx, parallel, **kw))
    assert cells.swa_cells == swa_cells
    assert (cells.n_ctx, cells.cells, cells.streams) == kvc.context_cells(ctx, parallel, kw.get("kv_unified", False))


# --------------------------------------------------------------------------- KV cache bytes

@pytest.mark.parametrize("type_k, type_v, per_cell", [
    ("f16", "f16", 512 + 512), ("q8_0", "q8_0", 272 + 272), ("q4_0", "q4_0", 144 + 144), ("f32", "f32", 2048),
    ("q8_0", "f16", 272 + 512), ("f16", "q4_0", 512 + 144), ("bf16", "q8_0", 512 + 272)])
def test_nano_kv_bytes_per_cell_and_cache_type(nano, type_k, type_v, per_cell):
    """llama-kv-cache.cpp llama_kv_cache: per attention block K [n_embd_k_gqa = 256, kv_size, n_stream] of type_k
    and V [256, kv_size, n_stream] of type_v; f16 gives 6 x 1024 = 6144 bytes a token."""
    kv = kvc.kv_cache_bytes(nano, Options(4096, 1, cache_type_k=type_k, cache_type_v=type_v))
    assert kv == dict((b, per_cell * 4096) for b in NANO_ATTENTION)


def test_nano_kv_defaults_are_one_slot_f16_and_measured_192_mib_at_32k(nano):
    """llama-server b10435 logged 192.00 MiB of KV for Nano at -c 32768 -np 2: 2 streams of 16384 cells, the same
    bytes as 1 stream of 32768."""
    assert kvc.kv_cache_bytes(nano, Options(4096)) == kvc.kv_cache_bytes(nano, Options(4096, 1, cache_type_k="f16", cache_type_v="f16", kv_unified=False))
    assert kvc.kv_cache_bytes(nano, Options(4096)) == dict((b, 1024 * 4096) for b in NANO_ATTENTION)
    two = kvc.kv_cache_bytes(nano, Options(32768, 2))
    assert two == dict((b, 1024 * 32768) for b in NANO_ATTENTION) and common.mib(sum(two.values())) == 192.0


def test_kv_bytes_count_every_padded_slot(nano):
    """-c 1025 -np 4: 4 streams of 512 cells (2048 cells), not 1025 nor 1280."""
    assert kvc.kv_cache_bytes(nano, Options(1025, 4)) == dict((b, 1024 * 2048) for b in NANO_ATTENTION)
    assert kvc.kv_cache_bytes(nano, Options(1025, 4, kv_unified=True)) == dict((b, 1024 * 1280) for b in NANO_ATTENTION)


def test_kv_bytes_of_sliding_blocks_use_the_swa_cells():
    f = facts(kv_blocks={0: (64, 64), 1: (64, 64)}, kv_heads={0: 1, 1: 1}, sliding_window=window(512, {0}))
    per_cell = 2 * 64 * 2
    assert kvc.kv_cache_bytes(f, Options(8192, 2)) == {0: per_cell * 1024 * 2, 1: per_cell * 4096 * 2}
    assert kvc.kv_cache_bytes(f, Options(8192, 2, kv_unified=True)) == {0: per_cell * 1536, 1: per_cell * 8192}
    assert kvc.kv_cache_bytes(f, Options(8192, 2, swa_full=True)) == {0: per_cell * 8192, 1: per_cell * 8192}
    assert kvc.kv_cache_bytes(f, Options(8192, 1, ubatch=256)) == {0: per_cell * 768, 1: per_cell * 8192}
    assert kvc.kv_cache_bytes(f, Options(8192, 1, ubatch=1024, batch=256)) == {0: per_cell * 768, 1: per_cell * 8192}


def test_without_flash_attention_every_v_row_is_the_widest():
    """llama-kv-cache.cpp: n_embd_v_gqa = !v_trans ? n_embd_v_gqa(il) : n_embd_v_gqa_max() (v_trans without flash
    attention); flash attention is the default."""
    f = facts(kv_blocks={0: (64, 32), 1: (64, 128)}, kv_heads={0: 1, 1: 1})
    assert kvc.kv_cache_bytes(f, Options(256)) == {0: (64 + 32) * 2 * 256, 1: (64 + 128) * 2 * 256}
    assert kvc.kv_cache_bytes(f, Options(256, flash_attn=False)) == {0: (64 + 128) * 2 * 256, 1: (64 + 128) * 2 * 256}


def test_mla_has_no_v_cache_even_without_flash_attention():
    """llama_kv_cache: has_v = !is_mla; only the compressed K (kv_lora_rank + rope dims) is cached."""
    f = facts(kv_blocks={0: (576, 0), 1: (576, 0)}, kv_heads={0: 1, 1: 1}, mla=True)
    assert kvc.kv_cache_bytes(f, Options(512)) == {0: 576 * 2 * 512, 1: 576 * 2 * 512}
    assert kvc.kv_cache_bytes(f, Options(512, flash_attn=False)) == {0: 576 * 2 * 512, 1: 576 * 2 * 512}
    assert kvc.kv_cache_bytes(f, Options(512, cache_type_k="q8_0")) == {0: 576 // 32 * 34 * 512, 1: 576 // 32 * 34 * 512}


def test_a_model_without_cache_has_no_kv_bytes():
    assert kvc.kv_cache_bytes(facts(), Options(4096, 4)) == {}


def test_the_head_size_must_be_whole_blocks_of_the_cache_type():
    """llama-context.cpp llama_init_from_model refuses a K (V) cache type whose block does not divide
    n_embd_head_k (n_embd_head_v); the head size is the first attention block's width over its KV heads."""
    f = facts(kv_blocks={0: (32, 64)}, kv_heads={0: 2})  # head_k 16, head_v 32
    with pytest.raises(mfacts.MemoryModelError) as info:
        kvc.kv_cache_bytes(f, Options(512, cache_type_k="q8_0"))
    assert str(info.value) == (
        "K cache type q8_0 with block size 32 does not divide the head size 16 (n_embd_head_k): a head is not a "
        "multiple of its blocks, and llama.cpp refuses to create the context; use another cache_type_k")
    assert kvc.kv_cache_bytes(f, Options(512, cache_type_v="q8_0")) == {0: (64 + 68) * 512}
    g = facts(kv_blocks={0: (64, 48)}, kv_heads={0: 2})  # head_k 32, head_v 24
    with pytest.raises(mfacts.MemoryModelError) as info:
        kvc.kv_cache_bytes(g, Options(512, cache_type_v="q4_0"))
    assert str(info.value) == (
        "V cache type q4_0 with block size 32 does not divide the head size 24 (n_embd_head_v): a head is not a "
        "multiple of its blocks, and llama.cpp refuses to create the context; use another cache_type_v")
    assert kvc.kv_cache_bytes(g, Options(512, cache_type_k="q4_0")) == {0: (36 + 96) * 512}


# --------------------------------------------------------------------------- output buffer

def test_output_buffer_is_one_row_of_logits_per_slot():
    assert kvc.output_buffer_bytes(facts(n_vocab=131072)) == 131072 * 4
    assert kvc.output_buffer_bytes(facts(n_vocab=131072), 3) == 3 * 131072 * 4
    assert kvc.output_buffer_bytes(facts(n_vocab=131072), 0) == 131072 * 4


# --------------------------------------------------------------------------- where the layers go

@pytest.mark.parametrize("split, n, cumulative", [
    ([3, 1], 2, [0.75, 1.0]), (None, 4, [0.25, 0.5, 0.75, 1.0]), ([0, 2], 2, [0.0, 1.0]), ([2, 0], 2, [1.0, 1.0]),
    ([1], 1, [1.0])])
def test_normalize_split_is_cumulative(split, n, cumulative):
    """llama.cpp: splits[i] = sum(split[:i + 1]) / sum(split); an even split without --tensor-split."""
    assert mest.normalize_split(split, n) == cumulative


@pytest.mark.parametrize("split, n, message", [
    ([1, 1], 0, "there is no GPU to place layers on"),
    ([1, 1, 1], 2, "the tensor split [1, 1, 1] does not give a share >= 0 to each of the 2 GPUs"),
    ([1, -1], 2, "the tensor split [1, -1] does not give a share >= 0 to each of the 2 GPUs"),
    ([0, 0], 2, "the tensor split [0, 0] does not give a share >= 0 to each of the 2 GPUs"),
])
def test_normalize_split_errors(split, n, message):
    with pytest.raises(mfacts.MemoryModelError) as info:
        mest.normalize_split(split, n)
    assert str(info.value) == message


@pytest.mark.parametrize("blocks, split, n, expected", [
    (3, [1, 1], 2, ([0, 0, 1], 1)),  # block 2 at 2/4 = 0.5 is not below the first bound 0.5
    (2, [1, 1], 2, ([0, 0], 1)),  # the output layer at 2/3
    (4, [0, 1], 2, ([1, 1, 1, 1], 1)),
    (4, [1, 0], 2, ([0, 0, 0, 0], 0)),
    (3, None, 1, ([0, 0, 0], 0)),
    (5, [1, 1, 2], 3, ([0, 0, 1, 2, 2], 2)),  # bounds 0.25, 0.5, 1.0 for positions 0, 1/6 ... 5/6
])
def test_layer_devices_first_device_whose_cumulative_share_exceeds_the_position(blocks, split, n, expected):
    """Block i (the output layer as i == n_layer) goes to the first device with i / (n_layer + 1) < splits[d]."""
    assert mest.layer_devices(blocks, split, n) == expected


def test_layer_devices_default_to_one_device():
    assert mest.layer_devices(3) == ([0, 0, 0], 0)


def tensor_facts(name, nbytes, block, type_id, shape, expert=False):
    return mfacts.TensorFacts(name, nbytes, block, type_id, shape, expert)


def weights_model():
    q8 = 8  # q8_0: 32 elements in 34 bytes
    ts = (tensor_facts("token_embd.weight", 2688 * 1000 // 32 * 34, None, q8, (2688, 1000)),
          tensor_facts("blk.0.attn_q.weight", 2688 * 4 // 32 * 34, 0, q8, (2688, 4)),
          tensor_facts("blk.0.attn_norm.weight", 2688 * 4, 0, 0, (2688,)),
          tensor_facts("blk.0.ffn_up_exps.weight", 1024 * 2 * 2 // 32 * 34, 0, q8, (1024, 2, 2), True),
          tensor_facts("blk.1.attn_q.weight", 512 * 4 // 32 * 34, 1, q8, (512, 4)),
          tensor_facts("output.weight", 2688 * 1000 // 32 * 34, None, q8, (2688, 1000)))
    return facts(tensors=ts, expert_tensors_by_block={0: ["blk.0.ffn_up_exps.weight"]})


def test_weights_on_cuda_pad_quantized_rows_once_and_align_to_128():
    """ggml-cuda.cu get_alloc_size: a quantized tensor whose ne0 is not a multiple of MATRIX_ROW_PADDING (512) gets
    ggml_row_size(type, 512 - ne0 % 512) more bytes; the CUDA buffer type aligns every tensor to 128."""
    f = weights_model()
    q = 11424 + 384 // 32 * 34  # 2688 % 512 = 128: 384 elements of padding -> 11832, aligned to 11904
    norm = 2688 * 4  # F32: no row padding, 10752 is a multiple of 128
    experts = 4352  # ne0 1024: no padding; 4352 = 34 * 128
    q_small = 2176  # 512 x 4 q8_0: a multiple of 512 elements, 2176 = 17 * 128
    output = 2856000 + 408  # 2856408, aligned to 2856448
    gpu, host, detail = mest.weight_bytes(f)
    assert gpu == [11904 + norm + experts + q_small + 2856448]
    assert q == 11832 and output == 2856408
    assert host == 2856000 and detail == {"devices_by_block": [0, 0], "output_device": 0, "host_expert_bytes": 0}
    cpu_gpu, cpu_host = mest.weight_bytes(f, backend="cpu")[:2]
    assert cpu_gpu == [11424 + norm + experts + q_small + 2856000] and cpu_host == 2856000  # 32-byte aligned already


def test_weights_of_cpu_tensors_go_to_the_host_and_moved_tensors_to_their_device():
    f = weights_model()
    gpu, host, detail = mest.weight_bytes(f, ["blk.0.ffn_up_exps.weight"], [1, 1], 2, "cpu")
    assert detail == {"devices_by_block": [0, 0], "output_device": 1, "host_expert_bytes": 4352}
    assert gpu == [11424 + 10752 + 2176, 2856000] and host == 2856000 + 4352
    moved = mest.weight_bytes(f, (), [1, 1], 2, "cpu", {"blk.0.ffn_up_exps.weight": 1})[0]
    assert moved == [11424 + 10752 + 2176, 4352 + 2856000]


def test_a_cpu_host_keeps_every_weight():
    f = weights_model()
    total = sum(t.nbytes for t in f.tensors)
    assert mest.weight_bytes(f, n_devices=0) == ([], total, {"devices_by_block": [], "output_device": None,
                                                           "host_expert_bytes": 4352})


def test_tied_embeddings_copy_token_embd_to_the_output_device():
    f = weights_model()
    tied = facts(tensors=f.tensors[:-1], expert_tensors_by_block=f.expert_tensors_by_block)
    assert mest.weight_bytes(tied, backend="cpu")[0] == [11424 + 10752 + 4352 + 2176 + 2856000]


# --------------------------------------------------------------------------- the input and the whole estimate

@pytest.mark.parametrize("name, value", [("ctx_size", 0), ("ctx_size", True), ("ctx_size", 1.5), ("parallel", 0),
                                         ("parallel", -1), ("ubatch", 0), ("ubatch", None)])
def test_validate_context_wants_whole_numbers_from_1(name, value):
    args = {"ctx_size": 4096, "parallel": 1, "ubatch": 512}
    args[name] = value
    with pytest.raises(mfacts.MemoryModelError) as info:
        kvc.validate_context(args["ctx_size"], args["parallel"], args["ubatch"])
    assert str(info.value) == "%s must be a whole number >= 1, got %r" % (name, value)


def test_validate_context_needs_a_padded_context_cell_per_slot():
    assert kvc.validate_context(1, 1, 1) is None
    assert kvc.validate_context(256, 256) is None and kvc.validate_context(257, 512) is None
    with pytest.raises(mfacts.MemoryModelError) as info:
        kvc.validate_context(256, 257)
    assert str(info.value) == "ctx_size 256 cannot hold 257 parallel slots"


def attention_only(n_vocab=1000000):
    """One attention block: 4 query heads of 64 on one KV head of 64, embedding 64, and a large vocabulary."""
    return facts(block_count=1, n_embd=64, n_vocab=n_vocab, kv_blocks={0: (64, 64)}, n_head={0: 4},
                 kv_heads={0: 1}, q_width={0: 256})


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
    assert cbuf.cpu_compute_bytes(f, Options(512, 1, ubatch=512, batch=2048, flash_attn=True)) == cbuf.cpu_compute_bytes(f, Options(512))


def test_cpu_compute_buffer_is_the_host_inputs_plus_the_worst_node_of_the_model(nano):
    """The CPU buffer of a host without GPU is what the host keeps beside a GPU without host-resident experts
    (inputs and embedding rows) plus the worst node of every block and of the output layer."""
    tokens = 512
    output = 2 * 2688 * tokens * 4 + 131072 * 4
    host = cbuf.host_compute_bytes(nano, Options(4096, 2))
    shape = cbuf.graph_shape(nano, Options(4096, 2))
    worst = max([cbuf.block_peak(nano, b, shape, True, (0, 0), True, True) for b in range(52)] + [output])
    assert cbuf.cpu_compute_bytes(nano, Options(4096, 2)) == host + worst
    assert cbuf.cpu_compute_bytes(nano, Options(4096, 2)) > cbuf.cpu_compute_bytes(nano, Options(4096, 1))
    assert cbuf.cpu_compute_bytes(nano, Options(4096, 2, kv_unified=True)) > cbuf.cpu_compute_bytes(nano, Options(4096, 2))


def test_graph_shape_rounds_the_micro_batch_up_to_the_slots():
    """llama_context::graph_reserve: n_tokens a multiple of n_seqs; one output row per slot (n_outputs_max)."""
    shape = cbuf.graph_shape(facts(), Options(1536, 3, ubatch=100, batch=300))
    assert (shape.tokens, shape.seqs, shape.outputs) == (102, 3, 3)
    assert shape.cells == kvc.cache_cells(facts(), Options(1536, 3, ubatch=100, batch=300))
    small = cbuf.graph_shape(facts(), Options(256, 1, ubatch=4))
    assert (small.tokens, small.seqs, small.outputs) == (4, 1, 1)


def test_pipeline_copies_multiply_the_device_inputs():
    """ggml-backend.cpp GGML_SCHED_MAX_COPIES: a pipeline-parallel graph keeps 4 copies of each split's inputs."""
    f = attention_only(n_vocab=100)
    inputs = 64 * 512 * 4 + 512 * 4 + 512 * 512 * 2 + 512 * 8 * 2 + 4
    assert cbuf.compute_buffer_bytes(f, Options(512), copies=4) - cbuf.compute_buffer_bytes(f, Options(512)) == 3 * inputs


@pytest.mark.parametrize("flash_attn, on", [(True, True), ("on", True), ("auto", True), ("true", True),
                                            ("enabled", True), (False, False), ("off", False), ("false", False)])
def test_estimate_reads_flash_attention(flash_attn, on):
    f = attention_only(n_vocab=100)
    result = mest.estimate(f, Options(512, flash_attn=flash_attn, backend="cpu"))
    assert result["flash_attn"] is on
    assert result["gpus"][0]["kv"] == sum(kvc.kv_cache_bytes(f, Options(512, flash_attn=on)).values())


def test_a_quantized_v_cache_needs_flash_attention():
    f = facts(kv_blocks={0: (64, 64)}, kv_heads={0: 2})
    with pytest.raises(mfacts.MemoryModelError) as info:
        mest.estimate(f, Options(512, cache_type_v="q8_0", flash_attn="off"))
    assert str(info.value) == ("a quantized V cache (cache_type_v=q8_0) needs flash attention: set flash_attn to on "
                               "or auto, or use cache_type_v f16")
    for plain in ("f32", "f16", "bf16"):
        assert mest.estimate(f, Options(512, cache_type_v=plain, flash_attn="off"))["flash_attn"] is False


def test_estimate_adds_up_each_gpu_and_the_host(nano):
    result = mest.estimate(nano, Options(32768, 2, backend="cpu", margin_mib=512, host_margin_mib=256))
    (gpu,) = result["gpus"]
    assert gpu["kv"] == 6144 * 32768 and gpu["recurrent"] == 2 * 23 * 2170880 and gpu["margin"] == 512 * MIB
    assert gpu["total"] == gpu["model"] + gpu["kv"] + gpu["recurrent"] + gpu["compute"] + gpu["margin"]
    assert gpu["kv_mib"] == 192.0 and gpu["recurrent_mib"] == 95.23 and gpu["margin_mib"] == 512.0
    host = result["host"]
    assert host["kv"] == 0 and host["recurrent"] == 0 and host["output"] == 2 * 131072 * 4
    assert host["margin"] == 256 * MIB
    assert host["total"] == host["model"] + host["output"] + host["compute"] + host["margin"]
    assert host["output_mib"] == 1.0 and host["mmap"] is True and host["pinned"] is False
    assert result["n_ctx"] == 32768 and result["cells"] == kvc.CacheCells(32768, 16384, 2, 0, 512)
    assert result["devices_by_block"] == [0] * 52 and result["output_device"] == 0 and result["warnings"] == []


def test_under_32_tokens_host_experts_are_computed_on_the_host_and_the_gpu_routes_them(nano):
    """CUDA's op offload starts at 32 tokens (ggml-cuda.cu, min_batch_size): at -ub 16 (-b 2048) the GPU reserves
    no copy of the host-resident experts and only routes their block, while the blocks whose experts stay on the
    GPU compute them there; the host computes the host-resident ones."""
    first = nano.expert_blocks[0]
    cpu = nano.expert_tensors_by_block[first]
    result = mest.estimate(nano, Options(4096, 1, ubatch=16), cpu_tensors=cpu)
    assert result["gpus"][0]["compute"] == cbuf.compute_buffer_bytes(nano, Options(4096, 1, ubatch=16, flash_attn=True, kv_unified=False), blocks=range(nano.block_count), has_output=True, remote_expert_blocks=[first])
    assert result["host"]["compute"] == cbuf.host_compute_bytes(nano, Options(4096, 1, ubatch=16), cpu_expert_blocks=[first])
    offloaded = mest.estimate(nano, Options(4096, 1, ubatch=32), cpu_tensors=cpu)
    expert_bytes = sum(t.nbytes for t in nano.tensors if t.name in cpu)
    assert offloaded["gpus"][0]["compute"] == cbuf.compute_buffer_bytes(nano, Options(4096, 1, ubatch=32, flash_attn=True, kv_unified=False), blocks=range(nano.block_count), has_output=True, cpu_expert_bytes_max=expert_bytes)


def test_a_cpu_host_holds_the_token_ids_and_embedding_rows_beside_what_one_gpu_would(nano):
    """With every block on one device, the GPU's buffer is the graph inputs and the worst node (holes of a hybrid
    model included); a host without GPU holds the same plus the token ids and the embedding rows it looks up
    (512 tokens: 512 x 4 + 2688 x 512 x 4 bytes). cpu_compute_bytes is the figure checked against llama-server."""
    assert cbuf.cpu_compute_bytes(nano, Options(4096)) - cbuf.compute_buffer_bytes(nano, Options(4096)) == 512 * 4 + 2688 * 512 * 4


def test_the_host_compute_defaults_are_one_slot_and_a_sliding_window_cache(nano):
    assert cbuf.host_compute_bytes(nano, Options(4096)) == cbuf.host_compute_bytes(nano, Options(4096, 1))
    assert cbuf.host_compute_bytes(nano, Options(4096, 2)) != cbuf.host_compute_bytes(nano, Options(4096, 1))
    swa = transformer("gemma3", 6, attention__sliding_window=512)
    assert cbuf.host_compute_bytes(swa, Options(8192)) == cbuf.host_compute_bytes(swa, Options(8192, swa_full=False))
    assert cbuf.host_compute_bytes(swa, Options(8192)) != cbuf.host_compute_bytes(swa, Options(8192, swa_full=True))


def test_a_unified_cache_reaches_the_host_compute_estimate(nano):
    """-kvu: one stream of 2 x 2048 cells instead of two of 2048: the host holds the graph inputs, whose masks
    follow the streams."""
    unified = mest.estimate(nano, Options(4096, 2, kv_unified=True))["host"]["compute"]
    assert unified == cbuf.host_compute_bytes(nano, Options(4096, 2, kv_unified=True))
    assert unified != cbuf.host_compute_bytes(nano, Options(4096, 2))


def test_estimate_defaults_are_one_slot_f16_and_the_1024_mib_margins(nano):
    result = mest.estimate(nano, Options(4096))
    assert result["gpus"][0]["margin"] == 1024 * MIB and result["host"]["margin"] == 1024 * MIB
    assert result["gpus"][0]["kv"] == 6144 * 4096 and result["gpus"][0]["recurrent"] == 23 * 2170880
    assert result["host"]["output"] == 131072 * 4 and result["flash_attn"] is True


def test_a_cpu_host_holds_the_caches(nano):
    result = mest.estimate(nano, Options(4096, 2), n_devices=0)
    assert result["gpus"] == [] and result["output_device"] is None
    host = result["host"]
    assert host["kv"] == 6144 * 4096 and host["recurrent"] == 2 * 23 * 2170880
    assert host["compute"] == cbuf.cpu_compute_bytes(nano, Options(4096, 2))
    assert host["pinned"] is False


@pytest.mark.parametrize("mmap, n_devices, backend, pinned", [
    (False, 1, "cuda", True), (True, 1, "cuda", False), (False, 1, "rpc", False), (False, 0, "cuda", False)])
def test_host_weights_are_pinned_only_without_mmap_beside_a_cuda_gpu(nano, mmap, n_devices, backend, pinned):
    host = mest.estimate(nano, Options(4096, mmap=mmap, backend=backend), n_devices=n_devices)["host"]
    assert host["pinned"] is pinned and host["mmap"] is mmap


def test_the_training_context_warning_starts_past_it():
    f = facts(context_length=4096)
    assert mest.estimate(f, Options(4096, backend="cpu"))["warnings"] == []
    assert mest.estimate(f, Options(4097, backend="cpu"))["warnings"] == [
        "ctx_size 4097 is beyond the model's training context (4096): quality may drop"]


# --------------------------------------------------------------------------- gathering the facts

def test_the_memory_kind_follows_the_blocks():
    """llama-model.cpp create_memory: a KV cache, an iSWA pair, a hybrid, or none for embedding models."""
    assert transformer("qwen3", 2).memory == "kv"
    assert transformer("gemma3", 6, attention__sliding_window=512).memory == "iswa"
    assert transformer("bert", 2).memory == "none" and transformer("bert", 2).kv_blocks == {}
    assert nano_facts().memory == "hybrid"
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


def test_missing_embedding_and_vocabulary_are_read_from_token_embd():
    tensors = [f32("token_embd.weight", 64, 500), f32("blk.0.attn_k.weight", 64, 32),
               f32("blk.0.attn_v.weight", 64, 32), f32("blk.0.attn_q.weight", 64, 64)]
    got = mfacts.model_facts({}, tensors, classify_model("x", {}, tensors))
    assert (got.n_embd, got.n_vocab) == (64, 500)
    assert got.warnings[:2] == ["x.embedding_length missing: 64 taken from the embedding tensor",
                                "vocabulary size missing: 500 taken from the embedding tensor"]
    assert got.kv_blocks == {0: (32, 32)}


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


def test_the_last_block_s_experts_see_only_the_output_rows_where_the_graph_keeps_them():
    """src/models/qwen3moe.cpp: ``if (il == n_layer - 1 && inp_out_ids)`` keeps only the output rows before the last
    block's feed-forward part, so its experts compute ``outputs`` rows; nemotron-h.cpp runs the whole micro-batch
    through every block."""
    tensors = [T("blk.%d.ffn_up_exps.weight" % b, (64, 32, 4), 64 * 32 * 4 * 4, 0) for b in range(3)]
    tensors += [T("token_embd.weight", (64, 32), 64 * 32 * 4, 0)]
    for arch, last_rows in (("qwen3moe", "outputs"), ("nemotron_h_moe", "tokens")):
        md = {"general.architecture": arch, arch + ".block_count": 3, arch + ".embedding_length": 64,
              arch + ".expert_count": 4, arch + ".expert_used_count": 2}
        facts = mfacts.model_facts(md, tensors, classify_model(arch, md, tensors))
        shape = cbuf.graph_shape(facts, Options(4096, 1, kv_unified=False, ubatch=512, batch=2048, swa_full=False))
        assert (shape.tokens, shape.outputs) == (512, 1)
        assert [cbuf._expert_tokens(facts, shape, b) for b in range(3)] == [512, 512, getattr(shape, last_rows)]


def mamba2_from_shapes(conv_channels, d_inner=64, n_group=2):
    """A one-block mamba2 model without ssm.* metadata: the widths come from ssm_conv1d {d_conv, conv channels},
    ssm_out {d_inner, n_embd} and ssm_norm {d_inner / n_group, n_group} (src/llama-model.cpp, LLM_ARCH_MAMBA2)."""
    tensors = [f32("token_embd.weight", 32, 100), f32("blk.0.ssm_in.weight", 32, 2 * d_inner),
               f32("blk.0.ssm_conv1d.weight", 4, conv_channels),
               f32("blk.0.ssm_norm.weight", d_inner // n_group, n_group), f32("blk.0.ssm_out.weight", d_inner, 32)]
    md = {"mamba2.block_count": 1, "mamba2.embedding_length": 32}
    return mfacts.model_facts(md, tensors, classify_model("mamba2", md, tensors))


@pytest.mark.parametrize("d_state", [1, 16])
def test_a_state_size_of_one_from_the_shapes_is_a_state(d_state):
    """conv channels = d_inner + 2 * n_group * d_state (llama-model.cpp: ssm_conv1d {d_conv, d_inner + 2*ng*d_state}):
    d_state 1 is the smallest state there is, not a missing one."""
    facts = mamba2_from_shapes(64 + 2 * 2 * d_state)
    assert facts.ssm["d_state"] == d_state and isinstance(facts.ssm["d_state"], int)
    assert facts.recurrent_blocks == {0: (3 * (64 + 4 * d_state), d_state * 64)}


def test_shapes_that_leave_no_room_for_a_state_are_refused_with_the_shapes():
    with pytest.raises(mfacts.MemoryModelError) as raised:
        mamba2_from_shapes(64)
    assert str(raised.value) == ("the recurrent blocks lack mamba2.ssm.* metadata and the ssm tensor shapes do not "
                                 "give a state size (conv channels 64, inner size 64)")


def test_conv_channels_that_do_not_divide_give_a_whole_state_size():
    """d_state is a count of values: (channels - d_inner) // (2 * n_group), never a fraction."""
    facts = mamba2_from_shapes(64 + 2 * 2 * 16 + 3)
    assert facts.ssm["d_state"] == 16 and isinstance(facts.ssm["d_state"], int)


def test_the_logits_are_counted_only_on_the_output_device():
    """The output layer runs on the device that holds ``output.weight`` (llama-model.cpp: dev_output); the logits,
    n_vocab x n_outputs floats, are in that device's compute buffer and in no other's."""
    vocab = 1000000
    tensors = [f32("token_embd.weight", 64, vocab), f32("output.weight", 64, vocab),
               f32("blk.0.attn_q.weight", 64, 64), f32("blk.0.attn_k.weight", 64, 32),
               f32("blk.0.attn_v.weight", 64, 32), f32("blk.0.ffn_up.weight", 64, 128)]
    md = {"llama.block_count": 1, "llama.embedding_length": 64, "llama.attention.head_count": 4,
          "llama.attention.head_count_kv": 2, "llama.feed_forward_length": 128}
    facts = mfacts.model_facts(md, tensors, classify_model("llama", md, tensors))
    shape = cbuf.graph_shape(facts, Options(4096, 64, kv_unified=False, ubatch=512, batch=2048, swa_full=False))
    logits = vocab * shape.outputs * 4
    with_output = cbuf.compute_buffer_bytes(facts, Options(4096, 64, ubatch=512), has_output=True)
    without = cbuf.compute_buffer_bytes(facts, Options(4096, 64, ubatch=512), has_output=False)
    assert shape.outputs == 64 and with_output >= logits > without
