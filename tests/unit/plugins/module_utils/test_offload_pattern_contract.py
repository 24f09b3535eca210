"""The whole contract of plugins/module_utils/_offload_pattern.py: what llama.cpp reads in a ``--override-tensor``
pattern, the deployment rules with their exact reasons, the escapes, the prefix-factored list of names and its
limits, the candidates tried and what ``check_pattern`` reports.

llama.cpp splits the ``-ot`` value on ``,`` and each item at its first ``=`` (common/arg.cpp
``parse_tensor_buffer_overrides``), then keeps the first override whose ``std::regex_search`` finds the tensor name
(src/llama-model-loader.cpp). Its own routed-expert pattern is ``\\.ffn_(up|down|gate|gate_up)_(ch|)exps``
(common/common.h ``LLM_FFN_EXPS_REGEX``). Tensor names are llama.cpp's (src/llama-arch.cpp ``LLM_TENSOR_NAMES``)."""
from __future__ import annotations

import re

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_pattern import (
    MAX_GROUP_DEPTH,
    MAX_PATTERN_BYTES,
    PatternError,
    _candidates,
    _python_bytes,
    _derived_candidates,
    _factored,
    _stem,
    block_expert_pattern,
    block_numbers_regex,
    check_pattern,
    escape,
    expert_pattern,
    matcher,
    pattern_problem,
)

CHAR_FIX = ("write a control character or a character outside ASCII as \\xHH escapes of its UTF-8 bytes")
POSSESSIVE = "possessive quantifiers ('*+', '++', '?+') are not ECMAScript std::regex syntax"
EMPTY_CLASS = ("'[]' and '[^]' match nothing and anything in ECMAScript but start a class in Python: write the class "
               "differently")
TOO_DEEP = "its groups are nested more than 64 deep (std::regex compiles each level recursively)"


def size_problem(size):
    return (f"it is {size} bytes long and at most 16384 are deployed: llama-server's std::regex crashes from about "
            "31 KB (libstdc++ compiles patterns recursively and caps them at 100000 states), and Linux refuses "
            "arguments over 131072 bytes")


def full(pattern):
    """std::regex_search with the pattern anchored at both ends: matches the whole name."""
    return matcher("^" + pattern + "$")


# ---- pattern_problem: the deployment rules ----

def test_the_length_limit_counts_utf8_bytes_on_both_sides_of_the_limit():
    """16384 bytes are deployed and 16385 are not; 'é' is two bytes, so 8193 of them are over the limit."""
    assert MAX_PATTERN_BYTES == 16384
    assert pattern_problem("a" * 16384) is None
    assert pattern_problem("a" * 16385) == size_problem(16385)
    assert pattern_problem("\u00e9" * 8193) == size_problem(16386)
    # 8192 of them fit the length and are refused as characters outside ASCII
    assert pattern_problem("\u00e9" * 8192) == "it contains the character '\u00e9' (U+00E9): " + CHAR_FIX


def test_the_length_is_checked_before_the_characters():
    assert pattern_problem("'" * 16385) == size_problem(16385)


@pytest.mark.parametrize("char", [" ", "~", "!", "a"])
def test_printable_ascii_from_space_to_tilde_is_accepted(char):
    assert pattern_problem("a" + char + "b") is None


@pytest.mark.parametrize("char, shown", [
    ("\x1f", "'\\x1f' (U+001F)"), ("\x7f", "'\\x7f' (U+007F)"), ("\t", "'\\t' (U+0009)"),
    ("\n", "'\\n' (U+000A)"), ("\u20ac", "'\u20ac' (U+20AC)"),
])
def test_a_character_outside_space_to_tilde_is_refused_by_name_and_code_point(char, shown):
    assert pattern_problem("ffn" + char + ",") == "it contains the character " + shown + ": " + CHAR_FIX


