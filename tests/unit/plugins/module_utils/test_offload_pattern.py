"""The offload pattern: built, proved, checked (plugins/module_utils/_offload_pattern.py)."""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._gguf import read_model
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_pattern import (
    MAX_ARG_STRLEN,
    MAX_PATTERN_BYTES,
    PatternError,
    block_expert_pattern,
    block_numbers_regex,
    check_pattern,
    expert_pattern,
    matcher,
    pattern_problem,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import block_index
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._tensor_classes import (
    classify_model,
    classify_tensor,
)
from test_tensor_classes import nemotron_nano  # pylint: disable=import-error
from tools.gguf_models import write_model

# Only what Python re and ECMAScript std::regex read alike, and nothing llama.cpp splits on.
PORTABLE = re.compile(r"^([A-Za-z0-9_:/ -]|\\[.()\[\]|*+?^$\\]|[.*+?|()^$]|\[[0-9-]+\])*$")


def matches(pattern, names):
    regex = re.compile(pattern)
    return {n for n in names if regex.search(n)}


def assert_proved(pattern, names, wanted):
    assert pattern_problem(pattern) is None, pattern
    assert "," not in pattern and "=" not in pattern and "{" not in pattern and "\\d" not in pattern
    assert PORTABLE.match(pattern), pattern
    assert matches(pattern, names) == set(wanted), pattern


def nemotron_names():
    metadata, tensors = nemotron_nano()
    layout = classify_model("nemotron_h_moe", metadata, tensors)
    return [t.name for t in tensors], layout


def test_nemotron_nano_gets_the_canonical_pattern_with_46_matches():
    names, layout = nemotron_names()
    pattern = expert_pattern(names, layout.expert_tensors)
    assert pattern == r"\.ffn_.*_exps\.weight"
    assert len(matches(pattern, names)) == 46
    assert_proved(pattern, names, layout.expert_tensors)


def _model(blocks, suffixes, extra=()):
    names = ["token_embd.weight", "output.weight", "output_norm.weight"] + list(extra)
    for i in blocks:
        names += ["blk.%d.%s" % (i, s) for s in suffixes]
    experts = [n for n in names if classify_tensor(n) == "routed_experts"]
    return names, experts


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
    "old_mixtral": (["ffn_gate_inp.weight"] + ["ffn_%s.%d.weight" % (p, e) for p in ("gate", "up", "down") for e in range(8)],
                    r"\.ffn_(down|gate|up)\.[0-9]+\.weight$"),
}


@pytest.mark.parametrize("arch", sorted(ARCH_SUFFIXES))
def test_pattern_per_architecture(arch):
    suffixes, expected = ARCH_SUFFIXES[arch]
    names, experts = _model(range(12), suffixes)
    assert experts
    pattern = expert_pattern(names, experts)
    assert pattern == expected
    assert_proved(pattern, names, experts)


def test_no_experts_gives_an_empty_pattern():
    names, experts = _model(range(3), ["attn_q.weight", "ffn_up.weight"])
    assert experts == []
    assert expert_pattern(names, experts) == ""
    assert block_expert_pattern(names, experts, [0, 1]) == ""


def test_a_name_that_defeats_every_convention_still_gets_an_exact_pattern():
    """A tensor named like an expert but not one (by the caller's classes): explicit alternation."""
    names = ["blk.0.ffn_up_exps.weight", "blk.1.ffn_up_exps.weight", "blk.0.attn_q.weight"]
    pattern = expert_pattern(names, ["blk.0.ffn_up_exps.weight"])
    assert_proved(pattern, names, ["blk.0.ffn_up_exps.weight"])


def test_names_with_comma_or_equals_are_matched_without_those_characters():
    names = ["blk.0.ffn_up_exps.weight", "blk.0.ffn_up_exps.a=b", "blk.0.ffn_x,y.weight"]
    wanted = ["blk.0.ffn_up_exps.a=b", "blk.0.ffn_x,y.weight"]
    assert_proved(expert_pattern(names, wanted), names, wanted)


