"""What the project directory holds (plugins/module_utils/_deploy_disk.py) and the configuration a run writes against
it (desired_config). The files are written as the llm_server role writes them (the API key file, then .env and the
compose file from the role's templates, rendered as ansible.builtin.template renders them); desired_config must find
nothing to write for exactly those files, and the file that changes in every other state.
tests/integration/test_role_unchanged_proof.py checks the same against the real modules run through Ansible."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_disk import (
    api_key_bytes,
    desired_config,
    model_outside_dir,
    read_disk,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_files import atomic_write, ensure_dir, save_snapshot
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_render import (
    compose_body,
    compose_values,
    config_hash,
    env_values,
)
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._role_variables import check_settings
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_decision import decide
from tests.helpers.deploy_templates import render_compose, render_env, template_sources
from tests.helpers.role_vars import role_values

KEY = "sk-disk-0001"
PLACEMENT = {"pattern": r"blk\.(1|4)\.ffn_(up|down)_exps\.weight$", "device_overrides": [], "topology": "cpu"}


@pytest.fixture
def project(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / "demo.gguf").write_bytes(b"GGUF")
    settings = check_settings(role_values({"llm_server_project_dir": str(tmp_path / "ai-llm"),
                                           "llm_server_model_path": str(models / "demo.gguf"),
                                           "llm_server_image": "localhost/ai-llm:cpu", "llm_server_ctx_size": 512}),
                              api_key=KEY).as_dict()
    return settings, write(settings, KEY, "OTHER='kept'\n")


def write(settings, key, env_before="", digest=None):
    """What the role leaves on disk (its API key file and its two templates); returns the configuration hash."""
    paths = settings["paths"]
    ensure_dir(settings["project_dir"], 0o750)
    ensure_dir(paths["secrets"], 0o700)
    if key:
        atomic_write(paths["api_key"], (key + "\n").encode("ascii"), 0o600)
    values = env_values(settings, PLACEMENT)
    digest = digest or config_hash(values, compose_values(settings, PLACEMENT, "podman"), template_sources(),
                                   (key + "\n").encode("ascii") if key else b"")
    atomic_write(paths["env"], render_env(values, digest, env_before).encode("utf-8"), 0o600)
    atomic_write(paths["compose"], render_compose(settings, PLACEMENT, "podman").encode("utf-8"), 0o640)
    return digest


def disk_of(settings):
    return read_disk(settings["project_dir"], settings["compose_file"], settings["rollback_dir"],
                     settings["paths"]["lock"], settings["model_dir"], settings["model_path"])


def desired(settings, key=KEY, placement=None, engine="podman", disk=None):
    """desired_config for the files of ``settings`` and ``placement`` against the project directory."""
    placement = placement or PLACEMENT
    return desired_config(disk_of(settings) if disk is None else disk, env_values(settings, placement),
                          compose_values(settings, placement, engine), render_compose(settings, placement, engine),
                          template_sources(), key)


def writes(config):
    """What ``desired_config`` changes: the files, whether the API key file, and whether what compose reads."""
    return config["files"], config["key_changed"], config["compose_changed"]


def kept(digest):
    """``desired_config`` for a directory that holds exactly the configuration ``digest``."""
    return {"config_hash": digest, "changed_keys": [], "key_changed": False, "compose_changed": False, "files": [],
            "first": False}


def test_an_empty_directory_holds_nothing(tmp_path):
    disk = read_disk(str(tmp_path / "none"), "docker-compose.prod.yml", str(tmp_path / "none" / ".rollback"),
                     str(tmp_path / "none" / ".llm_server.lock"))
    assert disk == {"env_config_hash": None, "env_block": None, "env_settled": False, "compose_exists": False,
                    "compose_sha256": None, "compose_body_sha256": None, "api_key_file": False, "api_key_sha256": None, "secrets_dir": False,
                    "verification": None, "snapshot_hash": None, "previous_snapshot_hash": None,
                    "lock_file": False}


def test_the_files_as_written_are_proved_with_their_hash(project):
    settings, digest = project
    disk = disk_of(settings)
    assert disk["env_config_hash"] == digest and disk["env_settled"] is True and disk["secrets_dir"] is True
    # llama-server reads --api-key-file line by line (common/arg.cpp): one key, one line
    assert api_key_bytes(KEY) == b"sk-disk-0001\n"
    assert disk["api_key_sha256"] == hashlib.sha256(b"sk-disk-0001\n").hexdigest()
    compose = Path(settings["paths"]["compose"]).read_bytes()
    assert disk["compose_sha256"] == hashlib.sha256(compose).hexdigest()
    assert disk["compose_body_sha256"] == hashlib.sha256(compose_body(compose.decode()).encode()).hexdigest()
    assert disk["model_outside_dir"] is None and disk["lock_file"] is False
    assert desired(settings) == kept(digest)


def test_another_configuration_key_or_engine_is_written_and_without_a_key_there_must_be_no_key_file(project):
    settings, digest = project
    config = desired(settings, placement=dict(PLACEMENT, pattern=r"blk\.1\.ffn_(up|down)_exps\.weight$"))
    assert writes(config) == (["env"], False, False) and config["config_hash"] != digest
    assert [c["key"] for c in config["changed_keys"]] == ["LLM_MOE_OFFLOAD_PATTERN"] and config["first"] is False
    config = desired(dict(settings, ctx_size=1024))
    assert config["changed_keys"] == [{"key": "LLM_CTX_SIZE", "old": "512", "new": "1024"}]
    assert writes(desired(settings, key=KEY + "x")) == (["env"], True, False)
    assert writes(desired(settings, key="")) == (["env"], True, False)
    # another compose file (json-file logs): the hash changes with the compose template's values
    assert writes(desired(settings, engine="docker")) == (["env", "compose"], False, True)
    os.unlink(settings["paths"]["api_key"])
    digest = write(settings, "")
    assert api_key_bytes("") == b"" and disk_of(settings)["api_key_file"] is False
    assert desired(settings, key="") == kept(digest)
    assert writes(desired(settings, key=KEY)) == (["env"], True, False)
    atomic_write(settings["paths"]["api_key"], b"", 0o600)  # an empty key file is still a file to remove
    assert disk_of(settings)["api_key_file"] is True and desired(settings, key="")["key_changed"] is True


@pytest.mark.parametrize("extra, settled", [
    (b"", True),
    (b"LLM_CTX_SIZE='4096'\n", False),      # a later line would win over the block: the writer drops it
    (b"export LLM_PORT=1\n", False),
    (b"OTHER2='x'\n", True),
    (b"# LLM_CTX_SIZE=1\n", True),          # a comment is kept as it is
    # bytes that are not UTF-8 on another line: the template writes text (U+FFFD in their place), so the reading
    # asks for that write too, and the proof agrees with the writer
    (b"OTHER3='\xff\xfe'\n", False),
])
def test_lines_outside_the_block(project, extra, settled):
    settings, digest = project
    with open(settings["paths"]["env"], "ab") as f:
        f.write(extra)
    disk = disk_of(settings)
    assert disk["env_settled"] is settled and disk["env_config_hash"] == digest
    # the hash stays: only .env is written again when a line outside the block must go
    assert desired(settings) == dict(kept(digest), files=[] if settled else ["env"])


def edit(name, change):
    """A damage: the file ``paths[name]`` rewritten by ``change`` (its text, line ends as they are)."""
    def damage(settings):
        with open(settings["paths"][name], encoding="utf-8", newline="") as f:
            text = f.read()
        assert change(text) != text
        with open(settings["paths"][name], "w", encoding="utf-8", newline="") as f:
            f.write(change(text))
    return damage


def no_secrets(settings):
    """No secrets directory, and one beside it whose name is not the role's."""
    os.unlink(settings["paths"]["api_key"])
    os.rmdir(settings["paths"]["secrets"])
    os.mkdir(os.path.join(settings["project_dir"], "secret"))


