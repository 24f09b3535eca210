"""The llm_server role's argument spec read on the controller (plugins/plugin_utils/_role_spec.py): the options of
the entry points, the secrets (no_log), and ansible-core's own check of the spec on each value, in ansible-core's
words (never a secret's value)."""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._role_spec import (
    OPTIONS,
    SECRETS,
    VARIABLES,
    load_options,
    short,
    spec_problems,
)

CORE = "ansible-core's check of the argument spec refuses it: "


def test_the_options_are_those_of_the_main_entry_point_which_the_others_share(tmp_path):
    spec = tmp_path / "argument_specs.yml"
    spec.write_text("argument_specs:\n  main:\n    options: &o\n      x_a: {type: int, default: 1}\n"
                    "  rollback:\n    options: *o\n", encoding="utf-8")
    assert load_options(str(spec)) == {"x_a": {"type": "int", "default": 1}}


def test_the_variables_are_the_options_that_are_not_secrets_in_the_specs_order():
    assert list(VARIABLES) == [name for name in OPTIONS if name not in SECRETS]
    assert all(OPTIONS[name]["no_log"] is True for name in SECRETS) and SECRETS
    assert short("llm_server_ctx_size") == "ctx_size"


@pytest.mark.parametrize("name, value, message", [
    ("llm_server_port", "abc", "argument 'llm_server_port' is of type str and we were unable to convert to int: "
                               "\"'abc'\" cannot be converted to an int"),
    ("llm_server_network_mode", "bridge", "value of llm_server_network_mode must be one of: , host, got: bridge"),
    ("llm_server_gpu_devices", ["x"], "Elements value for option 'llm_server_gpu_devices' is of type str and we were "
                                      "unable to convert to int: \"'x'\" cannot be converted to an int"),
    ("llm_server_allow_unauthenticated", [True], "argument 'llm_server_allow_unauthenticated' is of type list and we "
                                                 "were unable to convert to bool: <class 'list'> cannot be converted "
                                                 "to a bool"),
    # the empty values the role gives a meaning (its README, "Variables") are not the spec's types
    ("llm_server_log_verbosity", "", "argument 'llm_server_log_verbosity' is of type str and we were unable to "
                                     "convert to int: \"''\" cannot be converted to an int"),
    ("llm_server_min_decode_ratio", "", "argument 'llm_server_min_decode_ratio' is of type str and we were unable "
                                        "to convert to float: <class 'str'> cannot be converted to a float"),
    ("llm_server_model_url", None, "argument 'llm_server_model_url' is of type NoneType and we were unable to "
                                   "convert to list: <class 'NoneType'> cannot be converted to a list"),
])
def test_a_value_the_spec_refuses_gets_ansible_cores_message(name, value, message):
    assert spec_problems({name: value}) == [(name, CORE + message)]


def test_a_secret_the_spec_refuses_is_not_shown_and_what_the_spec_converts_passes():
    assert spec_problems({"llm_server_model_headers": "Bearer hf_x", "llm_server_api_key": "sk"}) == [
        ("llm_server_model_headers", "it is not a dict (the value is not shown)")]
    # a string where a string is declared may be empty or null; a list may come from Python as a tuple
    assert spec_problems({"llm_server_network_mode": None, "llm_server_parity_prompt": None,
                          "llm_server_compose_command": ("docker", "compose"), "llm_server_gpu_devices": "1,2",
                          "llm_server_min_prompt_ratio": None}) == []
