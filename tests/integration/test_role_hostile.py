"""Hostile and careless input on a real local deploy (podman, podman-compose, the CPU image, the real llama-server):
the API key in force or refused, never shown, never rolled back to another one; values refused before anything
changes; a full disk and a damaged snapshot after a verified deploy.

Run under the podman lock: ``flock /tmp/ai-llm-podman.lock python -m pytest tests/integration/test_role_hostile.py``.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess

import pytest

from tests.helpers.llm_deploy import local_deploy, recap, result
from tools.gguf_models import write_wrong_shape

KEY = "sk-RT'0002${HOME}"  # a quote and ${HOME}: what a .env line can drop or expand
OTHER_KEY = "sk-rotated-0003"


@pytest.fixture
def local(tmp_path):
    with local_deploy(tmp_path, "ai-llm-hostile") as deploy:
        yield deploy


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """One verified deploy that every refusal below must leave as it is (each compares the state before and after
    its own run), made once for all of them."""
    with local_deploy(tmp_path_factory.mktemp("refusals"), "ai-llm-refusals") as deploy:
        deploy.succeed("deploy")
        yield deploy


def state(deploy):
    """The project's files (sha256) and the container, to show that nothing changed."""
    digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
               for p in sorted(deploy.project.glob("*")) if p.is_file()}
    return digests, deploy.container()


def wrong_shape(deploy):
    """The path of the demo model that llama-server refuses to load, in the deploy's model directory."""
    return str(write_wrong_shape(deploy.model, deploy.models / "wrong-shape.gguf"))


def test_the_api_key_reaches_llama_server_is_proved_and_never_shown(local):
    run = local.succeed("deploy", "--diff", llm_server_api_key=KEY)
    shown = result(run.stdout)
    assert shown["auth"] == {"enforced": True, "checked": True}
    assert local.status("/props") == 401
    assert local.status("/props", KEY) == 200
    assert local.status("/props", KEY.replace("${HOME}", os.environ.get("HOME", ""))) == 401
    inspect = subprocess.run(["podman", "container", "inspect", local.name], capture_output=True, text=True,
                             check=True, timeout=60).stdout
    assert "sk-RT" not in inspect
    # A neighbouring change with --check --diff -vvv shows neither the key nor its file.
    check = local.succeed("deploy", "--check", "--diff", verbosity=3, llm_server_api_key=KEY, llm_server_ctx_size=1024)
    for output in (run.stdout, check.stdout):
        assert "sk-RT" not in output
    again = local.playbook("deploy", llm_server_api_key=KEY)
    assert recap(again.stdout)["changed"] == 0 and result(again.stdout)["auth"]["checked"] is True


def test_a_rollback_runs_with_the_current_key_only(local):
    local.succeed("deploy", llm_server_api_key=OTHER_KEY)
    run = local.playbook("deploy", llm_server_api_key=KEY, llm_server_model_path=wrong_shape(local))
    assert run.returncode != 0
    shown = result(run.stdout)
    assert shown["status"] == "rolled_back" and shown["rollback"]["serving"], shown["message"]
    assert local.status("/props", KEY) == 200
    assert local.status("/props", OTHER_KEY) == 401
    assert shown["auth"]["enforced"] and shown["auth"]["checked"]


LONG_PATTERN = "|".join(r"blk\.%d\.ffn_up_exps" % i for i in range(12000))
KEY_REFUSED = "llm_server_api_key: the key cannot be deployed"  # a key llama-server cannot read back


