"""The role's scenarios on one local host (podman, podman-compose, the CPU image, the real llama-server), each a
sequence of steps in order, every step starting from the state the one before left, one deploy per scenario:

- on a deploy with every routed expert on the CPU (mode all): check mode (nothing to do; a changed pattern
  reported, shown in the diff, and nothing touched); a pattern that matches nothing and a model whose data is cut
  are refused before anything changes, a compose file damaged by hand is restored; after them the host serves the
  inventory's configuration and a check run finds nothing to change;
- pattern change: block 1's experts, then block 4's: exactly one recreate, the same greedy answer (parity), no
  change on the next run, the log proves the new set.

The convergence of that deploy with idempotence and verify, and a model llama-server cannot load rolled back, are
the molecule scenarios ``default`` and ``rollback`` (extensions/molecule).

Every run is its own ``ansible-playbook`` process, as an operator runs it.
Run under the podman lock: ``flock /tmp/ai-llm-podman.lock python -m pytest tests/integration/test_role_scenarios.py``.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import time
import urllib.request

import pytest

from tests.helpers.llm_deploy import local_deploy, recap, result, write_cut_model

pytestmark = pytest.mark.skipif(not shutil.which("podman") or not shutil.which("podman-compose"),
                                reason="needs podman and podman-compose")

EXPERTS = ["blk.1.ffn_down_exps.weight", "blk.1.ffn_up_exps.weight", "blk.4.ffn_down_exps.weight",
           "blk.4.ffn_up_exps.weight"]
BLOCK_1 = r"blk\.1\.ffn_(up|down)_exps"
BLOCK_4 = r"blk\.4\.ffn_(up|down)_exps"
NOWHERE = r"blk\.9\.ffn_(up|down)_exps"  # the experts of a block the demo model does not have
FATAL = re.compile(r"^fatal: \[localhost\]: FAILED! => ", re.MULTILINE)


# ------------------------------------------------------------------ what a step reads
def deploy_run(deploy, *args, **role_vars):
    """playbooks/deploy.yml: rc, changed and failed (the recap), fatal (the msg of every failed task in order,
    rescued ones included), output, result (llm_server_result as shown at the end; {} when the run did not get
    there)."""
    proc = deploy.playbook("deploy", *args, **role_vars)
    output = proc.stdout + "\n" + proc.stderr
    counts = recap(proc.stdout)
    assert counts, output[-5000:]
    fatal = [json.JSONDecoder().raw_decode(output[m.end():])[0].get("msg", "") for m in FATAL.finditer(output)]
    return {"rc": proc.returncode, "changed": counts["changed"], "failed": counts["failed"], "fatal": fatal,
            "output": output, "result": result(proc.stdout) or {}}


def container(deploy):
    """The container (id, created, started, status) and llama-server's argv, the child of the container's init,
    from /proc/<pid>/cmdline split on NUL (every argv element stays one element)."""
    inspect = json.loads(subprocess.run(["podman", "container", "inspect", deploy.name], capture_output=True,
                                        text=True, check=True, timeout=60).stdout)[0]
    pid = inspect["State"]["Pid"]
    with open("/proc/%d/task/%d/children" % (pid, pid), encoding="ascii") as children:
        child = children.read().split()[0]
    with open("/proc/%s/cmdline" % child, "rb") as cmdline:
        argv = cmdline.read().rstrip(b"\0").decode().split("\0")
    return {"id": inspect["Id"], "created": inspect["Created"], "started": inspect["State"]["StartedAt"],
            "status": inspect["State"]["Status"], "argv": argv}


def snapshot(deploy):
    """What serves: the container, the sha256 of .env and of the compose file, and the time (podman events)."""
    files = [hashlib.sha256((deploy.project / name).read_bytes()).hexdigest()
             for name in (".env", "docker-compose.prod.yml")]
    return {"container": container(deploy), "files": files, "since": int(time.time())}


def events(deploy, since, *filters):
    """``podman events`` of the container since ``since``: "<status> <id>" lines."""
    argv = ["podman", "events", "--stream=false", "--since", str(since), "--filter", "container=" + deploy.name]
    for item in filters:
        argv += ["--filter", item]
    proc = subprocess.run(argv + ["--format", "{{.Status}} {{.ID}}"], capture_output=True, text=True, check=True,
                          timeout=60)
    return proc.stdout.split("\n")[:-1]


def assert_serves(deploy):
    """/health is 200 with status ok, /completion answers the asked number of tokens."""
    base = "http://127.0.0.1:%d" % deploy.port
    with urllib.request.urlopen(base + "/health", timeout=10) as answer:
        assert answer.status == 200 and json.loads(answer.read())["status"] == "ok"
    body = json.dumps({"prompt": "The capital of France is", "n_predict": 8, "temperature": 0,
                       "ignore_eos": True}).encode()
    request = urllib.request.Request(base + "/completion", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        completion = json.loads(answer.read())
    assert completion["tokens_predicted"] == 8 and isinstance(completion["content"], str), completion


def assert_log_proves(deploy, ansible_module, tensors):
    """The server's own log proves that exactly ``tensors`` (named here, not derived from the role's pattern) went
    to the CPU, and llama-server runs with the pattern the role reports (verification.json) as one
    ``--override-tensor`` element and the model at its path in the container."""
    log = ansible_module("llama_server_log", {"container": deploy.name, "container_engine": "podman",
                                              "expect_tensors": tensors})
    assert not log["failed"] and log["verified"], log
    assert log["load_error"] is None and log["per_tensor_lines_visible"], log
    assert sorted(t["tensor"] for t in log["overridden"]) == sorted(tensors)
    assert sorted(set(t["buffer"] for t in log["overridden"])) == ["CPU"]
    now = container(deploy)
    argv = now["argv"]
    assert now["status"] == "running"
    assert argv[0] == "/opt/llama/bin/llama-server"
    assert argv.count("--override-tensor") == 1
    assert argv[argv.index("--override-tensor") + 1] == deploy.verification()["pattern"] + "=CPU", argv
    assert argv[argv.index("--model") + 1] == "/models/demo.gguf", argv


# ------------------------------------------------------------------ check mode, then failures on the same deploy
@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The demo model with every routed expert on the CPU, deployed once for the check-mode and failure steps."""
    with local_deploy(tmp_path_factory.mktemp("scenario"), "ai-llm-scenario") as deploy:
        first = deploy_run(deploy)
        assert first["rc"] == 0 and first["failed"] == 0, first["output"][-5000:]
        write_cut_model(deploy.model, deploy.models / "cut.gguf")
        yield deploy


