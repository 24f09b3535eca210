"""The llm_server role's variables checked (plugins/plugin_utils/_role_variables.py): exact values, exact messages
(each names its variable and shows the value), both sides of every limit. The variables reach ``check_settings``
with the role's defaults applied (``role_values``), as a run hands them over.
"""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._role_spec import VARIABLES, short, spec_problems
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._role_variables import (
    INT32_MAX,
    SettingsError,
    check_placement,
    check_settings,
    container_model_path,
    project_paths,
)
from tests.helpers.role_vars import role_values

BASE = role_values(llm_server_model_path="/srv/models/x.gguf")

DOLLAR_BRACE = "it holds '${', which podman-compose's .env parser (python-dotenv) expands even inside quotes"
PROJECT_NAME = ("a compose project name (lower-case letters, digits, '_' and '-', starting with a letter or digit; "
                "the default is the basename of llm_server_project_dir)")
IMAGE = "an image reference ([registry/]name[:tag][@digest])"
OPEN_BIND = ("%s is reachable from other hosts and no llm_server_api_key is set: anyone on the network could use the "
             "server. Set llm_server_api_key, bind to 127.0.0.1, or set llm_server_allow_unauthenticated=true")
REQUIRED = "it is required: the GGUF on the host (the first shard of a split model)"
MOUNT = "%s holds ':' or ',', which a compose bind mount cannot carry"
HIDE = "'/' would hide the image's own files: mount elsewhere"
INTS = "%s is not a list of integers from 0 to 1023"
HELD = "%d s is shorter than a deploy may hold the lock (twice llm_server_health_timeout plus 300 s: %d s)"


def problems(api_key=None, entry="main", **values):
    """The {variable: message} check_settings refuses BASE updated by ``values`` with ({} when accepted)."""
    try:
        check_settings(dict(BASE, **values), api_key=api_key, entry=entry)
    except SettingsError as exc:
        return dict(exc.problems)
    return {}


def settings(**values):
    return check_settings(dict(BASE, **values))


def test_input_error_joins_the_pairs_of_any_iterable():
    exc = SettingsError([("llm_server_port", "0 is out of range"), ("llm_server_image", "bad")])
    assert exc.problems == [("llm_server_port", "0 is out of range"), ("llm_server_image", "bad")]
    assert str(exc) == "llm_server_port: 0 is out of range; llm_server_image: bad"
    assert exc.lines() == ["llm_server_port: 0 is out of range", "llm_server_image: bad"]
    assert exc.refusal("h1") == ("llm_server: these values cannot be deployed on h1: llm_server_port: 0 is out of "
                                 "range; llm_server_image: bad. Nothing was changed.")
    exc = SettingsError(iter([("a", "x")]))
    assert (exc.problems, str(exc), exc.lines()) == ([("a", "x")], "a: x", ["a: x"])
    assert exc.refusal("h2") == "llm_server: this value cannot be deployed on h2: a: x. Nothing was changed."
    assert SettingsError([]).lines() == []


@pytest.mark.parametrize("name", VARIABLES)
def test_a_missing_variable_is_a_programming_error_not_a_default(name):
    """The role's defaults give every variable a value: check_settings has no defaults of its own."""
    values = {k: v for k, v in BASE.items() if k != name}
    with pytest.raises(KeyError, match=r'^"%s has no value: the role\'s defaults \(defaults/main.yml\) give every variable one"$' % name):
        check_settings(values)


def test_the_api_key_is_checked_but_never_shown():
    assert settings().api_key_set is False
    assert check_settings(dict(BASE), api_key="sk-1").api_key_set is True
    assert check_settings(dict(BASE), api_key="").api_key_set is False
    assert problems(api_key="sk-1 ") == {
        "llm_server_api_key": "the key cannot be deployed: it starts or ends with a space, which HTTP drops from the "
                              "Authorization header (the key itself is not shown)"}
    assert problems(api_key=5) == {"llm_server_api_key": "it is not a string"}
    assert problems(api_key=5, llm_server_bind_address="0.0.0.0") == {
        "llm_server_api_key": "it is not a string", "llm_server_bind_address": OPEN_BIND % "0.0.0.0"}


