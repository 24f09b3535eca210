"""How each value the llm_server role writes is encoded, and what cannot be (plugins/module_utils/_deploy_encoding.py).

The .env encoding is read back with python-dotenv itself (what podman-compose 1.6.0 reads .env with) and with
``compose_go_single_quoted``, a line-for-line port of compose-go's reading of a single-quoted value
(github.com/compose-spec/compose-go, dotenv/parser.go, ``extractVarValue``; docker compose v2 cannot run here).
"""
from __future__ import annotations

import io
import json

import dotenv
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_encoding import (
    api_key_problem,
    compose_literal,
    control_chars,
    device_overrides_problem,
    dotenv_problem,
    dotenv_quote,
    dotenv_unquote,
    offload_pattern_problem,
)

DOLLAR_BRACE = "it holds '${', which podman-compose's .env parser (python-dotenv) expands even inside quotes"
CONTROL = "it holds control characters (%s), which a .env line cannot carry"
NOT_ASCII = ("it holds a character outside printable ASCII (a control character, newline or non-ASCII letter), "
             "which an Authorization header or llama-server's key file cannot carry unchanged")
SPACE = "it starts or ends with a space, which HTTP drops from the Authorization header"


def python_dotenv(text):
    """What podman-compose 1.6.0 reads: python-dotenv's dotenv_values (interpolation on, as it calls it)."""
    return dict(dotenv.dotenv_values(stream=io.StringIO(text)))


def compose_go_single_quoted(src):
    """compose-go dotenv/parser.go extractVarValue for a value starting with a single quote: (value, rest)."""
    quote = src[0]
    previous_is_escape = False
    chars = []
    for i in range(1, len(src)):
        char = src[i]
        if char != quote:
            if not previous_is_escape and char == "\\":
                previous_is_escape = True
                continue
            if previous_is_escape:
                previous_is_escape = False
                chars.append("\\")
            chars.append(char)
            continue
        if previous_is_escape:
            previous_is_escape = False
            chars.append(char)
            continue
        return "".join(chars), src[i + 1:]
    raise ValueError("unterminated quoted value")


@pytest.mark.parametrize("value", [
    "sk-RT'0002", "it's", "'", "a'b'c",   # a quote: written \' and read back by both parsers
    r"blk\.(3|4)\.ffn_.*_exps\.weight$", "a\\b", "\\.",  # backslashes and a $ anchor
    "a$b$HOME and $(date) `id`",          # $ without braces, command substitution, backticks: literal
    "$HOME", "$", "{}", "50%#not a comment ' \" ", "", "ünïcødé",
])
def test_env_values_read_back_byte_for_byte_by_both_parsers_and_the_roles_own_reading(value):
    assert dotenv_problem(value) is None
    assert python_dotenv("LLM_X=%s\n" % dotenv_quote(value)) == {"LLM_X": value}
    assert compose_go_single_quoted(dotenv_quote(value)) == (value, "")
    assert dotenv_unquote(dotenv_quote(value)) == value


def test_dotenv_quote_single_quotes_and_escapes_quotes_and_the_refused_values_really_differ_between_the_parsers():
    """The reasons hold: what dotenv_problem refuses does not survive one of the two parsers."""
    assert (dotenv_quote(""), dotenv_quote("abc"), dotenv_quote("a'b'")) == ("''", "'abc'", "'a\\'b\\''")
    assert python_dotenv("K=%s\n" % dotenv_quote("sk-${HOME}"))["K"] != "sk-${HOME}"
    doubled = "a\\\\b"
    assert python_dotenv("K=%s\n" % dotenv_quote(doubled))["K"] != compose_go_single_quoted(dotenv_quote(doubled))[0]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_any_value_is_refused_or_read_back_unchanged(value):
    if dotenv_problem(value) is not None:
        return
    assert python_dotenv("K=%s\n" % dotenv_quote(value)) == {"K": value}
    assert compose_go_single_quoted(dotenv_quote(value)) == (value, "")


def test_control_chars_are_c0_del_and_c1_as_sorted_escapes():
    assert control_chars("\x9b\nab\x00\x7f\n") == ["\\n", "\\x00", "\\x7f", "\\x9b"]
    assert control_chars("\x1f\x9f") == ["\\x1f", "\\x9f"]
    assert control_chars(" ~\xa0é\u2028") == []
    assert control_chars("") == []


@pytest.mark.parametrize("value, message", [
    ("a\tb\n", CONTROL % "\\n, \\t"),    # a newline would add keys to .env
    ("${\n", CONTROL % "\\n"),
    ("nul\x00", CONTROL % "\\x00"),
    ("sk-${HOME}", DOLLAR_BRACE),        # python-dotenv expands it even inside single quotes
    ("${\\\\", DOLLAR_BRACE),
    ("a\\\\b", "it holds a double backslash, which python-dotenv reads as one backslash and docker compose as two"),
    ("\\\\'", "it holds a double backslash, which python-dotenv reads as one backslash and docker compose as two"),
    ("a\\'b", "it holds a backslash before a single quote, which the .env parsers read as an escaped quote"),
    ("ends\\", "it ends with a backslash, which would escape the closing quote in .env"),
])
def test_dotenv_problem_names_the_first_rule_broken(value, message):
    assert dotenv_problem(value) == message


