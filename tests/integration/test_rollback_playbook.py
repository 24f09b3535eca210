"""playbooks/rollback.yml on a real local deploy (podman, podman-compose, the CPU image, the demo model):
deploy pattern A, deploy pattern B, rollback.yml returns to A, then llm_server_rollback_to=none clears it."""
from __future__ import annotations

import pytest

from tests.helpers.llm_deploy import local_deploy

PATTERN_A = r"blk\.1\.ffn_(up|down)_exps"
PATTERN_B = r"blk\.4\.ffn_(up|down)_exps"
TENSORS_A = ["blk.1.ffn_down_exps.weight", "blk.1.ffn_up_exps.weight"]
TENSORS_B = ["blk.4.ffn_down_exps.weight", "blk.4.ffn_up_exps.weight"]


@pytest.fixture
def local(tmp_path):
    with local_deploy(tmp_path, "ai-llm-rollback") as deploy:
        yield deploy


def overridden(ansible_module, deploy):
    """The tensors llama-server's log says it put on the CPU, and whether the per-tensor lines are visible."""
    log = ansible_module("llama_server_log", {"container": deploy.name, "container_engine": "podman"})
    assert not log["failed"], log
    return sorted(t["tensor"] for t in log["overridden"]), log["per_tensor_lines_visible"]


def test_rollback_returns_to_the_deploy_before_and_none_clears_the_pattern(local, ansible_module):
    for pattern, tensors in ((PATTERN_A, TENSORS_A), (PATTERN_B, TENSORS_B)):
        run = local.succeed("deploy", "-e", "llm_server_moe_offload_pattern=" + pattern)
        assert local.env_value("LLM_MOE_OFFLOAD_PATTERN") == pattern
        assert overridden(ansible_module, local) == (tensors, True)
    b_container = local.container()
    assert (local.project / ".rollback" / "previous" / ".env").exists()

    run = local.succeed("rollback")
    assert "Rolled back to the verified configuration before the current one" in run.stdout
    assert local.env_value("LLM_MOE_OFFLOAD_PATTERN") == PATTERN_A
    assert local.container()["id"] != b_container["id"] and local.container()["status"] == "running"
    assert overridden(ansible_module, local) == (TENSORS_A, True)
    assert local.health() == 200

    run = local.succeed("rollback", "-e", "llm_server_rollback_to=none")
    assert "Cleared LLM_MOE_OFFLOAD_PATTERN" in run.stdout
    assert local.env_value("LLM_MOE_OFFLOAD_PATTERN") == ""
    assert overridden(ansible_module, local) == ([], True)
    assert local.health() == 200
    # The keys the role does not clear stay as the deploy wrote them.
    assert local.env_value("LLM_PORT") == str(local.port)
