"""The whole contract of each check and encoder in plugins/module_utils/_deploy_values.py: exact values, exact
messages (each names its variable and shows the value), both sides of every limit and every default."""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_values import (
    INT32_MAX,
    InputError,
    _Checker,
    api_key_problem,
    base_url,
    check_placement,
    check_settings,
    compose_literal,
    compose_reference,
    container_model_path,
    control_chars,
    device_overrides_problem,
    dotenv_problem,
    dotenv_quote,
    dotenv_unquote,
    offload_pattern_problem,
    project_paths,
)

BASE = {
    "llm_server_model_path": "/srv/models/x.gguf",
    "llm_server_project_dir": "/srv/ai-llm",
    "llm_server_compose_project": "ai-llm",
}

DOLLAR_BRACE = "it holds '${', which podman-compose's .env parser (python-dotenv) expands even inside quotes"
PROJECT_NAME = ("a compose project name (lower-case letters, digits, '_' and '-', starting with a letter or digit; "
                "the default is the basename of llm_server_project_dir)")
CONTAINER_NAME = "a container name (letters, digits, '_', '.' and '-', starting with a letter or digit)"
SERVICE_NAME = "a compose service name (letters, digits, '.', '_' and '-')"
IMAGE = "an image reference ([registry/]name[:tag][@digest])"
LOG_SIZE = "a size such as 50m (digits and k, m or g)"
OPEN_BIND = ("%s is reachable from other hosts and no llm_server_api_key is set: anyone on the network could use the "
             "server. Set llm_server_api_key, bind to 127.0.0.1, or set llm_server_allow_unauthenticated=true")


def problems(api_key=None, entry="main", **values):
    """The {variable: message} check_settings refuses BASE updated by ``values`` with ({} when accepted)."""
    try:
        check_settings(dict(BASE, **values), api_key=api_key, entry=entry)
    except InputError as exc:
        return dict(exc.problems)
    return {}


def settings(**values):
    return check_settings(dict(BASE, **values))


# --- InputError ------------------------------------------------------------------------------------------------


def test_input_error_joins_variable_and_message_pairs():
    exc = InputError([("llm_server_port", "0 is out of range"), ("llm_server_image", "bad")])
    assert exc.problems == [("llm_server_port", "0 is out of range"), ("llm_server_image", "bad")]
    assert str(exc) == "llm_server_port: 0 is out of range; llm_server_image: bad"
    assert exc.lines() == ["llm_server_port: 0 is out of range", "llm_server_image: bad"]


def test_input_error_takes_any_iterable_of_pairs():
    exc = InputError(iter([("a", "x")]))
    assert exc.problems == [("a", "x")]
    assert str(exc) == "a: x"
    assert exc.lines() == ["a: x"]
    assert InputError([]).lines() == []


def test_only_the_first_message_of_a_variable_is_kept():
    checker = _Checker({})
    assert checker.fail("a", "first") is None
    checker.fail("b", "other")
    checker.fail("a", "second")
    assert checker.problems == [("a", "first"), ("b", "other")]


# --- .env ------------------------------------------------------------------------------------------------------


def test_control_chars_are_c0_del_and_c1_as_sorted_escapes():
    assert control_chars("\x9b\nab\x00\x7f\n") == ["\\n", "\\x00", "\\x7f", "\\x9b"]
    assert control_chars("\x1f\x9f") == ["\\x1f", "\\x9f"]
    assert control_chars(" ~\xa0é\u2028") == []
    assert control_chars("") == []


@pytest.mark.parametrize("value, message", [
    ("a\tb\n", "it holds control characters (\\n, \\t), which a .env line cannot carry"),
    ("${\n", "it holds control characters (\\n), which a .env line cannot carry"),
    ("sk-${HOME}", DOLLAR_BRACE),
    ("${\\\\", DOLLAR_BRACE),
    ("a\\\\b", "it holds a double backslash, which python-dotenv reads as one backslash and docker compose as two"),
    ("\\\\'", "it holds a double backslash, which python-dotenv reads as one backslash and docker compose as two"),
    ("a\\'b", "it holds a backslash before a single quote, which the .env parsers read as an escaped quote"),
    ("ends\\", "it ends with a backslash, which would escape the closing quote in .env"),
])
def test_dotenv_problem_names_the_first_rule_broken(value, message):
    assert dotenv_problem(value) == message


@pytest.mark.parametrize("value", ["", "$HOME", "{}", "a\\b", "it's", "\\.", "ü", "$"])
def test_dotenv_problem_accepts_what_both_parsers_read_alike(value):
    assert dotenv_problem(value) is None


def test_dotenv_quote_single_quotes_and_escapes_quotes():
    assert dotenv_quote("") == "''"
    assert dotenv_quote("abc") == "'abc'"
    assert dotenv_quote("a'b'") == "'a\\'b\\''"


@pytest.mark.parametrize("text, value", [
    ("'abc'", "abc"),
    ("  'abc'\n", "abc"),
    ("''", ""),
    ("'a\\'b'", "a'b"),
    ("'\\''", "'"),
    ("'a\\b'", "a\\b"),
    ("'", "'"),
    ("'abc", "'abc"),
    ("abc'", "abc'"),
    (" plain ", "plain"),
    ("", ""),
    ('"x"', '"x"'),
])
def test_dotenv_unquote_reads_the_roles_own_encoding(text, value):
    assert dotenv_unquote(text) == value


@pytest.mark.parametrize("value", ["", "it's", "'", "a'b'c", "a\\b", "$x"])
def test_dotenv_unquote_reverses_dotenv_quote(value):
    assert dotenv_unquote(dotenv_quote(value)) == value