SPLIT_URL = "https://models.example/n/m-00001-of-00002.gguf"
HEX = "ab" * 32


@pytest.mark.parametrize("values, expected", [
    # one URL, a scalar or a list of one; a split model's first shard with a host path named the same way
    ({"model_url": "https://models.example/m.gguf"}, {"model_url": ["https://models.example/m.gguf"]}),
    ({"model_url": [SPLIT_URL], "model_path": "/srv/models/m-00001-of-00002.gguf", "model_sha256": [HEX.upper(), HEX]},
     {"model_url": [SPLIT_URL], "model_sha256": [HEX, HEX]}),
    ({"model_url": SPLIT_URL, "model_path": "/srv/models/m-00001-of-00002.gguf",
      "model_sha256": "https://models.example/n/SHA256SUMS"},
     {"model_sha256": ["https://models.example/n/SHA256SUMS"]}),
    ({}, {"model_url": [], "model_sha256": [], "model_keep": 2}),
])
def test_the_model_source_is_kept_as_lists(values, expected):
    given = settings(**{"llm_server_" + k: v for k, v in values.items()}).as_dict()
    assert {k: given[k] for k in expected} == expected


@pytest.mark.parametrize("values, variable, message", [
    ({"model_url": "ftp://models.example/m.gguf"}, "model_url", "ftp://models.example/m.gguf is not an http or https URL"),
    ({"model_url": "https://u:secret@models.example/m.gguf"}, "model_url",
     "https://models.example/m.gguf holds credentials, which would show in logs: give them in llm_server_model_headers"),
    ({"model_url": SPLIT_URL}, "model_path",
     "/srv/models/x.gguf must be named as the first of 2 shards (<name>-00001-of-00002.gguf), the names llama.cpp "
     "looks for the other shards under"),
    ({"model_url": "https://models.example/m.gguf", "model_sha256": ["abc"]}, "model_sha256",
     '"abc" is neither a sha256 (64 hex digits) nor, alone, the URL of a SHA256SUMS file'),
    ({"model_sha256": [HEX]}, "model_sha256", "it checks a model fetched from llm_server_model_url, which is empty"),
    ({"model_keep": 0}, "model_keep", "0 is out of range: an integer from 1 to 1000"),
])
def test_a_model_source_that_cannot_be_fetched_is_refused_by_name(values, variable, message):
    assert problems(**{"llm_server_" + k: v for k, v in values.items()}) == {"llm_server_" + variable: message}


@pytest.mark.parametrize("headers, message", [
    ({"Authorization": "Bearer hf_x", "X-Count": 3}, None),
    ("Bearer hf_x", "it is not a dict of header names and values"),
    ({"Bad Name": "v"}, '"Bad Name" is not an HTTP header name'),
    ({"Authorization": "Bearer x\r\nX-Injected: 1"},
     "the value of Authorization is not one line of text (not shown: it may be a token)"),
])
def test_the_model_headers_are_checked_but_never_kept_or_shown(headers, message):
    try:
        kept = check_settings(dict(BASE), model_headers=headers).as_dict()
    except SettingsError as exc:
        assert dict(exc.problems) == {"llm_server_model_headers": message}
        assert "hf_x" not in str(exc)
    else:
        assert message is None and "hf_x" not in repr(kept)


def test_several_bad_values_give_one_message_each_in_order():
    with pytest.raises(SettingsError) as caught:
        check_settings(dict(BASE, llm_server_port=0, llm_server_image="a b", llm_server_ctx_size="x"))
    assert caught.value.lines() == [
        "llm_server_image: \"a b\" is not " + IMAGE,
        "llm_server_port: 0 is out of range: an integer from 1 to 65535",
        "llm_server_ctx_size: \"x\" is not an integer from 1 to 2147483647",
    ]


def test_a_bad_project_dir_leaves_no_compose_project_name_to_take_and_an_empty_rollback_dir_falls_back_to_the_root():
    assert problems(llm_server_project_dir="rel", llm_server_compose_project="", llm_server_rollback_dir="") == {
        "llm_server_project_dir": '"rel" is not an absolute path',
        "llm_server_compose_project": '"" is not ' + PROJECT_NAME}


