"""Tensor classes and block kinds (plugins/module_utils/_tensor_classes.py): the class of every llama.cpp tensor
name (src/llama-arch.cpp ``LLM_TENSOR_NAMES``, gguf-py ``TENSOR_NAMES``), the kinds of every block, the counts read
from the metadata or inferred, and the warnings, each with its exact text."""
from __future__ import annotations

import re

import pytest
from gguf.constants import TENSOR_NAMES

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._tensor_classes import (
    BLOCK_KINDS, TENSOR_CLASSES, classify_model, classify_tensor, ModelLayout)
from tests.helpers.tensor_names import T, nemotron_nano


def test_nemotron_nano_has_401_tensors_46_experts_and_23_23_6_layer_kinds():
    metadata, tensors = nemotron_nano()
    layout = classify_model("nemotron_h_moe", metadata, tensors)
    assert (len(tensors), layout.block_count, len(layout.expert_tensors)) == (401, 52, 46)
    assert all(n.endswith(("ffn_up_exps.weight", "ffn_down_exps.weight")) for n in layout.expert_tensors)
    assert [len(layout.layer_kinds[k]) for k in ("recurrent", "moe", "dense_ffn")] == [23, 23, 0]
    assert layout.layer_kinds["attention"] == [5, 12, 19, 26, 33, 42]
    assert (layout.block_kinds[0], layout.block_kinds[1]) == (["recurrent"], ["moe"])
    assert (layout.expert_count, layout.expert_used_count, layout.expert_shared_count) == (128, 6, 1)
    assert sorted(layout.expert_tensors_by_block) == layout.layer_kinds["moe"]
    classes = {"blk.1.ffn_gate_inp.weight": "router", "blk.1.exp_probs_b.bias": "router", "blk.0.ssm_a": "recurrent",
               "blk.1.ffn_up_shexp.weight": "shared_experts", "blk.0.ssm_norm.weight": "norm"}
    assert {n: layout.tensor_class[n] for n in classes} == classes
    assert layout.bytes_by_class["routed_experts"] == 46 * 7
    assert layout.total_bytes == sum(t.nbytes for t in tensors)
    assert sum(layout.bytes_by_class.values()) == layout.total_bytes
    assert set(layout.bytes_by_class) == set(TENSOR_CLASSES)
    assert layout.warnings == []


# common/common.h LLM_FFN_EXPS_REGEX: what llama-server's --cpu-moe moves to host memory.
LLAMA_CPP_EXPERTS = re.compile(r"\.ffn_(up|down|gate|gate_up)_(ch|)exps")
# src/llama-arch.cpp LLM_TENSOR_FFN_{GATE,DOWN,UP}_EXP: the old one-tensor-per-expert layout "blk.%d.ffn_gate.%d".
PER_EXPERT = ["blk.3.ffn_gate.0.weight", "blk.3.ffn_down.7.weight", "blk.3.ffn_up.15.weight"]


def _real_block_names():
    return sorted({n.format(bid=3) for n in TENSOR_NAMES.values() if n.startswith("blk.{bid}.")})


def test_every_real_block_tensor_is_a_routed_expert_exactly_when_llama_cpp_moves_it_with_cpu_moe():
    names = [n + ".weight" for n in _real_block_names()] + PER_EXPERT
    routed = sorted(n for n in names if classify_tensor(n) == "routed_experts")
    assert routed == sorted([n for n in names if LLAMA_CPP_EXPERTS.search(n)] + PER_EXPERT)
    assert {classify_tensor(n) for n in names} <= set(TENSOR_CLASSES)


