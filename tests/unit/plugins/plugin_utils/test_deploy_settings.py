"""The role's settings on the controller (plugins/plugin_utils/_deploy_settings.py): every variable the host has
goes through the action's templar, then check_settings; a refusal is a failed result that names the host and
lists every problem, each with its variable."""
from __future__ import annotations

import time

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_values import check_settings
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_settings import role_settings
from tests.helpers.role_vars import role_values

BASE = role_values(llm_server_model_path="/srv/models/x.gguf")


def plain(value):
    return value


def test_settings_are_check_settings_of_the_templated_variables_with_the_time_of_the_check():
    rendered = []

    def template(value):
        rendered.append(value)
        return 9090 if value == "{{ port }}" else value

    before = time.time()
    settings, failure = role_settings(template, dict(BASE, llm_server_port="{{ port }}", inventory_hostname="h1",
                                                     unrelated="{{ not templated }}"))
    assert failure is None
    assert before <= settings.pop("started") <= time.time()
    assert settings == check_settings(dict(BASE, llm_server_port=9090)).as_dict()
    assert settings["port"] == 9090
    assert "{{ port }}" in rendered and "{{ not templated }}" not in rendered


def test_the_api_key_is_templated_checked_and_never_returned():
    settings, failure = role_settings(plain, dict(BASE, llm_server_api_key="s3cret-key"))
    assert failure is None and settings["api_key_set"] is True
    assert "s3cret-key" not in repr(settings)
    settings, failure = role_settings(lambda v: None if v == "" else v, dict(BASE, llm_server_api_key=""))
    assert failure is None and settings["api_key_set"] is False
    no_key = {name: value for name, value in BASE.items() if name != "llm_server_api_key"}
    assert role_settings(plain, no_key)[0]["api_key_set"] is False


def test_a_refusal_names_the_host_and_every_problem_with_its_variable():
    settings, failure = role_settings(plain, dict(BASE, llm_server_port=99999, llm_server_ctx_size=0,
                                                  inventory_hostname="gpu-7"))
    assert settings is None
    assert failure["failed"] is True
    assert failure["problems"] == [
        "llm_server_port: 99999 is out of range: an integer from 1 to 65535",
        "llm_server_ctx_size: 0 is out of range: an integer from 1 to 2147483647",
    ]
    assert failure["msg"] == ("llm_server: these values cannot be deployed on gpu-7: "
                              + "; ".join(failure["problems"]) + ". Nothing was changed.")


def test_the_rollback_entry_needs_no_model_and_a_host_without_its_name_is_refused_as_question_mark():
    no_model = dict(BASE, llm_server_model_path="")
    failure = role_settings(plain, no_model)[1]
    assert failure["problems"] == [
        "llm_server_model_path: it is required: the GGUF on the host (the first shard of a split model)"]
    assert failure["msg"] == ("llm_server: this value cannot be deployed on ?: " + failure["problems"][0]
                              + ". Nothing was changed.")
    settings, failure = role_settings(plain, no_model, entry="rollback")
    assert failure is None and settings["model_path"] == ""