# --- compose ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, text", [
    ("", '""'),
    ("$", '"$$"'),
    ("a$$b", '"a$$$$b"'),
    (8080, '"8080"'),
    ("ünï", '"ünï"'),
    ("\xa0", '"\xa0"'),
    ('q"\\', '"q\\"\\\\"'),
    ("\x1f\n", '"\\u001f\\n"'),
    ("\x7f", '"\\u007f"'),
    ("\x85\x9f", '"\\u0085\\u009f"'),
    ("a\u2028b\u2029", '"a\\u2028b\\u2029"'),
    ("\ufeff\ufffe\uffff", '"\\ufeff\\ufffe\\uffff"'),
])
def test_compose_literal_is_a_json_string_with_dollars_doubled_and_non_ascii_kept(value, text):
    assert compose_literal(value) == text


def test_compose_reference_is_the_roles_unescaped_env_reference():
    assert compose_reference("LLM_PORT") == '"${LLM_PORT:-}"'
    assert compose_reference("LLM_PORT", "8080") == '"${LLM_PORT:-8080}"'


# --- the pattern and the API key ---------------------------------------------------------------------------------


def test_offload_pattern_problem_limits_the_utf8_bytes():
    assert offload_pattern_problem("a" * 16384) is None
    assert offload_pattern_problem("a" * 16385) == (
        "it is 16385 bytes long; llama-server crashes on patterns this long, the most the role deploys is 16384: "
        "move whole blocks with a shorter pattern (for example llm_server_moe_offload_mode=layers)")
    assert offload_pattern_problem("é" * 8193) == (
        "it is 16386 bytes long; llama-server crashes on patterns this long, the most the role deploys is 16384: "
        "move whole blocks with a shorter pattern (for example llm_server_moe_offload_mode=layers)")


def test_offload_pattern_problem_checks_env_then_regex():
    assert offload_pattern_problem(r"blk\.(3|4)\.ffn_.*_exps\.weight$") is None
    assert offload_pattern_problem("blk${X}") == DOLLAR_BRACE
    assert offload_pattern_problem("blk\n") == "it holds control characters (\\n), which a .env line cannot carry"
    assert offload_pattern_problem("(?i)exps") == "inline flags such as (?i) are not ECMAScript std::regex syntax"


BAD_ITEM = "%s is not PATTERN=DEVICE (one '=', no ',')"


@pytest.mark.parametrize("overrides, problem", [
    ([], None),
    ([r"blk\.0\.ffn_.*_exps=CUDA0", "exps=CUDA_Host"], None),
    (["exps"], BAD_ITEM % '"exps"'),
    (["a=b=CUDA0"], BAD_ITEM % '"a=b=CUDA0"'),
    (["a,b=CUDA0"], BAD_ITEM % '"a,b=CUDA0"'),
    (["=CUDA0"], BAD_ITEM % '"=CUDA0"'),
    (["exps=0CUDA"], BAD_ITEM % '"exps=0CUDA"'),
    (["exps=CUDA-0"], BAD_ITEM % '"exps=CUDA-0"'),
    (["ok=CUDA0", "exps"], BAD_ITEM % '"exps"'),
    (["a${=CUDA0"], '"a${=CUDA0": ' + DOLLAR_BRACE),
    (["(?i)x=CUDA0"], '"(?i)x=CUDA0": inline flags such as (?i) are not ECMAScript std::regex syntax'),
])
def test_device_overrides_problem_checks_each_item(overrides, problem):
    assert device_overrides_problem(overrides) == problem


def test_device_overrides_together_fit_in_one_pattern():
    exact = ["a" * 8185 + "=CUDA0", "b" * 8186 + "=CUDA1"]
    assert len(",".join(exact)) == 16384
    assert device_overrides_problem(exact) is None
    over = ["a" * 8186 + "=CUDA0", "b" * 8186 + "=CUDA1"]
    assert device_overrides_problem(over) == "together 16385 bytes, more than the 16384 llama-server takes"


@pytest.mark.parametrize("key, problem", [
    ("k" * 4096, None),
    ("sk- ~!", None),
    ("k" * 4097, "it is 4097 characters long; the most is 4096"),
    ("sk-é", "it holds a character outside printable ASCII (a control character, newline or non-ASCII letter), "
             "which an Authorization header or llama-server's key file cannot carry unchanged"),
    ("sk-\x7f", "it holds a character outside printable ASCII (a control character, newline or non-ASCII letter), "
                "which an Authorization header or llama-server's key file cannot carry unchanged"),
    ("sk\t", "it holds a character outside printable ASCII (a control character, newline or non-ASCII letter), "
             "which an Authorization header or llama-server's key file cannot carry unchanged"),
    (" sk", "it starts or ends with a space, which HTTP drops from the Authorization header"),
    ("sk ", "it starts or ends with a space, which HTTP drops from the Authorization header"),
])
def test_api_key_problem(key, problem):
    assert api_key_problem(key) == problem


# --- settings: defaults and paths --------------------------------------------------------------------------------


