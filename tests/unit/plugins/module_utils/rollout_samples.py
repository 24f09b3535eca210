"""Sample ``llm_server_result`` facts in the role's documented shape, for the rollout report's tests.

The plans are what ``moe_offload_plan`` answers for the Nemotron-3-Nano-30B-A3B Q4_K_M header
(``tools.gguf_models.write_nemotron_nano_30b``) on the cards of ``tests/data/nvidia_smi`` (an idle RTX A5500 with
24,148 MiB free at 32K context, the busy one with 5,276 MiB free, two idle A5500 at 128K); the measured buffers
are in llama-server's per-device form (``CUDA0`` model / KV / RS / compute MiB).
"""
from __future__ import annotations

import copy
import hashlib

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._rollout_report import HostRun, Rollout, build_report

PATTERN_2 = "blk\\.[13]\\.ffn_.*_exps\\.weight"
PATTERN_22 = "blk\\.([1368]|1[0357]|2[02479]|3[1468]|4[03579])\\.ffn_.*_exps\\.weight"


def _gpu(index, free, model, kv, rs, compute, experts, name="NVIDIA RTX A5500"):
    total = round(model + kv + rs + compute + 1024.0, 2)
    return {"index": index, "name": name, "model_mib": model, "kv_mib": kv, "recurrent_mib": rs,
            "compute_mib": compute, "margin_mib": 1024.0, "total_mib": total, "free_mib": free,
            "experts_mib": experts}


def result(status, message, plan, pattern="", buffers=None, vram=None, rollback=None, tensors=0):
    return {
        "status": status,
        "changed": status in ("changed", "rolled_back"),
        "message": message,
        "config_hash": hashlib.sha256(message.encode()).hexdigest(),
        "pattern": pattern,
        "pattern_source": "plan" if pattern else "none",
        "device_overrides": [],
        "tensors_moved": tensors,
        "evidence": "buffers" if buffers else "none",
        "plan": plan,
        "vram": vram if vram is not None else [],
        "buffers": buffers or {},
        "rollback": rollback or {"performed": False, "reason": None, "restored_from": None, "serving": "new"},
        "auth": {"enforced": False, "checked": False},
        "parity": "off",
        "timings": {"total": 14.2, "recreate": 3.1, "health": 2.4},
        "files": {"env": "/srv/ai-llm/.env", "compose": "/srv/ai-llm/docker-compose.prod.yml",
                  "verification": "/srv/ai-llm/verification.json"},
    }


ONE_A5500 = {
    "mode": "auto", "fits": True, "reason": "The routed experts of 2 of the 23 MoE blocks (1, 3) go to host memory",
    "cpu_expert_layers": [1, 3],
    "gpus": [_gpu(0, 24148, 21009.47, 192.0, 47.62, 1178.5, 0.0)],
    "host": {"experts_mib": 2362.5, "available_mib": 61440.0},
}
BUSY_A5500 = {
    "mode": "auto", "fits": True, "reason": "The routed experts of 22 of the 23 MoE blocks go to host memory",
    "cpu_expert_layers": [1, 3, 6, 8, 10, 13, 15, 17, 20, 22, 24, 27, 29, 31, 34, 36, 38, 40, 43, 45, 47, 49],
    "gpus": [_gpu(0, 5276, 2434.95, 192.0, 47.62, 1178.5, 0.0)],
    "host": {"experts_mib": 20937.0, "available_mib": 61440.0},
}
DUAL_A5500 = {
    "mode": "auto", "fits": True, "reason": "Everything fits on two RTX A5500, split 0.5,0.5",
    "cpu_expert_layers": [],
    "gpus": [_gpu(0, 24148, 10876.26, 512.0, 24.84, 208.25, 0.0), _gpu(1, 24148, 12264.71, 256.0, 22.77, 208.75, 0.0)],
    "host": {"experts_mib": 0.0, "available_mib": 122880.0},
}
CPU_HOST = {
    "mode": "all", "fits": True, "reason": "no GPU: every routed expert stays in host memory",
    "cpu_expert_layers": [1, 4], "gpus": [], "host": {"experts_mib": 4.0, "available_mib": 20480.0},
}


def changed_single():
    return result(
        "changed", "recreated and verified: 4 tensors on the CPU (2 blocks' experts)", copy.deepcopy(ONE_A5500),
        pattern=PATTERN_2, tensors=6,
        buffers={"model": {"CUDA0": 21003.12, "CPU_Mapped": 2375.2}, "kv": {"CUDA0": 192.0},
                 "rs": {"CUDA0": 47.62}, "compute": {"CUDA0": 1178.5, "CUDA_Host": 68.02}},
        vram=[{"gpu": 0, "planned_mib": 22427.59, "used_mib": 22843.0, "ok": True}])


def rolled_back_busy():
    return result(
        "rolled_back", "llama-server exited: check_tensor_dims wrong shape; rolled back to the last verified "
        "configuration, which serves again", copy.deepcopy(BUSY_A5500), pattern=PATTERN_22,
        buffers={"CUDA0": {"model": 2431.0, "kv": 192.0, "rs": 47.62, "compute": 1178.5}},
        vram=[{"gpu": 0, "planned_mib": 3853.07, "used_mib": 4102.0, "ok": True}],
        rollback={"performed": True, "reason": "llama-server exited", "restored_from": "/srv/ai-llm/.rollback",
                  "serving": "previous"})


def unchanged_dual():
    return result(
        "unchanged", "nothing to change", copy.deepcopy(DUAL_A5500),
        buffers={"model": {"CUDA0": 10870.0, "CUDA1": 12260.0}, "kv": {"CUDA0": 512.0, "CUDA1": 256.0},
                 "rs": {"CUDA0": 24.84, "CUDA1": 22.77}, "compute": {"CUDA0": 208.25, "CUDA1": 208.75}},
        vram=[{"gpu": 0, "planned_mib": 11621.35, "used_mib": 11903.0, "ok": True},
              {"gpu": 1, "planned_mib": 12752.23, "used_mib": 13011.0, "ok": True}])


def checked_cpu():
    return result("checked", "would recreate: LLM_CTX_SIZE 2048 -> 1024", copy.deepcopy(CPU_HOST),
                  pattern="\\.ffn_.*_exps\\.weight")


def refused_busy():
    plan = copy.deepcopy(BUSY_A5500)
    plan["fits"] = False
    plan["gpus"][0]["free_mib"] = 2048
    return result("failed", "the plan does not fit: GPU 0 needs 4877 MiB, 2048 MiB free (2829 MiB missing)", plan,
                  pattern=PATTERN_22)


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
