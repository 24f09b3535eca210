"""The llm_server role proves a deploy by the buffers llama-server prints, against the plan, on a real local deploy
(podman, podman-compose, the CPU image, the real llama-server). On a host without GPU these are the CPU KV,
recurrent-state and compute buffers; the model's weights are the mapped file.

Run under the podman lock: ``flock /tmp/ai-llm-podman.lock python -m pytest tests/integration/test_role_buffer_proof.py``.
"""
from __future__ import annotations

import json
import re

from tests.helpers.llm_deploy import local_deploy, result


def task_result(output, name):
    """The JSON result ``ansible-playbook -v`` prints for the role's task (or handler's task) called ``name``."""
    chunks = re.split(r"^(?:TASK|RUNNING HANDLER) \[ai_llm\.moe_offload\.llm_server : %s\]" % re.escape(name), output,
                      flags=re.MULTILINE)
    assert len(chunks) > 1, "no task %r in:\n%s" % (name, output[-5000:])
    chunk = chunks[-1]
    match = re.search(r"^ok: \[localhost\] => ", chunk, re.MULTILINE)
    assert match, output[-5000:]
    return json.JSONDecoder().raw_decode(chunk[match.end():].lstrip())[0]


def test_the_cpu_buffers_of_the_plan_are_checked_against_the_log(tmp_path):
    with local_deploy(tmp_path, "ai-llm-bufproof") as deploy:
        del deploy.base_vars["llm_server_log_verbosity"]  # the role's default: the buffer lines, no per-tensor lines
        run = deploy.succeed("deploy")
        plan = task_result(run.stdout, "Read the host, plan and decide again under the lock")["plan"]
        log = task_result(run.stdout, "Wait for /health 200, then prove the placement from the log, the GPU memory "
                                      "and the answers")["log"]
        host = plan["memory"]["host"]
        checks = {c["check"]: c for c in log["checks"]}
        assert checks["KV buffer CPU"]["ok"] and checks["KV buffer CPU"]["expected"] == round(host["kv_mib"], 2)
        assert abs(log["kv_buffers"]["CPU"] - host["kv_mib"]) <= 0.01
        assert checks["RS buffer CPU"]["ok"] and abs(log["rs_buffers"]["CPU"] - host["recurrent_mib"]) <= 0.01
        assert checks["compute buffer CPU"]["ok"] and log["compute_buffers"]["CPU"] <= host["compute_mib"]
        assert log["verified"] and result(run.stdout)["status"] == "changed"
        assert log["evidence"] != "per_tensor" and not log.get("overridden")