@pytest.mark.parametrize("pattern, reason", [
    ("a,b", "it contains ',' and llama.cpp splits --override-tensor on ',' (write ranges without {m,n}; a comma in "
            "a name is written \\x2c)"),
    ("exps=CPU", "it contains '=' and llama.cpp splits each item at the first '=' (give the pattern without "
                 "'=CPU'; an '=' in a name is written \\x3d)"),
    ("a'b", "it contains a single quote, which .env quoting and the start command do not carry unchanged "
            "(write \\x27)"),
    ('a"b', "it contains a double quote, which .env quoting and the start command do not carry unchanged "
            "(write \\x22)"),
    ("a`b", "it contains a backtick, which a shell may run as a command (write \\x60)"),
    ("a${b}", "it contains '${', which compose and dotenv expand as a variable (write \\$\\{)"),
    ("a\\\\b", "it contains '\\\\', which dotenv reads as one backslash in a quoted value (write \\x5c)"),
    ("(?<!a)b", "lookbehind and named groups are not ECMAScript std::regex syntax"),
    ("(?P<n>a)", "named groups are not ECMAScript std::regex syntax"),
    ("(?#note)a", "comments are not ECMAScript std::regex syntax"),
    ("(?>a)", "atomic groups are not ECMAScript std::regex syntax"),
    ("\\Ablk", "\\A is not ECMAScript std::regex syntax (use ^)"),
    ("weight\\Z", "\\Z is not ECMAScript std::regex syntax (use $)"),
    ("(?<=a)b", "it contains '=' and llama.cpp splits each item at the first '=' (give the pattern without "
                "'=CPU'; an '=' in a name is written \\x3d)"),
])
def test_each_refused_token_gives_its_reason_and_its_fix(pattern, reason):
    """The escapes named in the fixes are the token's byte: ',' 0x2c, '=' 0x3d, quote 0x27, double quote 0x22,
    backtick 0x60, backslash 0x5c."""
    assert pattern_problem(pattern) == reason


@pytest.mark.parametrize("flag", list("aiLmsux"))
def test_inline_flags_are_refused(flag):
    assert pattern_problem("(?%s)exps" % flag) == "inline flags such as (?i) are not ECMAScript std::regex syntax"


@pytest.mark.parametrize("pattern", [
    "(?:up|down)_exps", "(?!x)exps", r"\.ffn_.*_exps\.weight", "blk\\.[0-9]+\\.", "[*+]", "a\\*+", "a\\++",
    "a\\?+", "(a)" * 70, "\\(" * 70, "[$.]", "x{2}",
])
def test_syntax_ecmascript_and_python_read_alike_is_accepted(pattern):
    """Non-capturing groups, lookahead, classes, escaped quantifier characters followed by '+', many groups one
    after the other (not nested) and a counted repeat without ','."""
    assert pattern_problem(pattern) is None


@pytest.mark.parametrize("pattern", ["a*+", "a++", "a?+", "a{2}+", "*+"])
def test_possessive_quantifiers_are_refused(pattern):
    assert pattern_problem(pattern) == POSSESSIVE


@pytest.mark.parametrize("pattern", ["[]a", "a[^]b"])
def test_empty_and_negated_empty_classes_are_refused(pattern):
    assert pattern_problem(pattern) == EMPTY_CLASS


def test_group_depth_limit_on_both_sides():
    assert MAX_GROUP_DEPTH == 64
    assert pattern_problem("(" * 64 + "a" + ")" * 64) is None
    assert pattern_problem("(" * 65 + "a" + ")" * 65) == TOO_DEEP
    assert pattern_problem("(?:" * 65 + "a" + ")" * 65) == TOO_DEEP


def test_a_pattern_python_cannot_read_gives_pythons_reason():
    assert pattern_problem("ffn_(up").startswith("it is not a valid regular expression: missing ), unterminated")
    assert pattern_problem("+a?").startswith("it is not a valid regular expression: nothing to repeat")
    assert pattern_problem("blk[[0-9]").startswith("Python and ECMAScript may read it differently: Possible "
                                                   "nested set")


