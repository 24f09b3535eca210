"""The role's scenarios on docker (dockerd 20.10 of scripts/docker.sh, compose v2, the CPU image moved from podman,
the real llama-server), one deploy, every step starting from the state the one before left: the first deploy and an
unchanged rerun; check mode with a changed pattern (reported, shown in the diff, nothing touched); the pattern
changed; an API key (401 without it, 200 with it); a model llama-server cannot load (rolled back, still serving).

Run under the docker lock: ``flock /tmp/ai-llm-docker.lock python -m pytest tests/integration/test_role_docker.py``.
"""
from __future__ import annotations

import pytest

from tests.helpers.llm_deploy import local_deploy, recap, start_docker
from tools.gguf_models import write_wrong_shape

NOT_SERVING = start_docker()
pytestmark = pytest.mark.skipif(NOT_SERVING is not None, reason=str(NOT_SERVING))

EXPERTS = ["blk.1.ffn_down_exps.weight", "blk.1.ffn_up_exps.weight", "blk.4.ffn_down_exps.weight",
           "blk.4.ffn_up_exps.weight"]
BLOCK_4 = r"blk\.4\.ffn_(up|down)_exps"
KEY = "sk-docker-$test 'key'"


def run(deploy, *args, **role_vars):
    proc = deploy.playbook("deploy", *args, **role_vars)
    counts = recap(proc.stdout)
    assert counts, proc.stdout[-5000:] + proc.stderr[-2000:]
    return proc.returncode, counts["changed"], proc.stdout


def test_the_role_on_docker(tmp_path):
    with local_deploy(tmp_path, "ai-llm-docker", engine="docker") as deploy:
        rc, changed, out = run(deploy)
        assert (rc, deploy.health()) == (0, 200), out[-5000:]
        assert changed > 0
        assert sorted(deploy.verification()["tensors_moved"]) == EXPERTS
        first = deploy.container()
        assert first["status"] == "running"
        assert deploy.label() == deploy.env_value("LLM_CONFIG_HASH")

        assert run(deploy)[:2] == (0, 0)  # unchanged: nothing changes, nothing restarts
        assert deploy.container() == first

        env = (deploy.project / ".env").read_bytes()
        rc, changed, out = run(deploy, "--check", "--diff", llm_server_moe_offload_pattern=BLOCK_4)
        assert rc == 0 and changed > 0, out[-5000:]
        assert "+LLM_MOE_OFFLOAD_PATTERN='%s'" % BLOCK_4 in out
        assert (deploy.project / ".env").read_bytes() == env
        assert deploy.container() == first

        rc, changed, out = run(deploy, llm_server_moe_offload_pattern=BLOCK_4)
        assert (rc, deploy.health()) == (0, 200), out[-5000:]
        assert deploy.env_value("LLM_MOE_OFFLOAD_PATTERN") == BLOCK_4
        assert sorted(deploy.verification()["tensors_moved"]) == EXPERTS[2:]
        assert deploy.container()["id"] != first["id"]

        rc, changed, out = run(deploy, llm_server_moe_offload_pattern=BLOCK_4, llm_server_api_key=KEY)
        assert rc == 0, out[-5000:]
        assert (deploy.status("/props"), deploy.status("/props", "sk-wrong"), deploy.status("/props", KEY)) == (401, 401, 200)

        serving = deploy.container()
        wrong = write_wrong_shape(deploy.model, deploy.models / "wrong-shape.gguf")
        rc, changed, out = run(deploy, llm_server_moe_offload_pattern=BLOCK_4, llm_server_api_key=KEY,
                               llm_server_model_path=str(wrong))
        assert rc != 0
        assert "check_tensor_dims" in out
        assert deploy.health() == 200 and deploy.status("/props", KEY) == 200  # rolled back: the last configuration serves
        assert deploy.env_value("LLM_MODEL_PATH") == "/models/demo.gguf"
        assert deploy.container()["id"] != serving["id"]  # recreated with the restored files
