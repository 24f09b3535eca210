# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``llm_server_result``: the one result the llm_server role publishes per host (also written to
``verification.json``), assembled from what each phase registered: its status, a one-line message, and what
runs.

Standard library only; runs on the controller (the action ``llm_server_result``).
"""

from __future__ import annotations

import time

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_text import (
    failure_cause, parity_text, result_line)

STATUSES = ("changed", "unchanged", "failed", "rolled_back", "checked")
PLAN_GPU_KEYS = ("index", "name", "model_mib", "kv_mib", "recurrent_mib", "compute_mib", "margin_mib", "total_mib",
                 "free_mib")
PLAN_SPEED_KEYS = ("decode_tokens_per_second", "prompt_tokens_per_second", "calibrated", "prompt_calibrated")


def _ran(result):
    """A registered task result that ran (not skipped, not absent)."""
    return bool(result) and not result.get("skipped")


def plan_summary(settings, plan, placement):
    """The plan part of the result: mode, fits, reason, the blocks whose experts go to host RAM, per GPU, and the
    predicted speed (whether a calibration of the host gave its figures)."""
    plan = plan if _ran(plan) else {}
    memory = plan.get("memory") or {}
    host = memory.get("host") or {}
    predicted = plan.get("speed") or {}
    return {
        "mode": settings.get("moe_offload_mode"),
        "fits": plan.get("fits"),
        "reason": plan.get("reason") or plan.get("msg"),
        "cpu_expert_layers": plan.get("cpu_expert_layers") or [],
        "placement": plan.get("placement"),
        "gpu_devices": plan.get("gpu_devices") or (placement or {}).get("gpu_devices") or [],
        "tensor_split": plan.get("tensor_split") or "",
        "n_gpu_layers": plan.get("n_gpu_layers"),
        "gpus": [{k: g.get(k) for k in PLAN_GPU_KEYS} for g in memory.get("gpus") or []],
        "host": {"experts_mib": host.get("model_mib"),
                 "available_mib": host.get("available_mib")},
        "speed": {k: predicted.get(k) for k in PLAN_SPEED_KEYS} if predicted else None,
        "cuda_context": [{"index": d.get("index"), "name": d.get("name"), "context_mib": d.get("cuda_context_mib"),
                          "source": d.get("cuda_context_source")} for d in plan.get("devices") or []],
    }


def buffers(log):
    log = log or {}
    return {"model": log.get("model_buffers") or {}, "kv": log.get("kv_buffers") or {},
            "rs": log.get("rs_buffers") or {}, "compute": log.get("compute_buffers") or {}}


def _seconds(*deltas):
    total = 0.0
    found = False
    for delta in deltas:
        value = delta_seconds(delta)
        if value is not None:
            total += value
            found = True
    return round(total, 3) if found else None


def delta_seconds(delta):
    """Seconds of a command result's ``delta`` (``0:00:01.234567``), None when there is none."""
    if not delta:
        return None
    try:
        hours, minutes, seconds = str(delta).split(":")
        return round(int(hours) * 3600 + int(minutes) * 60 + float(seconds), 3)
    except ValueError:
        return None


def rollback_text(parts):
    """What the rollback did, as the second half of a failure message."""
    settings = parts.get("settings") or {}
    rollback = parts.get("rollback") or {}
    if rollback.get("performed") and rollback.get("serving"):
        return "%s; ai-llm serves again (%s/health 200)." % (rollback.get("reason"), settings.get("base_url"))
    if rollback.get("error"):
        return "The rollback failed too: %s" % rollback["error"]
    if rollback.get("reason"):
        return rollback["reason"]
    return ""


def status_and_message(parts):
    """``(status, message)`` of a run; what the lock did (waited for another deploy, took over a lock a killed run
    left) is said at the end."""
    status, message = _status_and_message(parts)
    lock = parts.get("lock") or {}
    if lock.get("queued") and lock.get("msg"):
        message = "%s (%s)" % (message, lock["msg"])
    return status, message


