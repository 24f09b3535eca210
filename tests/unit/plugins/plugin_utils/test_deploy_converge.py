"""What the llm_server role does with what it found (plugins/plugin_utils/_deploy_converge.py): recreate, verify
or nothing, and why, for every state a run can find; the verification's verdict; the cause of a failed task."""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_converge import (
    decide,
    failure_cause,
    log_expectations,
    verification_problem,
    vram_rows,
)

H = "a" * 64


def service(status="running", label=H, health=200, verified=H, verified_status="changed", auth=None):
    container = {"exists": status != "missing", "status": status, "running": status == "running",
                 "config_hash": label, "exit_code": 1 if status == "exited" else 0}
    return {"container": container, "health": health if status == "running" else None,
            "auth": auth or {"checked": False, "enforced": False},
            "disk": {"verification": {"config_hash": verified, "status": verified_status} if verified else None}}


def config(changed_keys=(), files=()):
    return {"config_hash": H, "changed_keys": list(changed_keys), "files_changed": list(files)}


def test_nothing_to_do_when_the_verified_configuration_runs_and_serves():
    assert decide(service(), config()) == {"recreate": False, "verify": False, "wait": False, "reason": ""}
    assert decide(service(), config(), verify_always=True)["verify"] is True


def test_changed_files_recreate_with_the_keys_that_changed():
    d = decide(service(), config([{"key": "LLM_CTX_SIZE", "old": "512", "new": "1024"}], ["/p/.env"]))
    assert d["recreate"] and d["verify"]
    assert 'LLM_CTX_SIZE "512" -> "1024"' in d["reason"]
    assert "the API key" in decide(service(), config(files=["/p/.env"]), key_changed=True)["reason"]


@pytest.mark.parametrize("status, words", [
    ("missing", "does not exist: it is created"),
    ("exited", "is exited (exit code 1): it is recreated"),
    ("stopped", "is stopped"),
    ("paused", "is paused"),
    ("restarting", "is restarting"),
    ("created", "is created"),
])
def test_a_container_gone_stopped_or_paused_is_brought_back_as_a_change(status, words):
    d = decide(service(status), config(), container_name="ai-llm-x")
    assert d["recreate"] and words in d["reason"]


def test_a_container_of_another_configuration_is_recreated():
    """A run killed after .env was written and before the recreate: the label tells."""
    d = decide(service(label="b" * 64), config())
    assert d["recreate"] and "ai-llm runs configuration bbbbbbbbbbbb but aaaaaaaaaaaa is on disk" in d["reason"]
    assert "without the role's label" in decide(service(label=None), config())["reason"]


def test_a_configuration_never_verified_is_verified_without_a_recreate():
    """A run killed during the health wait: the container runs the files on disk, nobody proved them."""
    d = decide(service(verified="c" * 64), config())
    assert d == {"recreate": False, "verify": True, "wait": False, "reason": d["reason"]}
    assert "never verified" in d["reason"]
    assert decide(service(verified=None), config())["verify"] is True
    assert decide(service(verified_status="failed"), config())["verify"] is True
    assert decide(service(health=503, verified="c" * 64), config())["wait"] is True


def test_a_verified_configuration_that_stopped_answering_is_recreated():
    assert decide(service(health=-1), config())["recreate"] is True


def test_an_api_key_not_in_force_is_recreated():
    d = decide(service(auth={"checked": True, "enforced": False, "without_key": 200, "with_key": 200}), config())
    assert d["recreate"] and "not in force" in d["reason"]


def test_the_verification_verdict():
    ok = {"verified": True, "per_tensor_lines_visible": True, "overridden": [{"tensor": "t"}]}
    assert verification_problem(ok, "p") == ""
    assert "failed to load" in verification_problem({"load_error": "bad shape"}, "p")
    nothing = {"verified": True, "per_tensor_lines_visible": True, "overridden": []}
    assert verification_problem(nothing, r"blk\.9") == ('the pattern matched no tensors: llama-server\'s log '
                                                        'shows no tensor overridden to CPU for "blk\\\\.9"')
    assert verification_problem({"verified": False, "msg": "missing: t"}, "p") == "missing: t"
    rows = vram_rows([0], [{"index": 0, "memory_used_mib": 100}], [{"index": 0, "memory_used_mib": 9100}],
                     {"gpus": [{"index": 0, "total_mib": 3024.0, "margin_mib": 1024.0}]}, 1024)
    assert rows == [{"index": 0, "planned_mib": 2000, "used_mib": 9000, "ok": False}]
    assert "GPU 0: 9000 MiB used, 2000 MiB planned" in verification_problem(ok, "p", rows, tolerance_mib=1024)
    parity = {"before": {"tokens": [1, 2]}, "after": {"tokens": [1, 3]}}
    assert "output parity failed" in verification_problem(ok, "p", parity=parity, seed=42)