def test_unknown_expert_names_are_an_error():
    with pytest.raises(PatternError):
        expert_pattern(["a"], ["b"])


@pytest.mark.parametrize("blocks, expected", [
    ({20, 21, 22, 23, 24, 25, 26, 27, 28, 29}, "2[0-9]"),
    (set(range(20, 52)), "([2-4][0-9]|5[01])"),
    ({1, 2, 20, 21}, "([12]|2[01])"),
    ({0, 1, 2, 3, 5, 7, 8, 9}, "[0-357-9]"),
    ({7}, "7"),
    ({1, 10, 100}, "(1|10|100)"),
])
def test_block_numbers_regex(blocks, expected):
    regex = block_numbers_regex(blocks)
    assert regex == expected
    assert {n for n in range(1000) if re.fullmatch(regex, str(n))} == blocks


def test_block_pattern_avoids_the_blk1_blk10_trap():
    names, layout = nemotron_names()
    pattern = block_expert_pattern(names, layout.expert_tensors, [1])
    assert pattern == r"blk\.1\.ffn_.*_exps\.weight"
    assert matches(pattern, names) == {"blk.1.ffn_up_exps.weight", "blk.1.ffn_down_exps.weight"}


def test_block_pattern_for_the_planners_range():
    names, layout = nemotron_names()
    blocks = range(20, 52)
    wanted = [n for n in layout.expert_tensors if block_index(n) >= 20]
    pattern = block_expert_pattern(names, layout.expert_tensors, blocks)
    assert pattern.startswith(r"blk\.(")
    assert_proved(pattern, names, wanted)
    assert block_expert_pattern(names, layout.expert_tensors, range(52)) == r"\.ffn_.*_exps\.weight"
    assert block_expert_pattern(names, layout.expert_tensors, [0, 2]) == ""  # Mamba blocks: no experts


def test_check_pattern_good_seed_pattern():
    names, layout = nemotron_names()
    result = check_pattern(r"\.ffn_.*_exps\.weight", names, layout.expert_tensors, layout.tensor_class)
    assert result["ok"] is True
    assert len(result["matched"]) == 46 and result["missed"] == [] and result["non_expert"] == []
    assert result["verdict"].startswith("ok")


def test_check_pattern_exp_catches_shared_experts_and_router_bias():
    names, layout = nemotron_names()
    result = check_pattern("exp", names, layout.expert_tensors, layout.tensor_class)
    assert result["ok"] is False
    classes = {item["class"] for item in result["non_expert"]}
    assert classes == {"shared_experts", "router"}
    assert {"tensor": "blk.1.exp_probs_b.bias", "class": "router"} in result["non_expert"]
    assert "shared experts" in result["verdict"] and "router" in result["verdict"]


def test_check_pattern_ffn_catches_the_router():
    names, layout = nemotron_names()
    result = check_pattern(r"ffn_.*", names, layout.expert_tensors, layout.tensor_class)
    assert not result["ok"]
    assert {"tensor": "blk.1.ffn_gate_inp.weight", "class": "router"} in result["non_expert"]


def test_check_pattern_blk1_trap_and_missed_biases():
    names, layout = nemotron_names()
    result = check_pattern(r"blk\.1.*_exps", names, layout.expert_tensors, layout.tensor_class)
    assert set(result["matched"]) == {n for n in layout.expert_tensors if re.match(r"blk\.1[0-9]?\.", n)}
    assert result["missed"] and not result["ok"]
    names, experts = _model(range(2), ARCH_SUFFIXES["gpt_oss"][0])
    result = check_pattern(r"\.ffn_.*_exps\.weight", names, experts, {})
    assert sorted(result["missed"]) == sorted(n for n in experts if n.endswith(".bias"))
    assert "misses 6 of the 12" in result["verdict"]