def test_defaults_of_every_setting():
    assert settings().as_dict() == {
        "project_dir": "/srv/ai-llm",
        "compose_file": "docker-compose.prod.yml",
        "compose_project": "ai-llm",
        "compose_command": [],
        "service_name": "ai-llm",
        "container_name": "ai-llm",
        "image": "localhost/ai-llm:cuda",
        "restart_policy": "unless-stopped",
        "network_mode": "",
        "bind_address": "127.0.0.1",
        "port": 8080,
        "container_port": 8080,
        "log_max_size": "50m",
        "log_max_file": 3,
        "log_verbosity": None,
        "extra_args": [],
        "api_key_set": False,
        "allow_unauthenticated": False,
        "model_path": "/srv/models/x.gguf",
        "model_dir": "/srv/models",
        "model_mount": "/models",
        "container_model_path": "/models/x.gguf",
        "ctx_size": 8192,
        "parallel": 1,
        "n_gpu_layers": "99",
        "gpu_devices": [],
        "moe_offload_mode": "auto",
        "moe_offload_layers": [],
        "moe_offload_pattern": "",
        "moe_offload_force": False,
        "health_timeout": 300,
        "verify_always": False,
        "vram_check": True,
        "vram_tolerance_mib": 1024,
        "parity_check": False,
        "parity_prompt": "The capital of France is",
        "parity_n_predict": 16,
        "parity_seed": 42,
        "rollback": True,
        "rollback_dir": "/srv/ai-llm/.rollback",
        "rollback_to": "previous",
        "lock_timeout": 1800,
        "lock_lease": 3600,
        "base_url": "http://127.0.0.1:8080",
        "paths": {
            "env": "/srv/ai-llm/.env",
            "compose": "/srv/ai-llm/docker-compose.prod.yml",
            "verification": "/srv/ai-llm/verification.json",
            "secrets": "/srv/ai-llm/secrets",
            "api_key": "/srv/ai-llm/secrets/api-key",
            "lock": "/srv/ai-llm/.llm_server.lock",
            "rollback": "/srv/ai-llm/.rollback",
        },
    }


def test_project_paths_are_the_files_under_the_project_dir():
    assert project_paths("/p", "c.yaml", "/r") == {
        "env": "/p/.env",
        "compose": "/p/c.yaml",
        "verification": "/p/verification.json",
        "secrets": "/p/secrets",
        "api_key": "/p/secrets/api-key",
        "lock": "/p/.llm_server.lock",
        "rollback": "/r",
    }


def test_paths_follow_the_project_dir_compose_file_and_rollback_dir():
    s = settings(llm_server_project_dir="/opt/llm/", llm_server_compose_project="llm",
                 llm_server_compose_file="compose.yaml", llm_server_rollback_dir="/var/backups/llm/")
    assert (s.project_dir, s.compose_file, s.rollback_dir) == ("/opt/llm", "compose.yaml", "/var/backups/llm")
    assert s.paths == project_paths("/opt/llm", "compose.yaml", "/var/backups/llm")


def test_the_compose_project_defaults_to_the_project_dirs_basename():
    values = {k: v for k, v in BASE.items() if k != "llm_server_compose_project"}
    values["llm_server_project_dir"] = "/opt/my-llm_1/"
    assert check_settings(values).compose_project == "my-llm_1"
    assert check_settings(dict(values, llm_server_compose_project="")).compose_project == "my-llm_1"
    values["llm_server_project_dir"] = "/opt/My-LLM"
    with pytest.raises(InputError) as caught:
        check_settings(values)
    assert caught.value.problems == [("llm_server_compose_project", '"My-LLM" is not ' + PROJECT_NAME)]


def test_the_project_dir_and_project_name_have_defaults():
    s = check_settings({"llm_server_model_path": "/srv/models/x.gguf"})
    assert (s.project_dir, s.compose_project, s.rollback_dir) == ("/srv/ai-llm", "ai-llm", "/srv/ai-llm/.rollback")


def test_a_bad_project_dir_leaves_no_project_name_to_default_to():
    with pytest.raises(InputError) as caught:
        check_settings({"llm_server_model_path": "/srv/models/x.gguf", "llm_server_project_dir": "rel"})
    assert caught.value.problems == [
        ("llm_server_project_dir", '"rel" is not an absolute path'),
        ("llm_server_compose_project", '"" is not ' + PROJECT_NAME),
    ]


@pytest.mark.parametrize("value, message", [
    ("srv/ai-llm", '"srv/ai-llm" is not an absolute path'),
    ("", '"" is not an absolute path'),
    ("/srv/../ai-llm", '"/srv/../ai-llm" holds a \'..\' segment: give the path itself'),
    ("/srv/a:b", '"/srv/a:b" holds \':\' or \',\', which a compose bind mount cannot carry'),
    ("/srv/a,b", '"/srv/a,b" holds \':\' or \',\', which a compose bind mount cannot carry'),
    (5, "5 is not a string"),
])
def test_a_bad_project_dir_is_named_with_its_value(value, message):
    assert problems(llm_server_project_dir=value) == {"llm_server_project_dir": message}


def test_paths_are_normalised_and_dotted_names_are_not_parent_segments():
    s = settings(llm_server_project_dir="/srv//ai-llm/./", llm_server_model_path="/srv/models/..x/a..b.gguf",
                 llm_server_model_dir="/srv/models/..x")
    assert (s.project_dir, s.model_path, s.container_model_path) == (
        "/srv/ai-llm", "/srv/models/..x/a..b.gguf", "/models/a..b.gguf")


def test_only_mounted_paths_refuse_colons_and_commas():
    s = settings(llm_server_model_path="/srv/models/a:b,c.gguf", llm_server_rollback_dir="/srv/back:up,1")
    assert (s.model_path, s.container_model_path, s.rollback_dir) == (
        "/srv/models/a:b,c.gguf", "/models/a:b,c.gguf", "/srv/back:up,1")
    assert problems(llm_server_model_dir="/srv/models:ro") == {
        "llm_server_model_dir": '"/srv/models:ro" holds \':\' or \',\', which a compose bind mount cannot carry'}
    assert problems(llm_server_model_mount="/m,x") == {
        "llm_server_model_mount": '"/m,x" holds \':\' or \',\', which a compose bind mount cannot carry'}