def test_the_rollback_entry_ignores_the_model_variables_when_no_model_is_given():
    """A relative model path is outside any directory; the root holds every path."""
    assert container_model_path("x.gguf", "/srv", "/models") is None
    assert container_model_path("/a/b/c.gguf", "/", "/m") == "/m/a/b/c.gguf"
    s = check_settings(dict(BASE, llm_server_model_path="", llm_server_model_dir="rel",
                            llm_server_model_mount="/"), entry="rollback")
    assert (s.model_path, s.model_dir, s.model_mount, s.container_model_path) == ("", "", "", None)
    assert problems(entry="rollback", llm_server_model_path="x.gguf") == {
        "llm_server_model_path": '"x.gguf" is not an absolute path'}
    assert problems(llm_server_model_path="", llm_server_model_mount="/") == {
        "llm_server_model_path": REQUIRED,
        "llm_server_model_mount": HIDE}


@pytest.mark.parametrize("values, api_key, address", [
    ({"bind_address": "127.0.0.2"}, None, "127.0.0.2"), ({"bind_address": "0.0.0.0"}, "sk-1", "0.0.0.0"),
    ({"bind_address": "0.0.0.0", "allow_unauthenticated": True}, None, "0.0.0.0"),
    ({"bind_address": "10.0.0.5"}, "sk-1", "10.0.0.5"),
    ({"bind_address": "10.0.0.5", "allow_unauthenticated": "yes"}, None, "10.0.0.5"),
    ({"bind_address": "::1", "network_mode": "host"}, None, "::1"),
    ({"bind_address": "::0001", "network_mode": "host"}, None, "::1"),
    ({"bind_address": "FD00::5", "network_mode": "host"}, "sk-1", "fd00::5"),
])
def test_addresses_that_are_loopback_keyed_or_allowed_are_kept_normalised(values, api_key, address):
    given = {"llm_server_" + name: value for name, value in values.items()}
    assert check_settings(dict(BASE, **given), api_key=api_key).bind_address == address


def _bad(variable, value, message):
    """A row of ``variable`` refusing ``value`` on its own."""
    return ({variable: value}, variable, message)


def _not(variable, what, *values):
    """Rows of values ``variable`` refuses as '"<value>" is not <what>'."""
    return [_bad(variable, value, '"%s" is not %s' % (value, what)) for value in values]


