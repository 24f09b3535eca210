"""The role's settings on the controller (plugins/plugin_utils/_deploy_settings.py): every variable the host has
goes through the action's templar, then check_settings; a refusal is a failed result that names the host and
lists every problem, each with its variable; a name with the role's prefixes that means nothing to the role or the
playbooks is a warning with the closest known name, and a problem with llm_server_strict_variables."""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._role_variables import check_settings
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_settings import (
    KNOWN_VARIABLES,
    PLAYBOOK_VARIABLES,
    role_settings,
    unknown_variables,
)
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
    settings, failure, _warnings = role_settings(template, dict(BASE, llm_server_port="{{ port }}",
                                                                inventory_hostname="h1", unrelated="{{ not templated }}"))
    assert failure is None
    assert before <= settings.pop("started") <= time.time()
    assert settings == check_settings(dict(BASE, llm_server_port=9090)).as_dict()
    assert settings["port"] == 9090
    assert "{{ port }}" in rendered and "{{ not templated }}" not in rendered


def test_the_api_key_is_templated_checked_and_never_returned():
    settings, failure, _warnings = role_settings(plain, dict(BASE, llm_server_api_key="s3cret-key"))
    assert failure is None and settings["api_key_set"] is True
    assert "s3cret-key" not in repr(settings)
    settings, failure, _warnings = role_settings(lambda v: None if v == "" else v, dict(BASE, llm_server_api_key=""))
    assert failure is None and settings["api_key_set"] is False
    no_key = {name: value for name, value in BASE.items() if name != "llm_server_api_key"}
    assert role_settings(plain, no_key)[0]["api_key_set"] is False


def test_a_refusal_names_the_host_and_every_problem_with_its_variable():
    settings, failure, _warnings = role_settings(plain, dict(BASE, llm_server_port=99999, llm_server_ctx_size=0,
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
    settings, failure, _warnings = role_settings(plain, no_model, entry="rollback")
    assert failure is None and settings["model_path"] == ""


NO_SUCH = "no variable of the llm_server role or of the collection's playbooks has this name"
ROOT = Path(__file__).resolve().parents[4]


@pytest.mark.parametrize("names, problems", [
    # a typo gets the closest known name, in name order; other prefixes and the role's registered facts are not read
    (["llm_server_ctxsize", "llm_rollout_seral", "ctx_size", "_llm_server_prepared", "llm_rollout"],
     [("llm_rollout_seral", NO_SUCH + "; did you mean llm_rollout_serial?"),
      ("llm_server_ctxsize", NO_SUCH + "; did you mean llm_server_ctx_size?")]),
    (["llm_server_model_paht", "llm_server_zzzzzzzzzzzzzzzzzzzzzzzz"],
     [("llm_server_model_paht", NO_SUCH + "; did you mean llm_server_model_path?"),
      ("llm_server_zzzzzzzzzzzzzzzzzzzzzzzz", NO_SUCH)]),
    # every variable of the role, the key included, and of the playbooks is known
    (list(BASE) + ["llm_server_api_key", "llm_server_hosts", "llm_server_result", "llm_rollout_serial"], []),
])
def test_unknown_variables(names, problems):
    assert unknown_variables(names) == problems


def test_the_playbooks_read_exactly_the_known_names_that_are_not_the_roles():
    """Every llm_server_* and llm_rollout_* name in the playbooks and the rollout report is known, and every
    PLAYBOOK_VARIABLES entry is read there (the role's own names are its argument spec's, BASE)."""
    sources = [p.read_text(encoding="utf-8") for p in sorted((ROOT / "playbooks").glob("*.yml"))]
    sources += [p.read_text(encoding="utf-8") for p in [ROOT / "plugins" / "callback" / "rollout_report.py"]
                + sorted((ROOT / "plugins" / "plugin_utils").glob("_rollout_*.py"))]
    read = set(re.findall(r"\b(llm_(?:server|rollout)_[a-z0-9_]+)", "\n".join(sources)))
    assert read - set(KNOWN_VARIABLES) == set()
    assert set(PLAYBOOK_VARIABLES) - read == set()
    assert set(PLAYBOOK_VARIABLES) & set(BASE) == set()


def test_an_unknown_name_is_a_warning_and_with_the_strict_switch_a_problem_listed_with_the_others():
    settings, failure, warnings = role_settings(plain, dict(BASE, llm_server_ctxsize=4096, inventory_hostname="h"))
    assert failure is None and settings["ctx_size"] == BASE["llm_server_ctx_size"]
    assert warnings == ["llm_server_ctxsize: " + NO_SUCH + "; did you mean llm_server_ctx_size?"]
    settings, failure, warnings = role_settings(plain, dict(BASE, llm_server_ctxsize=4096, llm_server_port=0,
                                                            llm_server_strict_variables=True, inventory_hostname="h"))
    assert settings is None and warnings == ["llm_server_ctxsize: " + NO_SUCH + "; did you mean llm_server_ctx_size?"]
    assert failure["problems"] == ["llm_server_port: 0 is out of range: an integer from 1 to 65535", warnings[0]]
    assert failure["msg"] == ("llm_server: these values cannot be deployed on h: " + "; ".join(failure["problems"])
                              + ". Nothing was changed.")
    # strict, with every name known: deployed
    settings, failure, warnings = role_settings(plain, dict(BASE, llm_server_strict_variables="true"))
    assert failure is None and warnings == [] and settings["strict_variables"] is True