def directory_for(name):
    """A damage: a directory where the file ``paths[name]`` belongs."""
    def damage(settings):
        os.unlink(settings["paths"][name])
        os.mkdir(settings["paths"][name])
    return damage


@pytest.mark.parametrize("damage, key, read, changes", [
    (edit("env", lambda text: text + text), KEY, {"env_settled": False}, (["env"], False, False)),  # a second block
    (edit("env", lambda text: text.replace("\n", "\r\n")), KEY, {"env_settled": False}, (["env"], False, False)),
    (edit("env", lambda text: text.rstrip("\n")), KEY, {"env_settled": False}, (["env"], False, False)),
    (edit("env", lambda text: text.replace("LLM_CTX_SIZE='512'", "LLM_CTX_SIZE='513'")), KEY, {"env_settled": True},
     (["env"], False, False)),
    (lambda settings: os.unlink(settings["paths"]["env"]), KEY, {"env_block": None}, (["env"], False, False)),
    # a blank line or a comment is not read by compose; a value is
    (edit("compose", lambda text: text + " "), KEY, {"compose_exists": True}, (["compose"], False, False)),
    (edit("compose", lambda text: text.replace("services:", "# a note\nservices:")), KEY, {"compose_exists": True},
     (["compose"], False, False)),
    (edit("compose", lambda text: text.replace('"unless-stopped"', '"no"')), KEY, {"compose_exists": True},
     (["compose"], False, True)),
    (lambda settings: os.unlink(settings["paths"]["compose"]), KEY, {"compose_exists": False},
     (["compose"], False, True)),
    # the files are right; the secrets directory is the role's step before the templates (unchanged reads it)
    (no_secrets, "", {"secrets_dir": False, "api_key_file": False}, ([], False, False)),
    # a directory where a file belongs reads as no file (no traceback from the host)
    (directory_for("env"), KEY, {"env_config_hash": None, "env_block": None}, (["env"], False, False)),
    (directory_for("compose"), KEY, {"compose_exists": False, "compose_sha256": None, "compose_body_sha256": None},
     (["compose"], False, True)),
    (directory_for("api_key"), KEY, {"api_key_file": False, "api_key_sha256": None}, ([], True, False)),
])
def test_a_file_the_role_would_change_is_written(project, damage, key, read, changes):
    settings, digest = project
    damage(settings)
    disk = disk_of(settings)
    assert {name: disk[name] for name in read} == read
    config = desired(settings, key=key)
    assert writes(config) == changes
    # the same values, template sources and key as the hash on disk (or none there): the same hash
    assert config["config_hash"] == digest


