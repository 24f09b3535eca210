"""Every value the llm_server role writes, checked and encoded in one place (plugins/module_utils/_deploy_values.py).

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

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_values import (
    InputError,
    api_key_problem,
    base_url,
    check_settings,
    compose_literal,
    container_model_path,
    dotenv_problem,
    dotenv_quote,
    offload_pattern_problem,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_pattern import MAX_PATTERN_BYTES

BASE = {
    "llm_server_model_path": "/srv/models/x.gguf",
    "llm_server_project_dir": "/srv/ai-llm",
    "llm_server_compose_project": "ai-llm",
}


def problems(api_key=None, **values):
    """The {variable: message} check_settings refuses BASE updated by ``values`` with."""
    try:
        check_settings(dict(BASE, **values), api_key=api_key)
    except InputError as exc:
        return dict(exc.problems)
    return {}


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


# --- .env ----------------------------------------------------------------------------------------------------

ROUND_TRIP = [
    "sk-RT'0002",                       # a quote: written \' and read back by both parsers
    r"blk\.(3|4)\.ffn_.*_exps\.weight$",  # backslashes and a $ anchor
    "a$b$HOME and $(date) `id`",          # $ without braces, command substitution, backticks: literal
    "50%#not a comment ' \" ",
    "",
    "ünïcødé",
]


@pytest.mark.parametrize("value", ROUND_TRIP)
def test_env_values_read_back_byte_for_byte_by_both_parsers(value):
    assert dotenv_problem(value) is None
    line = "LLM_X=%s\n" % dotenv_quote(value)
    assert python_dotenv(line) == {"LLM_X": value}
    assert compose_go_single_quoted(dotenv_quote(value)) == (value, "")


@pytest.mark.parametrize("value, reason", [
    ("sk-${HOME}", "'${'"),                    # python-dotenv expands it even inside single quotes
    ("a\\\\b", "double backslash"),             # python-dotenv reads one backslash, compose-go two
    ("a\\'b", "backslash before a single quote"),
    ("ends\\", "ends with a backslash"),
    ("two\nlines", "control characters"),     # a newline would add keys to .env
    ("tab\there", "control characters"),
    ("nul\x00", "control characters"),
])
def test_values_the_parsers_read_differently_are_refused(value, reason):
    assert reason in dotenv_problem(value)


def test_the_refused_values_really_differ_between_the_parsers():
    """The reasons hold: what dotenv_problem refuses does not survive one of the two parsers."""
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


# --- compose ---------------------------------------------------------------------------------------------------


def test_compose_literals_are_json_with_dollars_doubled():
    assert compose_literal('x\nprivileged: true') == '"x\\nprivileged: true"'
    assert compose_literal("a$b${X}") == '"a$$b$${X}"'
    assert json.loads(compose_literal('50m"\ncap_add: [ALL]')) == '50m"\ncap_add: [ALL]'


@pytest.mark.parametrize("value", ["a\u2028 b", "a\u2029  #b", "x\x85 y", "\x7fdel", "c1\x9b", "\ufeffbom", "\ufffe"])
def test_compose_literals_read_back_through_yaml_with_line_separators_and_non_printables(value):
    """YAML folds NEL, LS and PS as line breaks inside a double-quoted scalar (the space after one was lost) and
    refuses characters outside its printable set (YAML 1.2, 5.1 Character Set): they are written as \\uXXXX."""
    text = compose_literal(value)
    assert yaml.safe_load("x: " + text) == {"x": value}
    assert json.loads(text) == value
    assert text.isascii() or not set(text) & set("\x85\u2028\u2029\ufeff\x7f")


# --- numbers, names, paths -------------------------------------------------------------------------------------


@pytest.mark.parametrize("values, name, words", [
    ({"llm_server_port": 99999}, "llm_server_port", "from 1 to 65535"),
    ({"llm_server_port": 0}, "llm_server_port", "from 1 to 65535"),
    ({"llm_server_port": "8080\nX=1"}, "llm_server_port", "not an integer"),
    ({"llm_server_port": True}, "llm_server_port", "not an integer"),
    ({"llm_server_ctx_size": -5}, "llm_server_ctx_size", "out of range"),
    ({"llm_server_ctx_size": "9" * 5000}, "llm_server_ctx_size", "not an integer"),
    ({"llm_server_ctx_size": 512.5}, "llm_server_ctx_size", "not an integer"),
    ({"llm_server_parallel": 257}, "llm_server_parallel", "from 1 to 256"),
    ({"llm_server_n_gpu_layers": "99\nLLM_X=1"}, "llm_server_n_gpu_layers", "auto or all"),
    ({"llm_server_image": "localhost/x:1\n    privileged: true"}, "llm_server_image", "control characters"),
    ({"llm_server_image": "Local Host/x"}, "llm_server_image", "image reference"),
    ({"llm_server_log_max_size": '50m"\n    cap_add: [ALL]'}, "llm_server_log_max_size", "control characters"),
    ({"llm_server_log_max_size": '50m"'}, "llm_server_log_max_size", "a size such as 50m"),
    ({"llm_server_container_name": "ai llm"}, "llm_server_container_name", "container name"),
    ({"llm_server_compose_project": "AI-LLM"}, "llm_server_compose_project", "compose project name"),
    ({"llm_server_restart_policy": "no\nX"}, "llm_server_restart_policy", "control characters"),
    ({"llm_server_network_mode": "bridge"}, "llm_server_network_mode", "is not one of"),
    ({"llm_server_bind_address": "127.0.0.1\nLLM_X=1"}, "llm_server_bind_address", "control characters"),
    ({"llm_server_bind_address": "localhost"}, "llm_server_bind_address", "not an IPv4 or IPv6 address"),
    ({"llm_server_extra_args": ["--alias", "a\nb"]}, "llm_server_extra_args", "control characters"),
    ({"llm_server_project_dir": "srv/ai-llm"}, "llm_server_project_dir", "not an absolute path"),
    ({"llm_server_project_dir": "/srv/a:b"}, "llm_server_project_dir", "bind mount"),
    ({"llm_server_model_dir": "/srv/models/../etc"}, "llm_server_model_dir", "'..'"),
    ({"llm_server_moe_offload_mode": "most"}, "llm_server_moe_offload_mode", "is not one of"),
    ({"llm_server_moe_offload_layers": [1, -2]}, "llm_server_moe_offload_layers", "out of range"),
    ({"llm_server_lock_lease": 30}, "llm_server_lock_lease", "from 60"),
    ({"llm_server_lock_lease": 600}, "llm_server_lock_lease", "twice llm_server_health_timeout"),
])
def test_each_bad_value_gets_one_message_naming_its_variable(values, name, words):
    found = problems(**values)
    assert list(found) == [name], found
    assert words in found[name]


def test_several_bad_values_give_one_message_each():
    found = problems(llm_server_port=99999, llm_server_ctx_size=-5, llm_server_image="a b")
    assert sorted(found) == ["llm_server_ctx_size", "llm_server_image", "llm_server_port"]


def test_numbers_from_extra_vars_are_taken_as_integers():
    s = check_settings(dict(BASE, llm_server_port="18080", llm_server_ctx_size="512", llm_server_n_gpu_layers="all"))
    assert (s.port, s.ctx_size, s.n_gpu_layers) == (18080, 512, "all")


def test_paths_are_compared_as_paths():
    assert container_model_path("/srv/models/x.gguf", "/srv/mod", "/models") is None
    assert container_model_path("/srv/models/x.gguf", "/srv/models", "/models") == "/models/x.gguf"
    assert container_model_path("/srv/models/sub/x.gguf", "/srv", "/m") == "/m/models/sub/x.gguf"
    found = problems(llm_server_model_dir="/srv/mod")
    assert "not inside llm_server_model_dir /srv/mod (compared as paths)" in found["llm_server_model_path"]
    s = check_settings(dict(BASE, llm_server_model_dir="/srv/models/"))
    assert (s.model_dir, s.container_model_path) == ("/srv/models", "/models/x.gguf")


def test_the_model_is_required_except_for_the_rollback():
    assert "it is required" in problems(llm_server_model_path="")["llm_server_model_path"]
    assert check_settings(dict(BASE, llm_server_model_path=""), entry="rollback").model_path == ""


# --- the API key and the address ---------------------------------------------------------------------------------


def test_a_non_loopback_address_needs_a_key_or_a_permission():
    assert "no llm_server_api_key is set" in problems(llm_server_bind_address="0.0.0.0")["llm_server_bind_address"]
    assert problems(api_key="sk-1", llm_server_bind_address="0.0.0.0") == {}
    assert problems(llm_server_bind_address="0.0.0.0", llm_server_allow_unauthenticated=True) == {}
    assert problems(llm_server_bind_address="::1", llm_server_network_mode="host") == {}
    assert "IPv6" in problems(llm_server_bind_address="::1")["llm_server_bind_address"]


@pytest.mark.parametrize("key", ["sk-\nX", "sk-é", " sk-1", "sk-1 ", "sk-\x00", "k" * 4097])
def test_keys_llama_server_cannot_read_back_are_refused_without_showing_them(key):
    message = problems(api_key=key)["llm_server_api_key"]
    assert "the key itself is not shown" in message
    assert key.strip() not in message


@pytest.mark.parametrize("key", ["sk-RT'0002", "sk-${HOME}", 'a"b\\c $x `y` #z', "with inner space"])
def test_keys_with_quotes_dollars_and_backslashes_are_kept(key):
    assert api_key_problem(key) is None
    assert problems(api_key=key) == {}


def test_base_url():
    assert base_url("0.0.0.0", 8080) == "http://127.0.0.1:8080"
    assert base_url("::", 80) == "http://[::1]:80"
    assert base_url("10.1.2.3", 8080) == "http://10.1.2.3:8080"


# --- patterns ----------------------------------------------------------------------------------------------------


def test_patterns_longer_than_llama_server_takes_are_refused_with_a_message():
    long = "|".join(r"blk\.%d\.ffn_up_exps" % i for i in range(2000))
    assert len(long) > MAX_PATTERN_BYTES
    assert "llama-server crashes on patterns this long" in offload_pattern_problem(long)
    assert "bytes long" in problems(llm_server_moe_offload_pattern=long)["llm_server_moe_offload_pattern"]


@pytest.mark.parametrize("pattern, words", [
    (r"blk\.1\.ffn_up_exps=CPU", "'='"),
    (r"blk\.{1,3}", "','"),
    ("blk\\.1\n", "control characters"),
    ("blk${X}", "'${'"),
    ("(?P<n>exps)", "ECMAScript"),
])
def test_patterns_that_do_not_survive_env_compose_and_llama_cpp_are_refused(pattern, words):
    assert words in problems(llm_server_moe_offload_pattern=pattern)["llm_server_moe_offload_pattern"]