def test_check_mode_changes_nothing_and_reports_a_change_it_would_make(served):
    before = snapshot(served)
    run = deploy_run(served, "--check", "--diff")
    assert run["rc"] == 0 and run["failed"] == 0 and run["changed"] == 0, run["output"][-3000:]
    assert "would be recreated" not in run["output"]
    run = deploy_run(served, "--check", "--diff", llm_server_moe_offload_pattern=BLOCK_4)
    assert run["rc"] == 0 and run["failed"] == 0 and run["changed"] >= 1, run["output"][-3000:]
    assert "+LLM_MOE_OFFLOAD_PATTERN='%s'" % BLOCK_4 in run["output"]
    assert "would be recreated: the configuration changed (LLM_MOE_OFFLOAD_PATTERN" in run["output"]
    after = snapshot(served)
    assert after["files"] == before["files"]
    assert after["container"] == before["container"]


def test_a_pattern_that_matches_nothing_is_refused_before_anything_changes(served):
    before = snapshot(served)
    run = deploy_run(served, llm_server_moe_offload_pattern=NOWHERE)
    after = snapshot(served)
    assert run["rc"] != 0 and run["failed"] == 1 and run["changed"] == 0, run["output"][-3000:]
    assert len(run["fatal"]) == 1, run["output"][-3000:]  # the role's refusal, once: one host has no preflight
    # the role shows the pattern as JSON: each backslash doubled
    assert r'refused inventory pattern "blk\\.9\\.ffn_(up|down)_exps"' in run["fatal"][0], run["fatal"]
    assert "The pattern matched no tensors." in run["fatal"][0]
    assert "Nothing was changed" in run["fatal"][0]
    assert run["result"]["status"] == "failed" and run["result"]["timings"]["recreate"] is None
    assert after["files"] == before["files"]
    assert after["container"]["id"] == before["container"]["id"]
    assert after["container"]["started"] == before["container"]["started"]
    assert_serves(served)