def test_the_model_dir_defaults_to_the_model_paths_directory_and_the_mount_is_configurable():
    s = settings(llm_server_model_path="/data/gguf/sub/m-00001-of-00002.gguf", llm_server_model_dir="/data",
                 llm_server_model_mount="/mnt/m/")
    assert (s.model_dir, s.model_mount, s.container_model_path) == (
        "/data", "/mnt/m", "/mnt/m/gguf/sub/m-00001-of-00002.gguf")
    s = settings(llm_server_model_path="/data/gguf/m.gguf", llm_server_model_dir="")
    assert (s.model_dir, s.container_model_path) == ("/data/gguf", "/models/m.gguf")


@pytest.mark.parametrize("values, found", [
    ({"llm_server_model_path": ""},
     {"llm_server_model_path": "it is required: the GGUF on the host (the first shard of a split model)"}),
    ({"llm_server_model_path": None},
     {"llm_server_model_path": "it is required: the GGUF on the host (the first shard of a split model)"}),
    ({"llm_server_model_path": "x.gguf"}, {"llm_server_model_path": '"x.gguf" is not an absolute path'}),
    ({"llm_server_model_dir": "/srv/mod"},
     {"llm_server_model_path": "/srv/models/x.gguf is not inside llm_server_model_dir /srv/mod (compared as paths), "
                               "which is what the container gets mounted at /models"}),
    ({"llm_server_model_dir": "/srv/models/x.gguf"},
     {"llm_server_model_path": "/srv/models/x.gguf is not inside llm_server_model_dir /srv/models/x.gguf (compared "
                               "as paths), which is what the container gets mounted at /models"}),
    ({"llm_server_model_mount": "/"},
     {"llm_server_model_mount": "'/' would hide the image's own files: mount elsewhere"}),
    ({"llm_server_model_mount": "models"}, {"llm_server_model_mount": '"models" is not an absolute path'}),
    ({"llm_server_model_path": "/srv/models/${X}.gguf"},
     {"llm_server_model_path": 'the path in the container "/models/${X}.gguf" cannot go into .env: ' + DOLLAR_BRACE}),
])
def test_model_path_problems(values, found):
    assert problems(**values) == found


def test_the_rollback_entry_ignores_the_model_variables_when_no_model_is_given():
    s = check_settings(dict(BASE, llm_server_model_path="", llm_server_model_dir="rel",
                            llm_server_model_mount="/"), entry="rollback")
    assert (s.model_path, s.model_dir, s.model_mount, s.container_model_path) == ("", "", "/models", None)
    assert problems(entry="rollback", llm_server_model_path="x.gguf") == {
        "llm_server_model_path": '"x.gguf" is not an absolute path'}
    assert problems(llm_server_model_path="", llm_server_model_mount="/") == {
        "llm_server_model_path": "it is required: the GGUF on the host (the first shard of a split model)",
        "llm_server_model_mount": "'/' would hide the image's own files: mount elsewhere"}


def test_rollback_dir_defaults_under_the_project_dir_and_must_differ_from_it():
    assert problems(llm_server_rollback_dir="/srv/ai-llm/") == {
        "llm_server_rollback_dir": "it must not be llm_server_project_dir itself"}
    assert problems(llm_server_rollback_dir="backups") == {
        "llm_server_rollback_dir": '"backups" is not an absolute path'}
    assert problems(llm_server_project_dir="rel") == {
        "llm_server_project_dir": '"rel" is not an absolute path'}


def test_container_model_path_edges():
    assert container_model_path("/srv/models", "/srv/models", "/models") is None
    assert container_model_path("x.gguf", "/srv", "/models") is None
    assert container_model_path("/a/b/c.gguf", "/", "/m") == "/m/a/b/c.gguf"


def test_base_url_brackets_ipv6_and_maps_wildcards_to_loopback():
    assert base_url("::1", 8080) == "http://[::1]:8080"
    assert base_url("fd00::5", 1) == "http://[fd00::5]:1"
    assert base_url("127.0.0.1", 65535) == "http://127.0.0.1:65535"
    s = settings(llm_server_bind_address="::", llm_server_network_mode="host", llm_server_port="9000",
                 llm_server_allow_unauthenticated=True)
    assert (s.bind_address, s.base_url) == ("::", "http://[::1]:9000")


# --- settings: integers ------------------------------------------------------------------------------------------

INTEGERS = [
    # variable, lowest, highest, values the other limits need
    ("port", 1, 65535, {}),
    ("container_port", 1, 65535, {}),
    ("log_max_file", 1, 100, {}),
    ("log_verbosity", 0, 9, {}),
    ("ctx_size", 1, INT32_MAX, {}),
    ("parallel", 1, 256, {}),
    ("health_timeout", 1, 86400, {"llm_server_lock_lease": 604800}),
    ("vram_tolerance_mib", 0, 1048576, {}),
    ("parity_n_predict", 1, 4096, {}),
    ("parity_seed", 0, 2 ** 32 - 1, {}),
    ("lock_timeout", 0, 86400, {}),
    ("lock_lease", 900, 604800, {}),
]
RANGES = [row for row in INTEGERS if row[0] != "lock_lease"]


