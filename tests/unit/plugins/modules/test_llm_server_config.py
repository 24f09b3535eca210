"""llm_server_config (``state=pattern_cleared``, the on-demand rollback ``none``): the offload pattern and the
device overrides cleared in the role's block of .env, every other line kept, a new configuration hash, .env read by
the compose tool first; nothing written in check mode nor when the pattern is already cleared. The files are those
the role's templates write."""
from __future__ import annotations

import os

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_render import env_values, parse_env
from tests.helpers.deploy_settings import demo_model, settings as deploy_settings
from tests.helpers.deploy_templates import render_compose, render_env

PLACEMENT = {"pattern": r"blk\.(1|4)\.ffn_(up|down)_exps\.weight$", "device_overrides": [], "topology": "cpu"}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return demo_model(tmp_path_factory)


def project(model, tmp_path, env_before="OTHER='kept'\n"):
    """The settings of a project directory under ``tmp_path`` holding the role's .env and compose file."""
    (tmp_path / "ai-llm").mkdir()
    settings = deploy_settings(model, llm_server_project_dir=str(tmp_path / "ai-llm"))
    with open(settings["paths"]["env"], "w", encoding="utf-8") as f:
        f.write(render_env(env_values(settings, PLACEMENT), "a" * 64, env_before))
    with open(settings["paths"]["compose"], "w", encoding="utf-8") as f:
        f.write(render_compose(settings, PLACEMENT, "podman"))
    return settings


def clear(ansible_module, settings, check=False):
    return ansible_module("llm_server_config", {"settings": settings, "compose_command": ["podman-compose"]}, check=check)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_the_pattern_is_cleared_once_with_a_new_hash_and_check_mode_writes_nothing(ansible_module, model, tmp_path):
    settings = project(model, tmp_path)
    env = settings["paths"]["env"]
    before = read(env)
    checked = clear(ansible_module, settings, check=True)
    assert (checked["failed"], checked["changed"], read(env)) == (False, True, before), checked
    cleared = clear(ansible_module, settings)
    assert cleared["changed"] and cleared["changed_keys"] == [
        {"key": "LLM_MOE_OFFLOAD_PATTERN", "old": PLACEMENT["pattern"], "new": ""}], cleared
    assert cleared["config_hash"] == checked["config_hash"] != "a" * 64
    found = parse_env(read(env))
    assert (found["LLM_MOE_OFFLOAD_PATTERN"], found["LLM_CONFIG_HASH"]) == ("", cleared["config_hash"])
    assert read(env).startswith("OTHER='kept'\n") and found["LLM_CTX_SIZE"] == parse_env(before)["LLM_CTX_SIZE"]
    assert sorted(os.listdir(settings["project_dir"])) == [".env", settings["compose_file"]]  # no temporary file
    again = clear(ansible_module, settings)
    assert (again["changed"], again["changed_keys"], again["config_hash"]) == (False, [], cleared["config_hash"])


def test_an_env_without_the_role_s_block_is_refused(ansible_module, model, tmp_path):
    settings = project(model, tmp_path)
    with open(settings["paths"]["env"], "w", encoding="utf-8") as f:
        f.write("OTHER=1\n")
    result = clear(ansible_module, settings)
    assert result["failed"] and result["msg"] == (
        "llm_server: %s holds no block of the role: nothing to clear" % settings["paths"]["env"]), result