# ---- matcher: std::regex_search on the bytes of the name ----

def test_matcher_searches_anywhere_in_the_name_and_answers_a_bool():
    search = matcher(r"_exps\.")
    assert search("blk.0.ffn_up_exps.weight") is True
    assert search("blk.0.ffn_up_shexp.weight") is False


def test_matcher_reads_dot_dollar_and_escapes_as_ecmascript_does():
    """'.' is any byte but \\n and \\r; '$' is only the end; inside a class and after a backslash they are
    literals."""
    assert matcher("a.b")("a\tb") is True and matcher("a.b")("a\nb") is False and matcher("a.b")("a\rb") is False
    assert matcher("t$")("weight") is True and matcher("t$")("weight\n") is False
    assert matcher("^[.$]$")("$") is True and matcher("^[.$]$")(".") is True and matcher("^[.$]$")("x") is False
    assert matcher(r"a\.b")("a.b") is True and matcher(r"a\.b")("axb") is False
    assert matcher(r"a\$b")("a$b") is True
    assert matcher(r"^\xc3\xa9$")("\u00e9") is True and matcher("^..$")("\u00e9") is True


def test_matcher_reads_escaped_quantifier_characters_as_literals():
    assert matcher(r"^a\*+$")("a**") is True and matcher(r"^a\*+$")("a") is False
    assert matcher("^[*+]$")("+") is True


def test_matcher_raises_for_what_python_cannot_read():
    with pytest.raises(PatternError, match="^it is not a valid regular expression: "):
        matcher("ffn_(up")
    with pytest.raises(PatternError, match=re.escape(POSSESSIVE)):
        matcher("a++")


# ---- escape ----

def test_escape_keeps_the_characters_written_as_themselves():
    literal = "abcxyzABCXYZ0189_-:/ !#%&;<>@~"
    assert escape(literal) == literal
    assert escape(literal, exact=True) == literal


def test_escape_puts_a_backslash_before_each_metacharacter():
    assert escape(".()[]|*+?^$}{") == r"\.\(\)\[\]\|\*\+\?\^\$\}\{"


def test_escape_writes_comma_and_equals_as_a_dot_unless_exact():
    assert escape("a,b=c") == "a.b.c"
    assert escape("a,b=c", exact=False) == "a.b.c"
    assert escape("a,b=c", exact=True) == r"a\x2cb\x3dc"


@pytest.mark.parametrize("text, expected", [
    ("'", r"\x27"), ('"', r"\x22"), ("`", r"\x60"), ("\\", r"\x5c"), ("\n", r"\x0a"), ("\r", r"\x0d"),
    ("\x00", r"\x00"), ("\x7f", r"\x7f"), ("\u00e9", r"\xc3\xa9"), ("\u20ac", r"\xe2\x82\xac"), ("\udcff", r"\xff"),
])
def test_escape_writes_every_other_character_as_its_utf8_bytes(text, expected):
    """Bytes that are not valid UTF-8 in a GGUF name come back as the same byte (surrogateescape)."""
    assert escape(text) == expected
    assert escape(text, exact=True) == expected


@pytest.mark.parametrize("name", ["blk.0.ffn_up_exps.w,x", "a=b", "${HOME}", "q'\"`\\", "caf\u00e9\n", "{1,3}"])
def test_an_exact_escape_is_deployable_and_matches_exactly_the_text(name):
    pattern = escape(name, exact=True)
    assert pattern_problem(pattern) is None
    assert full(pattern)(name) is True
    assert full(pattern)(name + "x") is False and full(pattern)(name[:-1]) is False


# ---- block_numbers_regex ----