def test_a_lock_file_and_the_last_records_are_read(project):
    settings, digest = project
    open(settings["paths"]["lock"], "w", encoding="utf-8").close()
    files = {".env": b"A=1\n", settings["compose_file"]: b"services: {}\n"}
    save_snapshot(settings["rollback_dir"], files, "1" * 64)
    save_snapshot(settings["rollback_dir"], dict(files, **{".env": b"A=2\n"}), digest)
    verification = Path(settings["project_dir"]) / "verification.json"
    verification.write_text(json.dumps({"config_hash": digest, "status": "changed"}), encoding="utf-8")
    disk = disk_of(settings)
    assert disk["lock_file"] is True and disk["verification"] == {"config_hash": digest, "status": "changed"}
    assert (disk["snapshot_hash"], disk["previous_snapshot_hash"]) == (digest, "1" * 64)
    verification.write_text("[1, 2]", encoding="utf-8")
    assert disk_of(settings)["verification"] is None
    verification.write_bytes(b"\xff{")
    assert disk_of(settings)["verification"] == {"unreadable": True}
    os.unlink(settings["paths"]["verification"])
    os.mkdir(settings["paths"]["verification"])  # a directory in its place reads as none
    assert disk_of(settings)["verification"] is None


def test_the_model_must_resolve_inside_its_directory(tmp_path, project):
    settings, _digest = project
    assert model_outside_dir(settings["model_dir"], settings["model_path"]) is None
    outside = tmp_path / "elsewhere.gguf"
    os.replace(settings["model_path"], outside)
    os.symlink(outside, settings["model_path"])
    message = model_outside_dir(settings["model_dir"], settings["model_path"])
    assert message == ("llm_server_model_path: %s resolves to %s, outside llm_server_model_dir %s (%s), which is all "
                       "the container sees" % (settings["model_path"], outside, settings["model_dir"],
                                               settings["model_dir"]))
    assert disk_of(settings)["model_outside_dir"] == message
    # a sibling whose name starts with the directory's is outside too (compared as paths)
    assert model_outside_dir(str(tmp_path / "mod"), str(tmp_path / "models" / "x.gguf")) is not None


