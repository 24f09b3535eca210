"""Sample ``llm_server_result`` facts for the rollout report's tests, built by the role's own builder
(``_deploy_result.build``) from what its phases register.

The plans are what ``moe_offload_plan`` answers for the Nemotron-3-Nano-30B-A3B Q4_K_M header
(``tools.gguf_models.write_nemotron_nano_30b``) on the cards of ``tests/data/nvidia_smi`` (an idle RTX A5500 with
24,148 MiB free at 32K context, the busy one with 5,276 MiB free, two idle A5500 at 128K); the measured buffers
are in llama-server's per-device form (``CUDA0`` model / KV / RS / compute MiB).
"""
from __future__ import annotations

import copy
import hashlib

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils import _deploy_result as deploy_result
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._rollout_report import (
    HostRun, ReportError, Rollout, build_report)

PATTERN_2 = "blk\\.[13]\\.ffn_.*_exps\\.weight"
PATTERN_22 = "blk\\.([1368]|1[0357]|2[02479]|3[1468]|4[03579])\\.ffn_.*_exps\\.weight"


def _gpu(index, free, model, kv, rs, compute, name="NVIDIA RTX A5500"):
    total = round(model + kv + rs + compute + 1024.0, 2)
    return {"index": index, "name": name, "model_mib": model, "kv_mib": kv, "recurrent_mib": rs,
            "compute_mib": compute, "margin_mib": 1024.0, "total_mib": total, "free_mib": free}


SETTINGS = {"image": "localhost/ai-llm:cuda", "model_path": "/srv/models/Nemotron-3-Nano-30B-A3B-Q4_K_M.gguf",
            "moe_offload_mode": "auto", "base_url": "http://127.0.0.1:8080", "parity_check": False,
            "api_key_set": False, "paths": {"env": "/srv/ai-llm/.env", "compose": "/srv/ai-llm/docker-compose.prod.yml",
                                            "verification": "/srv/ai-llm/verification.json"}}
SNAPSHOT = "/srv/ai-llm/.rollback/snapshots/20261201T095900-1a2b3c4d"
TIMINGS = {"commands": ["0:00:01.100000", "0:00:02.000000"]}


def _plan_registered(plan):
    """What ``moe_offload_plan`` registers, for a plan given in the result's summarized shape (the planner's
    ``memory.host.model_mib`` is the summary's ``host.experts_mib``)."""
    host = {"model_mib": plan["host"]["experts_mib"], "available_mib": plan["host"]["available_mib"]}
    return {"fits": plan["fits"], "reason": plan["reason"], "cpu_expert_layers": plan["cpu_expert_layers"],
            "memory": {"gpus": plan["gpus"], "host": host}}


def _log(overridden, buffers):
    """What ``llama_server_log`` registers: the tensors overridden to host memory and the buffers per kind."""
    return {"verified": True, "evidence": "buffers", "overridden": [{"tensor": t} for t in overridden],
            "model_buffers": buffers.get("model", {}), "kv_buffers": buffers.get("kv", {}),
            "rs_buffers": buffers.get("rs", {}), "compute_buffers": buffers.get("compute", {})}


def result(plan, pattern="", status="", now=114.2, settings=None, **parts):
    """``llm_server_result`` as the role builds it (``_deploy_result.build``) from what its phases registered."""
    config_hash = hashlib.sha256(repr((pattern, plan["reason"])).encode()).hexdigest()
    base = {"host": "h", "settings": settings or SETTINGS, "started": 100.0, "status": status,
            "placement": {"pattern": pattern, "pattern_source": "plan" if pattern else "none", "device_overrides": []},
            "plan": _plan_registered(plan), "config": {"config_hash": config_hash},
            "service": {"auth": {"checked": False}}, "converge": {"recreate": False, "verify": False, "reason": ""},
            "changes": [False]}
    base.update(parts)
    return deploy_result.build(base, now=now)


ONE_A5500 = {
    "mode": "auto", "fits": True, "reason": "The routed experts of 2 of the 23 MoE blocks (1, 3) go to host memory",
    "cpu_expert_layers": [1, 3],
    "gpus": [_gpu(0, 24148, 21009.47, 192.0, 47.62, 1178.5)],
    "host": {"experts_mib": 2362.5, "available_mib": 61440.0},
}
BUSY_A5500 = {
    "mode": "auto", "fits": True, "reason": "The routed experts of 22 of the 23 MoE blocks go to host memory",
    "cpu_expert_layers": [1, 3, 6, 8, 10, 13, 15, 17, 20, 22, 24, 27, 29, 31, 34, 36, 38, 40, 43, 45, 47, 49],
    "gpus": [_gpu(0, 5276, 2434.95, 192.0, 47.62, 1178.5)],
    "host": {"experts_mib": 20937.0, "available_mib": 61440.0},
}
DUAL_A5500 = {
    "mode": "auto", "fits": True, "reason": "Everything fits on two RTX A5500, split 0.5,0.5",
    "cpu_expert_layers": [],
    "gpus": [_gpu(0, 24148, 10876.26, 512.0, 24.84, 208.25), _gpu(1, 24148, 12264.71, 256.0, 22.77, 208.75)],
    "host": {"experts_mib": 0.0, "available_mib": 122880.0},
}
CPU_HOST = {
    "mode": "all", "fits": True, "reason": "no GPU: every routed expert stays in host memory",
    "cpu_expert_layers": [1, 4], "gpus": [], "host": {"experts_mib": 4.0, "available_mib": 20480.0},
}