def _status_and_message(parts):
    host = parts.get("host") or "?"
    converge = parts.get("converge") or {}
    if parts.get("status") == "rolled_back" and not parts.get("failure"):
        return "rolled_back", rollback_text(parts)
    if parts.get("refusal"):
        return "failed", parts["refusal"]
    if parts.get("failure"):
        rollback = parts.get("rollback") or {}
        status = "rolled_back" if rollback.get("performed") and rollback.get("serving") else "failed"
        text = rollback_text(parts)
        return status, ("llm_server: the deploy on %s failed: %s.%s" % (host, parts["failure"].rstrip("."),
                                                                        " " + text if text else ""))
    if parts.get("check_mode"):
        if (parts.get("model_fetch") or {}).get("would_fetch"):
            return "checked", "%s (nothing was changed)" % parts["model_fetch"]["msg"]
        if converge.get("recreate"):
            return "checked", "check mode: %s (nothing was changed)" % converge.get("reason")
        if any(parts.get("changes") or []):
            return "checked", "check mode: the configuration files would change (nothing was changed)"
        return "checked", "check mode: nothing would change"
    log = parts.get("log") or {}
    if converge.get("verify") and _ran(log):
        moved = len(log.get("overridden") or [])
        proof = "verified: %d tensor(s) overridden to host memory (%s evidence)" % (moved, log.get("evidence"))
        reason = converge.get("reason") or "verified on request (llm_server_verify_always)"
        return "changed", "%s; %s" % (reason, proof)
    if any(parts.get("changes") or []):
        what = "kept the snapshot of the verified configuration" if _ran(parts.get("snapshot")) else \
            "updated files that do not change what ai-llm runs"
        return "changed", what
    config_hash = (parts.get("config") or {}).get("config_hash") or ""
    return "unchanged", "ai-llm serves the configuration on disk (%s); nothing to change" % config_hash[:12]


def restored_speed(service, rollback):
    """After a rollback, the speed the last verification recorded when the configuration put back is the one it
    measured (the same configuration hash), else None: nothing was measured of what serves."""
    last = (service.get("disk") or {}).get("verification") or {}
    same = last.get("config_hash") and last.get("config_hash") == rollback.get("config_hash")
    return last.get("speed") if same else None


def model_fetch_part(fetched):
    """``llm_server_result.model_fetch``: the bytes and seconds this run fetched the model in, its files and their
    bytes; None without ``llm_server_model_url``."""
    if not isinstance(fetched, dict):
        return None
    return {"bytes": fetched.get("bytes") or 0, "seconds": fetched.get("seconds"), "files": fetched.get("files") or [],
            "bytes_total": fetched.get("bytes_total"), "would_fetch": fetched.get("would_fetch") or 0}


