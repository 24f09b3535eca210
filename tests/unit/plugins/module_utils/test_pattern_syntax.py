"""How llama.cpp reads an ``--override-tensor`` pattern (plugins/module_utils/_pattern_syntax.py): the deployment
rules with their exact reasons, what ``matcher`` finds (``std::regex_search`` on the bytes of the name) and the
escapes.

llama.cpp splits the ``-ot`` value on ``,`` and each item at its first ``=`` (common/arg.cpp
``parse_tensor_buffer_overrides``), then keeps the first override whose ``std::regex_search`` finds the tensor name
(src/llama-model-loader.cpp ``create_tensor``, ECMAScript grammar), where an unescaped ``.`` matches any character
but ``\\n`` and ``\\r`` and ``$`` only the end."""
from __future__ import annotations

import re

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_pattern import expert_pattern
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._pattern_syntax import (
    MAX_GROUP_DEPTH,
    MAX_PATTERN_BYTES,
    PatternError,
    _python_bytes,
    escape,
    matcher,
    pattern_problem,
)
from tests.helpers.tensor_names import full


CHAR_FIX = ("write a control character or a character outside ASCII as \\xHH escapes of its UTF-8 bytes")


POSSESSIVE = "possessive quantifiers ('*+', '++', '?+') are not ECMAScript std::regex syntax"


EMPTY_CLASS = ("'[]' and '[^]' match nothing and anything in ECMAScript but start a class in Python: write the class "
               "differently")


TOO_DEEP = "its groups are nested more than 64 deep (std::regex compiles each level recursively)"


def size_problem(size):
    return (f"it is {size} bytes long and at most 16384 are deployed: llama-server's std::regex crashes from about "
            "31 KB (libstdc++ compiles patterns recursively and caps them at 100000 states), and Linux refuses "
            "arguments over 131072 bytes")


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


def test_the_proof_reads_dot_and_dollar_as_ecmascript_does():
    """Python's '$' also matches before a final newline and '.' matches '\\r'; std::regex (ECMAScript) does not."""
    assert re.search(r"weight$", "w.weight\n") and not matcher(r"weight$")("w.weight\n")
    assert re.search(r"a.b", "a\rb") and not matcher(r"a.b")("a\rb")
    assert matcher(r"a.b")("a\tb") and matcher(r"\x0a")("\n") and matcher(r"[.]")(".")
    assert matcher(r"^caf.$")("caf\u00e9") is False and matcher(r"^caf..$")("caf\u00e9")  # bytes, as std::regex<char>
    names = ["blk.0.ffn_up_exps.weight", "blk.0.ffn_up_exps.weight\n"]
    pattern = expert_pattern(names, names[:1])
    assert {n for n in names if matcher(pattern)(n)} == {names[0]}


@pytest.mark.parametrize("pattern, python", [
    ("[.$]x.", "[.$]x[^\\n\\r]"),     # '.' and '$' are literal inside a class, translated after it
    ("a\\*+", "a\\*+"),               # an escaped '*' then '+': one or more '*', not a possessive quantifier
    ("X+", "X+"),
    ("blk\\.[0-9]+\\.ffn_.*$", "blk\\.[0-9]+\\.ffn_[^\\n\\r]*\\Z"),
])
def test_the_ecmascript_reading_of_classes_escapes_and_quantifiers(pattern, python):
    assert _python_bytes(pattern) == python.encode()


# ---- escape ----


def test_escape_keeps_the_characters_written_as_themselves():
    literal = "abcxyzABCXYZ0189_-:/ !#%&;<>@~"
    assert escape(literal) == literal
    assert escape(literal, exact=True) == literal


def test_escape_writes_a_dot_as_a_literal():
    assert escape("blk.0.ffn_up_exps.weight") == r"blk\.0\.ffn_up_exps\.weight"
    assert escape("x(y)|z*") == r"x\(y\)\|z\*"
    assert escape("a,b=c") == "a.b.c"                       # readable; the proof rejects an over-match
    assert escape("a,b=c", exact=True) == r"a\x2cb\x3dc"
    for name in ("blk.0.moe.up.weight", "a.b", "."):
        assert re.fullmatch(escape(name), name)
        assert re.fullmatch(escape(name), name.replace(".", "X")) is None


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