@pytest.mark.parametrize("variable, low, high, extra", INTEGERS)
def test_integers_are_accepted_at_both_limits(variable, low, high, extra):
    name = "llm_server_" + variable
    assert getattr(settings(**dict(extra, **{name: low})), variable) == low
    assert getattr(settings(**dict(extra, **{name: high})), variable) == high
    assert getattr(settings(**dict(extra, **{name: " %d " % high})), variable) == high


@pytest.mark.parametrize("variable, low, high, extra", RANGES)
def test_integers_one_past_either_limit_are_refused_by_name(variable, low, high, extra):
    name = "llm_server_" + variable
    assert problems(**dict(extra, **{name: low - 1})) == {
        name: "%d is out of range: an integer from %d to %d" % (low - 1, low, high)}
    assert problems(**dict(extra, **{name: high + 1})) == {
        name: "%d is out of range: an integer from %d to %d" % (high + 1, low, high)}


def test_the_lock_lease_range_and_its_rule_against_the_health_timeout():
    assert problems(llm_server_health_timeout=0) == {
        "llm_server_health_timeout": "0 is out of range: an integer from 1 to 86400"}
    assert problems(llm_server_lock_lease=59) == {
        "llm_server_lock_lease": "59 is out of range: an integer from 60 to 604800"}
    assert problems(llm_server_lock_lease=604801) == {
        "llm_server_lock_lease": "604801 is out of range: an integer from 60 to 604800"}
    assert problems(llm_server_lock_lease=60, llm_server_health_timeout=1) == {
        "llm_server_lock_lease": "60 s is shorter than a deploy may hold the lock (twice llm_server_health_timeout "
                                 "plus 300 s: 302 s)"}
    assert settings(llm_server_lock_lease=302, llm_server_health_timeout=1).lock_lease == 302
    assert problems(llm_server_lock_lease=899) == {
        "llm_server_lock_lease": "899 s is shorter than a deploy may hold the lock (twice llm_server_health_timeout "
                                 "plus 300 s: 900 s)"}


@pytest.mark.parametrize("value, number", [
    ("18080", 18080), ("+42", 42), (" 7\n", 7), (512.0, 512), ("0009", 9),
])
def test_integers_are_read_from_text_and_whole_floats(value, number):
    assert settings(llm_server_port=value).port == number


@pytest.mark.parametrize("value, shown", [
    (True, "True"),
    (False, "False"),
    (None, "None"),
    (512.5, "512.5"),
    ([1], "[1]"),
    ({"a": 1}, "{'a': 1}"),
    ("abc", '"abc"'),
    ("1.0", '"1.0"'),
    ("", '""'),
    ("8080\nX=1", '"8080\\nX=1"'),
    ("9" * 20, '"' + "9" * 20 + '"'),
    ("x" * 38, '"' + "x" * 38 + '"'),
    ("x" * 39, '"' + "x" * 36 + "..."),
    ("9" * 5000, '"' + "9" * 36 + "..."),
])
def test_what_is_not_an_integer_is_shown_in_the_message(value, shown):
    assert problems(llm_server_port=value) == {"llm_server_port": "%s is not an integer from 1 to 65535" % shown}


@pytest.mark.parametrize("value, shown", [
    (-5, "-5"),
    ("-5", "-5"),
    ("9" * 19, "9" * 19),
    (10 ** 39, "1" + "0" * 39),
    (10 ** 40, "1" + "0" * 36 + "..."),
])
def test_out_of_range_integers_are_shown_up_to_40_characters(value, shown):
    assert problems(llm_server_ctx_size=value) == {
        "llm_server_ctx_size": "%s is out of range: an integer from 1 to 2147483647" % shown}


@pytest.mark.parametrize("value, verbosity", [(None, None), ("", None), (0, 0), ("3", 3), (9, 9)])
def test_log_verbosity_is_unset_or_0_to_9(value, verbosity):
    assert settings(llm_server_log_verbosity=value).log_verbosity == verbosity
    assert settings().log_verbosity is None


def test_log_verbosity_refusals_name_it():
    assert problems(llm_server_log_verbosity="high") == {
        "llm_server_log_verbosity": '"high" is not an integer from 0 to 9'}


@pytest.mark.parametrize("value, layers", [
    ("auto", "auto"), (" all ", "all"), (0, "0"), ("007", "7"), (" 12 ", "12"), (100000, "100000"),
])
def test_gpu_layers_are_a_count_or_auto_or_all(value, layers):
    assert settings(llm_server_n_gpu_layers=value).n_gpu_layers == layers


@pytest.mark.parametrize("value", ["1234567", 1234567, 100001, "999999", -1, "-1", True, 2.0, None, "AUTO", "", [1]])
def test_other_gpu_layers_are_refused_with_the_value(value):
    assert problems(llm_server_n_gpu_layers=value) == {
        "llm_server_n_gpu_layers": "%r is not a layer count (0 to 100000), auto or all" % (value,)}


# --- settings: booleans, strings, choices, names -------------------------------------------------------------------

BOOLEANS = [
    ("allow_unauthenticated", False),
    ("moe_offload_force", False),
    ("verify_always", False),
    ("vram_check", True),
    ("parity_check", False),
    ("rollback", True),
]


@pytest.mark.parametrize("variable, default", BOOLEANS)
def test_booleans_take_ansibles_words_and_0_1(variable, default):
    name = "llm_server_" + variable
    assert getattr(settings(), variable) is default
    for word in ("yes", "true", "on", "1", " Yes ", "TRUE", "On", True, 1):
        assert getattr(settings(**{name: word}), variable) is True, word
    for word in ("no", "false", "off", "0", " NO", "False", "OFF ", False, 0):
        assert getattr(settings(**{name: word}), variable) is False, word