def build(parts, now=None):
    """``llm_server_result`` from ``parts`` (what the phases registered; see the role's README, "Result")."""
    now = time.time() if now is None else now
    settings = parts.get("settings") or {}
    placement = parts.get("placement") or {}
    service = parts.get("service") or {}
    config = parts.get("config") or {}
    rollback = parts.get("rollback") or {}
    health = parts.get("health") or {}
    log = parts.get("log") if _ran(parts.get("log")) else None
    paths = settings.get("paths") or {}
    # Nothing measured this run: what the last verification proved still describes what runs.
    last = ((service.get("disk") or {}).get("verification") or {}) if not log else {}
    status, message = status_and_message(parts)
    restored = rollback.get("env_keys") or {}
    auth = health.get("auth") if _ran(health) and (health.get("auth") or {}).get("checked") else service.get("auth")
    auth = dict(auth or {})
    auth.setdefault("checked", False)
    auth["enforced"] = bool(auth.get("enforced")) if auth.get("checked") else bool(settings.get("api_key_set"))
    started = parts.get("started")
    timings = parts.get("timings") or {}
    result = {
        "status": status,
        "changed": status in ("changed", "rolled_back"),
        "message": message,
        "host": parts.get("host"),
        "image": settings.get("image"),
        "model": settings.get("model_path"),
        "config_hash": rollback.get("config_hash") if rollback.get("performed") else
        (config.get("config_hash") or (service.get("container") or {}).get("config_hash")),
        # (a restored .env without the key: compose reads ${LLM_MOE_OFFLOAD_PATTERN:-} as empty, no offload)
        "pattern": restored.get("LLM_MOE_OFFLOAD_PATTERN", "") if restored else
        placement.get("pattern", last.get("pattern", "")),
        "pattern_source": ("snapshot" if restored.get("LLM_MOE_OFFLOAD_PATTERN") else "none") if restored else
        placement.get("pattern_source", last.get("pattern_source", "none")),
        "device_overrides": [o for o in restored.get("LLM_DEVICE_OVERRIDES", "").split(",") if o] if restored
        else placement.get("device_overrides", last.get("device_overrides", [])),
        "tensors_moved": [t.get("tensor") for t in log.get("overridden") or []] if log else
        ([] if restored else last.get("tensors_moved", [])),
        "evidence": log.get("evidence") if log else (None if restored else last.get("evidence")),
        "plan": plan_summary(settings, parts.get("plan"), placement),
        "vram": parts.get("vram") or ([] if log or restored else last.get("vram") or []),
        "cuda_context": parts.get("cuda_context") or ([] if log or restored else last.get("cuda_context") or []),
        "buffers": buffers(log) if log else (buffers(None) if restored else last.get("buffers", buffers(None))),
        "offloaded_layers": log.get("offloaded_layers") if log else
        (None if restored else last.get("offloaded_layers")),
        "rollback": {"performed": bool(rollback.get("performed")), "reason": rollback.get("reason"),
                     "restored_from": rollback.get("restored_from"), "serving": rollback.get("serving")},
        "auth": {"enforced": auth["enforced"], "checked": auth["checked"]},
        "parity": parity_text(settings, parts.get("parity"), parts.get("parity_note")) if log or not last
        else last.get("parity", "off"),
        "model_fetch": model_fetch_part(parts.get("model_fetch")),
        "speed": restored_speed(service, rollback) if rollback.get("performed") else
        (parts.get("speed") if log else last.get("speed")),
        "timings": {
            "total": round(now - float(started), 3) if started else None,
            "recreate": _seconds(*(timings.get("commands") or [])),
            "health": health.get("seconds") if _ran(health) else None,
            "lock_wait": timings.get("lock_wait"),
        },
        "files": {"env": paths.get("env"), "compose": paths.get("compose"),
                  "verification": paths.get("verification")},
    }
    return result


def publishing(parts):
    """What an action returns to publish ``build(parts)``: ``line`` (``result_line``, what the action says) and
    ``ansible_facts`` with ``llm_server_result``."""
    published = build(parts)
    return {"line": result_line(published), "ansible_facts": {"llm_server_result": published}}


def _failed(result):
    return isinstance(result, dict) and bool(result.get("failed"))


def _changed(result):
    return isinstance(result, dict) and bool(result.get("changed"))


def _verified(verify):
    verify = verify or {}
    return bool(verify.get("verified")) and not verify.get("failed")


def failure_of(given):
    """What went wrong (``""`` when nothing did): the cause from the task that registered it - the proof, the
    recreate - before the rescue's own ``ansible_failed_result`` (a handler's failure reaches the rescue without its
    details in some ansible-core releases: ansible/ansible#81532, #85682)."""
    found = given.get("failure") or {}
    if not found:
        return ""
    recreated = given.get("recreated") or {}
    for result in (given.get("verify"), recreated.get("up")):
        if _failed(result):
            return failure_cause(result, {})
    return failure_cause(found.get("result") or {}, found.get("task") or {})