@pytest.mark.parametrize("pattern, reason", [
    (r"\.ffn_.*_exps\.weight=CPU", "'='"),
    (r"blk\.[0-9]{1,2}\.ffn", "','"),
    (r"(?<!x)blk\.ffn", "lookbehind"),
    (r"ffn_(up", "not a valid regular expression"),
    (r"blk\.[[0-9]]\.ffn_.*_exps", "may read it differently: Possible nested set"),
    ("", "empty"),
])
def test_check_pattern_unusable_patterns_do_not_crash(pattern, reason):
    names, layout = nemotron_names()
    result = check_pattern(pattern, names, layout.expert_tensors, layout.tensor_class)
    assert result["ok"] is False
    assert result["verdict"].startswith("unusable") and reason in result["verdict"]
    assert len(result["missed"]) == 46


def test_check_pattern_on_a_dense_model():
    names, experts = _model(range(2), ["attn_q.weight", "ffn_up.weight"])
    assert check_pattern("exps", names, experts, {})["ok"] is True
    result = check_pattern("ffn_up", names, experts, {n: classify_tensor(n) for n in names})
    assert not result["ok"] and "dense ffn" in result["verdict"]


# ---- properties: random models that follow llama.cpp's naming conventions ----

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


@settings(max_examples=150, deadline=None)
@given(random_models())
def test_property_pattern_matches_exactly_the_experts(names):
    experts = [n for n in names if classify_tensor(n) == "routed_experts"]
    assert_proved(expert_pattern(names, experts), names, experts)


@settings(max_examples=150, deadline=None)
@given(random_models(), st.data())
def test_property_block_pattern_matches_exactly_those_blocks(names, data):
    experts = [n for n in names if classify_tensor(n) == "routed_experts"]
    all_blocks = sorted({block_index(n) for n in names if block_index(n) is not None})
    chosen = data.draw(st.sets(st.sampled_from(all_blocks)))
    wanted = [n for n in experts if block_index(n) in chosen]
    pattern = block_expert_pattern(names, experts, chosen)
    if not wanted:
        assert pattern == ""
    else:
        assert_proved(pattern, names, wanted)


@settings(max_examples=150, deadline=None)
@given(random_models(), st.text(alphabet="abcfnpx_.*()|[]0-9\\,=?+", max_size=12))
def test_property_check_pattern_never_raises(names, pattern):
    experts = [n for n in names if classify_tensor(n) == "routed_experts"]
    result = check_pattern(pattern, names, experts, {n: classify_tensor(n) for n in names})
    assert set(result) >= {"ok", "matched", "missed", "non_expert", "verdict"}
    assert set(result["matched"]) | set(result["missed"]) == set(experts)
    if result["ok"]:
        assert matches(pattern, names) == set(experts)


# ---- real GGUF files of every architecture, written with gguf-py and read with our reader ----

EXPS_W, EXPS, CH = r"\.ffn_.*_exps\.weight", r"\.ffn_.*_exps\.", r"\.ffn_.*_(ch)?exps\.weight"
REAL_MODELS = {
    # kind: (architecture, layer kinds (empty ones left out), expert tensors, (count, used, shared), pattern)
    "nemotron_h_moe": ("nemotron_h_moe", {"attention": [3], "recurrent": [0, 2], "moe": [1, 4]}, 4, (8, 2, 1), EXPS_W),
    "nemotron_h": ("nemotron_h", {"attention": [3], "recurrent": [0, 2], "dense_ffn": [1, 4]}, 0, (0, 0, 0), ""),
    "qwen3moe": ("qwen3moe", {"attention": [0, 1], "moe": [0, 1]}, 6, (8, 2, 0), EXPS_W),
    "qwen2moe": ("qwen2moe", {"attention": [0, 1, 2], "moe": [0, 1, 2]}, 9, (8, 2, 1), EXPS_W),
    "mixtral": ("llama", {"attention": [0, 1, 2], "moe": [0, 1, 2]}, 9, (8, 2, 0), EXPS_W),
    "deepseek2": ("deepseek2", {"attention": [0, 1, 2, 3], "moe": [1, 2, 3], "dense_ffn": [0]}, 9, (16, 4, 1), EXPS_W),
    "gpt-oss": ("gpt-oss", {"attention": [0, 1], "moe": [0, 1]}, 12, (8, 4, 0), EXPS),
    "fused_gate_up": ("qwen3moe", {"attention": [0, 1], "moe": [0, 1]}, 4, (8, 2, 0), EXPS_W),
    "chexps": ("grovemoe", {"attention": [0, 1], "moe": [0, 1]}, 12, (16, 4, 0), CH),
    "unknown_moe": ("mymoe", {"attention": [0, 1, 2], "moe": [0, 1, 2]}, 9, (8, 2, 1), EXPS_W),
    "dense_llama": ("llama", {"attention": [0, 1], "dense_ffn": [0, 1]}, 0, (0, 0, 0), ""),
}