BOOLEANS = ["allow_unauthenticated", "moe_offload_force", "verify_always", "vram_check", "parity_check", "rollback"]
REFUSED = [
    # the values given (variables without the prefix), the variable refused, its message
    _bad("project_dir", "srv/ai-llm", '"srv/ai-llm" is not an absolute path'),
    _bad("project_dir", "/srv/../ai-llm", '"/srv/../ai-llm" holds a \'..\' segment: give the path itself'),
    _bad("project_dir", "/srv/a:b", MOUNT % '"/srv/a:b"'), _bad("project_dir", "/srv/a,b", MOUNT % '"/srv/a,b"'),
    _bad("project_dir", 5, "5 is not a string"), _bad("rollback_dir", "backups", '"backups" is not an absolute path'),
    _bad("rollback_dir", "/srv/ai-llm/", "it must not be llm_server_project_dir itself"),
    _bad("rollback_to", 1, "1 is not a string"),
    *_not("restart_policy", 'one of "no", "always", "on-failure", "unless-stopped"', "never", "No"),
    *_not("network_mode", 'one of "", "host"', "bridge"),
    *_not("gpu_access", 'one of "auto", "reservations", "cdi"', "nvidia"),
    *_not("moe_offload_mode", 'one of "auto", "all", "none", "layers"', "most"),
    *_not("moe_offload_goal", 'one of "fit", "speed"', "fastest"),
    *_not("rollback_to", 'one of "previous", "none"', "all"),
    *_not("compose_file", "a file name ending in .yml or .yaml", "compose.json", ".compose.yml", "sub/compose.yml"),
    *_not("compose_project", PROJECT_NAME, "AI-LLM", "-llm", "a" * 254),
    ({"project_dir": "/opt/My-LLM", "compose_project": ""}, "compose_project", '"My-LLM" is not ' + PROJECT_NAME),
    *_not("service_name", "a compose service name (letters, digits, '.', '_' and '-')", "ai llm", "a" * 254),
    *_not("container_name", "a container name (letters, digits, '_', '.' and '-', starting with a letter or digit)",
          "-ai", "ai llm", "a" * 254),
    *_not("image", IMAGE, "Local Host/x", "localhost/AI", "localhost/ai:-tag"),
    *_not("log_max_size", "a size such as 50m (digits and k, m or g)", "0m", "10000000", "50t", ""),
    _bad("log_max_size", '50m"', '"50m\\"" is not a size such as 50m (digits and k, m or g)'),
    # a newline in a value the compose file or .env carries
    _bad("image", "localhost/x:1\n    privileged: true",
         '"localhost/x:1\\n    privileged: true" holds control characters (\\n)'),
    _bad("log_max_size", '50m"\n    cap_add: [ALL]', '"50m\\"\\n    cap_add: [ALL]" holds control characters (\\n)'),
    _bad("restart_policy", "no\nX", '"no\\nX" holds control characters (\\n)'),
    _bad("bind_address", "127.0.0.1\n\tX", '"127.0.0.1\\n\\tX" holds control characters (\\n, \\t)'),
    _bad("extra_args", ["--alias", "a\nb"], 'the item "a\\nb" holds control characters (\\n)'),
    _bad("extra_args", ["ok", "a\tb\n"], 'the item "a\\tb\\n" holds control characters (\\n, \\t)'),
    # strings are limited in length; control characters are refused unless allowed (the parity prompt)
    _bad("parity_prompt", "p" * 65537, "65537 characters is longer than the 65536 allowed"),
    _bad("bind_address", "1" * 4097, "4097 characters is longer than the 4096 allowed"),
    _bad("bind_address", "1" * 4096, '"%s" is not an IPv4 or IPv6 address' % ("1" * 4096)),
    _bad("parity_prompt", 5, "5 is not a string"),
    # lists
    *[_bad("extra_args", value, "%r is not a list of strings" % (value,))
      for value in ["--verbose", None, ["a", None], ["a", ["b"]], ["a", {"b": 1}], ["a", ("b",)]]],
    _bad("extra_args", ["x"] * 257, "257 items is more than the 256 allowed"),
    *[_bad("compose_command", value, "%r does not start with a program" % (value,))
      for value in (["-f", "x"], ["", "compose"])],
    _bad("compose_command", "podman-compose", "'podman-compose' is not a list of strings"),
    *[_bad("gpu_devices", value, "%r is not a list of integers" % (value,))
      for value in ["1;2", "-1", "1,", "", 5, None]],
    *[_bad("gpu_devices", value, INTS % (value,)) for value in ([1, True], ["x"], [1.0], ["-1"])],
    _bad("gpu_devices", [-1], "-1 is out of range: integers from 0 to 1023"),
    _bad("gpu_devices", [1, 1024], "1024 is out of range: integers from 0 to 1023"),
    _bad("cpu_expert_layers", [1, -2], "-2 is out of range: integers from 0 to 65535"),
    _bad("cpu_expert_layers", [65536], "65536 is out of range: integers from 0 to 65535"),
    ({"moe_offload_mode": "layers"}, "cpu_expert_layers",
     "mode layers needs the block indices whose experts go to host RAM (or llm_server_moe_offload_pattern)"),
    *[_bad("n_gpu_layers", value, "%r is not a layer count (0 to 100000), auto or all" % (value,))
      for value in ["1234567", 1234567, 100001, "999999", -1, "-1", True, 2.0, None, "AUTO", "", [1], "99\nLLM_X=1"]],
    # what is not an integer is shown in the message, an integer out of range up to 40 characters
    *[_bad("port", value, "%s is not an integer from 1 to 65535" % shown) for value, shown in [
        (True, "True"), (False, "False"), (None, "None"), (512.5, "512.5"), ([1], "[1]"), ({"a": 1}, "{'a': 1}"),
        ("abc", '"abc"'), ("1.0", '"1.0"'), ("", '""'), ("8080\nX=1", '"8080\\nX=1"'), ("9" * 20, '"' + "9" * 20 + '"'),
        ("x" * 38, '"' + "x" * 38 + '"'), ("x" * 39, '"' + "x" * 36 + "..."), ("9" * 5000, '"' + "9" * 36 + "...")]],
    *[_bad("ctx_size", value, "%s is out of range: an integer from 1 to 2147483647" % shown) for value, shown in [
        (-5, "-5"), ("-5", "-5"), ("9" * 19, "9" * 19), (10 ** 39, "1" + "0" * 39), (10 ** 40, "1" + "0" * 36 + "...")]],
    # booleans: Ansible's words and 0 or 1 only
    *[_bad(variable, value, "%r is not a boolean" % (value,)) for variable in BOOLEANS
      for value in [2, -1, "maybe", "", "y", None, 1.0, [True]]],
    # the lock lease's range and its rule against the health timeout
    *[_bad("lock_lease", value, "%d is out of range: an integer from 60 to 604800" % value) for value in (59, 604801)],
    ({"lock_lease": 60, "health_timeout": 1}, "lock_lease", HELD % (60, 302)),
    _bad("lock_lease", 899, HELD % (899, 900)),
    # the model
    _bad("model_path", "", REQUIRED), _bad("model_path", None, REQUIRED),
    _bad("model_path", "x.gguf", '"x.gguf" is not an absolute path'),
    *[({"model_dir": directory}, "model_path", "/srv/models/x.gguf is not inside llm_server_model_dir %s (compared as "
       "paths), which is what the container gets mounted at /models" % directory)
      for directory in ("/srv/mod", "/srv/models/x.gguf")],
    _bad("model_path", "/srv/models/${X}.gguf",
         'the path in the container "/models/${X}.gguf" cannot go into .env: ' + DOLLAR_BRACE),
    _bad("model_dir", "/srv/models/../etc", '"/srv/models/../etc" holds a \'..\' segment: give the path itself'),
    _bad("model_dir", "/srv/models:ro", MOUNT % '"/srv/models:ro"'),
    _bad("model_mount", "/", HIDE), _bad("model_mount", "/m,x", MOUNT % '"/m,x"'),
    _bad("model_mount", "models", '"models" is not an absolute path'),
    # the address: other hosts reach it only with a key or a permission; IPv6 only in the host's network
    _bad("bind_address", "0.0.0.0", OPEN_BIND % "0.0.0.0"),
    ({"bind_address": "10.0.0.5", "allow_unauthenticated": "no"}, "bind_address", OPEN_BIND % "10.0.0.5"),
    ({"bind_address": "fd00::5", "network_mode": "host"}, "bind_address", OPEN_BIND % "fd00::5"),
    *[_bad("bind_address", address, "::1 is an IPv6 address: compose port publishing takes IPv4 here; use "
                                    "llm_server_network_mode=host for IPv6") for address in ("::0001", "::1")],
    _bad("bind_address", "localhost", '"localhost" is not an IPv4 or IPv6 address'),
    _bad("bind_address", None, '"" is not an IPv4 or IPv6 address'), _bad("bind_address", 127, "127 is not a string"),
    # the user's pattern: the rules of any deployed pattern, shown up to 120 characters
    _bad("moe_offload_pattern", "x" * 118 + "${", '"%s" cannot be deployed: %s' % ("x" * 118 + "${", DOLLAR_BRACE)),
    _bad("moe_offload_pattern", "x" * 119 + "${", '"%s..." cannot be deployed: %s' % ("x" * 117, DOLLAR_BRACE)),
    _bad("moe_offload_pattern", "blk\n", '"blk\\n" cannot be deployed: it holds control characters (\\n), which a '
                                         '.env line cannot carry'),
    _bad("moe_offload_pattern", "a" * (10 ** 7 + 1), "10000001 characters is longer than the 10000000 allowed"),
]


