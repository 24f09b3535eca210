"""Tensor classes and block kinds (plugins/module_utils/_tensor_classes.py)."""
from __future__ import annotations

from collections import namedtuple

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import block_index
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._tensor_classes import (
    BLOCK_KINDS,
    TENSOR_CLASSES,
    classify_model,
    classify_tensor,
)

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


def test_nemotron_nano_has_401_tensors_46_experts_and_23_23_6_layer_kinds():
    metadata, tensors = nemotron_nano()
    assert len(tensors) == 401
    layout = classify_model("nemotron_h_moe", metadata, tensors)
    assert layout.block_count == 52
    assert len(layout.expert_tensors) == 46
    assert all(n.endswith(("ffn_up_exps.weight", "ffn_down_exps.weight")) for n in layout.expert_tensors)
    assert len(layout.layer_kinds["recurrent"]) == 23
    assert len(layout.layer_kinds["moe"]) == 23
    assert layout.layer_kinds["attention"] == [5, 12, 19, 26, 33, 42]
    assert layout.layer_kinds["dense_ffn"] == []
    assert layout.block_kinds[0] == ["recurrent"] and layout.block_kinds[1] == ["moe"]
    assert (layout.expert_count, layout.expert_used_count, layout.expert_shared_count) == (128, 6, 1)
    assert sorted(layout.expert_tensors_by_block) == layout.layer_kinds["moe"]
    assert layout.tensor_class["blk.1.ffn_gate_inp.weight"] == "router"
    assert layout.tensor_class["blk.1.exp_probs_b.bias"] == "router"
    assert layout.tensor_class["blk.1.ffn_up_shexp.weight"] == "shared_experts"
    assert layout.tensor_class["blk.0.ssm_a"] == "recurrent"
    assert layout.tensor_class["blk.0.ssm_norm.weight"] == "norm"
    assert layout.bytes_by_class["routed_experts"] == 46 * 7
    assert layout.total_bytes == sum(t.nbytes for t in tensors)
    assert sum(layout.bytes_by_class.values()) == layout.total_bytes
    assert set(layout.bytes_by_class) == set(TENSOR_CLASSES)
    assert layout.warnings == []


def test_nemotron_kinds_come_from_metadata_not_names():
    """Per-layer arrays decide: a block named like Mamba but with KV heads is attention."""
    metadata, tensors = nemotron_nano()
    metadata["nemotron_h_moe.attention.head_count_kv"][0] = 2
    layout = classify_model("nemotron_h_moe", metadata, tensors)
    assert layout.block_kinds[0] == ["attention"]
    assert 0 not in layout.layer_kinds["recurrent"]


def test_nemotron_without_arrays_falls_back_to_names_with_a_warning():
    metadata, tensors = nemotron_nano()
    metadata["nemotron_h_moe.attention.head_count_kv"] = 2  # a scalar, not a per-layer array
    layout = classify_model("nemotron_h_moe", metadata, tensors)
    assert len(layout.layer_kinds["recurrent"]) == 23
    assert len(layout.layer_kinds["moe"]) == 23
    assert len(layout.layer_kinds["attention"]) == 6
    assert any("per-layer" in w for w in layout.warnings)


def test_dense_nemotron_h_ffn_blocks_are_dense():
    arch = "nemotron_h"
    kinds = "M-M*"
    tensors = [T("token_embd.weight", (8, 16), 512)]
    for i, k in enumerate(kinds):
        names = {"M": ["ssm_in.weight"], "-": ["ffn_up.weight", "ffn_down.weight"], "*": ["attn_q.weight"]}[k]
        tensors += [T("blk.%d.%s" % (i, n), (8, 8), 256) for n in names]
    metadata = {arch + ".block_count": 4,
                arch + ".attention.head_count_kv": [0, 0, 0, 2],
                arch + ".feed_forward_length": [0, 32, 0, 0]}
    layout = classify_model(arch, metadata, tensors)
    assert layout.layer_kinds == {"attention": [3], "recurrent": [0, 2], "moe": [], "dense_ffn": [1]}
    assert layout.expert_tensors == [] and layout.expert_count == 0


@pytest.mark.parametrize("name, cls", [
    ("blk.3.ffn_gate_exps.weight", "routed_experts"),
    ("blk.3.ffn_up_exps.bias", "routed_experts"),
    ("blk.3.ffn_gate_up_exps.weight", "routed_experts"),
    ("blk.3.ffn_down_chexps.weight", "routed_experts"),
    ("blk.3.ffn_gate.7.weight", "routed_experts"),
    ("blk.3.ffn_gate_shexp.weight", "shared_experts"),
    ("blk.3.ffn_gate_inp_shexp.weight", "shared_experts"),
    ("blk.3.ffn_gate_inp.weight", "router"),
    ("blk.3.ffn_gate_inp.bias", "router"),
    ("blk.3.exp_probs_b.bias", "router"),
    ("blk.3.ffn_norm_exps.weight", "norm"),
    ("blk.3.attn_norm.weight", "norm"),
    ("blk.3.attn_q_norm.weight", "norm"),
    ("blk.3.post_attention_norm.weight", "norm"),
    ("blk.3.attn_kv_a_mqa.weight", "attention"),
    ("blk.3.attn_sinks.weight", "attention"),
    ("blk.3.attn_output.bias", "attention"),
    ("blk.3.ssm_conv1d.bias", "recurrent"),
    ("blk.3.ssm_d", "recurrent"),
    ("blk.3.time_mix_key.weight", "recurrent"),
    ("blk.3.shortconv.in_proj.weight", "recurrent"),
    ("blk.3.ffn_up.weight", "dense_ffn"),
    ("blk.3.channel_mix_key.weight", "dense_ffn"),
    ("blk.3.nextn.eh_proj.weight", "other"),
    ("blk.3.nextn.enorm.weight", "norm"),
    ("blk.3.layer_output_scale.weight", "other"),
    ("token_embd.weight", "token_embd"),
    ("token_embd_norm.weight", "norm"),
    ("output.weight", "output"),
    ("output_norm.weight", "norm"),
    ("rope_freqs.weight", "other"),
    ("blk.x.ffn_up_exps.weight", "other"),
])
def test_classify_tensor(name, cls):
    assert classify_tensor(name) == cls


