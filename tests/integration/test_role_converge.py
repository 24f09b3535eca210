"""Every run converges, on a real local deploy with each engine (podman with podman-compose, docker with compose
v2; the CPU image, the real llama-server): whatever state a deploy finds (a run killed after .env was written, killed during the health wait, the
container removed, stopped or paused by hand, one that compose's own stop and rm cannot remove, two deploys at
once), the next run serves the configuration on disk, the run after it changes nothing, and verification.json
describes what runs.

One deploy per engine: each test starts from the verified deploy the one before left, and a test that changes the
inventory's values changes them in ``base_vars`` (the inventory every later run is given).

Run under the podman and docker locks: ``flock /tmp/ai-llm-podman.lock flock /tmp/ai-llm-docker.lock python -m pytest
tests/integration/test_role_converge.py``.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests.helpers.llm_deploy import local_deploy, recap, result, start_docker
from tools.gguf_models import write_wrong_shape

BLOCK_1 = r"blk\.1\.ffn_(up|down)_exps"
BLOCK_4 = r"blk\.4\.ffn_(up|down)_exps"
EXPERTS = ["blk.1.ffn_down_exps.weight", "blk.1.ffn_up_exps.weight", "blk.4.ffn_down_exps.weight",
           "blk.4.ffn_up_exps.weight"]


@pytest.fixture(scope="module", params=["podman", "docker"])
def local(request, tmp_path_factory):
    if request.param == "docker":
        why = start_docker()
        if why:
            pytest.skip(why)
    with local_deploy(tmp_path_factory.mktemp("converge"), "ai-llm-converge", engine=request.param) as deploy:
        deploy.succeed("deploy")
        yield deploy


def container_env(deploy):
    proc = subprocess.run([deploy.engine, "inspect", "--format", "{{range .Config.Env}}{{println .}}{{end}}", deploy.name],
                          capture_output=True, text=True, check=True, timeout=60)
    return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)


def assert_converged(deploy, **role_vars):
    """ai-llm serves what is on disk, verification.json says so, and one more run changes nothing."""
    now = deploy.container()
    assert now and now["status"] == "running", now
    assert deploy.health() == 200
    disk_hash = deploy.env_value("LLM_CONFIG_HASH")
    assert deploy.label() == disk_hash
    env = container_env(deploy)
    for key in ("LLM_CTX_SIZE", "LLM_MOE_OFFLOAD_PATTERN"):
        assert env[key[len("LLM_"):]] == (deploy.env_value(key) or ""), key
    verification = deploy.verification()
    assert verification["config_hash"] == disk_hash and verification["status"] in ("changed", "rolled_back")
    assert verification["pattern"] == (deploy.env_value("LLM_MOE_OFFLOAD_PATTERN") or "")
    again = deploy.succeed("deploy", **role_vars)
    assert recap(again.stdout)["changed"] == 0, again.stdout[-5000:]
    assert result(again.stdout)["status"] == "unchanged"
    assert deploy.container()["id"] == now["id"]


def wait_for(predicate, timeout=120.0, interval=0.005):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("timed out waiting for %r" % predicate)


def kill(proc):
    """SIGKILL ansible-playbook and everything it started (its process group), as an operator's kill -9 would."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


def test_killed_after_env_was_written_then_rerun(local):
    before = local.container()
    served = container_env(local)["CTX_SIZE"]
    local.base_vars["llm_server_ctx_size"] = 1024
    proc = local.start("deploy")
    wait_for(lambda: local.env_value("LLM_CTX_SIZE") == "1024")
    os.killpg(proc.pid, signal.SIGSTOP)  # frozen the moment .env holds the new value
    assert local.container()["id"] == before["id"], "the run got to the recreate before it was stopped"
    kill(proc)
    assert served != "1024" and container_env(local)["CTX_SIZE"] == served  # what the killed run left: drift
    assert (local.project / ".llm_server.lock").exists()

    run = local.succeed("deploy")
    shown = result(run.stdout)
    assert shown["status"] == "changed"
    assert "an earlier run stopped before it recreated ai-llm" in shown["message"]
    assert "took over the lock left by ansible-playbook (pid %d)" % proc.pid in run.stdout, run.stdout
    assert_converged(local)
    assert container_env(local)["CTX_SIZE"] == "1024"


def test_killed_during_the_health_wait_then_rerun_verifies(local):
    before = local.container()
    local.base_vars["llm_server_ctx_size"] = 768
    proc = local.start("deploy")
    wait_for(lambda: (local.container() or before)["id"] != before["id"])
    kill(proc)
    assert local.verification()["config_hash"] != local.env_value("LLM_CONFIG_HASH")  # never verified

    run = local.succeed("deploy")
    shown = result(run.stdout)
    assert shown["status"] == "changed" and "was never verified" in shown["message"], shown["message"]
    assert sorted(shown["tensors_moved"]) == EXPERTS and shown["evidence"] == "per_tensor"
    assert_converged(local)
    assert container_env(local)["CTX_SIZE"] == "768"