def tensors(blocks):
    return ["blk.%d.ffn_%s_exps.weight" % (b, k) for b in blocks for k in ("up", "gate", "down")]


def changed_single():
    return result(
        copy.deepcopy(ONE_A5500), pattern=PATTERN_2, changes=[True], timings=TIMINGS,
        converge={"recreate": True, "verify": True, "reason": "the configuration changed (LLM_MOE_OFFLOAD_PATTERN)"},
        log=_log(tensors([1, 3]), {"model": {"CUDA0": 21003.12, "CPU_Mapped": 2375.2}, "kv": {"CUDA0": 192.0},
                                   "rs": {"CUDA0": 47.62}, "compute": {"CUDA0": 1178.5, "CUDA_Host": 68.02}}),
        vram=[{"index": 0, "planned_mib": 22428, "used_mib": 22843, "ok": True}],
        health={"seconds": 2.4, "auth": {"checked": False}})


def rolled_back_busy():
    """The new configuration did not load; the last verified one (PATTERN_2) was restored and serves."""
    return result(
        copy.deepcopy(BUSY_A5500), pattern=PATTERN_22, changes=[True], timings=TIMINGS,
        converge={"recreate": True, "verify": True, "reason": "the configuration changed (LLM_MOE_OFFLOAD_PATTERN)"},
        failure="the model failed to load: check_tensor_dims: tensor 'blk.1.ffn_up_exps.weight' has wrong shape",
        rollback={"performed": True, "serving": True, "restored_from": SNAPSHOT, "config_hash": "b" * 64,
                  "reason": "Rolled back to the last verified configuration (%s)" % SNAPSHOT,
                  "env_keys": {"LLM_MOE_OFFLOAD_PATTERN": PATTERN_2, "LLM_DEVICE_OVERRIDES": ""}},
        health={"seconds": 2.4, "auth": {"checked": False}})


def unchanged_dual():
    """Nothing to change: what the last verification (verification.json) proved still describes what runs."""
    last = result(
        copy.deepcopy(DUAL_A5500), changes=[True],
        converge={"recreate": True, "verify": True, "reason": "no container"},
        log=_log([], {"model": {"CUDA0": 10870.0, "CUDA1": 12260.0}, "kv": {"CUDA0": 512.0, "CUDA1": 256.0},
                      "rs": {"CUDA0": 24.84, "CUDA1": 22.77}, "compute": {"CUDA0": 208.25, "CUDA1": 208.75}}),
        vram=[{"index": 0, "planned_mib": 11621, "used_mib": 11903, "ok": True},
              {"index": 1, "planned_mib": 12752, "used_mib": 13011, "ok": True}])
    return result(copy.deepcopy(DUAL_A5500), now=101.3,
                  service={"auth": {"checked": False}, "disk": {"verification": last}})


def checked_cpu():
    return result(copy.deepcopy(CPU_HOST), pattern="\\.ffn_.*_exps\\.weight", check_mode=True, now=100.8,
                  settings=dict(SETTINGS, moe_offload_mode="all"),
                  converge={"recreate": True, "verify": False, "reason": "the configuration changed (LLM_CTX_SIZE)"})


def refused_busy():
    plan = copy.deepcopy(BUSY_A5500)
    plan["fits"] = False
    plan["gpus"][0]["free_mib"] = 2048
    return result(plan, pattern=PATTERN_22, now=100.9, refusal=(
        "llm_server: the plan does not fit on h: GPU 0 needs 4877 MiB, 2048 MiB free (2829 MiB missing)"))


def sample_report():
    """A stopped rollout of six hosts with every kind of row: one GPU, two GPUs, rolled back, CPU only and not
    reached, unreachable, a plan refused in the preflight (a host name with markup, to be escaped)."""
    runs = [HostRun("gpu-box-1", 1, changed_single(), "deploy"),
            HostRun("gpu-box-2", 2, unchanged_dual(), "deploy"),
            HostRun("gpu-box-3", 3, rolled_back_busy(), "deploy"),
            HostRun("cpu-<b>4</b>", None, checked_cpu(), "preflight"),
            HostRun("gpu-box-5", 3, unreachable="Failed to connect to the host via ssh", unreachable_phase="deploy"),
            HostRun("gpu-box-6", None, refused_busy(), "preflight", failure="plan refused", failure_phase="preflight")]
    rollout = Rollout(hosts=[r.host for r in runs], batches=[["gpu-box-1"], ["gpu-box-2"], ["gpu-box-3", "gpu-box-5"]],
                      serial=[1, "34%", "100%"], started="2026-12-01T10:00:00Z", finished="2026-12-01T10:01:12Z",
                      seconds=72.3, batch_seconds=[20.1, 18.2, 30.0])
    return build_report(rollout, runs)


def error_of(call, *args):
    """The message of the ``ReportError`` that ``call(*args)`` raises."""
    with pytest.raises(ReportError) as caught:
        call(*args)
    return str(caught.value)