@pytest.mark.parametrize("blocks, expected", [
    ({0, 1}, "[01]"),
    ({0, 1, 2}, "[0-2]"),
    ({0, 2}, "[02]"),
    ({0, 1, 3, 4}, "[0134]"),
    ({0, 1, 2, 4, 5, 6}, "[0-24-6]"),
    ({10, 11}, "1[01]"),
    ({10, 11, 20, 21}, "[12][01]"),
    ({10, 11, 20, 21, 35}, "([12][01]|35)"),
    ({15, 20, 21, 30, 31}, "(15|[23][01])"),
    ({3, 12}, "(3|12)"),
    ({100, 101, 110, 111}, "1[01][01]"),
    ({9, 10, 99, 100}, "(9|10|99|100)"),
])
def test_block_numbers_regex_matches_exactly_the_numbers(blocks, expected):
    """Digit runs of three or more are ranges, shorter ones are listed; numbers of different lengths are
    alternatives, shortest first; same-length numbers that share their last digits are grouped."""
    regex = block_numbers_regex(blocks)
    assert regex == expected
    assert {n for n in range(1000) if re.fullmatch(regex, str(n))} == blocks


def test_block_numbers_regex_takes_numbers_as_strings_and_ignores_repeats():
    assert block_numbers_regex(["3", 3, "4"]) == "[34]"


# ---- _factored: the prefix-factored list of names ----

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


def test_factored_matches_exactly_a_set_of_real_expert_names():
    """Experts of some blocks among the same tensors of the other blocks."""
    kinds = ("gate", "up", "down", "gate_up")
    every = ["blk.%d.ffn_%s_exps.weight" % (b, k) for b in range(120) for k in kinds]
    words = [n for i, n in enumerate(every) if i % 7 in (0, 3)]
    search = full(_factored(words))
    assert {n for n in every if search(n)} == set(words)


def test_factored_of_nothing_is_empty_and_order_and_repeats_do_not_matter():
    assert _factored([]) == ""
    words = ["blk.1.a", "blk.1.b", "blk.2.a"]
    assert _factored(words[::-1] + words) == _factored(words)


def test_factored_writes_the_common_prefixes_once():
    """The module's own example: blk.1.a, blk.1.b, blk.2.a."""
    assert _factored(["blk.1.a", "blk.1.b", "blk.2.a"]) == r"blk\.(1\.(a|b)|2\.a)"


def test_factored_writes_the_common_suffix_once_at_the_end():
    words = ["blk.%d.ffn_up_exps.weight" % b for b in (1, 2)]
    assert _factored(words) == r"blk\.(1|2)\.ffn_up_exps\.weight"
    pattern = _factored(["blk.1.ffn_up_exps.weight", "blk.20.ffn_up_exps.weight", "blk.25.ffn_up_exps.weight"])
    assert pattern.count("ffn_up_exps") == 1 and pattern.endswith(r"\.ffn_up_exps\.weight")


# ---- _stem and the candidates ----

def test_stem_is_the_name_after_the_block_prefix():
    assert _stem("blk.12.ffn_up_exps.weight") == "ffn_up_exps.weight"
    assert _stem("output.weight") == "output.weight"
    assert _stem("v.blk.1.ffn_up.weight") == "v.blk.1.ffn_up.weight"


CANONICAL = [r"\.ffn_.*_exps\.weight", r"\.ffn_.*_exps\.", r"\.ffn_.*_(ch)?exps\.weight", r"\.ffn_.*_(ch)?exps\.",
             r"_(ch)?exps\."]


def test_candidates_are_the_conventions_then_those_derived_from_the_names():
    """The first is llama.cpp's documented seed pattern; the derived ones name the parts, then the suffixes, then
    every stem."""
    wanted = {"blk.0.ffn_up_exps.weight", "blk.3.ffn_down_chexps.bias"}
    assert list(_candidates(wanted)) == CANONICAL + [
        r"\.ffn_(down|up)_(ch)?exps\.",
        r"\.ffn_(down|up)_(ch)?exps\.(bias|weight)$",
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
])
def test_derived_candidates(wanted, expected):
    """Stacked experts (ffn_<part>_(ch)exps.<suffix>), the old one-tensor-per-expert layout
    (ffn_<part>.<expert>.<suffix>), and a mix of both that only the list of stems describes."""
    assert list(_derived_candidates(wanted)) == expected


