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

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._pattern_syntax import (
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
FLAGS = "inline flags such as (?i) are not ECMAScript std::regex syntax"
EQUALS = ("it contains '=' and llama.cpp splits each item at the first '=' (give the pattern without '=CPU'; an '=' "
          "in a name is written \\x3d)")


def size_problem(size):
    return (f"it is {size} bytes long and at most 16384 are deployed: llama-server's std::regex crashes from about "
            "31 KB (libstdc++ compiles patterns recursively and caps them at 100000 states), and Linux refuses "
            "arguments over 131072 bytes")


@pytest.mark.parametrize("pattern", [
    "a b", "a~b", "a!b", "(?:up|down)_exps", "(?!x)exps", r"\.ffn_.*_exps\.weight", "blk\\.[0-9]+\\.", "[*+]",
    "a\\*+", "a\\++", "a\\?+", "(a)" * 70, "\\(" * 70, "[$.]", "x{2}", "[((]" * 100,
    "a" * 16384, "(" * 64 + "a" + ")" * 64,  # the longest pattern and the deepest groups deployed
], ids=lambda pattern: pattern[:40])
def test_syntax_ecmascript_and_python_read_alike_is_accepted(pattern):
    """Printable ASCII from space to tilde, non-capturing groups, lookahead, classes (a '(' in one opens no group),
    escaped quantifier characters followed by '+', many groups one after the other (not nested) and a counted
    repeat without ','."""
    assert pattern_problem(pattern) is None


@pytest.mark.parametrize("pattern, reason", [
    # a character outside space to tilde, by name and code point (before the tokens: the ',' after it)
    ("ffn\x1f,", "it contains the character '\\x1f' (U+001F): " + CHAR_FIX),
    ("ffn\x7f,", "it contains the character '\\x7f' (U+007F): " + CHAR_FIX),
    ("ffn\n,", "it contains the character '\\n' (U+000A): " + CHAR_FIX),
    ("ffn\u20ac,", "it contains the character '\u20ac' (U+20AC): " + CHAR_FIX),
    # the escapes named in the fixes are the token's byte: ',' 0x2c, '=' 0x3d, quote 0x27, double quote 0x22,
    # backtick 0x60, backslash 0x5c
    ("a,b", "it contains ',' and llama.cpp splits --override-tensor on ',' (write ranges without {m,n}; a comma in "
            "a name is written \\x2c)"),
    ("exps=CPU", EQUALS),
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
    ("(?<=a)b", EQUALS),
    *[("(?%s)exps" % flag, FLAGS) for flag in "aiLmsux"],
    *[(pattern, POSSESSIVE) for pattern in ("a*+", "a++", "a?+", "a{2}+", "*+")],
    ("[]a", EMPTY_CLASS), ("a[^]b", EMPTY_CLASS),
    # 16384 UTF-8 bytes are deployed, 16385 are not ('é' is two bytes), whatever the characters; 8192 'é' fit the
    # length and are refused as characters outside ASCII
    ("a" * 16385, size_problem(16385)), ("\u00e9" * 8193, size_problem(16386)), ("'" * 16385, size_problem(16385)),
    ("\u00e9" * 8192, "it contains the character '\u00e9' (U+00E9): " + CHAR_FIX),
    # groups nested more than 64 deep
    ("(" * 65 + "a" + ")" * 65, TOO_DEEP), ("(?:" * 65 + "a" + ")" * 65, TOO_DEEP), ("(" * 2000 + "a" + ")" * 2000, TOO_DEEP),
], ids=lambda value: value[:40])
def test_each_refused_token_gives_its_reason_and_its_fix(pattern, reason):
    assert pattern_problem(pattern) == reason


def test_a_pattern_python_cannot_read_gives_pythons_reason_and_matcher_raises_it():
    assert pattern_problem("ffn_(up").startswith("it is not a valid regular expression: missing ), unterminated")
    assert pattern_problem("+a?").startswith("it is not a valid regular expression: nothing to repeat")
    assert pattern_problem("blk[[0-9]").startswith("Python and ECMAScript may read it differently: Possible "
                                                   "nested set")
    with pytest.raises(PatternError, match="^it is not a valid regular expression: "):
        matcher("ffn_(up")
    with pytest.raises(PatternError, match=re.escape(POSSESSIVE)):
        matcher("a++")


@pytest.mark.parametrize("pattern, name, found", [
    (r"_exps\.", "blk.0.ffn_up_exps.weight", True), (r"_exps\.", "blk.0.ffn_up_shexp.weight", False),
    # '.' is any byte but \n and \r (Python's '.' matches '\r'); '$' is only the end (Python's also matches
    # before a final newline); inside a class and after a backslash they are literals
    ("a.b", "a\tb", True), ("a.b", "a\nb", False), ("a.b", "a\rb", False),
    ("t$", "weight", True), ("t$", "weight\n", False),
    ("^[.$]$", "$", True), ("^[.$]$", ".", True), ("^[.$]$", "x", False),
    (r"a\.b", "a.b", True), (r"a\.b", "axb", False), (r"a\$b", "a$b", True), (r"\x0a", "\n", True),
    # bytes, as std::regex<char> reads them: 'é' is two
    (r"^\xc3\xa9$", "\u00e9", True), ("^..$", "\u00e9", True), ("^caf.$", "caf\u00e9", False),
    # escaped quantifier characters are literals
    (r"^a\*+$", "a**", True), (r"^a\*+$", "a", False), ("^[*+]$", "+", True),
])
def test_matcher_reads_a_pattern_as_ecmascript_does(pattern, name, found):
    assert matcher(pattern)(name) is found


@pytest.mark.parametrize("pattern, python", [
    ("[.$]x.", "[.$]x[^\\n\\r]"),     # '.' and '$' are literal inside a class, translated after it
    ("a\\*+", "a\\*+"),               # an escaped '*' then '+': one or more '*', not a possessive quantifier
    ("X+", "X+"),
    ("blk\\.[0-9]+\\.ffn_.*$", "blk\\.[0-9]+\\.ffn_[^\\n\\r]*\\Z"),
])
def test_the_ecmascript_reading_of_classes_escapes_and_quantifiers(pattern, python):
    assert _python_bytes(pattern) == python.encode()


@pytest.mark.parametrize("text, expected", [
    ("abcxyzABCXYZ0189_-:/ !#%&;<>@~", "abcxyzABCXYZ0189_-:/ !#%&;<>@~"),
    ("blk.0.ffn_up_exps.weight", r"blk\.0\.ffn_up_exps\.weight"), ("x(y)|z*", r"x\(y\)\|z\*"),
    (".()[]|*+?^$}{", r"\.\(\)\[\]\|\*\+\?\^\$\}\{"),
    # every other character as its UTF-8 bytes; bytes that are not valid UTF-8 in a GGUF name come back as the
    # same byte (surrogateescape)
    ("'", r"\x27"), ('"', r"\x22"), ("`", r"\x60"), ("\\", r"\x5c"), ("\n", r"\x0a"), ("\r", r"\x0d"),
    ("\x00", r"\x00"), ("\x7f", r"\x7f"), ("\u00e9", r"\xc3\xa9"), ("\u20ac", r"\xe2\x82\xac"), ("\udcff", r"\xff"),
])
def test_escape_writes_literals_metacharacters_and_other_characters(text, expected):
    assert escape(text) == expected
    assert escape(text, exact=True) == expected


def test_escape_writes_comma_and_equals_as_a_dot_unless_exact():
    assert escape("a,b=c") == "a.b.c"                       # readable; the proof rejects an over-match
    assert escape("a,b=c", exact=True) == r"a\x2cb\x3dc"


@pytest.mark.parametrize("name", ["blk.0.ffn_up_exps.w,x", "a=b", "${HOME}", "q'\"`\\", "caf\u00e9\n", "{1,3}"])
def test_an_exact_escape_is_deployable_and_matches_exactly_the_text(name):
    pattern = escape(name, exact=True)
    assert pattern_problem(pattern) is None
    assert full(pattern)(name) is True
    assert full(pattern)(name + "x") is False and full(pattern)(name[:-1]) is False