def rollback_part(given):
    """What the rollback to a snapshot did (``rollback`` of ``build``'s parts), from the results of
    ``rollback_steps.yml``: the snapshot put back (or the pattern cleared), the wait, or why nothing was rolled back."""
    settings = (given.get("prepared") or {}).get("settings") or {}
    rollback = given.get("rollback") or {}
    restored = rollback.get("restored") or {}
    cleared = rollback.get("cleared") or {}
    returned = rollback.get("returned") or {}
    if rollback.get("error"):
        return {"performed": False, "error": failure_cause(rollback["error"].get("result") or {},
                                                           rollback["error"].get("task") or {})}
    if restored.get("missing"):
        return {"performed": False,
                "reason": "No snapshot in %s (no verified deploy yet): nothing was restored, ai-llm "
                          "runs the failed configuration." % settings.get("rollback_dir")}
    if returned.get("healthy"):
        if _ran(cleared):
            reason = "Cleared LLM_MOE_OFFLOAD_PATTERN"
        else:
            reason = "%s (%s)" % ("Rolled back to the verified configuration before the current one"
                                  if restored.get("which") == "previous" else
                                  "Rolled back to the last verified configuration", restored.get("restored_from"))
        return {"performed": True, "serving": True, "which": restored.get("which") or "none",
                "restored_from": restored.get("restored_from"),
                "config_hash": restored.get("config_hash") or cleared.get("config_hash"),
                "env_keys": restored.get("env_keys") or {"LLM_MOE_OFFLOAD_PATTERN": "", "LLM_DEVICE_OVERRIDES": ""},
                "reason": reason}
    if not given.get("failure"):
        return {}
    if _verified(given.get("verify")):
        reason = "ai-llm serves the verified configuration: it was not rolled back, and the next run keeps its snapshot."
    elif (given.get("prepared") or {}).get("converge", {}).get("verify") and not settings.get("rollback"):
        reason = "Rollback is off (llm_server_rollback=false): nothing was restored."
    else:
        reason = ""
    return {"performed": False, "reason": reason}


def to_record(published, given, check_mode=False):
    """Whether this run writes ``published`` (``llm_server_result``) into verification.json: not in check mode,
    and only when the run recreated ai-llm, verified it without a recreate, or rolled back to a snapshot, so that the
    file always describes what was last proved to run (a run that changes nothing or is refused leaves it)."""
    if check_mode or not (published.get("files") or {}).get("verification"):
        return False
    return bool(_ran((given.get("recreated") or {}).get("up")) or _ran(given.get("verify"))
                or (published.get("rollback") or {}).get("performed"))


def parts_from(given, check_mode=False):
    """``build``'s parts from the result action's options (``given``; the role's README, "Result"): the prepared
    settings, service, plan and placement, the lock, the writes, the recreate, the proof, the snapshot, the
    rollback and what went wrong."""
    prepared = given.get("prepared") or {}
    verify = given.get("verify") or {}
    returned = (given.get("rollback") or {}).get("returned")
    lock = given.get("lock") or {}
    recreated = given.get("recreated") or {}
    settings = prepared.get("settings") or {}
    failure = failure_of(given)
    refusal = ""
    if not failure:
        refusal = next((failure_cause(r) for r in (prepared, lock) if _failed(r)), "")
    removed, up = recreated.get("removed") or {}, recreated.get("up") or {}
    return {
        "host": given.get("host"),
        "check_mode": check_mode,
        "status": "failed" if refusal else given.get("status") or "",
        "refusal": refusal,
        "failure": failure,
        "settings": settings,
        "started": settings.get("started"),
        "service": prepared.get("service") or {},
        "placement": prepared.get("placement") or {},
        "plan": prepared.get("plan") or {},
        "config": prepared.get("config") or {},
        "converge": prepared.get("converge") or {},
        "changes": [_changed(r) for r in given.get("written") or []] + [
            _changed(given.get("snapshot")), _ran(up)],
        "health": returned if _ran(returned) else verify.get("health") or {},
        "log": verify.get("log") or {},
        "vram": verify.get("vram") or [],
        "cuda_context": verify.get("cuda_context") or [],
        "parity": verify.get("parity") or {},
        "speed": verify.get("speed"),
        "model_fetch": prepared.get("model_fetch"),
        "parity_note": verify.get("parity_note") or "",
        "snapshot": given.get("snapshot") or {},
        "rollback": rollback_part(given),
        "lock": lock,
        "timings": {"commands": [removed.get("delta") or "", up.get("delta") or ""], "lock_wait": lock.get("waited")},
    }