def test_the_list_of_stems_is_a_candidate_only_under_the_length_limit():
    assert list(_derived_candidates({"blk.0." + "a" * 16383})) == [r"\." + "a" * 16383 + "$"]
    assert list(_derived_candidates({"blk.0." + "a" * 16384})) == []


# ---- expert_pattern and block_expert_pattern ----

def _qwen3moe(blocks):
    names = ["token_embd.weight", "output_norm.weight", "output.weight"]
    for b in blocks:
        names += ["blk.%d.%s" % (b, s) for s in (
            "attn_norm.weight", "attn_q.weight", "ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight",
            "ffn_down_exps.weight")]
    experts = [n for n in names if "_exps." in n]
    return names, experts


def test_no_expert_tensors_give_an_empty_pattern():
    assert expert_pattern([], []) == ""
    assert expert_pattern(["blk.0.attn_q.weight"], []) == ""
    names, experts = _qwen3moe(range(2))
    assert block_expert_pattern(names, experts, []) == ""
    assert block_expert_pattern(names, experts, [5]) == ""


def test_expert_names_missing_from_the_model_are_named_five_at_most():
    unknown = ["blk.%d.ffn_up_exps.weight" % b for b in range(6)]
    message = "^expert tensors not among the model's tensors: %s$" % re.escape(", ".join(sorted(unknown)[:5]))
    with pytest.raises(PatternError, match=message):
        expert_pattern(["blk.0.attn_q.weight"], unknown)
    with pytest.raises(PatternError, match=message):
        block_expert_pattern(["blk.0.attn_q.weight"], unknown, [0])


def test_the_seed_pattern_when_it_is_exact():
    names, experts = _qwen3moe(range(3))
    assert expert_pattern(names, experts) == r"\.ffn_.*_exps\.weight"


def test_the_list_of_names_when_no_convention_is_exact():
    """Some blocks' up-experts among every block's: anchored at both ends, prefix-factored."""
    names = ["blk.%d.ffn_up_exps.weight" % b for b in range(12)]
    wanted = [names[0], names[5], names[10]]
    assert expert_pattern(names, wanted) == r"^blk\.(0|10|5)\.ffn_up_exps\.weight$"


def test_block_pattern_of_every_expert_block_is_the_whole_model_pattern():
    names, experts = _qwen3moe(range(3))
    assert block_expert_pattern(names, experts, [0, 1, 2, 7]) == r"\.ffn_.*_exps\.weight"


def test_block_pattern_takes_block_numbers_as_strings():
    names, experts = _qwen3moe(range(12))
    assert block_expert_pattern(names, experts, ["1"]) == r"blk\.1\.ffn_.*_exps\.weight"
    assert block_expert_pattern(names, experts, [1, 10, 11]) == r"blk\.(1|1[01])\.ffn_.*_exps\.weight"


def test_block_pattern_is_anchored_when_a_longer_name_holds_the_same_text():
    names, experts = _qwen3moe(range(2))
    names.append("xblk.1.ffn_up_exps.weight")
    assert block_expert_pattern(names, experts, [1]) == r"^blk\.1\.ffn_.*_exps\.weight"


def test_block_pattern_of_experts_stored_one_tensor_each():
    """The names of llama.cpp's unmerged experts (LLM_TENSOR_FFN_*_EXP, ``blk.%d.ffn_gate.%d``: one tensor per
    expert, as early Mixtral files have them) match none of the ``_exps`` conventions: the block head goes before
    the tail built from the names, still readable, not before the list of every name."""
    names, experts = ["token_embd.weight", "output.weight"], []
    for block in range(12):
        names += ["blk.%d.attn_q.weight" % block, "blk.%d.ffn_gate_inp.weight" % block]
        for part in ("gate", "down", "up"):
            experts += ["blk.%d.ffn_%s.%d.weight" % (block, part, expert) for expert in range(4)]
    names += experts
    assert expert_pattern(names, experts) == r"\.ffn_(down|gate|up)\.[0-9]+\.weight$"
    pattern = block_expert_pattern(names, experts, [1, 10])
    assert pattern == r"blk\.(1|10)\.ffn_(down|gate|up)\.[0-9]+\.weight$"
    assert [n for n in names if re.search(pattern, n)] == [n for n in experts if n.split(".")[1] in ("1", "10")]