@pytest.mark.parametrize("values, variable, message", REFUSED,
                         ids=["%s-%d" % (row[1], i) for i, row in enumerate(REFUSED)])
def test_each_value_that_cannot_be_deployed_is_refused_by_name_with_the_value(values, variable, message):
    given = {"llm_server_" + name: value for name, value in values.items()}
    assert problems(**given) == {"llm_server_" + variable: message}


def _kept(variable, *values):
    """Rows of values ``variable`` keeps as they are."""
    return [(variable, value, value) for value in values]


ACCEPTED = [
    # variable, value, the setting
    *_kept("compose_file", "compose.yaml", "a.b-c_d.yml"), *_kept("compose_project", "llm_2-b", "a" * 253),
    *_kept("service_name", ".ai_llm-2", "A" * 253), *_kept("container_name", "Ai.llm_2-b", "a" * 253),
    *_kept("image", "ghcr.io/ggml-org/llama.cpp:server-cuda", "registry.local:5000/team/llm__x@sha256:" + "0a" * 32,
           "llama"),
    *_kept("log_max_size", "1", "9999999k", "50M", "2G"),
    *_kept("restart_policy", "no", "always", "on-failure", "unless-stopped"), *_kept("network_mode", "", "host"),
    *_kept("moe_offload_mode", "auto", "all", "none"), *_kept("rollback_to", "previous", "none"),
    *_kept("parity_prompt", "p" * 65536, "Q:\n\tA"), ("parity_prompt", None, ""),
    ("rollback_dir", "", "/srv/ai-llm/.rollback"), ("rollback_dir", None, "/srv/ai-llm/.rollback"),
    ("network_mode", None, ""), ("ctx_size", "512", 512), ("n_gpu_layers", "all", "all"),
    ("port", "18080", 18080), ("port", "+42", 42), ("port", " 7\n", 7), ("port", 512.0, 512), ("port", "0009", 9),
    ("log_verbosity", None, None), ("log_verbosity", "", None), ("log_verbosity", 0, 0), ("log_verbosity", "3", 3),
    ("log_verbosity", 9, 9),
    ("n_gpu_layers", "auto", "auto"), ("n_gpu_layers", " all ", "all"), ("n_gpu_layers", 0, "0"),
    ("n_gpu_layers", "007", "7"), ("n_gpu_layers", " 12 ", "12"), ("n_gpu_layers", 100000, "100000"),
    ("gpu_devices", [], []), ("gpu_devices", [0, 1023], [0, 1023]), ("gpu_devices", (3, 1), [3, 1]),
    ("gpu_devices", "1,2", [1, 2]), ("gpu_devices", " 3 , 1,3 ", [3, 1]), ("gpu_devices", "0", [0]),
    ("gpu_devices", [" 2 ", "5"], [2, 5]), ("gpu_devices", [2, 2, 2], [2]),
    ("compose_command", ["podman-compose", "--verbose"], ["podman-compose", "--verbose"]),
    ("compose_command", ("docker", "compose"), ["docker", "compose"]),
    # string lists turn scalars into strings
    ("extra_args", ["--temp", 0.5, "-n", 4, "--flag", True, False],
     ["--temp", "0.5", "-n", "4", "--flag", "true", "false"]),
    ("extra_args", ["x"] * 256, ["x"] * 256), ("moe_offload_pattern", None, ""),
    # booleans take Ansible's words and 0 or 1
    *[(variable, word, True) for variable in BOOLEANS for word in ("yes", "true", "on", "1", " Yes ", "TRUE", "On", True, 1)],
    *[(variable, word, False) for variable in BOOLEANS for word in ("no", "false", "off", "0", " NO", "False", "OFF ", False, 0)],
]