def test_the_cause_of_a_failed_command_is_what_it_printed():
    result = {"msg": "non-zero return code", "rc": 1, "cmd": ["podman-compose", "up", "-d", "ai-llm"],
              "stderr": "Error: something\nOSError: [Errno 7] Argument list too long: 'podman'\n"}
    cause = failure_cause(result)
    assert cause.startswith("podman-compose up -d ai-llm failed (rc=1): ")
    assert "Argument list too long" in cause and "non-zero return code" not in cause
    assert failure_cause({"msg": "llm_server: refused x"}) == "refused x"
    assert failure_cause({"msg": "", "cause": "llama-server exited: boom"}) == "llama-server exited: boom"
    assert failure_cause({}, {"name": "Write"}) == "the task Write failed"


# moe_offload_plan's result as the role registers it: two GPUs, the second holding the experts of the first's blocks
TWO_GPUS = {
    "devices": [{"device": "CUDA0", "index": 1}, {"device": "CUDA1", "index": 0}],
    "memory": {"gpus": [{"index": 1, "model_mib": 1369.2, "kv_mib": 192.0, "recurrent_mib": 95.23,
                         "compute_mib": 1170.4},
                        {"index": 0, "model_mib": 800.5, "kv_mib": 0.0, "recurrent_mib": 47.62, "compute_mib": 300.0}],
               "host": {"model_mib": 21772.0, "kv_mib": 0, "recurrent_mib": 0, "compute_mib": 40.0}},
}
CPU_ONLY = {"devices": [], "memory": {"gpus": [], "host": {"model_mib": 30.0, "kv_mib": 27.0, "recurrent_mib": 0.0,
                                                           "compute_mib": 22.77}}}
SETTINGS = {"extra_args": [], "n_gpu_layers": "99"}


def test_each_planned_device_gets_its_buffers_by_llama_cpps_name():
    expect = log_expectations(TWO_GPUS, "multi", SETTINGS)
    assert expect["expect_model_buffers"] == {"CUDA0": 1369.2, "CUDA1": 800.5}
    assert expect["expect_kv_buffers"] == {"CUDA0": 192.0}  # no KV line for a device without attention blocks
    assert expect["expect_rs_buffers"] == {"CUDA0": 95.23, "CUDA1": 47.62}
    assert expect["expect_compute_buffers"] == {"CUDA0": 1170.4, "CUDA1": 300.0}


def test_a_host_without_gpu_is_proved_by_its_cpu_buffers():
    expect = log_expectations(CPU_ONLY, "cpu", SETTINGS, ["blk.1.ffn_up_exps.weight"])
    assert expect == {"expect_model_buffers": {}, "expect_kv_buffers": {"CPU": 27.0}, "expect_rs_buffers": {},
                      "expect_compute_buffers": {"CPU": 22.77}, "expect_tensors": None}


@pytest.mark.parametrize("topology, verbosity, shown", [
    ("cpu", None, False), ("cpu", 4, False), ("cpu", "4", False), ("cpu", 5, True), ("cpu", "6", True),
    ("single", None, True), ("single", 4, True), ("multi", 5, True)])
def test_the_tensors_are_expected_where_the_log_can_show_them(topology, verbosity, shown):
    """On GPUs always (the device buffers stand in for hidden per-tensor lines); on a host without GPU only from
    -lv 5, where llama.cpp prints the per-tensor DEBUG lines (src/llama-model-loader.cpp, create_tensor)."""
    wanted = ["blk.1.ffn_up_exps.weight", "blk.1.ffn_down_exps.weight"]
    plan = CPU_ONLY if topology == "cpu" else TWO_GPUS
    expect = log_expectations(plan, topology, dict(SETTINGS, log_verbosity=verbosity), wanted)
    assert expect["expect_tensors"] == (wanted if shown else None)


@pytest.mark.parametrize("layers", ["99", "all", "120", 99])
def test_every_layer_offloaded_keeps_the_expectations(layers):
    assert log_expectations(TWO_GPUS, "multi", dict(SETTINGS, n_gpu_layers=layers))["expect_model_buffers"]


@pytest.mark.parametrize("plan, settings", [
    (TWO_GPUS, dict(SETTINGS, extra_args=["-ub", "1024"])),
    (TWO_GPUS, dict(SETTINGS, n_gpu_layers="20")),
    (TWO_GPUS, dict(SETTINGS, n_gpu_layers="auto")),
    ({"skipped": True}, SETTINGS),
    (dict(TWO_GPUS, failed=True), SETTINGS),
    (None, SETTINGS),
    ({}, SETTINGS),
])
def test_nothing_is_expected_when_the_server_does_not_run_as_planned(plan, settings):
    expect = log_expectations(plan, "multi", settings)
    buffers = {k: v for k, v in expect.items() if k.endswith("_buffers")}
    assert buffers == {"expect_model_buffers": {}, "expect_kv_buffers": {}, "expect_rs_buffers": {},
                       "expect_compute_buffers": {}}