@pytest.mark.parametrize("variable", [variable for variable, _default in BOOLEANS])
@pytest.mark.parametrize("value", [2, -1, "maybe", "", "y", None, 1.0, [True]])
def test_other_booleans_are_refused_with_the_value(variable, value):
    name = "llm_server_" + variable
    assert problems(**{name: value}) == {name: "%r is not a boolean" % (value,)}


def test_strings_are_limited_in_length():
    assert settings(llm_server_parity_prompt="p" * 65536).parity_prompt == "p" * 65536
    assert problems(llm_server_parity_prompt="p" * 65537) == {
        "llm_server_parity_prompt": "65537 characters is longer than the 65536 allowed"}
    assert problems(llm_server_bind_address="1" * 4097) == {
        "llm_server_bind_address": "4097 characters is longer than the 4096 allowed"}
    assert problems(llm_server_bind_address="1" * 4096) == {
        "llm_server_bind_address": '"%s" is not an IPv4 or IPv6 address' % ("1" * 4096)}


def test_control_characters_are_refused_unless_the_value_allows_them():
    assert settings(llm_server_parity_prompt="Q:\n\tA").parity_prompt == "Q:\n\tA"
    assert settings(llm_server_parity_prompt=None).parity_prompt == ""
    assert problems(llm_server_bind_address="127.0.0.1\n\tX") == {
        "llm_server_bind_address": '"127.0.0.1\\n\\tX" holds control characters (\\n, \\t)'}
    assert problems(llm_server_parity_prompt=5) == {"llm_server_parity_prompt": "5 is not a string"}


@pytest.mark.parametrize("variable, choices", [
    ("restart_policy", ["no", "always", "on-failure", "unless-stopped"]),
    ("network_mode", ["", "host"]),
    ("moe_offload_mode", ["auto", "all", "none"]),
    ("rollback_to", ["previous", "none"]),
])
def test_each_choice_is_accepted(variable, choices):
    for choice in choices:
        assert getattr(settings(**{"llm_server_" + variable: choice}), variable) == choice


def test_an_unset_network_mode_is_the_default_one():
    assert settings(llm_server_network_mode=None).network_mode == ""


@pytest.mark.parametrize("variable, value, message", [
    ("restart_policy", "never", '"never" is not one of "no", "always", "on-failure", "unless-stopped"'),
    ("restart_policy", "No", '"No" is not one of "no", "always", "on-failure", "unless-stopped"'),
    ("network_mode", "bridge", '"bridge" is not one of "", "host"'),
    ("moe_offload_mode", "most", '"most" is not one of "auto", "all", "none", "layers"'),
    ("rollback_to", "all", '"all" is not one of "previous", "none"'),
    ("rollback_to", 1, "1 is not a string"),
])
def test_other_choices_are_refused_with_the_choices(variable, value, message):
    name = "llm_server_" + variable
    assert problems(**{name: value}) == {name: message}


@pytest.mark.parametrize("variable, value, what", [
    ("compose_file", "compose.json", "a file name ending in .yml or .yaml"),
    ("compose_file", ".compose.yml", "a file name ending in .yml or .yaml"),
    ("compose_file", "sub/compose.yml", "a file name ending in .yml or .yaml"),
    ("compose_project", "AI-LLM", PROJECT_NAME),
    ("compose_project", "-llm", PROJECT_NAME),
    ("compose_project", "a" * 254, PROJECT_NAME),
    ("service_name", "ai llm", SERVICE_NAME),
    ("service_name", "a" * 254, SERVICE_NAME),
    ("container_name", "-ai", CONTAINER_NAME),
    ("container_name", "ai llm", CONTAINER_NAME),
    ("container_name", "a" * 254, CONTAINER_NAME),
    ("image", "Local Host/x", IMAGE),
    ("image", "localhost/AI", IMAGE),
    ("image", "localhost/ai:-tag", IMAGE),
    ("log_max_size", "0m", LOG_SIZE),
    ("log_max_size", "10000000", LOG_SIZE),
    ("log_max_size", "50t", LOG_SIZE),
    ("log_max_size", "", LOG_SIZE),
])
def test_names_that_do_not_match_are_refused_with_what_they_should_be(variable, value, what):
    name = "llm_server_" + variable
    assert problems(**{name: value}) == {name: '"%s" is not %s' % (value, what)}


@pytest.mark.parametrize("variable, value", [
    ("compose_file", "compose.yaml"),
    ("compose_file", "a.b-c_d.yml"),
    ("compose_project", "llm_2-b"),
    ("compose_project", "a" * 253),
    ("service_name", ".ai_llm-2"),
    ("service_name", "A" * 253),
    ("container_name", "Ai.llm_2-b"),
    ("container_name", "a" * 253),
    ("image", "ghcr.io/ggml-org/llama.cpp:server-cuda"),
    ("image", "registry.local:5000/team/llm__x@sha256:" + "0a" * 32),
    ("image", "llama"),
    ("log_max_size", "1"),
    ("log_max_size", "9999999k"),
    ("log_max_size", "50M"),
    ("log_max_size", "2G"),
])
def test_names_that_match_are_kept(variable, value):
    assert getattr(settings(**{"llm_server_" + variable: value}), variable) == value


# --- settings: lists -------------------------------------------------------------------------------------------