@pytest.mark.parametrize("endian", ["little", "big"])
@pytest.mark.parametrize("kind", sorted(REAL_MODELS))
def test_real_model_files(tmp_path, kind, endian):
    arch, kinds, n_experts, counts, expected = REAL_MODELS[kind]
    model = read_model(write_model(kind, tmp_path / (kind + ".gguf"), endian=endian))
    layout = classify_model(model.architecture, model.metadata, model.tensors)
    names = [t.name for t in model.tensors]
    assert layout.architecture == arch
    assert {k: v for k, v in layout.layer_kinds.items() if v} == kinds
    assert len(layout.expert_tensors) == n_experts
    assert (layout.expert_count, layout.expert_used_count, layout.expert_shared_count) == counts
    assert sum(layout.bytes_by_class.values()) == sum(t.nbytes for t in model.tensors)
    assert layout.warnings == []
    pattern = expert_pattern(names, layout.expert_tensors)
    assert pattern == expected
    if n_experts:
        assert_proved(pattern, names, layout.expert_tensors)
    if kind == "gpt-oss":
        assert any(n.endswith("_exps.bias") for n in layout.expert_tensors)
        assert {t.type_name.lower() for t in model.tensors if layout.tensor_class[t.name] == "routed_experts"
                and t.name.endswith(".weight")} == {"mxfp4"}
    if kind == "deepseek2":
        assert {layout.tensor_class[n] for n in names if "exp_probs_b" in n} == {"router"}
        assert layout.bytes_by_class["shared_experts"] > 0


# ---- crafted tensor names, the length bound and what llama.cpp's std::regex reads ----

CRAFTED = ["\n", "'", "${HOME}", "`id`", ",", "=", '"', "\\", "\r", "\u00e9", "$", "{1,3}"]


@pytest.mark.parametrize("odd", CRAFTED)
def test_a_pattern_built_from_crafted_names_passes_the_same_check_as_a_users(odd):
    """The names of a crafted model hold a newline, a quote, ${, a backtick, ',' or '=': the pattern that names them
    passes pattern_problem() (the check a user's pattern gets) and matches exactly them, read as std::regex does."""
    names = ["blk.0.ffn_up_exps.w%sx" % odd, "blk.0.ffn_up_exps.w.x", "blk.0.attn_q.weight", "blk.1.ffn_up_exps.w%sx" % odd]
    for wanted in (names[:1], [names[0], names[3]], [names[1]]):
        pattern = expert_pattern(names, wanted)
        assert pattern_problem(pattern) is None, pattern
        assert {n for n in names if matcher(pattern)(n)} == set(wanted), pattern
        for bad in ("\n", "\r", "'", '"', "`", "${", "\\\\", ",", "="):
            assert bad not in pattern, (bad, pattern)
    pattern = block_expert_pattern(names, [names[0], names[3]], [1])
    assert pattern_problem(pattern) is None and {n for n in names if matcher(pattern)(n)} == {names[3]}


@pytest.mark.parametrize("pattern, reason", [
    ("blk\\.1\n", "the character '\\n' (U+000A)"),
    ("a'b", "single quote"), ('a"b', "double quote"), ("a`id`", "backtick"), ("a${HOME}", "'${'"),
    ("a\\\\b", "'\\\\'"), ("caf\u00e9", "U+00E9"), ("a\x00", "U+0000"),
    ("[]a", "'[]' and '[^]'"), ("a[^]", "'[]' and '[^]'"), ("a*+", "possessive"), ("(?>a)", "atomic"),
    ("(" * 65 + "a" + ")" * 65, "nested more than 64 deep"), ("(" * 2000 + "a" + ")" * 2000, "nested more than"),
])
def test_pattern_problem_refuses_what_cannot_be_deployed(pattern, reason):
    assert reason in pattern_problem(pattern)
    assert pattern_problem("(" * 64 + "a" + ")" * 64) is None and pattern_problem("[((]" * 100) is None