# The class of block tensors "blk.3.<suffix>", by class.
BLOCK_SUFFIXES = {
    # stacked routed experts beyond llama.cpp's real names (those: the test above): biases, no suffix at all; and
    # the old one-tensor-per-expert layout
    "routed_experts": ["ffn_down_exps.bias", "ffn_up_exps.bias", "ffn_up_exps", "ffn_gate.7.weight"],
    # shared experts, including the shared expert's gate
    "shared_experts": ["ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight",
                       "ffn_gate_inp_shexp.weight"],
    # the router and its selection bias
    "router": ["ffn_gate_inp.weight", "ffn_gate_inp.bias", "exp_probs_b.bias"],
    # any '_'-separated word ending in "norm", before attention, recurrent and dense-FFN prefixes; multi-token
    # prediction sub-layers keep their names after "nextn."
    "norm": ["ffn_norm_exps.weight", "attn_norm.weight", "attn_norm_2.weight", "attn_k_norm.weight",
             "attn_q_norm.weight", "post_attention_norm.weight", "attn_kv_a_norm.weight", "ssm_norm.weight",
             "ssm_b_norm.weight", "ffn_norm.weight", "ffn_sub_norm.weight", "post_ffw_norm_1.weight",
             "layer_output_norm.weight", "altup_router_norm.weight", "nextn.enorm.weight", "nextn.hnorm.weight",
             "nextn.shared_head_norm.weight"],
    "attention": ["attn_q.weight", "attn_qkv.weight", "attn_output.weight", "attn_output.bias",
                  "attn_kv_a_mqa.weight", "attn_k_b.weight", "attn_sinks.weight", "attn_gate.weight"],
    # Mamba, RWKV time mix, LFM2 short convolution
    "recurrent": ["ssm_in.weight", "ssm_a", "ssm_d", "ssm_conv1d.bias", "time_mix_key.weight", "time_mix_ln.weight",
                  "shortconv.conv.weight", "shortconv.in_proj.weight"],
    # ffn_* that is no expert, router or norm, and the RWKV channel mix
    "dense_ffn": ["ffn_up.weight", "ffn_gate.weight", "ffn_down.bias", "ffn_latent_up.weight",
                  "channel_mix_key.weight", "channel_mix_receptance.weight"],
    "other": ["nextn.eh_proj.weight", "nextn.embed_tokens.weight", "nextn.shared_head_head.weight",
              "layer_output_scale.weight", "altup_router.weight", "inp_gate.weight", "laurel_l.weight",
              "indexer.k_norm.weight", "vis_gate.weight"],
}
# Names outside "blk.N." (the vision tower, an encoder's blocks) are classed by their first part.
WHOLE_NAMES = {
    "routed_experts": ["blk.12.ffn_down_exps.weight"],
    "token_embd": ["token_embd.weight", "per_layer_token_embd.weight", "token_types.weight", "position_embd.weight"],
    "output": ["output.weight", "output.bias"],
    "norm": ["output_norm.weight", "output_norm.bias", "token_embd_norm.weight", "per_layer_proj_norm.weight",
             "output_hc_norm.weight"],
    "other": ["output_hc_fn.weight", "rope_freqs.weight", "altup_proj.weight", "cls.output.weight",
              "v.blk.3.ffn_up.weight", "dec.blk.3.attn_q.weight", "blk.x.ffn_up_exps.weight"],
}


@pytest.mark.parametrize("name, cls", [("blk.3." + s, c) for c, suffixes in BLOCK_SUFFIXES.items() for s in suffixes]
                         + [(n, c) for c, names in WHOLE_NAMES.items() for n in names])
def test_classify_tensor(name, cls):
    assert classify_tensor(name) == cls


