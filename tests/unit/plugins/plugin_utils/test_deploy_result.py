"""llm_server_result (plugins/plugin_utils/_deploy_result.py): one result per host with every documented key, its
status and a one-line message, for a change, no change, a check run, a refusal, a failure and a rollback."""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_result import (
    PLAN_GPU_KEYS, STATUSES, _ran, _seconds, build, buffers, delta_seconds, failure_of, parts_from, plan_summary,
    rollback_part, rollback_text, status_and_message, to_record)

README = Path(__file__).resolve().parents[4] / "roles" / "llm_server" / "README.md"
BASE_URL = "http://127.0.0.1:8080"
SETTINGS = {"image": "localhost/ai-llm:cpu", "model_path": "/m/demo.gguf", "moe_offload_mode": "all",
            "base_url": BASE_URL, "parity_check": False, "api_key_set": False,
            "paths": {"env": "/p/.env", "compose": "/p/c.yml", "verification": "/p/verification.json"}}
LOG = {"evidence": "per_tensor", "verified": True, "overridden": [{"tensor": "blk.1.ffn_up_exps.weight"}],
       "model_buffers": {"CPU_Mapped": 4.8}, "kv_buffers": {"CPU": 0.06}, "rs_buffers": {}, "compute_buffers": {}}
ROLLED_BACK = "Rolled back to the last verified configuration (/p/.rollback/x)"
SERVES_AGAIN = ROLLED_BACK + "; ai-llm serves again (http://127.0.0.1:8080/health 200)."
EMPTY_BUFFERS = {"model": {}, "kv": {}, "rs": {}, "compute": {}}
LAST = {"pattern": r"blk\.1\.ffn_.*_exps\.weight", "pattern_source": "plan",
        "device_overrides": [r"blk\.2\.ffn_.*_exps\.weight=CUDA0"], "tensors_moved": ["blk.1.ffn_up_exps.weight"],
        "evidence": "device_buffers", "vram": [{"index": 0, "planned_mib": 100, "used_mib": 90, "ok": True}],
        "cuda_context": [{"index": 0, "uuid": "GPU-1", "name": "H200", "device": "CUDA0", "held_mib": 90,
                          "buffers_mib": 13.0, "context_mib": 77}],
        "buffers": {"model": {"CUDA0": 10.0}, "kv": {"CUDA0": 1.0}, "rs": {}, "compute": {"CUDA0": 2.0}},
        "offloaded_layers": {"offloaded": 49, "total": 49}, "parity": 'identical: 2 tokens "ok"',
        "speed": {"decode_tokens_per_second": 20.1, "prompt_tokens_per_second": 400.0, "runs": 3, "prompt_tokens": 512,
                  "predicted_tokens": 128, "previous": None, "decode_ratio": None, "prompt_ratio": None}}
# A speed measured this run, against LAST's.
NEW_SPEED = dict(LAST["speed"], decode_tokens_per_second=10.05, previous=LAST["speed"], decode_ratio=0.5,
                 prompt_ratio=1.0)
EMPTY_PLAN = {"mode": None, "fits": None, "reason": None, "cpu_expert_layers": [], "placement": None,
              "gpu_devices": [], "tensor_split": "", "n_gpu_layers": None, "gpus": [],
              "host": {"experts_mib": None, "available_mib": None}, "speed": None, "cuda_context": []}