def test_block_index_reads_the_whole_number():
    assert block_index("blk.10.ffn_up_exps.weight") == 10
    assert block_index("blk.1.attn_q.weight") == 1
    assert block_index("output.weight") is None
    assert block_index("v.blk.1.attn_q.weight") is None


def _layout(arch, names, metadata=None, nbytes=100):
    return classify_model(arch, metadata or {}, [T(n, (4, 4), nbytes) for n in names])


def test_deepseek2_leading_dense_blocks_and_shared_experts():
    names = ["token_embd.weight", "output.weight", "output_norm.weight"]
    for i in range(4):
        names += ["blk.%d.attn_q_a.weight" % i, "blk.%d.attn_kv_a_mqa.weight" % i, "blk.%d.attn_norm.weight" % i]
        if i == 0:
            names += ["blk.0.ffn_gate.weight", "blk.0.ffn_up.weight", "blk.0.ffn_down.weight"]
        else:
            names += ["blk.%d.%s" % (i, s) for s in (
                "ffn_gate_inp.weight", "exp_probs_b.bias", "ffn_gate_exps.weight", "ffn_up_exps.weight",
                "ffn_down_exps.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight")]
    layout = _layout("deepseek2", names, {"deepseek2.block_count": 4, "deepseek2.expert_count": 64,
                                          "deepseek2.expert_used_count": 6, "deepseek2.expert_shared_count": 2})
    assert layout.layer_kinds == {"attention": [0, 1, 2, 3], "recurrent": [], "moe": [1, 2, 3], "dense_ffn": [0]}
    assert len(layout.expert_tensors) == 9
    assert layout.expert_shared_count == 2
    assert layout.bytes_by_class["shared_experts"] == 900
    assert layout.bytes_by_class["router"] == 600


def test_unknown_architecture_following_conventions_and_inferred_counts():
    names = ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_gate_inp.weight",
             "blk.0.ffn_up_exps.weight", "blk.0.ffn_up_shexp.weight",
             "blk.1.attn_q.weight", "blk.1.ffn_gate_inp.weight", "blk.1.ffn_up_exps.weight",
             "blk.1.ffn_up_shexp.weight"]
    tensors = [T(n, (8, 8, 16) if "_exps" in n else (8, 8), 64) for n in names]
    layout = classify_model("brand_new_moe", {}, tensors)
    assert layout.block_count == 2
    assert layout.layer_kinds["moe"] == [0, 1] and layout.layer_kinds["attention"] == [0, 1]
    assert layout.expert_count == 16  # ne[2] of the stacked experts
    assert layout.expert_shared_count == 1  # shared-expert tensors without a count key


def test_dense_model_has_no_experts():
    names = ["token_embd.weight", "output.weight"] + [
        "blk.%d.%s" % (i, s) for i in range(3) for s in ("attn_q.weight", "ffn_up.weight", "ffn_norm.weight")]
    layout = _layout("llama", names, {"llama.block_count": 3})
    assert layout.expert_tensors == [] and layout.expert_tensors_by_block == {}
    assert layout.layer_kinds == {"attention": [0, 1, 2], "recurrent": [], "moe": [], "dense_ffn": [0, 1, 2]}
    assert layout.bytes_by_class["routed_experts"] == 0


def test_unknown_sizes_count_zero_with_a_warning():
    tensors = [T("blk.0.ffn_up_exps.weight", (32, 8, 4), None), T("blk.0.attn_q.weight", (8, 8), 256)]
    layout = classify_model("qwen3moe", {}, tensors)
    assert layout.total_bytes == 256
    assert layout.bytes_by_class["routed_experts"] == 0
    assert layout.expert_tensors == ["blk.0.ffn_up_exps.weight"]
    assert any("unknown size" in w and "blk.0.ffn_up_exps.weight" in w for w in layout.warnings)


def test_blocks_without_tensors_still_listed_and_kinds_are_known():
    layout = _layout("llama", ["blk.0.attn_q.weight"], {"llama.block_count": 3})
    assert layout.block_kinds == {0: ["attention"], 1: [], 2: []}
    assert all(k in BLOCK_KINDS for kinds in layout.block_kinds.values() for k in kinds)


def test_extra_blocks_beyond_block_count_are_counted_with_a_warning():
    layout = _layout("glm4moe", ["blk.0.ffn_up_exps.weight", "blk.2.nextn.eh_proj.weight"], {"glm4moe.block_count": 2})
    assert layout.block_count == 3
    assert layout.warnings