def _long_expert(length):
    name = "blk.0.ffn_up_exps." + "w" * (length - 18)
    assert len(name) == length
    return name


def test_names_up_to_256_characters_are_listed():
    wanted = _long_expert(256)
    names = [wanted, "blk.1.ffn_up_exps." + "w" * 238]
    assert expert_pattern(names, [wanted]) == r"^blk\.0\.ffn_up_exps\." + "w" * 238 + "$"


def test_a_name_over_256_characters_is_refused_by_name():
    wanted = [_long_expert(258), _long_expert(257)]
    names = wanted + ["blk.1.ffn_up_exps." + "w" * 239]
    with pytest.raises(PatternError) as error:
        expert_pattern(names, wanted)
    assert str(error.value) == ("no pattern matches exactly the 2 expert tensors: the tensor name %r is 257 "
                                "characters long (llama.cpp loads names of fewer than 64 bytes)" % wanted[1])


def test_block_pattern_errors_name_the_blocks_asked_for():
    """The caller says blk.0.ffn_down_exps.weight is not an expert: no convention can be exact for block 0."""
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


def test_the_list_nests_64_groups_and_no_more():
    other = "blk.1.ffn_up_exps.weight"
    assert expert_pattern(_chain(65) + [other], _chain(65)) == (
        r"^blk\.0\.ffn_up_exps\.weight" + "(_" * 64 + ")?" * 64 + "$")
    with pytest.raises(PatternError) as error:
        expert_pattern(_chain(66) + [other], _chain(66))
    assert str(error.value) == "no pattern matches exactly the 66 expert tensors: the list of their names is " \
                               "refused: " + TOO_DEEP


def _refused_list_of(size):
    """66 nested names and others that make their list ``size`` bytes long."""
    fill = ["blk.%d.ffn_up_exps." % b + "x" * 200 for b in range(1, 75)]
    wanted = _chain(66) + fill
    missing = size - len("^" + _factored(wanted) + "$")
    wanted[-1] += "x" * missing
    assert 0 <= missing and len(wanted[-1]) <= 256
    return wanted


def test_a_list_of_exactly_the_limit_is_refused_for_its_nesting_and_one_byte_more_for_its_length():
    other = "blk.999.ffn_up_exps.weight"
    wanted = _refused_list_of(16384)
    with pytest.raises(PatternError) as error:
        expert_pattern(wanted + [other], wanted)
    assert str(error.value) == ("no pattern matches exactly the 140 expert tensors: the list of their names is "
                                "refused: " + TOO_DEEP)
    wanted = _refused_list_of(16385)
    with pytest.raises(PatternError) as error:
        expert_pattern(wanted + [other], wanted)
    assert str(error.value) == (
        "no pattern matches exactly the 140 expert tensors: no readable pattern is exact, and the list of their "
        "names would be 16385 bytes, more than the 16384 deployed (llama-server's std::regex crashes from about "
        "31 KB)")


# ---- check_pattern ----

def test_check_pattern_exact_pattern():
    names, experts = _qwen3moe(range(2))
    assert check_pattern(r"\.ffn_.*_exps\.weight", names, experts, {}) == {
        "pattern": r"\.ffn_.*_exps\.weight", "ok": True, "matched": sorted(experts), "missed": [], "non_expert": [],
        "verdict": "ok: moves exactly the 6 routed-expert tensors and nothing else"}