# ---- classify_model ----
def test_a_model_is_classified_as_a_whole():
    tensors = [
        T("token_embd.weight", (8, 32), 10), T("output_norm.weight", (8,), 1), T("output.weight", (8, 32), 20),
        T("rope_freqs.weight", (4,), 2), T("blk.1.ssm_in.weight", (8, 8), 6), T("blk.1.ffn_up.weight", (8, 8), 7),
        T("blk.0.ffn_up_exps.weight", (8, 16, 4), 100), T("blk.0.attn_q.weight", (8, 8), 3),
        T("blk.0.ffn_gate_inp.weight", (8, 4), 4), T("blk.0.ffn_down_exps.weight", (16, 8, 4), 50),
        T("blk.0.ffn_up_shexp.weight", (8, 16), 5)]
    layout = classify_model("mymoe", {}, tensors)
    assert layout == ModelLayout(
        architecture="mymoe", block_count=2,
        block_kinds={0: ["attention", "moe"], 1: ["dense_ffn", "recurrent"]},
        layer_kinds={"attention": [0], "recurrent": [1], "moe": [0], "dense_ffn": [1]},
        tensor_class={
            "token_embd.weight": "token_embd", "output_norm.weight": "norm", "output.weight": "output",
            "rope_freqs.weight": "other", "blk.1.ssm_in.weight": "recurrent", "blk.1.ffn_up.weight": "dense_ffn",
            "blk.0.ffn_up_exps.weight": "routed_experts", "blk.0.attn_q.weight": "attention",
            "blk.0.ffn_gate_inp.weight": "router", "blk.0.ffn_down_exps.weight": "routed_experts",
            "blk.0.ffn_up_shexp.weight": "shared_experts"},
        bytes_by_class={"routed_experts": 150, "shared_experts": 5, "router": 4, "attention": 3, "recurrent": 6,
                        "dense_ffn": 7, "token_embd": 10, "output": 20, "norm": 1, "other": 2},
        total_bytes=208,
        expert_tensors=["blk.0.ffn_down_exps.weight", "blk.0.ffn_up_exps.weight"],
        expert_tensors_by_block={0: ["blk.0.ffn_down_exps.weight", "blk.0.ffn_up_exps.weight"]},
        expert_count=4, expert_used_count=0, expert_shared_count=1, warnings=[])
    assert list(layout.bytes_by_class) == list(TENSOR_CLASSES)
    assert list(layout.layer_kinds) == list(BLOCK_KINDS)
    assert repr(layout) == "ModelLayout('mymoe', blocks=2, experts=2 tensors)"


def test_no_architecture_and_no_metadata():
    layout = classify_model(None, None, [T("token_embd.weight", (8, 32), 10)])
    assert (layout.architecture, layout.block_count, layout.block_kinds, layout.warnings) == ("", 0, {}, [])
    assert layout.layer_kinds == {"attention": [], "recurrent": [], "moe": [], "dense_ffn": []}
    assert layout.expert_tensors == [] and layout.expert_tensors_by_block == {}
    assert (layout.expert_count, layout.expert_used_count, layout.expert_shared_count) == (0, 0, 0)
    assert layout.total_bytes == 10


def test_expert_tensors_are_listed_sorted_by_block():
    names = ["blk.10.ffn_up_exps.weight", "blk.2.ffn_up_exps.weight", "blk.2.ffn_down_exps.weight",
             "blk.10.ffn_down_exps.weight", "blk.2.attn_q.weight"]
    layout = classify_model("qwen3moe", {}, [T(n, (8, 8, 4), 1) for n in names])
    assert layout.expert_tensors == ["blk.10.ffn_down_exps.weight", "blk.10.ffn_up_exps.weight",
                                     "blk.2.ffn_down_exps.weight", "blk.2.ffn_up_exps.weight"]
    assert layout.expert_tensors_by_block == {2: ["blk.2.ffn_down_exps.weight", "blk.2.ffn_up_exps.weight"],
                                              10: ["blk.10.ffn_down_exps.weight", "blk.10.ffn_up_exps.weight"]}
    assert layout.block_kinds[3] == [] and layout.block_count == 11


FIVE_Q = "blk.0.attn_q.weight, blk.1.attn_q.weight, blk.2.attn_q.weight, blk.3.attn_q.weight, blk.4.attn_q.weight"


@pytest.mark.parametrize("unknown, listed", [(5, FIVE_Q), (6, FIVE_Q + ", ...")])
def test_tensors_of_unknown_size_count_zero_and_five_are_named(unknown, listed):
    tensors = [T("blk.%d.attn_q.weight" % i, (8, 8), None) for i in range(unknown)]
    layout = classify_model("llama", {"llama.block_count": unknown}, tensors + [T("output.weight", (8, 8), 64)])
    assert layout.warnings == ["%d tensor(s) of unknown size counted as 0 bytes: %s" % (unknown, listed)]
    assert layout.bytes_by_class["attention"] == 0 and layout.total_bytes == 64