def test_the_lock_file_and_the_model_are_read_only_when_asked_and_the_compose_file_by_its_name(project):
    """The model only with both paths; not asked: no answer."""
    settings, _digest = project
    for model_dir, model_path in ((settings["model_dir"], None), (None, settings["model_path"]), (None, None)):
        disk = read_disk(settings["project_dir"], settings["compose_file"], settings["rollback_dir"], None, model_dir,
                         model_path)
        assert "model_outside_dir" not in disk and "lock_file" not in disk
    os.rename(settings["paths"]["compose"], os.path.join(settings["project_dir"], "compose.yml"))
    assert disk_of(settings)["compose_exists"] is False
    assert read_disk(settings["project_dir"], "compose.yml", settings["rollback_dir"])["compose_exists"] is True


def test_the_hash_on_disk_is_kept_while_the_compose_file_the_values_and_the_key_are_the_same(project):
    """A hash written from other template sources stays as long as the files are the ones this run writes: the
    container made from it is not recreated for a template edit that changes no byte of the compose file."""
    settings, digest = project
    old = "f" * 64
    write(settings, KEY, "OTHER='kept'\n", digest=old)
    assert desired(settings) == kept(old)
    # the key or a value changes: the new hash
    assert desired(settings, key=KEY + "x")["config_hash"] not in (old, digest)
    assert desired(dict(settings, ctx_size=1024))["config_hash"] not in (old, digest)
    # the compose file differs (here a comment): the new hash, which is the same as for a directory holding nothing
    with open(settings["paths"]["compose"], "a", encoding="utf-8") as f:
        f.write("# a comment\n")
    config = desired(settings)
    assert config["config_hash"] == digest == desired(settings, disk={})["config_hash"]
    assert writes(config) == (["env", "compose"], False, False)


def serving(settings, digest):
    """``llm_server_service_info``'s result: the project directory as it is, and ai-llm running ``digest`` verified."""
    disk = dict(disk_of(settings), verification={"config_hash": digest, "status": "changed"})
    return {"disk": disk, "health": 200, "auth": {"checked": True, "enforced": True},
            "container": {"exists": True, "running": True, "status": "running", "config_hash": digest}}


def test_a_compose_file_changed_by_a_comment_with_the_same_values_is_written_and_nothing_is_recreated(project):
    settings, digest = project
    with open(settings["paths"]["compose"], "a", encoding="utf-8") as f:
        f.write("# a comment\n")
    config = desired(settings)
    assert config == dict(kept(digest), files=["compose"])
    assert decide(serving(settings, digest), config) == {"recreate": False, "verify": False, "wait": False, "reason": ""}


def test_a_hand_edit_of_what_compose_reads_is_restored_and_recreated_with_the_same_hash(project):
    """.env and its hash are as the run writes them; the compose file's service was edited by hand: the run writes the
    compose file again, and the container made from the edited file is recreated."""
    settings, digest = project
    edit("compose", lambda text: text.replace('"unless-stopped"', '"always"'))(settings)
    config = desired(settings)
    assert config == dict(kept(digest), files=["compose"], compose_changed=True)
    assert decide(serving(settings, digest), config) == {
        "recreate": True, "verify": True, "wait": True,
        "reason": "the configuration changed (the compose file): ai-llm is recreated"}


def test_a_directory_without_the_role_s_block_is_the_first_deploy(tmp_path, project):
    settings, digest = project
    os.unlink(settings["paths"]["env"])
    config = desired(settings)
    assert config == {"config_hash": digest, "changed_keys": [], "key_changed": False, "compose_changed": False,
                      "files": ["env"], "first": True}