# The rollback and the recreate's replacement do not depend on the engine: podman only (test_role_docker.py rolls back
# on docker)
PODMAN_ONLY = pytest.mark.parametrize("local", ["podman"], indirect=True)


@PODMAN_ONLY
def test_an_unverified_forced_pattern_left_by_a_killed_run_is_rolled_back(local):
    before = local.container()
    bad = {"llm_server_moe_offload_pattern": r"blk\.9\.ffn_(up|down)_exps", "llm_server_moe_offload_force": True}
    proc = local.start("deploy", **bad)
    wait_for(lambda: (local.container() or before)["id"] != before["id"])
    kill(proc)

    run = local.playbook("deploy", **bad)
    assert run.returncode != 0
    shown = result(run.stdout)
    assert shown["status"] == "rolled_back", shown["message"]
    assert "the pattern matched no tensors" in shown["message"]
    assert "Rolled back to the last verified configuration" in shown["message"]
    # The inventory as it was before: what runs now is that configuration again.
    assert_converged(local)


@pytest.mark.parametrize("action, words", [
    (["rm", "--force"], "does not exist: it is created from the configuration on disk"),
    (["stop"], "is exited"),
    (["pause"], "is paused"),
])
def test_a_container_removed_stopped_or_paused_by_hand_comes_back_as_a_change(local, action, words):
    subprocess.run([local.engine] + action + [local.name], check=True, capture_output=True, timeout=120)
    run = local.succeed("deploy")
    shown = result(run.stdout)
    assert shown["status"] == "changed" and words in shown["message"], shown["message"]
    assert shown["rollback"]["performed"] is False
    assert_converged(local)


def assert_new_container_serves(deploy, run, old_id):
    assert run.returncode == 0, run.stdout[-5000:]
    shown = result(run.stdout)
    assert shown["status"] == "changed" and shown["rollback"]["performed"] is False
    assert shown["timings"]["recreate"] is not None
    now = deploy.container()
    assert now["id"] != old_id and now["status"] == "running" and now["restarts"] == 0
    assert deploy.health() == 200


@PODMAN_ONLY
def test_the_recreate_replaces_a_container_compose_cannot_remove(local):
    """Paused (compose's stop and rm refuse it every time), then crash-looping by its restart policy (stop finds
    it exited between two restarts, the restart brings it back, rm fails "as it is running" while compose exits 0
    and the old container stays): the recreate replaces it all the same."""
    subprocess.run([local.engine, "pause", local.name], check=True, capture_output=True, timeout=60)
    paused = local.container()
    assert paused["status"] == "paused"
    local.base_vars["llm_server_ctx_size"] = 1024
    run = local.playbook("deploy")
    assert_new_container_serves(local, run, paused["id"])
    assert container_env(local)["CTX_SIZE"] == "1024"

    # the running configuration broken by hand, restarted by its restart policy
    wrong = write_wrong_shape(local.model, local.models / "wrong-shape.gguf")
    local.set_env("LLM_MODEL_PATH", "'/models/%s'" % wrong.name)
    assert local.compose("up", "-d", "--force-recreate", "ai-llm").returncode == 0
    wait_for(lambda: (local.container() or {}).get("restarts", 0) >= 2, timeout=30, interval=0.2)
    looping = local.container()
    run = local.playbook("deploy")
    assert_new_container_serves(local, run, looping["id"])
    assert container_env(local)["MODEL_PATH"] == "/models/demo.gguf"


def test_two_deploys_at_once_queue(local):
    first = local.start("deploy", llm_server_moe_offload_pattern=BLOCK_1)
    wait_for((local.project / ".llm_server.lock").exists)
    second = local.start("deploy", llm_server_moe_offload_pattern=BLOCK_4)
    out_first = first.communicate(timeout=600)[0]
    out_second = second.communicate(timeout=600)[0]
    assert first.returncode == 0, out_first[-5000:]
    assert second.returncode == 0, out_second[-5000:]
    assert "waited" in out_second and "held by ansible-playbook (pid %d)" % first.pid in out_second, out_second
    assert "waited" in result(out_second)["message"]
    assert result(out_second)["pattern"] == BLOCK_4
    assert local.env_value("LLM_MOE_OFFLOAD_PATTERN") == BLOCK_4
    assert local.verification()["pattern"] == BLOCK_4
    assert sorted(local.verification()["tensors_moved"]) == ["blk.4.ffn_down_exps.weight", "blk.4.ffn_up_exps.weight"]
    assert_converged(local, llm_server_moe_offload_pattern=BLOCK_4)