@pytest.mark.parametrize("variable, value, setting", ACCEPTED,
                         ids=["%s-%d" % (row[0], i) for i, row in enumerate(ACCEPTED)])
def test_each_value_that_can_be_deployed_is_kept_normalised(variable, value, setting):
    kept = getattr(settings(**{"llm_server_" + variable: value}), variable)
    assert (kept, type(kept)) == (setting, type(setting))


COMBINED = [
    # the values given together (variables without the prefix), the settings they give
    ({"project_dir": "/opt/llm/", "compose_project": "llm", "compose_file": "compose.yaml",
      "rollback_dir": "/var/backups/llm/"},
     {"project_dir": "/opt/llm", "compose_file": "compose.yaml", "rollback_dir": "/var/backups/llm",
      "paths": project_paths("/opt/llm", "compose.yaml", "/var/backups/llm")}),
    ({"project_dir": "/opt/p", "rollback_dir": ""}, {"rollback_dir": "/opt/p/.rollback"}),
    # an empty compose project is the project dir's basename
    ({"project_dir": "/opt/my-llm_1/", "compose_project": ""}, {"compose_project": "my-llm_1"}),
    # paths are normalised, and dotted names are not parent segments
    ({"project_dir": "/srv//ai-llm/./", "model_path": "/srv/models/..x/a..b.gguf", "model_dir": "/srv/models/..x"},
     {"project_dir": "/srv/ai-llm", "model_path": "/srv/models/..x/a..b.gguf",
      "container_model_path": "/models/a..b.gguf"}),
    # only mounted paths refuse ':' and ','
    ({"model_path": "/srv/models/a:b,c.gguf", "model_dir": "/srv/models", "rollback_dir": "/srv/back:up,1"},
     {"model_path": "/srv/models/a:b,c.gguf", "container_model_path": "/models/a:b,c.gguf",
      "rollback_dir": "/srv/back:up,1"}),
    ({"model_dir": "/srv/models/"}, {"model_dir": "/srv/models", "container_model_path": "/models/x.gguf"}),
    # an empty model dir is the model path's directory, and the mount is configurable
    ({"model_path": "/data/gguf/sub/m-00001-of-00002.gguf", "model_dir": "/data", "model_mount": "/mnt/m/"},
     {"model_dir": "/data", "model_mount": "/mnt/m", "container_model_path": "/mnt/m/gguf/sub/m-00001-of-00002.gguf"}),
    ({"model_path": "/data/gguf/m.gguf", "model_dir": ""},
     {"model_dir": "/data/gguf", "container_model_path": "/models/m.gguf"}),
    # mode layers takes layers or a pattern; layers alone leave the mode as it is
    ({"moe_offload_mode": "layers", "cpu_expert_layers": "0,65535"},
     {"moe_offload_mode": "layers", "cpu_expert_layers": [0, 65535]}),
    ({"moe_offload_mode": "layers", "moe_offload_pattern": r"blk\.3\.ffn_.*_exps"},
     {"moe_offload_pattern": r"blk\.3\.ffn_.*_exps"}),
    ({"cpu_expert_layers": [4]}, {"moe_offload_mode": "auto"}),
    ({"lock_lease": 302, "health_timeout": 1}, {"lock_lease": 302}),
    # the wildcards are reached on loopback
    ({"bind_address": "::", "network_mode": "host", "port": "9000", "allow_unauthenticated": True},
     {"bind_address": "::", "base_url": "http://[::1]:9000"}),
    ({"bind_address": "0.0.0.0", "allow_unauthenticated": True}, {"base_url": "http://127.0.0.1:8080"}),
]


