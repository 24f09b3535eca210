"""llm_server_config with ``state=recorded``: verification.json written whole (mode 0640, through a renamed
temporary file), not again when it holds the same text, nothing written in check mode. The other states are
checked through the role (tests/integration/test_role_container.py and the scenarios)."""
from __future__ import annotations

import json
import os
import stat

import pytest

from tests.helpers.deploy_settings import demo_model, settings as deploy_settings


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return demo_model(tmp_path_factory)


def project(model, tmp_path):
    """The settings of a project directory under ``tmp_path``, which the role has made before it records."""
    (tmp_path / "ai-llm").mkdir()
    return deploy_settings(model, llm_server_project_dir=str(tmp_path / "ai-llm"))


def record(ansible_module, settings, content=None, check=False):
    args = {"state": "recorded", "settings": settings}
    if content is not None:
        args["content"] = content
    return ansible_module("llm_server_config", args, check=check)


def test_recorded_writes_verification_json_once_and_check_mode_writes_nothing(ansible_module, model, tmp_path):
    settings = project(model, tmp_path)
    path = settings["paths"]["verification"]
    first = json.dumps({"status": "changed"}, indent=4) + "\n"
    checked = record(ansible_module, settings, first, check=True)
    assert (checked["failed"], checked["changed"], os.path.exists(path)) == (False, True, False), checked
    written = record(ansible_module, settings, first)
    assert (written["changed"], written["files_changed"]) == (True, [path]), written
    with open(path, encoding="utf-8") as handle:
        assert handle.read() == first
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    again = record(ansible_module, settings, first)
    assert (again["changed"], again["files_changed"]) == (False, [])
    second = json.dumps({"status": "rolled_back"}, indent=4) + "\n"
    replaced = record(ansible_module, settings, second)
    assert replaced["changed"] and replaced["files_changed"] == [path]
    with open(path, encoding="utf-8") as handle:
        assert handle.read() == second
    assert sorted(os.listdir(os.path.dirname(path))) == ["verification.json"]   # no temporary file left


def test_recorded_needs_the_content(ansible_module, model, tmp_path):
    result = record(ansible_module, project(model, tmp_path))
    assert result["failed"] and result["msg"] == "state is recorded but all of the following are missing: content", result