@pytest.mark.parametrize("role_vars, words", [
    ({"llm_server_api_key": "sk-\nLLM_CTX_SIZE=1"}, KEY_REFUSED),
    ({"llm_server_api_key": "sk-é"}, KEY_REFUSED),
    ({"llm_server_api_key": " sk-spaced"}, KEY_REFUSED),
    ({"llm_server_port": 99999}, "llm_server_port: "),
    ({"llm_server_ctx_size": -5}, "llm_server_ctx_size: "),
    ({"llm_server_ctx_size": "9" * 5000}, "llm_server_ctx_size: "),
    ({"llm_server_model_dir": "PREFIX"}, "llm_server_model_path: "),  # the models directory without its last letters
    ({"llm_server_bind_address": "0.0.0.0"}, "llm_server_bind_address: "),
    ({"llm_server_image": "localhost/x:1\n    privileged: true\n    pid: host"}, "llm_server_image: "),
    ({"llm_server_log_max_size": '50m"\n    cap_add: [ALL]\n    x: "'}, "llm_server_log_max_size: "),
    ({"llm_server_n_gpu_layers": "99\nLLM_CTX_SIZE=1"}, "llm_server_n_gpu_layers: "),
    ({"llm_server_moe_offload_pattern": "blk${HOME}"}, "llm_server_moe_offload_pattern: "),
    ({"llm_server_moe_offload_pattern": LONG_PATTERN}, "llm_server_moe_offload_pattern: "),
])
def test_values_that_cannot_be_deployed_are_refused_before_anything_changes(deployed, role_vars, words):
    before = state(deployed)
    if role_vars.get("llm_server_model_dir") == "PREFIX":
        role_vars = dict(role_vars, llm_server_model_dir=str(deployed.models)[:-2])  # .../mode of .../models
        assert deployed.model.startswith(role_vars["llm_server_model_dir"])  # a string prefix, not a parent directory
    run = deployed.playbook("deploy", **role_vars)
    assert run.returncode != 0
    shown = result(run.stdout)
    assert shown["status"] == "failed" and words in shown["message"], shown["message"]
    assert "Nothing was changed" in shown["message"]
    assert "non-zero return code" not in run.stdout and "Argument list too long" not in run.stdout
    key = role_vars.get("llm_server_api_key")
    assert key is None or key.strip() not in run.stdout  # a refused key is never shown either
    assert state(deployed) == before


def test_extra_arguments_reach_llama_server_literally(local):
    alias = "a$b${HOME}`id`'\" $(id)"
    local.succeed("deploy", llm_server_extra_args=["--alias", alias])
    pid = json.loads(subprocess.run(["podman", "container", "inspect", local.name], capture_output=True, text=True,
                                    check=True, timeout=60).stdout)[0]["State"]["Pid"]
    child = open("/proc/%d/task/%d/children" % (pid, pid)).read().split()[0]
    argv = open("/proc/%s/cmdline" % child, "rb").read().rstrip(b"\0").split(b"\0")
    assert argv[-2:] == [b"--alias", alias.encode()]


@pytest.fixture
def small_disk(local, tmp_path):
    """The rollback directory on a tmpfs of 512 KiB (root only): room for two snapshots until it is filled."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "small-disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k,mode=0700", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory):
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:  # unbuffered: close() has nothing left to flush on a full disk
        try:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        except OSError:
            pass
    return filler


def test_a_full_disk_after_a_verified_deploy_keeps_serving_and_says_so(local, small_disk):
    local.succeed("deploy", llm_server_rollback_dir=str(small_disk))
    last = os.readlink(small_disk / "last")
    filler = fill(small_disk)
    run = local.playbook("deploy", llm_server_rollback_dir=str(small_disk), llm_server_ctx_size=1024)
    assert run.returncode != 0
    shown = result(run.stdout)
    assert shown["status"] == "failed" and not shown["rollback"]["performed"], shown["message"]
    assert "keeping the snapshot" in shown["message"] and "No space left on device" in shown["message"]
    assert "ai-llm serves the verified configuration: it was not rolled back" in shown["message"]
    assert "rollback failed" not in shown["message"].lower()
    assert local.health() == 200 and local.env_value("LLM_CTX_SIZE") == "1024"
    assert os.readlink(small_disk / "last") == last
    assert [p.name for p in small_disk.iterdir() if "tmp" in p.name] == []
    filler.unlink()
    local.succeed("deploy", llm_server_rollback_dir=str(small_disk), llm_server_ctx_size=1024)
    assert os.readlink(small_disk / "last") != last
    again = local.playbook("deploy", llm_server_rollback_dir=str(small_disk), llm_server_ctx_size=1024)
    assert recap(again.stdout)["changed"] == 0


def test_a_damaged_snapshot_is_refused_not_restored(local):
    local.succeed("deploy")
    with open(local.project / ".rollback" / "last" / "docker-compose.prod.yml", "a") as f:
        f.write("    image: [damaged\n")
    run = local.playbook("deploy", llm_server_model_path=wrong_shape(local))
    assert run.returncode != 0
    shown = result(run.stdout)
    assert shown["status"] == "failed" and "does not match the sha256" in shown["message"], shown["message"]
    assert "image: [damaged" not in (local.project / "docker-compose.prod.yml").read_text()