def test_the_compose_command_is_a_list_starting_with_a_program():
    assert settings(llm_server_compose_command=["podman-compose", "--verbose"]).compose_command == [
        "podman-compose", "--verbose"]
    assert settings(llm_server_compose_command=("docker", "compose")).compose_command == ["docker", "compose"]
    assert problems(llm_server_compose_command=["-f", "x"]) == {
        "llm_server_compose_command": "['-f', 'x'] does not start with a program"}
    assert problems(llm_server_compose_command=["", "compose"]) == {
        "llm_server_compose_command": "['', 'compose'] does not start with a program"}
    assert problems(llm_server_compose_command="podman-compose") == {
        "llm_server_compose_command": "'podman-compose' is not a list of strings"}


def test_string_lists_turn_scalars_into_strings():
    assert settings(llm_server_extra_args=["--temp", 0.5, "-n", 4, "--flag", True, False]).extra_args == [
        "--temp", "0.5", "-n", "4", "--flag", "true", "false"]
    assert settings(llm_server_extra_args=["x"] * 256).extra_args == ["x"] * 256


@pytest.mark.parametrize("value, message", [
    ("--verbose", "'--verbose' is not a list of strings"),
    ({"a": 1}, "{'a': 1} is not a list of strings"),
    (None, "None is not a list of strings"),
    (["a", None], "['a', None] is not a list of strings"),
    (["a", ["b"]], "['a', ['b']] is not a list of strings"),
    (["a", {"b": 1}], "['a', {'b': 1}] is not a list of strings"),
    (["a", ("b",)], "['a', ('b',)] is not a list of strings"),
    (["ok", "a\tb\n"], 'the item "a\\tb\\n" holds control characters (\\n, \\t)'),
    (["x"] * 257, "257 items is more than the 256 allowed"),
])
def test_bad_string_lists_are_refused_with_the_value(value, message):
    assert problems(llm_server_extra_args=value) == {"llm_server_extra_args": message}


@pytest.mark.parametrize("value, numbers", [
    ([], []),
    ([0, 1023], [0, 1023]),
    ((3, 1), [3, 1]),
    ("1,2", [1, 2]),
    (" 3 , 1,3 ", [3, 1]),
    ("0", [0]),
    ([" 2 ", "5"], [2, 5]),
    ([2, 2, 2], [2]),
])
def test_integer_lists_from_lists_or_comma_separated_text(value, numbers):
    assert settings(llm_server_gpu_devices=value).gpu_devices == numbers


@pytest.mark.parametrize("value, message", [
    ("1;2", "'1;2' is not a list of integers"),
    ("-1", "'-1' is not a list of integers"),
    ("1,", "'1,' is not a list of integers"),
    ("", "'' is not a list of integers"),
    (5, "5 is not a list of integers"),
    (None, "None is not a list of integers"),
    ([1, True], "[1, True] is not a list of integers from 0 to 1023"),
    (["x"], "['x'] is not a list of integers from 0 to 1023"),
    ([1.0], "[1.0] is not a list of integers from 0 to 1023"),
    (["-1"], "['-1'] is not a list of integers from 0 to 1023"),
    ([-1], "-1 is out of range: integers from 0 to 1023"),
    ([1, 1024], "1024 is out of range: integers from 0 to 1023"),
    ("1024", "1024 is out of range: integers from 0 to 1023"),
])
def test_bad_integer_lists_are_refused_with_the_value(value, message):
    assert problems(llm_server_gpu_devices=value) == {"llm_server_gpu_devices": message}


def test_offload_layers_are_block_indices():
    s = settings(llm_server_moe_offload_mode="layers", llm_server_moe_offload_layers="0,65535")
    assert (s.moe_offload_mode, s.moe_offload_layers) == ("layers", [0, 65535])
    assert problems(llm_server_moe_offload_layers=[65536]) == {
        "llm_server_moe_offload_layers": "65536 is out of range: integers from 0 to 65535"}


def test_mode_layers_needs_layers_or_a_pattern():
    assert problems(llm_server_moe_offload_mode="layers") == {
        "llm_server_moe_offload_layers": "mode layers needs the block indices whose experts go to host RAM "
                                         "(or llm_server_moe_offload_pattern)"}
    assert settings(llm_server_moe_offload_mode="layers",
                    llm_server_moe_offload_pattern=r"blk\.3\.ffn_.*_exps").moe_offload_pattern == r"blk\.3\.ffn_.*_exps"
    assert settings(llm_server_moe_offload_layers=[4]).moe_offload_mode == "auto"


# --- settings: the pattern, the key and the address -----------------------------------------------------------------


def test_the_users_pattern_is_shown_up_to_120_characters():
    assert settings(llm_server_moe_offload_pattern=None).moe_offload_pattern == ""
    exact = "x" * 118 + "${"
    assert problems(llm_server_moe_offload_pattern=exact) == {
        "llm_server_moe_offload_pattern": '"%s" cannot be deployed: %s' % (exact, DOLLAR_BRACE)}
    longer = "x" * 119 + "${"
    assert problems(llm_server_moe_offload_pattern=longer) == {
        "llm_server_moe_offload_pattern": '"%s..." cannot be deployed: %s' % ("x" * 117, DOLLAR_BRACE)}
    assert problems(llm_server_moe_offload_pattern="blk\n") == {
        "llm_server_moe_offload_pattern": '"blk\\n" cannot be deployed: it holds control characters (\\n), '
                                          "which a .env line cannot carry"}


def test_the_users_pattern_is_limited_to_ten_million_characters():
    assert problems(llm_server_moe_offload_pattern="a" * (10 ** 7 + 1)) == {
        "llm_server_moe_offload_pattern": "10000001 characters is longer than the 10000000 allowed"}