@pytest.mark.parametrize("values, expected", COMBINED)
def test_values_given_together_give_their_settings(values, expected):
    s = settings(**{"llm_server_" + name: value for name, value in values.items()})
    assert {name: getattr(s, name) for name in expected} == expected


# The empty values the role gives a meaning (no -lv, no speed gate, no download) where ansible-core's check of the
# spec's type refuses them (the role's README, "Variables").
EMPTY_MEANS = ("log_verbosity", "min_decode_ratio", "min_prompt_ratio", "model_url", "model_sha256")


def test_every_value_the_role_accepts_passes_ansible_cores_check_of_the_spec_but_the_empty_values_it_gives_a_meaning():
    """So the role's check refuses whatever rolespec_validate would refuse: the playbooks turn that off."""
    rows = [{variable: value} for variable, value, _setting in ACCEPTED] + [values for values, _e in COMBINED] + [{}]
    for row in rows:
        given = dict(BASE, **{"llm_server_" + name: value for name, value in row.items()})
        check_settings(given)
        assert spec_problems({name: value for name, value in given.items()
                              if not (short(name) in EMPTY_MEANS and value in (None, ""))}) == [], row
    for name in EMPTY_MEANS:
        assert check_settings(dict(BASE, **{"llm_server_" + name: None}))
        assert check_settings(dict(BASE, **{"llm_server_" + name: ""}))