# ---- the expert counts ----
# ne[2] of the first stacked expert tensor is the number of experts where the metadata has none (or 0, or not an
# integer); a 3-D tensor of another class (deepseek2's attn_k_b) and a per-expert 2-D tensor do not count. A bool is
# a number, a float or a string is ignored. The shared-expert count is inferred only when the metadata has none.
EXPERT_TENSORS = [T("blk.0.attn_k_b.weight", (128, 512, 16), 1), T("blk.0.ffn_gate.0.weight", (8, 16), 1),
                  T("blk.1.ffn_up_exps.weight", (8, 16, 32), 1), T("blk.2.ffn_up_exps.weight", (8, 16, 64), 1)]
UP_EXPS = [T("blk.0.ffn_up_exps.weight", (8, 16, 4), 1)]
WITH_SHEXP = UP_EXPS + [T("blk.0.ffn_up_shexp.weight", (8, 16), 1)]


@pytest.mark.parametrize("arch, metadata, tensors, counts", [
    ("deepseek2", {}, EXPERT_TENSORS, (32, 0, 0)),
    ("deepseek2", {"deepseek2.expert_count": 0}, EXPERT_TENSORS, (32, 0, 0)),
    ("deepseek2", {"deepseek2.expert_count": "8"}, EXPERT_TENSORS, (32, 0, 0)),
    ("deepseek2", {"deepseek2.expert_count": 8}, EXPERT_TENSORS, (8, 0, 0)),
    ("deepseek2", {}, EXPERT_TENSORS[:2], (0, 0, 0)),
    ("deepseek2", {}, [T("blk.0.ffn_up_exps.weight", None, 1)], (0, 0, 0)),
    ("qwen3moe", {"qwen3moe.expert_used_count": True, "qwen3moe.expert_count": 2.0}, UP_EXPS, (4, 1, 0)),
    ("qwen3moe", {"qwen3moe.expert_used_count": "2"}, UP_EXPS, (4, 0, 0)),
    ("qwen2moe", {}, WITH_SHEXP, (4, 0, 1)),
    ("qwen2moe", {"qwen2moe.expert_shared_count": 0}, WITH_SHEXP, (4, 0, 0)),
    ("qwen2moe", {"qwen2moe.expert_shared_count": 2}, UP_EXPS, (4, 0, 2)),
    ("qwen2moe", {"qwen2moe.expert_shared_count": "1"}, UP_EXPS, (4, 0, 0)),
])
def test_expert_counts_from_the_metadata_else_the_tensors(arch, metadata, tensors, counts):
    layout = classify_model(arch, metadata, tensors)
    assert (layout.expert_count, layout.expert_used_count, layout.expert_shared_count) == counts


# ---- the block count; the block kinds from the tensors, or from the per-layer metadata of nemotron_h(_moe) ----
def _blocks(*tensors):
    """``blk.N.<suffix>`` tensors of ``(N, suffix)`` pairs."""
    return [T("blk.%d.%s" % (b, s), (8, 8), 1) for b, s in tensors]


def _kinds(count, held):
    """The block kinds of ``count`` blocks: ``held`` ({block: kinds}), [] for the others."""
    return {**dict.fromkeys(range(count), []), **held}


OUTPUT = [T("output.weight", (8, 8), 1)]
Q0, NEXTN, SSM_ATTN = (0, "attn_q.weight"), "nextn.eh_proj.weight", ((0, "ssm_in.weight"), (1, "attn_q.weight"))
IMPLAUSIBLE = "llama.block_count 65537 is implausible (more than 65536): ignored, blocks counted from the tensor names"