@pytest.mark.parametrize("text, value", [
    ("'abc'", "abc"), ("  'abc'\n", "abc"), ("''", ""), ("'a\\'b'", "a'b"), ("'\\''", "'"), ("'a\\b'", "a\\b"),
    ("'", "'"), ("'abc", "'abc"), ("abc'", "abc'"), (" plain ", "plain"), ("", ""), ('"x"', '"x"'),
])
def test_dotenv_unquote_reads_the_roles_own_encoding(text, value):
    assert dotenv_unquote(text) == value


@pytest.mark.parametrize("value, text", [
    ("", '""'), ("$", '"$$"'), ("a$$b", '"a$$$$b"'), ("a$b${X}", '"a$$b$${X}"'), (8080, '"8080"'),
    ("ünï", '"ünï"'), ("\xa0", '"\xa0"'), ('q"\\', '"q\\"\\\\"'), ("x\nprivileged: true", '"x\\nprivileged: true"'),
    ("\x1f\n", '"\\u001f\\n"'), ("\x7f", '"\\u007f"'), ("\x85\x9f", '"\\u0085\\u009f"'),
    ("a\u2028b\u2029", '"a\\u2028b\\u2029"'), ("\ufeff\ufffe\uffff", '"\\ufeff\\ufffe\\uffff"'),
])
def test_compose_literal_is_a_json_string_with_dollars_doubled_and_non_ascii_kept(value, text):
    assert compose_literal(value) == text


@pytest.mark.parametrize("value", [
    '50m"\ncap_add: [ALL]', "a\u2028 b", "a\u2029  #b", "x\x85 y", "\x7fdel", "c1\x9b", "\ufeffbom", "\ufffe"])
def test_compose_literals_read_back_through_yaml_with_line_separators_and_non_printables(value):
    """YAML folds NEL, LS and PS as line breaks inside a double-quoted scalar (the space after one would be lost) and
    refuses characters outside its printable set (YAML 1.2, 5.1 Character Set): they are written as \\uXXXX."""
    text = compose_literal(value)
    assert yaml.safe_load("x: " + text) == {"x": value}
    assert json.loads(text) == value
    assert text.isascii() or not set(text) & set("\x85\u2028\u2029\ufeff\x7f")


def test_offload_pattern_problem_limits_the_utf8_bytes_then_checks_env_then_regex():
    too_long = ("it is %d bytes long; llama-server crashes on patterns this long, the most the role deploys is 16384: "
                "move whole blocks with a shorter pattern (for example llm_server_moe_offload_mode=layers)")
    assert offload_pattern_problem("a" * 16384) is None
    assert offload_pattern_problem("a" * 16385) == too_long % 16385
    assert offload_pattern_problem("é" * 8193) == too_long % 16386
    assert offload_pattern_problem(r"blk\.(3|4)\.ffn_.*_exps\.weight$") is None
    assert offload_pattern_problem("blk${X}") == DOLLAR_BRACE
    assert offload_pattern_problem("blk\n") == CONTROL % "\\n"
    assert offload_pattern_problem("(?i)exps") == "inline flags such as (?i) are not ECMAScript std::regex syntax"


BAD_ITEM = "%s is not PATTERN=DEVICE (one '=', no ',')"


@pytest.mark.parametrize("overrides, problem", [
    ([], None),
    ([r"blk\.0\.ffn_.*_exps=CUDA0", "exps=CUDA_Host"], None),
    (["exps"], BAD_ITEM % '"exps"'), (["a=b=CUDA0"], BAD_ITEM % '"a=b=CUDA0"'),
    (["a,b=CUDA0"], BAD_ITEM % '"a,b=CUDA0"'), (["=CUDA0"], BAD_ITEM % '"=CUDA0"'),
    (["exps=0CUDA"], BAD_ITEM % '"exps=0CUDA"'), (["exps=CUDA-0"], BAD_ITEM % '"exps=CUDA-0"'),
    (["ok=CUDA0", "exps"], BAD_ITEM % '"exps"'),
    (["a${=CUDA0"], '"a${=CUDA0": ' + DOLLAR_BRACE),
    (["(?i)x=CUDA0"], '"(?i)x=CUDA0": inline flags such as (?i) are not ECMAScript std::regex syntax'),
    # together, joined by ',', 16384 bytes at most
    (["a" * 8185 + "=CUDA0", "b" * 8186 + "=CUDA1"], None),
    (["a" * 8186 + "=CUDA0", "b" * 8186 + "=CUDA1"], "together 16385 bytes, more than the 16384 llama-server takes"),
])
def test_device_overrides_problem_checks_each_item(overrides, problem):
    assert device_overrides_problem(overrides) == problem


@pytest.mark.parametrize("key, problem", [
    ("k" * 4096, None), ("sk- ~!", None), ("sk-RT'0002", None), ("sk-${HOME}", None), ('a"b\\c $x `y` #z', None),
    ("with inner space", None), ("k" * 4097, "it is 4097 characters long; the most is 4096"),
    ("sk-é", NOT_ASCII), ("sk-\x7f", NOT_ASCII), ("sk\t", NOT_ASCII), (" sk", SPACE), ("sk ", SPACE),
])
def test_api_key_problem(key, problem):
    assert api_key_problem(key) == problem