INTEGERS = [
    # variable, lowest, highest, values the other limits need
    ("port", 1, 65535, {}), ("container_port", 1, 65535, {}), ("log_max_file", 1, 100, {}),
    ("log_verbosity", 0, 9, {}), ("ctx_size", 1, INT32_MAX, {}), ("parallel", 1, 256, {}),
    ("health_timeout", 1, 86400, {"llm_server_lock_lease": 604800}), ("vram_tolerance_mib", 0, 1048576, {}),
    ("parity_n_predict", 1, 4096, {}), ("parity_seed", 0, 2 ** 32 - 1, {}), ("lock_timeout", 0, 86400, {}),
    ("lock_lease", 900, 604800, {}), ("speed_prompt_tokens", 1, INT32_MAX, {}),
    ("speed_predict_tokens", 1, INT32_MAX, {}), ("speed_runs", 1, 100, {}),
]


@pytest.mark.parametrize("variable, low, high, extra", INTEGERS)
def test_integers_are_accepted_at_both_limits_and_refused_by_name_one_past(variable, low, high, extra):
    name = "llm_server_" + variable
    assert getattr(settings(**dict(extra, **{name: low})), variable) == low
    assert getattr(settings(**dict(extra, **{name: high})), variable) == high
    assert getattr(settings(**dict(extra, **{name: " %d " % high})), variable) == high
    if variable == "lock_lease":
        return  # its range is 60 to 604800 and the health timeout sets its lowest: REFUSED has both messages
    for value in (low - 1, high + 1):
        assert problems(**dict(extra, **{name: value})) == {
            name: "%d is out of range: an integer from %d to %d" % (value, low, high)}


@pytest.mark.parametrize("variable", ["min_decode_ratio", "min_prompt_ratio"])
def test_a_minimum_speed_ratio_is_a_share_in_0_to_1_or_empty(variable):
    name = "llm_server_" + variable
    assert getattr(settings(), variable) is None
    assert [getattr(settings(**{name: v}), variable) for v in (None, "", 0.9, "0.5", 1)] == [None, None, 0.9, 0.5, 1.0]
    for value in (0, 1.5, -0.1, "fast", True):
        assert problems(**{name: value}) == {
            name: "%r is not a share above 0 and at most 1 (for example 0.9), or empty" % (value,)}


PATTERN = "llm_server_moe_offload_pattern"


@pytest.mark.parametrize("args, expected", [
    # pattern, its source, device overrides, context size, the model's training context
    (("", "plan", [], 0, 0), []), ((None, "plan", None, None, None), []),
    ((r"blk\.1\.ffn_up_exps", "plan", [r"blk\.0\.ffn=CUDA0"], 8192, 8192), []), (("", "plan", [], 1000000, 0), []),
    (("", "plan", [], 0, 4096), []),
    # where the pattern came from; shown up to 120 characters
    (("blk${X}", "model", [], 0, 0),
     [(PATTERN, 'the pattern gguf_info built from the model\'s tensor names "blk${X}" cannot be deployed: ' + DOLLAR_BRACE)]),
    (("blk${X}", None, [], 0, 0), [(PATTERN, 'the pattern "blk${X}" cannot be deployed: ' + DOLLAR_BRACE)]),
    (("y" * 118 + "${", "user", [], 0, 0), [(PATTERN, 'the pattern "%s${" cannot be deployed: %s' % ("y" * 118, DOLLAR_BRACE))]),
    (("y" * 119 + "${", "user", [], 0, 0), [(PATTERN, 'the pattern "%s..." cannot be deployed: %s' % ("y" * 117, DOLLAR_BRACE))]),
    # every problem is listed
    (("a${", "plan", ["exps"], 8193, 8192), [
        (PATTERN, "the pattern the plan built from the model's tensor names \"a${\" cannot be deployed: " + DOLLAR_BRACE),
        (PATTERN, "the plan's device overrides cannot be deployed: \"exps\" is not PATTERN=DEVICE (one '=', no ',')"),
        ("llm_server_ctx_size", "8193 is more than the model's training context 8192")]),
])
def test_each_placement_problem_is_listed_with_where_the_pattern_came_from(args, expected):
    assert check_placement(*args) == expected