@pytest.mark.parametrize("arch, metadata, tensors, block_count, kinds, warnings", [
    # from the tensor names; from the metadata, with blocks that hold no tensor
    ("llama", {}, _blocks(Q0, (2, "attn_q.weight")) + OUTPUT, 3, {0: ["attention"], 1: [], 2: ["attention"]}, []),
    ("llama", {"llama.block_count": 4}, _blocks((1, "attn_q.weight")) + OUTPUT, 4, _kinds(4, {1: ["attention"]}), []),
    ("llama", {"llama.block_count": 0}, OUTPUT, 0, {}, []),
    # blocks beyond the block count (multi-token prediction, nextn, comes after the counted ones), with a warning
    ("glm4moe", {"glm4moe.block_count": 3}, _blocks((2, NEXTN)), 3, _kinds(3, {}), []),
    ("glm4moe", {"glm4moe.block_count": 2}, _blocks((2, NEXTN)), 3, _kinds(3, {}),
     ["tensors name blocks up to 2 but glm4moe.block_count is 2"]),
    ("glm4moe", {"glm4moe.block_count": 0}, _blocks((0, NEXTN)), 1, {0: []},
     ["tensors name blocks up to 0 but glm4moe.block_count is 0"]),
    # a block count up to 65536 is taken, more is ignored; a block number up to 65535 lists every block
    ("llama", {"llama.block_count": 65536}, _blocks(Q0), 65536, _kinds(65536, {0: ["attention"]}), []),
    ("llama", {"llama.block_count": 65537}, _blocks(Q0, (2, "attn_q.weight")), 3,
     _kinds(3, {0: ["attention"], 2: ["attention"]}), [IMPLAUSIBLE]),
    ("llama", {}, _blocks((65535, "attn_q.weight")), 65536, _kinds(65536, {65535: ["attention"]}), []),
    # a block number over 65535 lists only the blocks that hold tensors
    ("llama", {}, _blocks((1, "attn_q.weight"), (65536, "ffn_up.weight")), 65537,
     {1: ["attention"], 65536: ["dense_ffn"]}, ["a tensor name gives block number 65536 (more than 65536 blocks): "
                                                "only the blocks that hold tensors are listed"]),
    # nemotron_h_moe blocks after the per-layer arrays take their kinds from the tensors
    ("nemotron_h_moe", {"nemotron_h_moe.block_count": 2, "nemotron_h_moe.attention.head_count_kv": [0, 2],
                        "nemotron_h_moe.feed_forward_length": [0, 0]},
     [T("blk.2.ffn_up_exps.weight", (8, 16, 8), 1), T("blk.2.nextn.eh_proj.weight", (8, 8), 1)], 3,
     {0: ["recurrent"], 1: ["attention"], 2: ["moe"]},
     ["tensors name blocks up to 2 but nemotron_h_moe.block_count is 2"]),
    # without a block count the tensors size the arrays
    ("nemotron_h", {"nemotron_h.attention.head_count_kv": (0, 0), "nemotron_h.feed_forward_length": (0, 0)},
     _blocks(*SSM_ATTN), 2, {0: ["recurrent"], 1: ["recurrent"]}, []),
    # the per-layer arrays of other architectures are not read
    ("jamba", {"jamba.block_count": 2, "jamba.attention.head_count_kv": [0, 0], "jamba.feed_forward_length": [0, 0]},
     _blocks(*SSM_ATTN), 2, {0: ["recurrent"], 1: ["attention"]}, []),
    ("qwen3moe", {}, _blocks(*SSM_ATTN), 2, {0: ["recurrent"], 1: ["attention"]}, []),
] + [
    # the kinds of the tensor classes: a router without stacked experts still makes a MoE block; norms, shared
    # experts and other tensors make no kind
    ("llama", {}, _blocks(*((0, s) for s in suffixes)), 1, {0: kinds}, []) for suffixes, kinds in [
        (["attn_q.weight"], ["attention"]), (["ssm_in.weight"], ["recurrent"]), (["ffn_up_exps.weight"], ["moe"]),
        (["ffn_gate_inp.weight"], ["moe"]), (["ffn_up.weight"], ["dense_ffn"]),
        (["attn_norm.weight", "ffn_up_shexp.weight", "layer_output_scale.weight"], []),
        (["attn_q.weight", "ssm_in.weight", "ffn_gate_inp.weight", "ffn_up.weight"],
         ["attention", "dense_ffn", "moe", "recurrent"])]])