def test_the_length_bound_is_said_and_derived_patterns_over_it_are_refused():
    assert pattern_problem("a" * MAX_PATTERN_BYTES) is None
    problem = pattern_problem("a" * (MAX_PATTERN_BYTES + 1))
    assert problem.startswith("it is %d bytes long and at most %d are deployed" % (MAX_PATTERN_BYTES + 1,
                                                                                   MAX_PATTERN_BYTES))
    assert "std::regex" in problem and str(MAX_ARG_STRLEN) in problem
    # every other expert of 6000 blocks with irregular names: no convention is exact, the list is too long
    names = ["blk.%d.ffn_up_exps.w%d" % (b, b * 7919 % 10007) for b in range(6000)]
    with pytest.raises(PatternError, match="list of their names would be [0-9]+ bytes, more than the %d deployed"
                       % MAX_PATTERN_BYTES):
        expert_pattern(names, names[::2])
    names = ["blk.%d.ffn_up_exps.weight" % b for b in range(3000)]
    # a shorter irregular list is spelled out, prefix-factored
    pattern = expert_pattern(names[:40], names[:40:3])
    assert pattern == r"^blk\.(0|1[258]|2[147]|3[0369]|[369])\.ffn_up_exps\.weight$" or len(pattern) < 120, pattern
    assert {n for n in names if matcher(pattern)(n)} == set(names[:40:3])


def test_names_longer_than_llama_cpp_loads_are_refused_by_name():
    long_name = "blk.0.ffn_up_exps." + "w" * 300
    names = [long_name, "blk.0.ffn_up_exps.x", "blk.1.ffn_up_exps.x"]
    with pytest.raises(PatternError, match="the tensor name 'blk.0.ffn_up_exps.wwww.* is 318 characters long"):
        expert_pattern(names, [long_name, names[2]])


def test_the_proof_reads_dot_and_dollar_as_ecmascript_does():
    """Python's '$' also matches before a final newline and '.' matches '\\r'; std::regex (ECMAScript) does not."""
    assert re.search(r"weight$", "w.weight\n") and not matcher(r"weight$")("w.weight\n")
    assert re.search(r"a.b", "a\rb") and not matcher(r"a.b")("a\rb")
    assert matcher(r"a.b")("a\tb") and matcher(r"\x0a")("\n") and matcher(r"[.]")(".")
    assert matcher(r"^caf.$")("caf\u00e9") is False and matcher(r"^caf..$")("caf\u00e9")  # bytes, as std::regex<char>
    names = ["blk.0.ffn_up_exps.weight", "blk.0.ffn_up_exps.weight\n"]
    pattern = expert_pattern(names, names[:1])
    assert {n for n in names if matcher(pattern)(n)} == {names[0]}


def test_the_builder_tries_a_fixed_number_of_candidates_whatever_the_tensor_count(monkeypatch):
    """Linear in the tensor count: each candidate costs one search per name, and their number does not grow."""
    from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _offload_pattern
    tried = []
    original = _offload_pattern._Proof.exact
    monkeypatch.setattr(_offload_pattern._Proof, "exact", lambda self, p: tried.append(p) or original(self, p))
    counts = []
    for blocks in (100, 3000):
        experts = ["blk.%d.ffn_%s_exps.weight" % (b, k) for b in range(blocks) for k in ("up", "down")]
        names = experts + ["x" + n for n in experts]  # every expert has a non-expert twin
        del tried[:]
        assert expert_pattern(names, experts) == r"^blk\.[0-9]+\.ffn_.*_exps\.weight"
        counts.append(len(tried))
    assert counts[0] == counts[1] < 20
