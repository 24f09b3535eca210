"""What a given pattern moves of a model (plugins/module_utils/_pattern_check.py): the routed experts matched and
missed, the other tensors moved by class, and the verdict, each with its exact text. A pattern is read as llama.cpp
reads it (src/llama-model-loader.cpp ``create_tensor``: ``std::regex_search`` on the tensor name)."""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._pattern_check import check_pattern
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._pattern_syntax import pattern_problem
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._tensor_classes import classify_tensor
from tests.helpers.tensor_names import (
    ARCH_SUFFIXES,
    matches,
    model_names,
    nemotron_names,
    qwen3moe_names,
    random_models,
)


def test_check_pattern_reports_missed_experts_and_moved_non_experts():
    names, experts = qwen3moe_names(range(2))
    classes = {"blk.0.ffn_gate_inp.weight": "router"}
    assert check_pattern(r"blk\.0\.ffn_(gate|up|down)", names, experts, classes) == {
        "pattern": r"blk\.0\.ffn_(gate|up|down)", "ok": False,
        "matched": ["blk.0.ffn_down_exps.weight", "blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight"],
        "missed": ["blk.1.ffn_down_exps.weight", "blk.1.ffn_gate_exps.weight", "blk.1.ffn_up_exps.weight"],
        "non_expert": [{"tensor": "blk.0.ffn_gate_inp.weight", "class": "router"}],
        "verdict": "wrong: misses 3 of the 6 routed-expert tensors (e.g. blk.1.ffn_down_exps.weight); also moves "
                   "1 non-expert tensor(s): 1 router (e.g. blk.0.ffn_gate_inp.weight)"}
    # experts missing from the tensor list count as matched
    result = check_pattern(r"\.ffn_.*_exps\.weight", ["blk.0.attn_q.weight"], ["blk.0.ffn_up_exps.weight"], {})
    assert result["ok"] is True and result["matched"] == ["blk.0.ffn_up_exps.weight"]


def test_check_pattern_counts_moved_tensors_by_class_in_class_order():
    """Classes are counted and named with spaces for underscores; a tensor without a class is 'other'."""
    names, experts = qwen3moe_names(range(2))
    names += ["blk.0.ffn_up_shexp.weight"]
    classes = {"blk.0.attn_norm.weight": "norm", "blk.1.attn_norm.weight": "norm", "output_norm.weight": "norm",
               "blk.0.ffn_up_shexp.weight": "shared_experts"}
    result = check_pattern("norm|ffn_up_", names, experts, classes)
    assert result["ok"] is False
    assert result["missed"] == ["blk.0.ffn_down_exps.weight", "blk.0.ffn_gate_exps.weight",
                                "blk.1.ffn_down_exps.weight", "blk.1.ffn_gate_exps.weight"]
    assert result["non_expert"] == [
        {"tensor": "blk.0.attn_norm.weight", "class": "norm"},
        {"tensor": "blk.0.ffn_up_shexp.weight", "class": "shared_experts"},
        {"tensor": "blk.1.attn_norm.weight", "class": "norm"},
        {"tensor": "output_norm.weight", "class": "norm"}]
    assert result["verdict"] == (
        "wrong: misses 4 of the 6 routed-expert tensors (e.g. blk.0.ffn_down_exps.weight); also moves 4 non-expert "
        "tensor(s): 3 norm, 1 shared experts (e.g. blk.0.attn_norm.weight)")
    assert check_pattern("token", names, experts, {})["non_expert"] == [{"tensor": "token_embd.weight",
                                                                         "class": "other"}]


def test_check_pattern_on_a_model_without_routed_experts():
    names = ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_up.weight", "blk.1.ffn_up.weight"]
    assert check_pattern("exps", names, [], {}) == {
        "pattern": "exps", "ok": True, "matched": [], "missed": [], "non_expert": [],
        "verdict": "ok: the model has no routed experts and the pattern moves nothing"}
    classes = {"blk.0.ffn_up.weight": "dense_ffn", "blk.1.ffn_up.weight": "dense_ffn"}
    result = check_pattern("ffn_up", names, [], classes)
    assert result["ok"] is False
    assert result["verdict"] == ("wrong: the model has no routed experts, yet the pattern moves 2 non-expert "
                                 "tensor(s): 2 dense ffn (e.g. blk.0.ffn_up.weight)")


@pytest.mark.parametrize("pattern, problem", [
    ("", "the pattern is empty"), (None, "the pattern is empty"), ("exps=CPU", pattern_problem("exps=CPU")),
    ("a++", "possessive quantifiers ('*+', '++', '?+') are not ECMAScript std::regex syntax"),
    ("ffn_(up", pattern_problem("ffn_(up")),
])
def test_check_pattern_with_a_pattern_that_cannot_be_deployed(pattern, problem):
    """Never raises, also for a pattern Python cannot read: every expert is missed."""
    names, experts = qwen3moe_names(range(1))
    assert check_pattern(pattern, names, experts, {}) == {
        "pattern": pattern, "ok": False, "matched": [], "missed": sorted(experts), "non_expert": [],
        "verdict": "unusable: " + problem}


# ---- on Nemotron-3-Nano-30B-A3B and on models of llama.cpp's naming conventions ----


def test_check_pattern_on_nemotron_nano_seed_exp_and_blk1_trap_and_on_gpt_oss_missed_biases():
    names, layout = nemotron_names()
    assert len(layout.expert_tensors) == 46
    assert check_pattern(r"\.ffn_.*_exps\.weight", names, layout.expert_tensors, layout.tensor_class) == {
        "pattern": r"\.ffn_.*_exps\.weight", "ok": True, "matched": sorted(layout.expert_tensors), "missed": [],
        "non_expert": [], "verdict": "ok: moves exactly the 46 routed-expert tensors and nothing else"}
    assert check_pattern("exp", names, layout.expert_tensors, layout.tensor_class)["verdict"] == (
        "wrong: also moves 69 non-expert tensor(s): 23 router, 46 shared experts (e.g. blk.1.exp_probs_b.bias)")
    result = check_pattern(r"blk\.1.*_exps", names, layout.expert_tensors, layout.tensor_class)
    assert set(result["matched"]) == {n for n in layout.expert_tensors if re.match(r"blk\.1[0-9]?\.", n)}
    assert result["missed"] and not result["ok"]
    names, experts = model_names(range(2), ARCH_SUFFIXES["gpt_oss"][0])
    result = check_pattern(r"\.ffn_.*_exps\.weight", names, experts, {})
    assert sorted(result["missed"]) == sorted(n for n in experts if n.endswith(".bias"))
    assert result["verdict"] == "wrong: misses 6 of the 12 routed-expert tensors (e.g. blk.0.ffn_down_exps.bias)"


@settings(max_examples=150, deadline=None)
@given(random_models(), st.text(alphabet="abcfnpx_.*()|[]0-9\\,=?+", max_size=12))
def test_property_check_pattern_never_raises(names, pattern):
    experts = [n for n in names if classify_tensor(n) == "routed_experts"]
    result = check_pattern(pattern, names, experts, {n: classify_tensor(n) for n in names})
    assert set(result) >= {"ok", "matched", "missed", "non_expert", "verdict"}
    assert set(result["matched"]) | set(result["missed"]) == set(experts)
    if result["ok"]:
        assert matches(pattern, names) == set(experts)
