"""A deploy that changes nothing skips the lock and the writes: the controller proves, from one read of the host
(llm_server_service_info), that the files on disk are those llm_server_config would write. That proof must agree
with the module itself: here the real modules (through Ansible) write the API key file, .env and the compose file,
then every way the files can differ from the configuration is made on disk, and each time the controller's proof
refuses while llm_server_config (in check mode) sees a change.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_decision import unchanged
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_disk import written_config
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._role_variables import check_settings
from tests.helpers.deploy_hosts import proved
from tests.helpers.llm_deploy import write_api_key
from tests.helpers.role_vars import role_values
from tools.gguf_models import write_demo_model

pytestmark = pytest.mark.skipif(not shutil.which("podman") or not shutil.which("podman-compose"),
                                reason="needs podman and podman-compose")

KEY = "sk-unchanged-0001"
PLACEMENT = {"pattern": r"blk\.(1|4)\.ffn_(up|down)_exps\.weight$", "device_overrides": [], "topology": "cpu"}


@pytest.fixture
def project(tmp_path, ansible_module):
    models = tmp_path / "models"
    models.mkdir()
    model = write_demo_model(str(models / "demo.gguf"))
    settings = check_settings(role_values({"llm_server_project_dir": str(tmp_path / "ai-llm"),
                                           "llm_server_model_path": model, "llm_server_image": "localhost/ai-llm:cpu",
                                           "llm_server_ctx_size": 512}), api_key=KEY).as_dict()
    key = write_api_key(ansible_module, settings, KEY)
    config = write_config(ansible_module, settings)
    assert not key["failed"] and not config["failed"] and config["changed"], config
    return settings, config


def write_config(ansible_module, settings, placement=None, check=False):
    return ansible_module("llm_server_config", {"settings": settings, "placement": placement or PLACEMENT,
                                                "compose_command": ["podman-compose"], "engine": "podman"}, check=check)


def read(ansible_module, settings):
    result = ansible_module("llm_server_service_info", {
        "project_dir": settings["project_dir"], "container_name": "ai-llm-absent", "compose_command": ["podman-compose"],
        "lock_path": settings["paths"]["lock"], "model_path": settings["model_path"],
        "model_dir": settings["model_dir"], "rollback_dir": settings["rollback_dir"]})
    assert result["failed"] is False, result
    return result


def test_the_proof_agrees_with_llm_server_config(ansible_module, project):
    settings, config = project
    disk = read(ansible_module, settings)["disk"]
    assert written_config(disk, settings, PLACEMENT, KEY, "podman") == proved(config["config_hash"])
    again = write_config(ansible_module, settings)
    assert again["changed"] is False and again["config_hash"] == config["config_hash"]
    # Another configuration or another key: the files are not those.
    other = dict(PLACEMENT, pattern=r"blk\.1\.ffn_(up|down)_exps\.weight$")
    assert written_config(disk, settings, other, KEY, "podman") is None
    assert write_config(ansible_module, settings, other, check=True)["changed"] is True
    assert written_config(disk, settings, PLACEMENT, KEY + "x", "podman") is None
    assert written_config(disk, settings, PLACEMENT, "", "podman") is None
    assert written_config(disk, dict(settings, ctx_size=1024), PLACEMENT, KEY, "podman") is None


def test_files_that_differ_are_never_proved_unchanged(ansible_module, project):
    """Each way the files can differ, made on disk one at a time (the files put back between): the proof refuses
    and llm_server_config (check mode) sees a change."""
    settings, _config = project
    env, compose = settings["paths"]["env"], settings["paths"]["compose"]
    kept = {path: Path(path).read_bytes() for path in (env, compose)}
    text = kept[env].decode("utf-8")
    damages = {
        "stray_key": lambda: open(env, "a", encoding="utf-8").write("LLM_CTX_SIZE='4096'\n"),
        "second_block": lambda: open(env, "a", encoding="utf-8").write(text),
        "crlf": lambda: open(env, "w", encoding="utf-8", newline="").write(text.replace("\n", "\r\n")),
        "compose_byte": lambda: open(compose, "a", encoding="utf-8").write(" "),
        "no_env": lambda: os.unlink(env),
        "no_compose": lambda: os.unlink(compose),
    }
    for damage, make in damages.items():
        make()
        disk = read(ansible_module, settings)["disk"]
        assert written_config(disk, settings, PLACEMENT, KEY, "podman") is None, damage
        assert write_config(ansible_module, settings, check=True)["changed"] is True, damage
        for path, data in kept.items():
            Path(path).write_bytes(data)


def test_leftovers_a_missing_secrets_dir_and_a_model_outside_are_not_proved(ansible_module, project, tmp_path):
    settings, _config = project
    leftover = os.path.join(settings["project_dir"], ".env.llm_server-tmp-abc123")
    open(leftover, "w", encoding="utf-8").close()
    assert written_config(read(ansible_module, settings)["disk"], settings, PLACEMENT, KEY, "podman") is None
    os.unlink(leftover)
    assert written_config(read(ansible_module, settings)["disk"], settings, PLACEMENT, KEY, "podman") is not None
    # The model becomes a link out of the directory the container mounts: llm_server_config refuses it.
    outside = tmp_path / "elsewhere.gguf"
    os.replace(settings["model_path"], outside)
    os.symlink(outside, settings["model_path"])
    disk = read(ansible_module, settings)["disk"]
    assert "outside llm_server_model_dir" in disk["model_outside_dir"]
    assert written_config(disk, settings, PLACEMENT, KEY, "podman") is None
    refused = write_config(ansible_module, settings)
    assert refused["failed"] is True and refused["msg"] == disk["model_outside_dir"]


def test_a_run_has_nothing_to_do_only_when_everything_holds(ansible_module, project):
    settings, config = project
    digest = config["config_hash"]
    service = read(ansible_module, settings)
    # What the host shows once the role has recreated, verified and kept this configuration.
    service.update(container={"exists": True, "running": True, "status": "running", "config_hash": digest},
                   health=200, auth={"checked": True, "enforced": True})
    service["disk"].update(verification={"config_hash": digest, "status": "changed"}, snapshot_hash=digest)
    settings = dict(settings, rollback=True, verify_always=False)
    done = unchanged(service, settings, PLACEMENT, KEY)
    assert done["unchanged"] is True and done["config"]["config_hash"] == digest
    assert done["converge"] == {"recreate": False, "verify": False, "wait": False, "reason": ""}

    def without(**changes):
        changed = dict(service, **{k: v for k, v in changes.items() if k != "disk"})
        changed["disk"] = dict(service["disk"], **changes.get("disk", {}))
        return unchanged(changed, settings, PLACEMENT, KEY)

    assert without(disk={"lock_file": True})["reason"] == "the project directory's lock file exists"
    assert "runs configuration" in without(container=dict(service["container"], config_hash="0" * 64))["reason"]
    assert "exited" in without(container={"exists": True, "running": False, "status": "exited"})["reason"]
    assert "never verified" in without(disk={"verification": {"config_hash": digest, "status": "failed"}})["reason"]
    assert "/health answers 503" in without(health=503)["reason"]
    assert "not in force" in without(auth={"checked": True, "enforced": False})["reason"]
    assert without(disk={"snapshot_hash": None})["reason"] == "the last snapshot is not this configuration"
    assert unchanged(service, dict(settings, rollback=False), PLACEMENT, KEY)["unchanged"] is True
    assert unchanged(service, dict(settings, verify_always=True), PLACEMENT, KEY)["unchanged"] is False
    assert "not those" in unchanged(service, settings, PLACEMENT, "")["reason"]


def test_bytes_that_are_not_utf8_outside_the_block_change_nothing_for_either(ansible_module, project):
    settings, config = project
    with open(settings["paths"]["env"], "ab") as f:
        f.write(b"OTHER='\xff\xfe'\n")
    disk = read(ansible_module, settings)["disk"]
    assert written_config(disk, settings, PLACEMENT, KEY, "podman")["config_hash"] == config["config_hash"]
    assert write_config(ansible_module, settings, check=True)["changed"] is False
