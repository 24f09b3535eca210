"""Tensor names of MoE models (and a whole-name matcher) for the tests of the tensor classes and the offload
pattern: Nemotron-3-Nano-30B-A3B's 401 real names, blocks of llama.cpp's per-architecture tensor names
(src/llama-arch.cpp ``LLM_TENSOR_NAMES``) and random models that follow those naming conventions (a hypothesis
strategy)."""
from __future__ import annotations

import re
from collections import namedtuple

from hypothesis import strategies as st

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._pattern_syntax import matcher
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._tensor_classes import classify_model, classify_tensor

T = namedtuple("T", "name shape nbytes")
# Nemotron-3-Nano-30B-A3B: M Mamba-2, E MoE, * attention (reference, section 3).
NEMOTRON_NANO_LAYOUT = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
_NEMOTRON_BLOCK_TENSORS = {
    "M": ["ssm_in.weight", "ssm_conv1d.weight", "ssm_conv1d.bias", "ssm_dt.bias", "ssm_a", "ssm_d",
          "ssm_norm.weight", "ssm_out.weight"],
    "*": ["attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight"],
    "E": ["ffn_gate_inp.weight", "exp_probs_b.bias", "ffn_up_exps.weight", "ffn_down_exps.weight",
          "ffn_up_shexp.weight", "ffn_down_shexp.weight"],
}


def nemotron_nano():
    """(metadata, tensors) of Nemotron-3-Nano-30B-A3B: the 401 real tensor names, sizes made up."""
    tensors = [T("token_embd.weight", (2688, 131072), 1000)]
    for i, kind in enumerate(NEMOTRON_NANO_LAYOUT):
        tensors.append(T("blk.%d.attn_norm.weight" % i, (2688,), 4 * 2688))
        for suffix in _NEMOTRON_BLOCK_TENSORS[kind]:
            shape = (2688, 1856, 128) if "_exps" in suffix else (2688, 64)
            tensors.append(T("blk.%d.%s" % (i, suffix), shape, 7 if "_exps" in suffix else 3))
    tensors += [T("output_norm.weight", (2688,), 4 * 2688), T("output.weight", (2688, 131072), 2000)]
    arch = "nemotron_h_moe"
    metadata = {
        "general.architecture": arch,
        arch + ".block_count": len(NEMOTRON_NANO_LAYOUT),
        arch + ".attention.head_count_kv": [2 if k == "*" else 0 for k in NEMOTRON_NANO_LAYOUT],
        arch + ".feed_forward_length": [1856 if k == "E" else 0 for k in NEMOTRON_NANO_LAYOUT],
        arch + ".expert_count": 128,
        arch + ".expert_used_count": 6,
        arch + ".expert_shared_count": 1,
    }
    return metadata, tensors


def nemotron_names():
    """(the tensor names, the ``ModelLayout``) of Nemotron-3-Nano-30B-A3B."""
    metadata, tensors = nemotron_nano()
    layout = classify_model("nemotron_h_moe", metadata, tensors)
    return [t.name for t in tensors], layout


def matches(pattern, names):
    """The names that Python's ``re.search`` finds ``pattern`` in."""
    regex = re.compile(pattern)
    return {n for n in names if regex.search(n)}


def full(pattern):
    """std::regex_search with the pattern anchored at both ends: matches the whole name."""
    return matcher("^" + pattern + "$")


def model_names(blocks, suffixes, extra=()):
    """(names, routed-expert names) of a model: global tensors, ``extra`` and ``blk.N.<suffix>`` for each block."""
    names = ["token_embd.weight", "output.weight", "output_norm.weight"] + list(extra)
    for i in blocks:
        names += ["blk.%d.%s" % (i, s) for s in suffixes]
    experts = [n for n in names if classify_tensor(n) == "routed_experts"]
    return names, experts


def qwen3moe_names(blocks):
    """(names, routed-expert names) of a qwen3moe model of ``blocks``."""
    return model_names(blocks, ARCH_SUFFIXES["qwen3moe"][0])


ARCH_SUFFIXES = {
    # name -> (block tensor suffixes, expected pattern)
    "qwen3moe": (["attn_q.weight", "attn_norm.weight", "ffn_gate_inp.weight", "ffn_gate_exps.weight",
                  "ffn_up_exps.weight", "ffn_down_exps.weight"], r"\.ffn_.*_exps\.weight"),
    "qwen2moe": (["attn_q.bias", "ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight",
                  "ffn_down_exps.weight", "ffn_gate_inp_shexp.weight", "ffn_gate_shexp.weight",
                  "ffn_up_shexp.weight", "ffn_down_shexp.weight"], r"\.ffn_.*_exps\.weight"),
    "gpt_oss": (["attn_sinks.weight", "ffn_gate_inp.weight", "ffn_gate_inp.bias", "ffn_gate_exps.weight",
                 "ffn_gate_exps.bias", "ffn_up_exps.weight", "ffn_up_exps.bias", "ffn_down_exps.weight",
                 "ffn_down_exps.bias"], r"\.ffn_.*_exps\."),
    "fused_gate_up": (["ffn_gate_inp.weight", "ffn_gate_up_exps.weight", "ffn_down_exps.weight"],
                      r"\.ffn_.*_exps\.weight"),
    "chexps_only": (["ffn_gate_inp.weight", "ffn_up_chexps.weight", "ffn_down_chexps.weight"],
                    r"\.ffn_.*_(ch)?exps\.weight"),
    "grovemoe": (["ffn_gate_inp.weight", "ffn_up_exps.weight", "ffn_down_exps.weight", "ffn_up_chexps.weight",
                  "ffn_down_chexps.weight"], r"\.ffn_.*_(ch)?exps\.weight"),
    "arctic": (["ffn_norm_exps.weight", "ffn_up.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight",
                "ffn_down_exps.weight"], r"\.ffn_(down|gate|up)_exps\."),
    "old_mixtral": (["ffn_gate_inp.weight"]
                    + ["ffn_%s.%d.weight" % (p, e) for p in ("gate", "up", "down") for e in range(8)],
                    r"\.ffn_(down|gate|up)\.[0-9]+\.weight$"),
}


EXPERT_SUFFIXES = ["ffn_%s_%s.%s" % (p, k, w) for p in ("gate", "up", "down", "gate_up")
                   for k in ("exps", "chexps") for w in ("weight", "bias")]
OTHER_SUFFIXES = ["attn_q.weight", "attn_norm.weight", "ffn_gate_inp.weight", "ffn_gate_inp.bias",
                  "exp_probs_b.bias", "ffn_up_shexp.weight", "ffn_down_shexp.weight", "ffn_gate_inp_shexp.weight",
                  "ffn_up.weight", "ffn_down.weight", "ffn_norm_exps.weight", "ssm_in.weight", "ssm_a",
                  "ssm_conv1d.bias", "post_attention_norm.weight"]


@st.composite
def random_models(draw):
    blocks = draw(st.sets(st.integers(0, 130), min_size=1, max_size=40))
    expert_suffixes = draw(st.sets(st.sampled_from(EXPERT_SUFFIXES), min_size=1, max_size=5))
    other_suffixes = draw(st.sets(st.sampled_from(OTHER_SUFFIXES), max_size=8))
    moe_blocks = draw(st.sets(st.sampled_from(sorted(blocks)), min_size=1))
    names = ["token_embd.weight", "output.weight", "output_norm.weight"]
    for b in sorted(blocks):
        names += ["blk.%d.%s" % (b, s) for s in sorted(other_suffixes)]
        if b in moe_blocks:
            names += ["blk.%d.%s" % (b, s) for s in sorted(expert_suffixes)]
    return names
