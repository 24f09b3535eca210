"""Every run converges, on a real local deploy (podman, podman-compose, the CPU image, the real llama-server):
whatever state a deploy finds (a run killed after .env was written, killed during the health wait, the
container removed, stopped or paused by hand, two deploys at once), the next run serves the configuration on
disk, the run after it changes nothing, and verification.json describes what runs.

Run under the podman lock: ``flock /tmp/ai-llm-podman.lock python -m pytest tests/integration/test_role_converge.py``.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests.helpers.llm_deploy import local_deploy, recap, result

BLOCK_1 = r"blk\.1\.ffn_(up|down)_exps"
BLOCK_4 = r"blk\.4\.ffn_(up|down)_exps"
EXPERTS = ["blk.1.ffn_down_exps.weight", "blk.1.ffn_up_exps.weight", "blk.4.ffn_down_exps.weight",
           "blk.4.ffn_up_exps.weight"]


@pytest.fixture
def local(tmp_path):
    with local_deploy(tmp_path, "ai-llm-converge") as deploy:
        run = deploy.playbook("deploy")
        assert run.returncode == 0, run.stdout[-5000:]
        yield deploy


def container_env(deploy):
    proc = subprocess.run(["podman", "inspect", "--format", "{{range .Config.Env}}{{println .}}{{end}}", deploy.name],
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
    again = deploy.playbook("deploy", **role_vars)
    assert again.returncode == 0, again.stdout[-5000:]
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
    proc = local.start("deploy", llm_server_ctx_size=1024)
    wait_for(lambda: local.env_value("LLM_CTX_SIZE") == "1024")
    os.killpg(proc.pid, signal.SIGSTOP)  # frozen the moment .env holds the new value
    assert local.container()["id"] == before["id"], "the run got to the recreate before it was stopped"
    kill(proc)
    assert container_env(local)["CTX_SIZE"] == "512"  # what the killed run left: drift
    assert (local.project / ".llm_server.lock").exists()

    run = local.playbook("deploy", llm_server_ctx_size=1024)
    assert run.returncode == 0, run.stdout[-5000:]
    shown = result(run.stdout)
    assert shown["status"] == "changed"
    assert "an earlier run stopped before it recreated ai-llm" in shown["message"]
    assert "took over the lock left by ansible-playbook (pid %d)" % proc.pid in run.stdout, run.stdout
    assert_converged(local, llm_server_ctx_size=1024)
    assert container_env(local)["CTX_SIZE"] == "1024"


def test_killed_during_the_health_wait_then_rerun_verifies(local):
    before = local.container()
    proc = local.start("deploy", llm_server_ctx_size=1024)
    wait_for(lambda: (local.container() or before)["id"] != before["id"])
    kill(proc)
    assert local.verification()["config_hash"] != local.env_value("LLM_CONFIG_HASH")  # never verified

    run = local.playbook("deploy", llm_server_ctx_size=1024)
    assert run.returncode == 0, run.stdout[-5000:]
    shown = result(run.stdout)
    assert shown["status"] == "changed" and "was never verified" in shown["message"], shown["message"]
    assert sorted(shown["tensors_moved"]) == EXPERTS and shown["evidence"] == "per_tensor"
    assert_converged(local, llm_server_ctx_size=1024)


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
    subprocess.run(["podman"] + action + [local.name], check=True, capture_output=True, timeout=120)
    run = local.playbook("deploy")
    assert run.returncode == 0, run.stdout[-5000:]
    shown = result(run.stdout)
    assert shown["status"] == "changed" and words in shown["message"], shown["message"]
    assert "Rolled back" not in run.stdout
    assert_converged(local)


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
