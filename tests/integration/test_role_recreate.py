"""The recreate on a real local deploy when the old container is one that compose's own stop + rm
cannot remove: crash-looping by its restart policy (stop finds it exited between two restarts, the restart
brings it back, rm then fails with "cannot remove container ... as it is running" while compose exits 0 and
the old container stays), or paused (the same refusal, every time: the deterministic stand-in)."""
from __future__ import annotations

import subprocess
import time

import pytest

from tests.helpers.llm_deploy import local_deploy, result, write_wrong_shape


@pytest.fixture
def local(tmp_path):
    with local_deploy(tmp_path, "ai-llm-recreate") as deploy:
        yield deploy


def container_env(deploy):
    proc = subprocess.run(["podman", "inspect", "--format", "{{range .Config.Env}}{{println .}}{{end}}", deploy.name],
                          capture_output=True, text=True, check=True, timeout=60)
    return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)


def assert_new_container_serves(deploy, run, old_id):
    assert run.returncode == 0, run.stdout[-5000:]
    assert "Rolled back" not in run.stdout
    shown = result(run.stdout)
    assert shown["status"] == "changed" and shown["timings"]["recreate"] is not None
    now = deploy.container()
    assert now["id"] != old_id and now["status"] == "running" and now["restarts"] == 0
    assert deploy.health() == 200


def test_recreate_replaces_a_container_compose_cannot_remove(local):
    run = local.playbook("deploy")
    assert run.returncode == 0, run.stdout[-5000:]

    # Paused: compose's stop and rm refuse it every time.
    subprocess.run(["podman", "pause", local.name], check=True, capture_output=True, timeout=60)
    paused = local.container()
    assert paused["status"] == "paused"
    run = local.playbook("deploy", "-e", "llm_server_ctx_size=1024")
    assert_new_container_serves(local, run, paused["id"])
    assert container_env(local)["CTX_SIZE"] == "1024"

    # Crash-looping: the running configuration broken by hand, restarted by its restart policy.
    wrong = write_wrong_shape(local.model, local.models / "wrong-shape.gguf")
    local.set_env("LLM_MODEL_PATH", "'/models/%s'" % wrong.name)
    assert local.compose("up", "-d", "--force-recreate", "ai-llm").returncode == 0
    deadline = time.monotonic() + 30
    while (local.container() or {}).get("restarts", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    looping = local.container()
    assert looping["restarts"] >= 2, looping
    run = local.playbook("deploy", "-e", "llm_server_ctx_size=1024")
    assert_new_container_serves(local, run, looping["id"])
    assert container_env(local)["MODEL_PATH"] == "/models/demo.gguf"