def test_a_model_whose_data_is_cut_is_refused_before_anything_changes(served):
    before = snapshot(served)
    run = deploy_run(served, llm_server_model_path=str(served.models / "cut.gguf"))
    after = snapshot(served)
    assert run["rc"] != 0 and run["failed"] == 1 and run["changed"] == 0, run["output"][-3000:]
    assert len(run["fatal"]) == 1, run["output"][-3000:]  # the reader's reason, once: one host has no preflight
    assert run["fatal"][0].startswith("%s: at byte " % (served.models / "cut.gguf")), run["fatal"]
    assert "lies beyond the end of the file" in run["fatal"][0]
    assert run["result"]["status"] == "failed" and run["result"]["timings"]["recreate"] is None
    assert after["files"] == before["files"]
    assert after["container"]["id"] == before["container"]["id"]
    assert after["container"]["started"] == before["container"]["started"]


def test_a_compose_file_damaged_by_hand_is_restored(served):
    before = snapshot(served)
    (served.project / "docker-compose.prod.yml").write_text(
        "services:\n  ai-llm:\n    image: [edited by hand, not yaml for compose\n")
    run = deploy_run(served)
    after = snapshot(served)
    assert run["rc"] == 0 and run["failed"] == 0 and run["changed"] >= 1, run["output"][-3000:]
    assert run["result"]["status"] == "changed" and run["result"]["timings"]["recreate"] is not None
    assert run["fatal"] == []
    assert after["files"] == before["files"]
    assert after["container"]["status"] == "running"
    assert after["container"]["argv"] == before["container"]["argv"]
    assert_serves(served)


def test_after_the_failures_the_host_serves_the_inventory_configuration(served, ansible_module):
    assert_serves(served)
    assert_log_proves(served, ansible_module, EXPERTS)
    run = deploy_run(served, "--check")
    assert run["rc"] == 0 and run["changed"] == 0, run["output"][-3000:]


# ------------------------------------------------------------------ pattern change
@pytest.fixture(scope="module")
def block_1(tmp_path_factory):
    """The experts of block 1 only (an explicit pattern), with the parity check on."""
    with local_deploy(tmp_path_factory.mktemp("pattern-change"), "ai-llm-pattern") as deploy:
        deploy.base_vars.update(llm_server_moe_offload_pattern=BLOCK_1, llm_server_parity_check=True)
        deploy.first = deploy_run(deploy)
        yield deploy


def test_converge_and_idempotence_of_one_block(block_1):
    assert block_1.first["rc"] == 0 and block_1.first["failed"] == 0, block_1.first["output"][-5000:]
    before = container(block_1)
    assert BLOCK_1 + "=CPU" in before["argv"]
    run = deploy_run(block_1)
    assert run["rc"] == 0 and run["changed"] == 0, run["output"][-5000:]
    assert container(block_1) == before


def test_a_changed_pattern_is_one_verified_recreate_with_the_same_answer(block_1):
    before = container(block_1)
    since = int(time.time())
    run = deploy_run(block_1, llm_server_moe_offload_pattern=BLOCK_4)
    now = container(block_1)
    lines = events(block_1, since)
    created = [line.split()[-1] for line in lines if line.startswith("create ")]
    started = [line.split()[-1] for line in lines if line.startswith("start ")]
    verification = block_1.verification()
    assert run["rc"] == 0 and run["failed"] == 0, run["output"][-3000:]
    assert run["result"]["status"] == "changed" and run["result"]["timings"]["recreate"] is not None
    assert now["id"] != before["id"] and now["status"] == "running"
    assert created == [now["id"]] and started == [now["id"]], lines
    assert BLOCK_1 + "=CPU" in before["argv"] and BLOCK_4 + "=CPU" in now["argv"]
    assert verification["pattern"] == BLOCK_4
    assert sorted(verification["tensors_moved"]) == ["blk.4.ffn_down_exps.weight", "blk.4.ffn_up_exps.weight"]
    assert verification["parity"].startswith("identical"), verification["parity"]


def test_the_same_pattern_again_changes_nothing_and_restarts_nothing(block_1):
    before = container(block_1)
    run = deploy_run(block_1, llm_server_moe_offload_pattern=BLOCK_4)
    assert run["rc"] == 0 and run["changed"] == 0, run["output"][-3000:]
    assert run["result"]["status"] == "unchanged" and run["result"]["timings"]["recreate"] is None
    now = container(block_1)
    assert now["id"] == before["id"] and now["started"] == before["started"]


def test_verify_the_log_proves_the_experts_of_block_4(block_1, ansible_module):
    assert_serves(block_1)
    assert_log_proves(block_1, ansible_module, ["blk.4.ffn_up_exps.weight", "blk.4.ffn_down_exps.weight"])
