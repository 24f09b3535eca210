"""What the project directory holds (plugins/module_utils/_deploy_disk.py) and the controller's proof that it already
holds a configuration. The files are written as llm_server_config writes them (its steps: the API key file, the
role's block merged into .env, the compose file, each with atomic_write); the proof must accept exactly those files
and refuse every other state, as llm_server_config would then write something. tests/integration/
test_role_unchanged_proof.py checks the same against the real modules run through Ansible."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_disk import (
    api_key_bytes,
    model_outside_dir,
    read_disk,
    written_config,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_files import atomic_write, ensure_dir, save_snapshot
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_render import (
    config_hash,
    env_block,
    env_values,
    merge_env,
    render_compose,
)
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._role_variables import check_settings
from tests.helpers.deploy_hosts import proved
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


def write(settings, key, env_before=""):
    """What llm_server_api_key and llm_server_config leave on disk; returns the configuration hash."""
    paths = settings["paths"]
    ensure_dir(settings["project_dir"], 0o750)
    ensure_dir(paths["secrets"], 0o700)
    if key:
        atomic_write(paths["api_key"], (key + "\n").encode("ascii"), 0o600)
    values = env_values(settings, PLACEMENT)
    compose = render_compose(settings, PLACEMENT, "podman")
    digest = config_hash(values, compose, (key + "\n").encode("ascii") if key else b"")
    atomic_write(paths["env"], merge_env(env_before, env_block(values, digest))[0].encode("utf-8"), 0o600)
    atomic_write(paths["compose"], compose.encode("utf-8"), 0o640)
    return digest


def disk_of(settings):
    return read_disk(settings["project_dir"], settings["compose_file"], settings["rollback_dir"],
                     settings["paths"]["lock"], settings["model_dir"], settings["model_path"])


def proof(settings, key=KEY, placement=None, engine="podman"):
    return written_config(disk_of(settings), settings, placement or PLACEMENT, key, engine)


def test_an_empty_directory_holds_nothing(tmp_path):
    disk = read_disk(str(tmp_path / "none"), "docker-compose.prod.yml", str(tmp_path / "none" / ".rollback"),
                     str(tmp_path / "none" / ".llm_server.lock"))
    assert disk == {"env_config_hash": None, "env_block": None, "env_settled": False, "compose_exists": False,
                    "compose_sha256": None, "api_key_file": False, "api_key_sha256": None, "secrets_dir": False,
                    "leftovers": False, "verification": None, "snapshot_hash": None, "previous_snapshot_hash": None,
                    "lock_file": False}


def test_the_files_as_written_are_proved_with_their_hash(project):
    settings, digest = project
    disk = disk_of(settings)
    assert disk["env_config_hash"] == digest and disk["env_settled"] is True and disk["secrets_dir"] is True
    # llama-server reads --api-key-file line by line (common/arg.cpp): one key, one line
    assert api_key_bytes(KEY) == b"sk-disk-0001\n"
    assert disk["api_key_sha256"] == hashlib.sha256(b"sk-disk-0001\n").hexdigest()
    assert disk["compose_sha256"] == hashlib.sha256(Path(settings["paths"]["compose"]).read_bytes()).hexdigest()
    assert disk["model_outside_dir"] is None and disk["lock_file"] is False
    assert proof(settings) == proved(digest)


def test_another_configuration_key_or_engine_is_not_proved_and_without_a_key_there_must_be_no_key_file(project):
    settings, _digest = project
    assert proof(settings, placement=dict(PLACEMENT, pattern=r"blk\.1\.ffn_(up|down)_exps\.weight$")) is None
    assert proof(dict(settings, ctx_size=1024)) is None
    assert proof(settings, key=KEY + "x") is None
    assert proof(settings, key="") is None
    assert proof(settings, engine="docker") is None  # another compose file (device reservations, json-file logs)
    os.unlink(settings["paths"]["api_key"])
    digest = write(settings, "")
    assert api_key_bytes("") == b"" and disk_of(settings)["api_key_file"] is False
    assert proof(settings, key="")["config_hash"] == digest
    assert proof(settings, key=KEY) is None
    atomic_write(settings["paths"]["api_key"], b"", 0o600)  # an empty key file is still a file to remove
    assert disk_of(settings)["api_key_file"] is True and proof(settings, key="") is None


@pytest.mark.parametrize("extra, settled", [
    (b"", True),
    (b"LLM_CTX_SIZE='4096'\n", False),      # a later line would win over the block: the writer drops it
    (b"export LLM_PORT=1\n", False),
    (b"OTHER2='x'\n", True),
    (b"# LLM_CTX_SIZE=1\n", True),          # a comment is kept as it is
    # llm_server_config compares .env read with errors='replace': another line's bytes that are not UTF-8 do not
    # make it write (which would replace them with U+FFFD); the reading here neither fails nor asks for a write
    (b"OTHER3='\xff\xfe'\n", True),
])
def test_lines_outside_the_block(project, extra, settled):
    settings, digest = project
    with open(settings["paths"]["env"], "ab") as f:
        f.write(extra)
    disk = disk_of(settings)
    assert disk["env_settled"] is settled and disk["env_config_hash"] == digest
    assert (proof(settings) is not None) is settled
    if settled:
        assert proof(settings)["config_hash"] == digest


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


@pytest.mark.parametrize("damage, key, read", [
    (edit("env", lambda text: text + text), KEY, {"env_settled": False}),  # a second block
    (edit("env", lambda text: text.replace("\n", "\r\n")), KEY, {"env_settled": False}),
    (edit("env", lambda text: text.rstrip("\n")), KEY, {"env_settled": False}),
    (edit("env", lambda text: text.replace("LLM_CTX_SIZE='512'", "LLM_CTX_SIZE='513'")), KEY, {"env_settled": True}),
    (lambda settings: os.unlink(settings["paths"]["env"]), KEY, {"env_block": None}),
    (edit("compose", lambda text: text + " "), KEY, {"compose_exists": True}),
    (lambda settings: os.unlink(settings["paths"]["compose"]), KEY, {"compose_exists": False}),
    # a killed atomic_write: the writer removes it
    (lambda settings: open(os.path.join(settings["project_dir"], ".env.llm_server-tmp-x1"), "wb").close(), KEY,
     {"leftovers": True}),
    (no_secrets, "", {"secrets_dir": False, "api_key_file": False}),
    # a directory where a file belongs reads as no file (no traceback from the host)
    (directory_for("env"), KEY, {"env_config_hash": None, "env_block": None}),
    (directory_for("compose"), KEY, {"compose_exists": False, "compose_sha256": None}),
    (directory_for("api_key"), KEY, {"api_key_file": False, "api_key_sha256": None}),
])
def test_a_file_the_writer_would_change_is_not_proved(project, damage, key, read):
    settings, _digest = project
    damage(settings)
    disk = disk_of(settings)
    assert {name: disk[name] for name in read} == read
    assert proof(settings, key=key) is None


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
    assert disk_of(settings)["model_outside_dir"] == message and proof(settings) is None
    # a sibling whose name starts with the directory's is outside too (compared as paths)
    assert model_outside_dir(str(tmp_path / "mod"), str(tmp_path / "models" / "x.gguf")) is not None


def test_the_lock_file_and_the_model_are_read_only_when_asked_and_the_compose_file_by_its_name(project):
    """The model only with both paths; not asked: no answer, and no proof."""
    settings, _digest = project
    for model_dir, model_path in ((settings["model_dir"], None), (None, settings["model_path"]), (None, None)):
        disk = read_disk(settings["project_dir"], settings["compose_file"], settings["rollback_dir"], None, model_dir,
                         model_path)
        assert "model_outside_dir" not in disk and "lock_file" not in disk
        assert written_config(disk, settings, PLACEMENT, KEY, "podman") is None
    os.rename(settings["paths"]["compose"], os.path.join(settings["project_dir"], "compose.yml"))
    assert disk_of(settings)["compose_exists"] is False
    assert read_disk(settings["project_dir"], "compose.yml", settings["rollback_dir"])["compose_exists"] is True