def test_the_result_has_the_keys_the_readme_documents_and_no_other():
    result = README.read_text().split("\n## Result\n", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", result, re.MULTILINE))
    assert documented == set(build({}, now=0.0))


@pytest.mark.parametrize("registered, ran", [
    (None, False), ({}, False), ({"skipped": True, "changed": False}, False), ({"skipped": False, "changed": False}, True),
    ({"changed": False}, True)])
def test_ran_is_a_result_that_is_there_and_not_skipped(registered, ran):
    assert _ran(registered) is ran


H200 = {"index": 0, "name": "H200", "model_mib": 1000, "kv_mib": 200, "recurrent_mib": 0, "compute_mib": 300,
        "margin_mib": 512, "total_mib": 2012, "free_mib": 140000}


@pytest.mark.parametrize("settings, plan, placement, summary", [
    # every documented key of a plan
    ({"moe_offload_mode": "auto"},
     {"fits": True, "reason": "the experts of 2 blocks go to host RAM", "msg": "not this", "cpu_expert_layers": [3, 4],
      "placement": "layer", "gpu_devices": [1], "tensor_split": "3,1", "n_gpu_layers": 40,
      "memory": {"gpus": [dict(H200, extra="dropped"), {"index": 1}], "host": {"model_mib": 1600, "available_mib": 64000}},
      "speed": {"decode_tokens_per_second": 41.5, "prompt_tokens_per_second": 900.0, "calibrated": True,
                "prompt_calibrated": False, "from": "..."},
      "devices": [{"device": "CUDA0", "index": 1, "name": "H200", "uuid": "GPU-1", "cuda_context_mib": 555,
                   "cuda_context_source": "assumed"}]},
     {"gpu_devices": [0]},
     {"mode": "auto", "fits": True, "reason": "the experts of 2 blocks go to host RAM", "cpu_expert_layers": [3, 4],
      "placement": "layer", "gpu_devices": [1], "tensor_split": "3,1", "n_gpu_layers": 40,
      "gpus": [H200, dict({k: None for k in PLAN_GPU_KEYS}, index=1)],
      "host": {"experts_mib": 1600, "available_mib": 64000},
      "speed": {"decode_tokens_per_second": 41.5, "prompt_tokens_per_second": 900.0, "calibrated": True,
                "prompt_calibrated": False},
      "cuda_context": [{"index": 1, "name": "H200", "context_mib": 555, "source": "assumed"}]}),
    # msg without a reason, the placed GPUs without the plan's; the host's model size counts as its experts
    ({"moe_offload_mode": "layers"},
     {"fits": False, "msg": "does not fit", "cpu_expert_layers": [5],
      "memory": {"host": {"model_mib": 700, "available_mib": 100}}},
     {"gpu_devices": [0, 1]},
     {"mode": "layers", "fits": False, "reason": "does not fit", "cpu_expert_layers": [5], "placement": None,
      "gpu_devices": [0, 1], "tensor_split": "", "n_gpu_layers": None, "gpus": [],
      "host": {"experts_mib": 700, "available_mib": 100}, "speed": None, "cuda_context": []}),
    # a plan that did not run is empty
    ({}, None, None, EMPTY_PLAN), ({}, {}, {}, EMPTY_PLAN),
    ({"moe_offload_mode": "all"}, {"skipped": True, "fits": True, "reason": "r", "gpu_devices": [3], "tensor_split": "1,1"},
     {"gpu_devices": [2]}, dict(EMPTY_PLAN, mode="all", gpu_devices=[2])),
])
def test_plan_summary(settings, plan, placement, summary):
    assert plan_summary(settings, plan, placement) == summary


def test_buffers_are_the_four_kinds_of_the_log_each_a_dict():
    assert buffers(None) == EMPTY_BUFFERS
    assert buffers({"model_buffers": None, "kv_buffers": {}}) == EMPTY_BUFFERS
    log = {"model_buffers": {"CUDA0": 1.5}, "kv_buffers": {"CUDA0": 0.5}, "rs_buffers": {"CPU": 0.1},
           "compute_buffers": {"CUDA_Host": 2.0}, "other": {"x": 1}}
    assert buffers(log) == {"model": {"CUDA0": 1.5}, "kv": {"CUDA0": 0.5}, "rs": {"CPU": 0.1},
                            "compute": {"CUDA_Host": 2.0}}


@pytest.mark.parametrize("delta, seconds", [("0:00:01.234567", 1.235), ("1:02:03.5", 3723.5), ("0:01:00", 60.0),
                                            ("2:00:00", 7200.0), ("0:00:00", 0.0), ("", None), (None, None), (0, None),
                                            ("bad", None), ("1:2", None), ("a:b:c", None), ("0:0:0:1", None)])
def test_delta_seconds_reads_hours_minutes_seconds_only(delta, seconds):
    assert delta_seconds(delta) == seconds


@pytest.mark.parametrize("deltas, total", [
    ((), None), (("", None, "bad"), None), (("0:00:00",), 0.0), (("", "0:00:00.500000"), 0.5),
    (("0:00:00.500000", "bad", "0:00:01.250000"), 1.75), (("0:01:00", "0:00:02.5"), 62.5)])
def test_seconds_sums_the_deltas_there_are_and_is_none_without_any(deltas, total):
    assert _seconds(*deltas) == total


SERVING = {"performed": True, "serving": True, "reason": ROLLED_BACK}


@pytest.mark.parametrize("rollback, text", [
    (None, ""), ({}, ""),
    # serving again, whatever the error says; else the error, else the reason
    (dict(SERVING, error="ignored"), SERVES_AGAIN),
    (dict(SERVING, serving=False, error="ignored"), "The rollback failed too: ignored"),
    ({"performed": True, "reason": ROLLED_BACK}, ROLLED_BACK), ({"serving": True, "reason": ROLLED_BACK}, ROLLED_BACK),
    ({"error": "no snapshot", "reason": ROLLED_BACK}, "The rollback failed too: no snapshot"),
])
def test_rollback_text_says_what_the_rollback_did(rollback, text):
    assert rollback_text({"settings": {"base_url": BASE_URL}, "rollback": rollback}) == text


FILES_ONLY = "updated files that do not change what ai-llm runs"
VERIFY = {"recreate": False, "verify": True, "reason": ""}


@pytest.mark.parametrize("parts, said", [
    # a rollback run: what the rollback did, after the failure when there is one
    ({"host": "h1", "status": "rolled_back", "settings": SETTINGS, "rollback": SERVING, "changes": [True]},
     ("rolled_back", SERVES_AGAIN)),
    ({"status": "rolled_back", "rollback": {"reason": "nothing to roll back to"}},
     ("rolled_back", "nothing to roll back to")),
    ({"host": "h1", "status": "rolled_back", "failure": "the snapshot is gone", "settings": SETTINGS,
      "rollback": SERVING},
     ("rolled_back", "llm_server: the deploy on h1 failed: the snapshot is gone. " + SERVES_AGAIN)),
    # a refusal wins over a failure and check mode
    ({"refusal": "llm_server: refused", "failure": "boom", "check_mode": True}, ("failed", "llm_server: refused")),
    # a failure names the host and ends with one period
    ({"host": "h2", "failure": "boom."}, ("failed", "llm_server: the deploy on h2 failed: boom.")),
    ({"failure": "boom ..."}, ("failed", "llm_server: the deploy on ? failed: boom .")),
    ({"host": "h2", "failure": "boom", "check_mode": True,
      "rollback": {"performed": True, "serving": False, "error": "compose failed"}},
     ("failed", "llm_server: the deploy on h2 failed: boom. The rollback failed too: compose failed")),
    ({"host": "h2", "failure": "boom", "settings": SETTINGS, "rollback": SERVING},
     ("rolled_back", "llm_server: the deploy on h2 failed: boom. " + SERVES_AGAIN)),
    # check mode says what would change
    ({"check_mode": True, "converge": VERIFY, "log": LOG, "changes": [False, True]},
     ("checked", "check mode: the configuration files would change (nothing was changed)")),
    ({"check_mode": True, "converge": VERIFY, "changes": [False, False]}, ("checked", "check mode: nothing would change")),
    # a model to fetch first: the plan waits for its header
    ({"check_mode": True, "converge": VERIFY, "model_fetch": {
        "would_fetch": 5, "msg": "check mode: the model would be fetched first (0.0 MiB), and the plan made from its header"}},
     ("checked", "check mode: the model would be fetched first (0.0 MiB), and the plan made from its header "
                 "(nothing was changed)")),
    ({"check_mode": True, "changes": [True], "converge": {"recreate": True, "reason": "the image changed"}},
     ("checked", "check mode: the image changed (nothing was changed)")),
    # a verified run: its reason and what the log proved
    ({"converge": VERIFY, "log": {"evidence": "device_buffers", "overridden": [{"tensor": "a"}, {"tensor": "b"}]},
      "changes": [False]},
     ("changed", "verified on request (llm_server_verify_always); verified: 2 tensor(s) overridden to host memory "
                 "(device_buffers evidence)")),
    ({"converge": {"verify": True, "reason": "the model changed"}, "log": {"evidence": "none"}},
     ("changed", "the model changed; verified: 0 tensor(s) overridden to host memory (none evidence)")),
    # without a verification, changed files say what they kept
    ({"converge": {"verify": True}, "log": {"skipped": True, "evidence": "per_tensor"}, "changes": [False, True],
      "snapshot": {"changed": True}}, ("changed", "kept the snapshot of the verified configuration")),
    ({"converge": {"verify": False}, "log": LOG, "changes": [True], "snapshot": {"skipped": True}},
     ("changed", FILES_ONLY)),
    # no change: the first twelve characters of the hash
    ({"config": {"config_hash": "0123456789abcdef"}, "changes": [False, False]},
     ("unchanged", "ai-llm serves the configuration on disk (0123456789ab); nothing to change")),
    ({}, ("unchanged", "ai-llm serves the configuration on disk (); nothing to change")),
    # the lock is said only when the run queued and the lock says why
    ({"changes": [True], "lock": {"queued": True, "msg": "waited 3 s"}}, ("changed", FILES_ONLY + " (waited 3 s)")),
    ({"changes": [True], "lock": {"queued": True, "msg": ""}}, ("changed", FILES_ONLY)),
    ({"changes": [True], "lock": {"queued": False, "msg": "took the lock"}}, ("changed", FILES_ONLY)),
])
def test_status_and_message(parts, said):
    assert status_and_message(parts) == said


NOTHING_REGISTERED = {
    "status": "unchanged", "changed": False, "message": "ai-llm serves the configuration on disk (); nothing to change",
    "host": None, "image": None, "model": None, "config_hash": None, "pattern": "", "pattern_source": "none",
    "device_overrides": [], "tensors_moved": [], "evidence": None, "plan": EMPTY_PLAN, "vram": [], "cuda_context": [],
    "buffers": EMPTY_BUFFERS, "offloaded_layers": None,
    "rollback": {"performed": False, "reason": None, "restored_from": None, "serving": None},
    "auth": {"enforced": False, "checked": False}, "parity": "off", "speed": None, "model_fetch": None,
    "timings": {"total": None, "recreate": None, "health": None, "lock_wait": None},
    "files": {"env": None, "compose": None, "verification": None}}
# What SETTINGS alone put in the result.
OF_SETTINGS = dict(NOTHING_REGISTERED, image="localhost/ai-llm:cpu", model="/m/demo.gguf",
                   plan=dict(EMPTY_PLAN, mode="all"),
                   files={"env": "/p/.env", "compose": "/p/c.yml", "verification": "/p/verification.json"})


def test_build_of_nothing_registered_has_every_key_empty():
    assert build({}, now=5.0) == NOTHING_REGISTERED


def test_build_of_a_run_that_measured_nothing_reports_the_last_verification():
    service = {"disk": {"verification": LAST}, "container": {"config_hash": "c" * 64},
               "auth": {"checked": True, "enforced": True}}
    result = build({"host": "h1", "settings": SETTINGS, "started": "100.25", "service": service,
                    "changes": [False], "log": {"skipped": True, "evidence": "per_tensor"},
                    "timings": {"commands": ["", ""], "lock_wait": 1.5}}, now=101.0)
    assert result == dict(
        OF_SETTINGS, host="h1", config_hash="c" * 64, pattern=LAST["pattern"], pattern_source="plan",
        device_overrides=LAST["device_overrides"], tensors_moved=["blk.1.ffn_up_exps.weight"], evidence="device_buffers",
        vram=LAST["vram"], cuda_context=LAST["cuda_context"], buffers=LAST["buffers"],
        offloaded_layers={"offloaded": 49, "total": 49},
        auth={"enforced": True, "checked": True}, parity='identical: 2 tokens "ok"', speed=LAST["speed"],
        timings={"total": 0.75, "recreate": None, "health": None, "lock_wait": 1.5})


def test_build_prefers_this_runs_placement_and_measurements_over_the_last_verification():
    placement = {"pattern": "", "pattern_source": "none", "device_overrides": ["x=CUDA1"]}
    vram = [{"index": 0, "planned_mib": 5, "used_mib": 4, "ok": True}]
    result = build({"settings": SETTINGS, "service": {"disk": {"verification": LAST}}, "placement": placement,
                    "config": {"config_hash": "a" * 64}, "vram": vram}, now=1.0)
    assert (result["pattern"], result["pattern_source"], result["device_overrides"]) == ("", "none", ["x=CUDA1"])
    assert (result["config_hash"], result["vram"], result["evidence"]) == ("a" * 64, vram, "device_buffers")


def test_build_of_a_last_verification_without_some_keys_uses_their_empty_values():
    last = {"evidence": "none"}
    result = build({"settings": dict(SETTINGS, parity_check=True), "service": {"disk": {"verification": last}}})
    empty = ("pattern", "pattern_source", "device_overrides", "tensors_moved", "vram", "buffers", "offloaded_layers",
             "parity")
    assert {k: result[k] for k in empty} == {k: NOTHING_REGISTERED[k] for k in empty} and result["evidence"] == "none"


def test_build_of_a_verified_recreate_reports_what_the_log_measured():
    log = {"evidence": "per_tensor", "overridden": [{"tensor": "blk.1.ffn_up_exps.weight"}, {"tensor": "t2"}],
           "model_buffers": {"CPU_Mapped": 4.8}, "kv_buffers": {"CPU": 0.06},
           "offloaded_layers": {"offloaded": 1, "total": 2}}
    settings = dict(SETTINGS, parity_check=True, api_key_set=True)
    placement = {"pattern": r"\.ffn_.*_exps\.weight", "pattern_source": "inventory", "device_overrides": ["y=CUDA0"],
                 "gpu_devices": [0]}
    result = build({"host": "h1", "settings": settings, "started": 100, "placement": placement,
                    "service": {"disk": {"verification": LAST}, "auth": {"checked": True, "enforced": False}},
                    "config": {"config_hash": "d" * 64, "changed": True},
                    "converge": {"recreate": True, "verify": True, "reason": "the configuration changed"},
                    "changes": [True, False, False, True], "log": log,
                    "health": {"seconds": 2.5, "auth": {"checked": True, "enforced": True}},
                    "parity": {"after": {"tokens": [1, 2, 3], "content": "ok"}},
                    "parity_note": "ignored", "speed": NEW_SPEED,
                    "rollback": {"config_hash": "e" * 64, "reason": "not needed"},
                    "timings": {"commands": ["0:00:00.500000", "0:00:01.250000"], "lock_wait": 0}}, now=110.0)
    assert result == dict(
        OF_SETTINGS, status="changed", changed=True,
        message="the configuration changed; verified: 2 tensor(s) overridden to host memory (per_tensor evidence)",
        host="h1", config_hash="d" * 64, pattern=r"\.ffn_.*_exps\.weight", pattern_source="inventory",
        device_overrides=["y=CUDA0"], tensors_moved=["blk.1.ffn_up_exps.weight", "t2"], evidence="per_tensor",
        plan=dict(EMPTY_PLAN, mode="all", gpu_devices=[0]),
        buffers={"model": {"CPU_Mapped": 4.8}, "kv": {"CPU": 0.06}, "rs": {}, "compute": {}},
        offloaded_layers={"offloaded": 1, "total": 2},
        rollback={"performed": False, "reason": "not needed", "restored_from": None, "serving": None},
        auth={"enforced": True, "checked": True}, parity='identical: 3 tokens "ok"', speed=NEW_SPEED,
        timings={"total": 10.0, "recreate": 1.75, "health": 2.5, "lock_wait": 0})


def test_build_passes_the_parity_note_when_there_was_no_baseline():
    settings = dict(SETTINGS, parity_check=True)
    result = build({"settings": settings, "log": LOG, "parity": {}, "parity_note": "no baseline: ai-llm was down"})
    assert result["parity"] == "no baseline: ai-llm was down"
    assert build({"settings": settings, "log": LOG})["parity"] == "no baseline (nothing served before this deploy)"
    # nothing measured and no last verification: no baseline either
    assert build({"settings": settings, "service": {"disk": {}}})["parity"] == (
        "no baseline (nothing served before this deploy)")


def test_build_of_a_rollback_reports_the_snapshot_put_back():
    rollback = {"performed": True, "serving": True, "config_hash": "e" * 64, "reason": ROLLED_BACK,
                "restored_from": "/p/.rollback/x",
                "env_keys": {"LLM_MOE_OFFLOAD_PATTERN": "blk", "LLM_DEVICE_OVERRIDES": "a=CUDA0,,b=CUDA1"}}
    placement = {"pattern": "new", "pattern_source": "plan", "device_overrides": ["new=CUDA0"]}
    result = build({"host": "h1", "settings": SETTINGS, "status": "rolled_back", "placement": placement,
                    "service": {"disk": {"verification": LAST}}, "config": {"config_hash": "d" * 64},
                    "rollback": rollback, "health": {"skipped": True, "seconds": 9}}, now=1.0)
    # of the last verification only its parity line
    assert result == dict(
        OF_SETTINGS, status="rolled_back", changed=True, message=SERVES_AGAIN, host="h1", config_hash="e" * 64,
        pattern="blk", pattern_source="snapshot", device_overrides=["a=CUDA0", "b=CUDA1"], parity='identical: 2 tokens "ok"',
        rollback={"performed": True, "reason": ROLLED_BACK, "restored_from": "/p/.rollback/x", "serving": True})
    # the speed of the configuration put back, when the last verification measured that one
    same = dict(LAST, config_hash="e" * 64)
    assert build({"status": "rolled_back", "service": {"disk": {"verification": same}}, "log": LOG,
                  "speed": NEW_SPEED, "rollback": rollback})["speed"] == LAST["speed"]


@pytest.mark.parametrize("env_keys, placed", [
    ({"LLM_MOE_OFFLOAD_PATTERN": "", "LLM_DEVICE_OVERRIDES": ""}, ("", "none", [])),
    ({"LLM_MOE_OFFLOAD_PATTERN": "blk"}, ("blk", "snapshot", [])),
    # compose reads a missing key as ${LLM_MOE_OFFLOAD_PATTERN:-}: empty, the restored server offloads nothing
    ({"CTX_SIZE": "4096"}, ("", "none", [])),
])
def test_build_of_a_rollback_places_what_the_snapshot_holds_whatever_this_run_planned(env_keys, placed):
    rollback = {"performed": True, "serving": True, "env_keys": env_keys}
    result = build({"status": "rolled_back", "rollback": rollback,
                    "placement": {"pattern": "p", "pattern_source": "plan", "device_overrides": ["o=CUDA0"]}})
    assert (result["pattern"], result["pattern_source"], result["device_overrides"]) == placed


@pytest.mark.parametrize("health, service_auth, api_key_set, auth", [
    ({"auth": {"checked": True, "enforced": True}}, {"checked": True, "enforced": False}, False,
     {"enforced": True, "checked": True}),
    ({"auth": {"checked": True, "enforced": False}}, {"checked": False}, True, {"enforced": False, "checked": True}),
    ({"auth": {"checked": False, "enforced": True}}, {"checked": True, "enforced": False}, True,
     {"enforced": False, "checked": True}),
    ({"skipped": True, "auth": {"checked": True, "enforced": True}}, {"checked": False}, False,
     {"enforced": False, "checked": False}),
    ({}, {"checked": True, "enforced": True}, False, {"enforced": True, "checked": True}),
    ({}, {"enforced": False}, True, {"enforced": True, "checked": False}),
    ({}, None, True, {"enforced": True, "checked": False}),
    ({"seconds": 1.0}, None, False, {"enforced": False, "checked": False}),
])
def test_auth_is_what_this_run_proved_else_what_the_service_showed_else_whether_a_key_is_set(
        health, service_auth, api_key_set, auth):
    result = build({"settings": {"api_key_set": api_key_set}, "health": health, "service": {"auth": service_auth}})
    assert result["auth"] == auth


@pytest.mark.parametrize("parts, status, changed", [
    ({"changes": [True]}, "changed", True), ({"status": "rolled_back"}, "rolled_back", True), ({}, "unchanged", False),
    ({"failure": "boom"}, "failed", False), ({"check_mode": True}, "checked", False)])
def test_changed_is_true_for_a_change_or_a_rollback_only(parts, status, changed):
    result = build(parts)
    assert (result["status"], result["changed"]) == (status, changed)
    assert status in STATUSES


def test_the_total_time_runs_to_now_by_default_rounded_to_milliseconds(monkeypatch):
    assert build({"started": 100.0}, now=100.12345)["timings"]["total"] == 0.123
    monkeypatch.setattr(time, "time", lambda: 160.5)
    assert build({"started": 100.0})["timings"]["total"] == 60.5


# failure_of, rollback_part, parts_from: build's parts from the options of the action llm_server_result

VERIFYING = {"recreate": True, "verify": True, "wait": True, "reason": "r"}
PREPARED = {"settings": dict(SETTINGS, rollback=True, rollback_dir="/p/.rollback", started=100.0),
            "service": {"disk": {}}, "plan": {"fits": True}, "placement": {"pattern": "p"},
            "config": {"config_hash": "f" * 64, "files": ["env"]}, "converge": VERIFYING,
            "decision": {"unchanged": False, "reason": "r"}}
FAILED = {"result": {"msg": "llm_server: boom"}, "task": {"name": "Start ai-llm"}}


def test_the_failure_is_the_cause_the_failed_step_registered_before_the_rescue_s_own():
    assert failure_of({}) == "" and failure_of({"failure": {}, "verify": {"failed": True, "msg": "x"}}) == ""
    assert failure_of({"failure": FAILED}) == "boom"
    assert failure_of({"failure": {"result": {}, "task": {"name": "Write"}}}) == "the task Write failed"
    # the proof's or the recreate's own result first: a handler's failure reaches the rescue without its details
    assert failure_of({"failure": FAILED, "verify": {"failed": True, "msg": "llm_server: no answer"}}) == "no answer"
    up = {"failed": True, "msg": "non-zero return code", "rc": 1, "cmd": ["podman-compose", "up"], "stderr": "no space\n"}
    assert failure_of({"failure": FAILED, "recreated": {"up": up}}) == "podman-compose up failed (rc=1): no space"
    assert failure_of({"failure": FAILED, "recreated": {"up": {"changed": True}}, "verify": {"verified": True}}) == "boom"


def test_what_the_rollback_to_a_snapshot_did():
    base = {"prepared": PREPARED}
    restored = {"which": "last", "restored_from": "/p/.rollback/x", "config_hash": "e" * 64,
                "env_keys": {"LLM_MOE_OFFLOAD_PATTERN": "blk"}}
    back = rollback_part(dict(base, rollback={"restored": restored, "returned": {"healthy": True}}))
    assert back == {"performed": True, "serving": True, "which": "last", "restored_from": "/p/.rollback/x",
                    "config_hash": "e" * 64, "env_keys": {"LLM_MOE_OFFLOAD_PATTERN": "blk"}, "reason": ROLLED_BACK}
    before = rollback_part(dict(base, rollback={"restored": dict(restored, which="previous"),
                                                "returned": {"healthy": True}}))
    assert before["reason"] == "Rolled back to the verified configuration before the current one (/p/.rollback/x)"
    cleared = rollback_part(dict(base, rollback={"restored": {"skipped": True}, "cleared": {"config_hash": "c"},
                                                 "returned": {"healthy": True}}))
    assert (cleared["reason"], cleared["which"], cleared["config_hash"]) == (
        "Cleared LLM_MOE_OFFLOAD_PATTERN", "none", "c")
    assert cleared["env_keys"] == {"LLM_MOE_OFFLOAD_PATTERN": "", "LLM_DEVICE_OVERRIDES": ""}
    assert rollback_part(dict(base, rollback={"restored": {"missing": True, "failed": True}})) == {
        "performed": False, "reason": "No snapshot in /p/.rollback (no verified deploy yet): nothing "
                                      "was restored, ai-llm runs the failed configuration."}
    assert rollback_part(dict(base, rollback={"error": {"result": {"msg": "no"}, "task": {}}})) == {
        "performed": False, "error": "no"}
    assert rollback_part(base) == {} and rollback_part(dict(base, rollback={"error": {}})) == {}
    off = {"prepared": dict(PREPARED, settings=dict(PREPARED["settings"], rollback=False)), "failure": FAILED}
    assert rollback_part(off) == {
        "performed": False, "reason": "Rollback is off (llm_server_rollback=false): nothing was restored."}
    assert rollback_part(dict(off, verify={"verified": True})) == {
        "performed": False, "reason": "ai-llm serves the verified configuration: it was not rolled back, and the next "
                                      "run keeps its snapshot."}
    # nothing was being verified: no rollback was due
    assert rollback_part(dict(off, prepared=dict(off["prepared"], converge={"verify": False}))) == {
        "performed": False, "reason": ""}
    assert rollback_part(dict(base, failure=FAILED)) == {"performed": False, "reason": ""}


def test_the_parts_of_a_run_that_changes_nothing_come_from_the_prepare_step():
    decided = dict(PREPARED, config={"config_hash": "f" * 64, "files": []},
                   converge={"recreate": False, "verify": False}, decision={"unchanged": True})
    got = parts_from({"host": "h1", "prepared": decided, "written": [{}, {"changed": False}, {}, {}, {}]})
    assert (got["host"], got["config"], got["converge"]) == ("h1", decided["config"], decided["converge"])
    assert got["changes"] == [False] * 7 and got["refusal"] == "" and got["status"] == ""
    assert build(got)["status"] == "unchanged"


def test_the_parts_of_a_refusal_a_verified_recreate_and_a_failure():
    refused = parts_from({"prepared": dict(PREPARED, failed=True, msg="llm_server: refused x")})
    assert (refused["status"], refused["refusal"]) == ("failed", "refused x")
    locked = parts_from({"prepared": PREPARED, "lock": {"failed": True, "msg": "llm_server: waited"}})
    assert locked["refusal"] == "waited"
    verified = parts_from({"prepared": PREPARED, "status": "changed", "lock": {"waited": 0.5},
                           "written": [{"changed": False}, {"changed": True}, {}, {"changed": True}, {}],
                           "recreated": {"removed": {"delta": "0:00:01.5"}, "up": {"delta": "0:00:02", "changed": True}},
                           "verify": {"verified": True, "health": {"seconds": 3.0}, "log": LOG,
                                      "vram": [{"index": 0}], "parity": {"after": {}}, "parity_note": "n"}},
                          check_mode=False)
    assert verified["converge"] == VERIFYING and verified["log"] == LOG and verified["status"] == "changed"
    assert verified["changes"] == [False, True, False, True, False, False, True]
    assert (verified["health"], verified["vram"], verified["parity_note"]) == ({"seconds": 3.0}, [{"index": 0}], "n")
    assert verified["timings"] == {"commands": ["0:00:01.5", "0:00:02"], "lock_wait": 0.5}
    assert build(verified, now=110.0)["timings"] == {"total": 10.0, "recreate": 3.5, "health": 3.0, "lock_wait": 0.5}
    failed = parts_from({"prepared": dict(PREPARED, failed=True, msg="x"), "failure": FAILED,
                         "rollback": {"returned": {"healthy": False, "seconds": 9.0}},
                         "verify": {"health": {"seconds": 3.0}}})
    assert (failed["refusal"], failed["failure"], failed["health"]) == ("", "boom", {"healthy": False, "seconds": 9.0})


RECORDED = {"files": {"verification": "/p/verification.json"}, "rollback": {"performed": False}}
UP = {"recreated": {"up": {"changed": True}}}


@pytest.mark.parametrize("published, given, check_mode, recorded", [
    (RECORDED, UP, False, True),                                                             # a recreate
    (RECORDED, {"verify": {"verified": True}}, False, True),                                 # verified, no recreate
    (RECORDED, {"verify": {"failed": True}}, False, True),                                   # a proof that failed
    (dict(RECORDED, rollback={"performed": True}), {}, False, True),                         # back to a snapshot
    (RECORDED, {"verify": {"skipped": True}, "recreated": {"up": {"skipped": True}}}, False, False),  # nothing to prove
    (RECORDED, {}, False, False),                                                            # unchanged or refused
    (RECORDED, UP, True, False),                                                             # check mode
    (dict(RECORDED, files={"verification": None}), UP, False, False),                        # no file known
])
def test_verification_json_is_written_after_a_recreate_a_verify_or_a_rollback_only(published, given, check_mode,
                                                                                   recorded):
    assert to_record(published, given, check_mode) is recorded


def test_the_cuda_context_measured_this_run_is_published_and_a_rollback_clears_it():
    measured = [{"index": 0, "uuid": "GPU-1", "name": "H200", "device": "CUDA0", "held_mib": 900, "buffers_mib": 400.0,
                 "context_mib": 500}]
    parts = parts_from({"verify": {"cuda_context": measured, "log": LOG}})
    assert parts["cuda_context"] == measured
    assert build(dict(parts, service={"disk": {"verification": LAST}}), now=0.0)["cuda_context"] == measured
    # nothing measured and nothing proved: the last verification's
    assert build({"service": {"disk": {"verification": LAST}}}, now=0.0)["cuda_context"] == LAST["cuda_context"]