def test_check_pattern_reports_missed_experts_and_moved_non_experts():
    names, experts = _qwen3moe(range(2))
    classes = {"blk.0.ffn_gate_inp.weight": "router"}
    assert check_pattern(r"blk\.0\.ffn_(gate|up|down)", names, experts, classes) == {
        "pattern": r"blk\.0\.ffn_(gate|up|down)", "ok": False,
        "matched": ["blk.0.ffn_down_exps.weight", "blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight"],
        "missed": ["blk.1.ffn_down_exps.weight", "blk.1.ffn_gate_exps.weight", "blk.1.ffn_up_exps.weight"],
        "non_expert": [{"tensor": "blk.0.ffn_gate_inp.weight", "class": "router"}],
        "verdict": "wrong: misses 3 of the 6 routed-expert tensors (e.g. blk.1.ffn_down_exps.weight); also moves "
                   "1 non-expert tensor(s): 1 router (e.g. blk.0.ffn_gate_inp.weight)"}


def test_check_pattern_counts_moved_tensors_by_class_in_class_order():
    """Classes are counted and named with spaces for underscores; a tensor without a class is 'other'."""
    names, experts = _qwen3moe(range(2))
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


def test_check_pattern_that_moves_only_non_experts():
    names, experts = _qwen3moe(range(1))
    result = check_pattern("attn_q", names, experts, {"blk.0.attn_q.weight": "attention"})
    assert result["verdict"] == ("wrong: misses 3 of the 3 routed-expert tensors (e.g. blk.0.ffn_down_exps.weight); "
                                 "also moves 1 non-expert tensor(s): 1 attention (e.g. blk.0.attn_q.weight)")
    result = check_pattern("_exps", names + ["blk.0.ffn_norm_exps.weight"], experts,
                           {"blk.0.ffn_norm_exps.weight": "norm"})
    assert result["matched"] == sorted(experts) and result["missed"] == []
    assert result["verdict"] == "wrong: also moves 1 non-expert tensor(s): 1 norm (e.g. blk.0.ffn_norm_exps.weight)"


def test_check_pattern_counts_experts_missing_from_the_tensor_list():
    result = check_pattern(r"\.ffn_.*_exps\.weight", ["blk.0.attn_q.weight"], ["blk.0.ffn_up_exps.weight"], {})
    assert result["ok"] is True and result["matched"] == ["blk.0.ffn_up_exps.weight"]


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


@pytest.mark.parametrize("pattern", ["", None])
def test_check_pattern_without_a_pattern(pattern):
    names, experts = _qwen3moe(range(1))
    assert check_pattern(pattern, names, experts, {}) == {
        "pattern": pattern, "ok": False, "matched": [], "missed": sorted(experts), "non_expert": [],
        "verdict": "unusable: the pattern is empty"}


def test_check_pattern_with_a_pattern_that_cannot_be_deployed():
    names, experts = _qwen3moe(range(1))
    assert check_pattern("exps=CPU", names, experts, {}) == {
        "pattern": "exps=CPU", "ok": False, "matched": [], "missed": sorted(experts), "non_expert": [],
        "verdict": "unusable: " + pattern_problem("exps=CPU")}
    assert check_pattern("a++", names, experts, {})["verdict"] == "unusable: " + POSSESSIVE


@pytest.mark.parametrize("pattern, python", [
    ("[.$]x.", "[.$]x[^\\n\\r]"),     # '.' and '$' are literal inside a class, translated after it
    ("a\\*+", "a\\*+"),               # an escaped '*' then '+': one or more '*', not a possessive quantifier
    ("X+", "X+"),
    ("blk\\.[0-9]+\\.ffn_.*$", "blk\\.[0-9]+\\.ffn_[^\\n\\r]*\\Z"),
])
def test_the_ecmascript_reading_of_classes_escapes_and_quantifiers(pattern, python):
    assert _python_bytes(pattern) == python.encode()
