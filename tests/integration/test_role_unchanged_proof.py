"""A deploy that changes nothing skips the lock and the writes: the controller proves, from one read of the host
(llm_server_service_info), that the files on disk are those the run writes (``desired_config``). That proof must
agree with the writer itself, the role's tasks/files.yml (ansible.builtin.copy and ansible.builtin.template): here
those tasks write the API key file, .env and the compose file, then each way the files can differ is made on disk
(or another configuration is asked for), and each time ``desired_config`` names a file to write exactly when the
role's task that writes it reports a change in check mode; what compose reads of the compose file, and the keys of
.env's block, change as the restart rule says.

Run under the podman lock: ``flock /tmp/ai-llm-podman.lock python -m pytest tests/integration/test_role_unchanged_proof.py``.
"""
from __future__ import annotations

import os
import re
import shutil

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._role_variables import check_settings
from tests.helpers.deploy_hosts import desired, proved
from tests.helpers.role_files import write_files
from tests.helpers.role_vars import role_values
from tools.gguf_models import write_demo_model

pytestmark = pytest.mark.skipif(not shutil.which("podman") or not shutil.which("podman-compose"),
                                reason="needs podman and podman-compose (the compose tool checks .env when it is written)")

KEY = "sk-unchanged-0001"
PLACEMENT = {"pattern": r"blk\.(1|4)\.ffn_(up|down)_exps\.weight$", "device_overrides": [], "topology": "cpu"}
# The tasks of tasks/files.yml that write, by what desired_config says of them.
TASKS = {"secrets_dir": "Make the project directory", "api_key": "the API key file", "env": "Write .env",
         "compose": "Write the compose file"}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The files as the role's tasks write them, and a copy of the project directory to put back before each case."""
    tmp = tmp_path_factory.mktemp("unchanged")
    models = tmp / "models"
    models.mkdir()
    model = write_demo_model(str(models / "demo.gguf"))
    settings = check_settings(role_values({"llm_server_project_dir": str(tmp / "ai-llm"),
                                           "llm_server_model_path": model, "llm_server_image": "localhost/ai-llm:cpu",
                                           "llm_server_ctx_size": 512}), api_key=KEY).as_dict()
    proc, given = write_files(settings, PLACEMENT, api_key=KEY)
    assert proc.returncode == 0 and recap_changed(proc) > 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    shutil.copytree(settings["project_dir"], tmp / "pristine", symlinks=True)
    return settings, given["config"]["config_hash"], tmp / "pristine"


@pytest.fixture
def project(written):
    settings, digest, pristine = written
    shutil.rmtree(settings["project_dir"])
    shutil.copytree(pristine, settings["project_dir"], symlinks=True)
    return settings, digest


def recap_changed(proc):
    """``changed=N`` of the play recap."""
    return int(re.search(r"^localhost\s*:.*\bchanged=(\d+)", proc.stdout, re.MULTILINE).group(1))


def changed_tasks(proc):
    """What the role's writing tasks report changed (``TASKS``' names), checked against the recap's count."""
    blocks = proc.stdout.split("\nTASK [")[1:]
    changed = [block.split("]", 1)[0] for block in blocks if re.search(r"^changed: \[localhost\]", block, re.MULTILINE)]
    assert len(changed) == recap_changed(proc), proc.stdout[-4000:]
    found = {name for name, task in TASKS.items() if any(task in block for block in changed)}
    assert len(found) == len(changed), changed
    return found


def read(ansible_module, settings):
    result = ansible_module("llm_server_service_info", {
        "project_dir": settings["project_dir"], "container_name": "ai-llm-absent", "compose_command": ["podman-compose"],
        "lock_path": settings["paths"]["lock"], "model_path": settings["model_path"],
        "model_dir": settings["model_dir"], "rollback_dir": settings["rollback_dir"]})
    assert result["failed"] is False, result
    return result


def edit(name, change):
    """A damage: the file ``paths[name]`` rewritten by ``change`` (its bytes)."""
    def damage(settings):
        with open(settings["paths"][name], "rb") as f:
            data = f.read()
        assert change(data) != data
        with open(settings["paths"][name], "wb") as f:
            f.write(change(data))
    return damage


def remove(name):
    return lambda settings: os.unlink(settings["paths"][name])


def no_secrets(settings):
    shutil.rmtree(settings["paths"]["secrets"])


OTHER = dict(PLACEMENT, pattern=r"blk\.1\.ffn_(up|down)_exps\.weight$")


@pytest.mark.parametrize("damage, run, found, compose_changed, keys", [
    # the files as written; lines outside the block that stay as they are (a comment, bytes that are not UTF-8)
    (None, {}, set(), False, []),
    (edit("env", lambda data: data + b"# a note\n"), {}, set(), False, []),
    # a line that is not UTF-8: the .env template rewrites it as text (U+FFFD for each byte), and read_disk asks for
    # that write
    (edit("env", lambda data: data + b"OTHER='\xff\xfe'\n"), {}, {"env"}, False, []),
    # .env: a key of the block edited by hand, a key of the role outside the block, no .env
    (edit("env", lambda data: data.replace(b"LLM_CTX_SIZE='512'", b"LLM_CTX_SIZE='513'")), {}, {"env"}, False,
     ["LLM_CTX_SIZE"]),
    (edit("env", lambda data: data + b"LLM_CTX_SIZE='4096'\n"), {}, {"env"}, False, []),
    (remove("env"), {}, {"env"}, False, []),
    # the compose file: what compose reads edited by hand, a comment only, no compose file
    (edit("compose", lambda data: data.replace(b'"unless-stopped"', b'"always"')), {}, {"compose"}, True, []),
    (edit("compose", lambda data: data.replace(b"services:", b"# a note\n\nservices:")), {}, {"compose"}, False, []),
    (remove("compose"), {}, {"compose"}, True, []),
    # the API key file: another key, no secrets directory (nor key file)
    (edit("api_key", lambda data: b"sk-other\n"), {}, {"api_key"}, False, []),
    (no_secrets, {}, {"secrets_dir", "api_key"}, False, []),
    # another configuration: another placement, no API key
    (None, {"placement": OTHER}, {"env"}, False, ["LLM_MOE_OFFLOAD_PATTERN"]),
    (None, {"api_key": ""}, {"env", "api_key"}, False, []),
])
def test_the_proof_names_a_change_exactly_when_the_role_s_tasks_make_one(ansible_module, project, damage, run, found,
                                                                         compose_changed, keys):
    settings, digest = project
    if damage:
        damage(settings)
    placement, key = run.get("placement", PLACEMENT), run.get("api_key", KEY)
    service = read(ansible_module, settings)
    config = desired(settings, placement, service, key)
    proc, _given = write_files(settings, placement, api_key=key, check=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    said = set(config["files"]) | ({"api_key"} if config["key_changed"] else set()) | (
        set() if service["disk"]["secrets_dir"] else {"secrets_dir"})
    assert said == changed_tasks(proc) == found
    assert config["compose_changed"] is compose_changed
    assert [c["key"] for c in config["changed_keys"]] == keys
    if not found:
        assert config == proved(digest)
