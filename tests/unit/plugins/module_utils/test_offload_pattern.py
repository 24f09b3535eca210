"""The offload pattern (plugins/module_utils/_offload_pattern.py): built and proved. The block-number regexes, the
prefix-factored list of names and its limits, the candidates tried, and the patterns built for real models, each
deployable (``_pattern_syntax.pattern_problem``) and matching exactly the wanted tensors.

llama.cpp keeps the first override whose ``std::regex_search`` finds the tensor name (src/llama-model-loader.cpp),
where an unescaped ``.`` matches any character: a name that differs from an expert tensor's only where the
expert's has a dot would be moved too. Its own routed-expert pattern is ``\\.ffn_(up|down|gate|gate_up)_(ch|)exps``
(common/common.h ``LLM_FFN_EXPS_REGEX``). Tensor names are llama.cpp's (src/llama-arch.cpp ``LLM_TENSOR_NAMES``)."""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import block_index
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_pattern import (
    _candidates,
    _derived_candidates,
    _factored,
    _stem,
    block_expert_pattern,
    block_numbers_regex,
    expert_pattern,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._pattern_syntax import (
    PatternError,
    matcher,
    pattern_problem,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._tensor_classes import classify_model, classify_tensor
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.model import read_model
from tests.helpers.tensor_names import (
    ARCH_SUFFIXES,
    full,
    matches,
    model_names,
    nemotron_names,
    qwen3moe_names,
    random_models,
)
from tools.gguf_models import write_model


TOO_DEEP = "its groups are nested more than 64 deep (std::regex compiles each level recursively)"


@pytest.mark.parametrize("blocks, expected", [
    ({0, 1}, "[01]"), ({0, 1, 2}, "[0-2]"), ({0, 2}, "[02]"), ({0, 1, 3, 4}, "[0134]"),
    ({0, 1, 2, 4, 5, 6}, "[0-24-6]"), ({10, 11}, "1[01]"), ({10, 11, 20, 21}, "[12][01]"),
    ({10, 11, 20, 21, 35}, "([12][01]|35)"), ({15, 20, 21, 30, 31}, "(15|[23][01])"), ({3, 12}, "(3|12)"),
    ({100, 101, 110, 111}, "1[01][01]"), ({9, 10, 99, 100}, "(9|10|99|100)"), (set(range(20, 30)), "2[0-9]"),
    (set(range(20, 52)), "([2-4][0-9]|5[01])"), ({1, 2, 20, 21}, "([12]|2[01])"),
    ({0, 1, 2, 3, 5, 7, 8, 9}, "[0-357-9]"), ({7}, "7"), ({1, 10, 100}, "(1|10|100)"),
    (["3", 3, "4"], "[34]"),  # numbers as strings, repeats ignored
])
def test_block_numbers_regex_matches_exactly_the_numbers(blocks, expected):
    """Digit runs of three or more are ranges, shorter ones are listed; numbers of different lengths are
    alternatives, shortest first; same-length numbers that share their last digits are grouped."""
    regex = block_numbers_regex(blocks)
    assert regex == expected
    assert {n for n in range(1000) if re.fullmatch(regex, str(n))} == {int(b) for b in blocks}


FACTORED_CASES = [
    # words, near misses (none of them is a word)
    (["a"], ["", "aa", "b"]),
    (["a", "aa"], ["", "aaa", "b", "ab", "ba"]),
    (["ab", "abcd"], ["a", "abc", "abd", "abcde", "abdc", "b", "cd"]),
    (["a", "ab", "ac"], ["", "b", "abc", "ad", "aab"]),
    (["a", "ba", "cba"], ["", "b", "aa", "ca", "bba", "dcba", "cb"]),
    (["ab", "cd"], ["ad", "cb", "abcd", "a", "d"]),
    (["", "a"], ["aa", "b"]),
    (["abc", "xbc"], ["bc", "c", "abcbc", "xabc", "ybc"]),
    (["blk.1.a", "blk.1.b", "blk.2.a"], ["blk.2.b", "blk.1.", "blk.1.ab", "blkx1.a", "blk.12.a", "blk.1"]),
    (["blk.1.ffn_up_exps.weight", "blk.20.ffn_up_exps.weight", "blk.25.ffn_up_exps.weight"],
     ["blk.2.ffn_up_exps.weight", "blk.21.ffn_up_exps.weight", "blk.10.ffn_up_exps.weight",
      "blk.250.ffn_up_exps.weight", "blk.1.ffn_up_exps.weigh", "blk.1.ffn_up_exps.weightt",
      "blk.1.ffn_down_exps.weight", "blk.1xffn_up_exps.weight", ".ffn_up_exps.weight"]),
    (["blk.0.ffn_up_exps.weight", "blk.0.ffn_up_exps.bias", "blk.0.ffn_gate_up_exps.weight"],
     ["blk.0.ffn_up_exps.", "blk.0.ffn_gate_up_exps.bias", "blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps"]),
    (["a,b", "a=b"], ["a.b", "a;b", "axb", "a,=b"]),
    (["x=1", "y=1"], ["x;1", "x.1", "=1", "xy=1"]),
    (["blk.0.ffn_up_exps.w\nx", "blk.0.ffn_up_exps.w'x", "blk.0.ffn_up_exps.w\u00e9x"],
     ["blk.0.ffn_up_exps.w\rx", "blk.0.ffn_up_exps.w.x", "blk.0.ffn_up_exps.w\u00e8x", "blk.0.ffn_up_exps.wx"]),
    (["blk.0.ffn_up_exps.w${x}", "blk.0.ffn_up_exps.w\\x"], ["blk.0.ffn_up_exps.w$x", "blk.0.ffn_up_exps.w\\\\x"]),
]


@pytest.mark.parametrize("words, near_misses", FACTORED_CASES)
def test_factored_matches_each_word_and_no_near_miss(words, near_misses):
    """Words that are prefixes or suffixes of each other, share a prefix or a suffix, or hold characters that
    must be escaped: the anchored pattern matches each word and nothing else, and is deployable."""
    pattern = _factored(words)
    search = full(pattern)
    assert all(search(w) for w in words), pattern
    assert [w for w in near_misses if search(w)] == [], pattern
    assert pattern_problem("^" + pattern + "$") is None


def test_factored_matches_exactly_some_blocks_experts_among_every_blocks():
    kinds = ("gate", "up", "down", "gate_up")
    every = ["blk.%d.ffn_%s_exps.weight" % (b, k) for b in range(120) for k in kinds]
    words = [n for i, n in enumerate(every) if i % 7 in (0, 3)]
    search = full(_factored(words))
    assert {n for n in every if search(n)} == set(words)


@pytest.mark.parametrize("words, pattern", [
    ([], ""),
    (["blk.1.a", "blk.1.b", "blk.2.a"], r"blk\.(1\.(a|b)|2\.a)"),  # the module's own example
    (["blk.2.a", "blk.1.b", "blk.1.a", "blk.1.a", "blk.1.b", "blk.2.a"], r"blk\.(1\.(a|b)|2\.a)"),
    # the suffix all words share is written once, at the end
    (["blk.1.ffn_up_exps.weight", "blk.2.ffn_up_exps.weight"], r"blk\.(1|2)\.ffn_up_exps\.weight"),
    (["blk.1.ffn_up_exps.weight", "blk.20.ffn_up_exps.weight", "blk.25.ffn_up_exps.weight"],
     r"blk\.(1|2(0|5))\.ffn_up_exps\.weight"),
])
def test_factored_writes_common_prefixes_and_the_common_suffix_once_whatever_the_order(words, pattern):
    assert _factored(words) == pattern


def test_candidates_are_the_conventions_then_those_derived_from_the_names():
    """The first is llama.cpp's documented seed pattern; the derived ones name the parts, then the suffixes, then
    every stem (the name after the block prefix)."""
    assert _stem("blk.12.ffn_up_exps.weight") == "ffn_up_exps.weight"
    assert _stem("output.weight") == "output.weight"
    assert _stem("v.blk.1.ffn_up.weight") == "v.blk.1.ffn_up.weight"
    wanted = {"blk.0.ffn_up_exps.weight", "blk.3.ffn_down_chexps.bias"}
    assert list(_candidates(wanted)) == [
        r"\.ffn_.*_exps\.weight", r"\.ffn_.*_exps\.", r"\.ffn_.*_(ch)?exps\.weight", r"\.ffn_.*_(ch)?exps\.",
        r"_(ch)?exps\.", r"\.ffn_(down|up)_(ch)?exps\.", r"\.ffn_(down|up)_(ch)?exps\.(bias|weight)$",
        r"\.(ffn_down_chexps\.bias|ffn_up_exps\.weight)$",
    ]


@pytest.mark.parametrize("wanted, expected", [
    ({"blk.0.ffn_up_exps.weight", "blk.1.ffn_up_exps.weight"},
     [r"\.ffn_up_exps\.", r"\.ffn_up_exps\.weight$", r"\.ffn_up_exps\.weight$"]),
    ({"blk.0.ffn_up_chexps.weight", "blk.0.ffn_gate_up_chexps.weight"},
     [r"\.ffn_(gate_up|up)_chexps\.", r"\.ffn_(gate_up|up)_chexps\.weight$",
      r"\.(ffn_gate_up_chexps\.weight|ffn_up_chexps\.weight)$"]),
    ({"blk.0.ffn_gate.0.weight", "blk.0.ffn_up.7.weight"},
     [r"\.ffn_(gate|up)\.[0-9]+\.weight$", r"\.(ffn_gate\.0\.weight|ffn_up\.7\.weight)$"]),
    ({"blk.0.ffn_up_exps.weight", "blk.0.ffn_up.0.weight"}, [r"\.(ffn_up\.0\.weight|ffn_up_exps\.weight)$"]),
    ({"blk.0.ffn_up_exps.a=b"}, [r"\.ffn_up_exps\.", r"\.ffn_up_exps\.a.b$", r"\.ffn_up_exps\.a.b$"]),
    # the list of stems only under the length limit
    ({"blk.0." + "a" * 16383}, [r"\." + "a" * 16383 + "$"]), ({"blk.0." + "a" * 16384}, []),
])
def test_derived_candidates(wanted, expected):
    """Stacked experts (ffn_<part>_(ch)exps.<suffix>), the old one-tensor-per-expert layout
    (ffn_<part>.<expert>.<suffix>), and a mix of both that only the list of stems describes."""
    assert list(_derived_candidates(wanted)) == expected


def test_expert_names_missing_from_the_model_are_named_five_at_most():
    unknown = ["blk.%d.ffn_up_exps.weight" % b for b in range(6)]
    message = "^expert tensors not among the model's tensors: %s$" % re.escape(", ".join(sorted(unknown)[:5]))
    with pytest.raises(PatternError, match=message):
        expert_pattern(["blk.0.attn_q.weight"], unknown)
    with pytest.raises(PatternError, match=message):
        block_expert_pattern(["blk.0.attn_q.weight"], unknown, [0])


@pytest.mark.parametrize("count, others, blocks, pattern", [
    (3, [], [0, 1, 2, 7], r"\.ffn_.*_exps\.weight"),  # every expert block: the whole model's pattern
    (12, [], ["1"], r"blk\.1\.ffn_.*_exps\.weight"),
    (12, [], [1, 10, 11], r"blk\.(1|1[01])\.ffn_.*_exps\.weight"),
    (2, [], [5], ""),  # blocks without experts
    # anchored when a longer name holds the same text
    (2, ["xblk.1.ffn_up_exps.weight"], [1], r"^blk\.1\.ffn_.*_exps\.weight"),
])
def test_block_pattern_of_a_qwen3moe_model(count, others, blocks, pattern):
    names, experts = qwen3moe_names(range(count))
    assert block_expert_pattern(names + others, experts, blocks) == pattern


def test_block_pattern_of_experts_stored_one_tensor_each():
    """The names of llama.cpp's unmerged experts (LLM_TENSOR_FFN_*_EXP, ``blk.%d.ffn_gate.%d``: one tensor per
    expert, as early Mixtral files have them) match none of the ``_exps`` conventions: the block head goes before
    the tail built from the names, still readable, not before the list of every name."""
    names, experts = model_names(range(12), ["attn_q.weight"] + ARCH_SUFFIXES["old_mixtral"][0])
    pattern = block_expert_pattern(names, experts, [1, 10])
    assert pattern == r"blk\.(1|10)\.ffn_(down|gate|up)\.[0-9]+\.weight$"
    assert [n for n in names if re.search(pattern, n)] == [n for n in experts if n.split(".")[1] in ("1", "10")]


def _long_expert(length):
    name = "blk.0.ffn_up_exps." + "w" * (length - 18)
    assert len(name) == length
    return name


def test_names_up_to_256_characters_are_listed_and_the_shortest_longer_one_is_refused_by_name():
    """The block pattern's error names the blocks asked for. The caller says blk.0.ffn_down_exps.weight is not an
    expert: no convention can be exact for block 0."""
    wanted = [_long_expert(258), _long_expert(257)]
    names = wanted + ["blk.1.ffn_up_exps." + "w" * 239]
    with pytest.raises(PatternError) as error:
        expert_pattern(names, wanted)
    assert str(error.value) == ("no pattern matches exactly the 2 expert tensors: the tensor name %r is 257 "
                                "characters long (llama.cpp loads names of fewer than 64 bytes)" % wanted[1])
    long_name = _long_expert(257)
    names = [long_name, "blk.0.ffn_down_exps.weight", "blk.1.ffn_down_exps.weight"]
    experts = [long_name, "blk.1.ffn_down_exps.weight"]
    with pytest.raises(PatternError) as error:
        block_expert_pattern(names, experts, [0, 2, 3])
    assert str(error.value) == ("no pattern matches exactly the 1 expert tensors of blocks [023]: the tensor name "
                                "%r is 257 characters long (llama.cpp loads names of fewer than 64 bytes)" % long_name)
    listed = _long_expert(256)
    names[0] = experts[0] = listed
    assert block_expert_pattern(names, experts, [0]) == r"^blk\.0\.ffn_up_exps\." + "w" * 238 + "$"


def _chain(count):
    """Names each one character longer than the one before: their list nests one group per name."""
    return ["blk.0.ffn_up_exps.weight" + "_" * k for k in range(count)]


def _refused_list_of(size):
    """66 nested names and others that make their list ``size`` bytes long."""
    fill = ["blk.%d.ffn_up_exps." % b + "x" * 200 for b in range(1, 75)]
    wanted = _chain(66) + fill
    missing = size - len("^" + _factored(wanted) + "$")
    wanted[-1] += "x" * missing
    assert 0 <= missing and len(wanted[-1]) <= 256
    return wanted


def test_the_list_nests_64_groups_65_are_refused_at_the_length_limit_and_one_byte_over_for_the_length():
    assert expert_pattern(_chain(65) + ["blk.1.ffn_up_exps.weight"], _chain(65)) == (
        r"^blk\.0\.ffn_up_exps\.weight" + "(_" * 64 + ")?" * 64 + "$")
    for size, why in [(16384, "the list of their names is refused: " + TOO_DEEP),
                      (16385, "no readable pattern is exact, and the list of their names would be 16385 bytes, more "
                              "than the 16384 deployed (llama-server's std::regex crashes from about 31 KB)")]:
        wanted = _refused_list_of(size)
        with pytest.raises(PatternError) as error:
            expert_pattern(wanted + ["blk.999.ffn_up_exps.weight"], wanted)
        assert str(error.value) == "no pattern matches exactly the 140 expert tensors: " + why


# What every built pattern is written with: no ',', no '=', no counted repeat, no class escape such as '\d'.
PORTABLE = re.compile(r"^([A-Za-z0-9_:/ -]|\\[.()\[\]|*+?^$\\]|[.*+?|()^$]|\[[0-9-]+\])*$")


def assert_proved(pattern, names, wanted):
    assert pattern_problem(pattern) is None, pattern
    assert PORTABLE.match(pattern), pattern
    assert matches(pattern, names) == set(wanted), pattern


def test_nemotron_nano_gets_the_canonical_pattern_with_46_matches_and_block_patterns_without_the_blk1_trap():
    names, layout = nemotron_names()
    experts = layout.expert_tensors
    pattern = expert_pattern(names, experts)
    assert pattern == r"\.ffn_.*_exps\.weight"
    assert len(matches(pattern, names)) == 46
    assert_proved(pattern, names, experts)
    pattern = block_expert_pattern(names, experts, [1])
    assert pattern == r"blk\.1\.ffn_.*_exps\.weight"
    assert matches(pattern, names) == {"blk.1.ffn_up_exps.weight", "blk.1.ffn_down_exps.weight"}
    pattern = block_expert_pattern(names, experts, range(20, 52))  # the planner's range
    assert pattern == r"blk\.(2[02479]|3[1468]|4[03579]|51)\.ffn_.*_exps\.weight"
    assert_proved(pattern, names, [n for n in experts if block_index(n) >= 20])
    assert block_expert_pattern(names, experts, range(52)) == r"\.ffn_.*_exps\.weight"
    assert block_expert_pattern(names, experts, [0, 2]) == ""  # Mamba blocks: no experts


@pytest.mark.parametrize("arch", sorted(ARCH_SUFFIXES))
def test_pattern_per_architecture(arch):
    suffixes, expected = ARCH_SUFFIXES[arch]
    names, experts = model_names(range(12), suffixes)
    assert experts
    pattern = expert_pattern(names, experts)
    assert pattern == expected
    assert_proved(pattern, names, experts)


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
    pattern = block_expert_pattern(names, [names[0], names[3]], [1])
    assert pattern_problem(pattern) is None and {n for n in names if matcher(pattern)(n)} == {names[3]}


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


@pytest.mark.parametrize("experts, others", [
    # the stem fallback: \.moe\.up\.weight$
    (["blk.0.moe.up.weight", "blk.1.moe.up.weight"], ["blk.0.moeXup.weight", "blk.1.moe_up.weight", "output.weight"]),
    # the explicit list: one block's names, beside the same stems of other blocks and look-alikes
    (["blk.2.moe.up.weight"], ["blk.0.moe.up.weight", "blk.2.moe_up.weight", "blk.2Xmoe.up.weight"]),
    # a final newline, which Python's '$' (not std::regex's) would let the derived \.ffn_up_exps\.weight$ match
    (["blk.0.ffn_up_exps.weight"], ["blk.0.ffn_up_exps.weight\n"]),
])
def test_a_pattern_never_moves_a_name_that_differs_at_a_dot_or_by_a_final_newline(experts, others):
    pattern = expert_pattern(experts + others, experts)
    assert sorted(n for n in experts + others if matcher(pattern)(n)) == sorted(experts)
    assert "\\." in pattern