def test_the_api_key_is_checked_but_never_shown():
    assert settings().api_key_set is False
    assert check_settings(dict(BASE), api_key="sk-1").api_key_set is True
    assert check_settings(dict(BASE), api_key="").api_key_set is False
    assert problems(api_key="sk-1 ") == {
        "llm_server_api_key": "the key cannot be deployed: it starts or ends with a space, which HTTP drops from the "
                              "Authorization header (the key itself is not shown)"}
    assert problems(api_key=5) == {"llm_server_api_key": "it is not a string"}
    assert problems(api_key=5, llm_server_bind_address="0.0.0.0") == {
        "llm_server_api_key": "it is not a string",
        "llm_server_bind_address": OPEN_BIND % "0.0.0.0"}


@pytest.mark.parametrize("values, api_key, found", [
    ({"llm_server_bind_address": "0.0.0.0"}, None, {"llm_server_bind_address": OPEN_BIND % "0.0.0.0"}),
    ({"llm_server_bind_address": "0.0.0.0"}, "", {"llm_server_bind_address": OPEN_BIND % "0.0.0.0"}),
    ({"llm_server_bind_address": "10.0.0.5", "llm_server_allow_unauthenticated": "no"}, None,
     {"llm_server_bind_address": OPEN_BIND % "10.0.0.5"}),
    ({"llm_server_bind_address": "fd00::5", "llm_server_network_mode": "host"}, None,
     {"llm_server_bind_address": OPEN_BIND % "fd00::5"}),
    ({"llm_server_bind_address": "::0001"}, None,
     {"llm_server_bind_address": "::1 is an IPv6 address: compose port publishing takes IPv4 here; use "
                                 "llm_server_network_mode=host for IPv6"}),
    ({"llm_server_bind_address": "localhost"}, None,
     {"llm_server_bind_address": '"localhost" is not an IPv4 or IPv6 address'}),
    ({"llm_server_bind_address": None}, None, {"llm_server_bind_address": '"" is not an IPv4 or IPv6 address'}),
    ({"llm_server_bind_address": 127}, None, {"llm_server_bind_address": "127 is not a string"}),
])
def test_address_problems(values, api_key, found):
    assert problems(api_key=api_key, **values) == found


@pytest.mark.parametrize("values, api_key, address", [
    ({"llm_server_bind_address": "127.0.0.2"}, None, "127.0.0.2"),
    ({"llm_server_bind_address": "10.0.0.5"}, "sk-1", "10.0.0.5"),
    ({"llm_server_bind_address": "10.0.0.5", "llm_server_allow_unauthenticated": "yes"}, None, "10.0.0.5"),
    ({"llm_server_bind_address": "::0001", "llm_server_network_mode": "host"}, None, "::1"),
    ({"llm_server_bind_address": "FD00::5", "llm_server_network_mode": "host"}, "sk-1", "fd00::5"),
])
def test_addresses_that_are_loopback_keyed_or_allowed_are_kept_normalised(values, api_key, address):
    assert check_settings(dict(BASE, **values), api_key=api_key).bind_address == address


def test_every_problem_is_reported_at_once_in_order():
    with pytest.raises(InputError) as caught:
        check_settings(dict(BASE, llm_server_port=0, llm_server_image="a b", llm_server_ctx_size="x"))
    assert caught.value.lines() == [
        "llm_server_image: \"a b\" is not " + IMAGE,
        "llm_server_port: 0 is out of range: an integer from 1 to 65535",
        "llm_server_ctx_size: \"x\" is not an integer from 1 to 2147483647",
    ]


# --- the placement -------------------------------------------------------------------------------------------------


def test_a_placement_without_problems_gives_none():
    assert check_placement("", "plan", [], 0, 0) == []
    assert check_placement(None, "plan", None, None, None) == []
    assert check_placement(r"blk\.1\.ffn_up_exps", "plan", [r"blk\.0\.ffn=CUDA0"], 8192, 8192) == []
    assert check_placement("", "plan", [], 1000000, 0) == []
    assert check_placement("", "plan", [], 0, 4096) == []


@pytest.mark.parametrize("source, what", [
    ("plan", "the pattern the plan built from the model's tensor names"),
    ("model", "the pattern gguf_info built from the model's tensor names"),
    ("user", "the pattern"),
    (None, "the pattern"),
])
def test_a_placement_pattern_problem_says_where_the_pattern_came_from(source, what):
    assert check_placement("blk${X}", source, [], 0, 0) == [
        ("llm_server_moe_offload_pattern", '%s "blk${X}" cannot be deployed: %s' % (what, DOLLAR_BRACE))]


def test_a_placement_pattern_is_shown_up_to_120_characters():
    exact = "y" * 118 + "${"
    assert check_placement(exact, "user", [], 0, 0) == [
        ("llm_server_moe_offload_pattern", 'the pattern "%s" cannot be deployed: %s' % (exact, DOLLAR_BRACE))]
    assert check_placement("y" * 119 + "${", "user", [], 0, 0) == [
        ("llm_server_moe_offload_pattern", 'the pattern "%s..." cannot be deployed: %s' % ("y" * 117, DOLLAR_BRACE))]


def test_every_placement_problem_is_listed():
    assert check_placement("a${", "plan", ["exps"], 8193, 8192) == [
        ("llm_server_moe_offload_pattern",
         "the pattern the plan built from the model's tensor names \"a${\" cannot be deployed: " + DOLLAR_BRACE),
        ("llm_server_moe_offload_pattern",
         "the plan's device overrides cannot be deployed: \"exps\" is not PATTERN=DEVICE (one '=', no ',')"),
        ("llm_server_ctx_size", "8193 is more than the model's training context 8192"),
    ]