def test_the_block_count_and_the_block_kinds(arch, metadata, tensors, block_count, kinds, warnings):
    """The layer kinds list the blocks of each kind, in order."""
    layout = classify_model(arch, metadata, tensors)
    assert (layout.block_count, layout.block_kinds, layout.warnings) == (block_count, kinds, warnings)
    assert layout.layer_kinds == {k: [b for b in sorted(kinds) if k in kinds[b]] for k in BLOCK_KINDS}


def _nemotron(arch, layers, expert_count=8):
    """layers: (head_count_kv, feed_forward_length, tensor suffixes) per block."""
    tensors = [T("blk.%d.%s" % (i, s), (8, 8), 1) for i, (_kv, _ff, suffixes) in enumerate(layers) for s in suffixes]
    meta = {arch + ".block_count": len(layers),
            arch + ".attention.head_count_kv": [kv for kv, _ff, _s in layers],
            arch + ".feed_forward_length": [ff for _kv, ff, _s in layers],
            arch + ".expert_count": expert_count}
    return classify_model(arch, meta, tensors)


def test_nemotron_kinds_follow_llama_cpps_per_layer_rule():
    """src/models/nemotron-h.cpp load_arch_hparams: a layer is recurrent iff n_head_kv(i) == 0 and n_ff(i) == 0;
    a layer with KV heads is attention; one with an FFN length is MoE when it holds experts or a router, dense
    when it holds a dense FFN, and otherwise MoE iff the model has experts (load_arch_tensors: n_expert != 0).
    load_arch_tensors builds attention only where n_ff(i) == 0, and llama-model.cpp keeps a KV cache only for
    layers that are neither recurrent nor FFN: KV heads beside an FFN length do not make an attention block."""
    layers = [(0, 0, ["ssm_in.weight", "ffn_up.weight"]), (0, 1, ["ffn_up_exps.weight"]), (1, 0, ["ssm_in.weight"]),
              (0, 64, ["ffn_up.weight"]), (0, 64, ["ffn_gate_inp.weight", "ffn_up.weight"]), (0, 64, []),
              (0, 64, ["attn_norm.weight"]), (2, 64, ["ffn_up_exps.weight"]), (2, 64, ["ffn_up.weight"]),
              (2, 0, ["attn_q.weight"])]
    layout = _nemotron("nemotron_h_moe", layers)
    assert layout.block_kinds == {0: ["recurrent"], 1: ["moe"], 2: ["attention"], 3: ["dense_ffn"], 4: ["moe"],
                                  5: ["moe"], 6: ["moe"], 7: ["moe"], 8: ["dense_ffn"], 9: ["attention"]}
    assert layout.warnings == []
    layout = _nemotron("nemotron_h", layers, expert_count=0)
    assert layout.block_kinds[5] == ["dense_ffn"] and layout.block_kinds[1] == ["moe"]
    assert _nemotron("nemotron_h_moe", layers, expert_count=1).block_kinds[5] == ["moe"]


@pytest.mark.parametrize("head_count_kv, feed_forward_length", [
    (2, [0, 0, 0]), ([0, 2], [0, 0, 0]), ([0, 2, 0], [0, 0]), ([0, 2, 0, 0], [0, 0, 0, 0]), ([0, 2, "0"], [0, 0, 0]),
    ([0, 2, 0], None)])
def test_nemotron_without_usable_per_layer_arrays_falls_back_to_the_tensor_names(head_count_kv, feed_forward_length):
    """An array is used only when it has one int per block."""
    tensors = [T("blk.0.ssm_in.weight", (8, 8), 1), T("blk.1.ffn_up_exps.weight", (8, 16, 8), 1),
               T("blk.2.attn_q.weight", (8, 8), 1)]
    meta = {"nemotron_h_moe.block_count": 3, "nemotron_h_moe.attention.head_count_kv": head_count_kv}
    if feed_forward_length is not None:
        meta["nemotron_h_moe.feed_forward_length"] = feed_forward_length
    layout = classify_model("nemotron_h_moe", meta, tensors)
    assert layout.block_kinds == {0: ["recurrent"], 1: ["moe"], 2: ["attention"]}
    assert layout.warnings == ["nemotron_h_moe without per-layer head_count_kv / feed_forward_length arrays: block "
                               "kinds taken from tensor names"]
