# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the llm_server role does with what it found: recreate ai-llm, verify it, or nothing; and whether what
it verified holds (the log, the GPU memory, the answers).

Standard library only. Runs on the controller (the filters of ``plugins/filter/llm_server_*.py``) on the
results of ``llm_server_service_info``, ``llm_server_config``, ``llama_server_log`` and ``gpu_info``. ``unchanged``
tells a run that has nothing to do before it takes the lock.

Converge, don't react: every run compares the configuration hash on disk with the one the container was created
from (its label) and with the last verification, so that a run killed at any moment (or a lost handler)
cannot leave a container that runs something else, or a configuration that was never verified.
"""

from __future__ import annotations

import json

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_disk import written_config

# Statuses of verification.json that mean "this configuration was proved to serve".
VERIFIED_STATUSES = ("changed", "unchanged", "rolled_back")


def _short(value, width=60):
    text = json.dumps(value if value is not None else "")
    return text if len(text) <= width else text[:width - 4] + '..."'


def describe_changes(changed_keys, key_changed=False, files=()):
    """``LLM_CTX_SIZE "512" -> "1024"``, the API key, or the compose file, for a message."""
    parts = ["%s %s -> %s" % (c["key"], _short(c.get("old")), _short(c.get("new"))) for c in changed_keys or []]
    if key_changed:
        parts.append("the API key")
    if not parts and any(not f.endswith(".env") for f in files or ()):
        parts.append("the compose file")
    return ", ".join(parts) or "the configuration files"


def decide(service, config, key_changed=False, verify_always=False, container_name="ai-llm"):
    """``{"recreate", "verify", "wait", "reason"}`` for what the run found.

    ``service`` is the result of ``llm_server_service_info`` (read before the configuration was written),
    ``config`` the result of ``llm_server_config``.
    """
    desired = config.get("config_hash")
    container = service.get("container") or {}
    verification = (service.get("disk") or {}).get("verification") or {}
    verified = verification.get("config_hash") == desired and verification.get("status") in VERIFIED_STATUSES
    files = config.get("files_changed") or []
    content_changed = any(c.get("key") for c in config.get("changed_keys") or []) or any(
        not f.endswith("/secrets") for f in files)
    if content_changed or key_changed:
        reason = "the configuration changed (%s): ai-llm is recreated" % describe_changes(
            config.get("changed_keys"), key_changed, files)
        return {"recreate": True, "verify": True, "wait": True, "reason": reason}
    if not container.get("exists"):
        reason = "the ai-llm container %s does not exist: it is created from the configuration on disk" % container_name
        return {"recreate": True, "verify": True, "wait": True, "reason": reason}
    if not container.get("running"):
        reason = "ai-llm (%s) is %s%s: it is recreated with the configuration on disk" % (
            container_name, container.get("status"),
            " (exit code %s)" % container.get("exit_code") if container.get("status") == "exited" else "")
        return {"recreate": True, "verify": True, "wait": True, "reason": reason}
    if container.get("config_hash") != desired:
        was = container.get("config_hash")
        reason = ("ai-llm runs configuration %s but %s is on disk (an earlier run stopped before it recreated "
                  "ai-llm): it is recreated" % ((was or "")[:12] or "without the role's label", (desired or "")[:12]))
        return {"recreate": True, "verify": True, "wait": True, "reason": reason}
    auth = service.get("auth") or {}
    if auth.get("checked") and not auth.get("enforced"):
        reason = ("the API key is not in force (/props answered %s without it and %s with it): ai-llm is recreated"
                  % (auth.get("without_key"), auth.get("with_key")))
        return {"recreate": True, "verify": True, "wait": True, "reason": reason}
    if service.get("health") != 200 and verified:
        reason = "ai-llm runs the verified configuration but /health answers %s: it is recreated" % service.get("health")
        return {"recreate": True, "verify": True, "wait": True, "reason": reason}
    if not verified:
        reason = ("the configuration %s that ai-llm runs was never verified (an earlier run stopped before its "
                  "verification): it is verified now" % (desired or "")[:12])
        return {"recreate": False, "verify": True, "wait": service.get("health") != 200, "reason": reason}
    if verify_always:
        return {"recreate": False, "verify": True, "wait": False, "reason": ""}
    return {"recreate": False, "verify": False, "wait": False, "reason": ""}


def unchanged(service, settings, placement, api_key=""):
    """Whether a run has nothing to do, from the host read without the lock (``llm_server_service_info``):
    ``{"unchanged": True, "config", "converge"}`` (``config`` as ``llm_server_config`` returns it when it writes
    nothing) or ``{"unchanged": False, "reason"}``.

    Nothing to do: no lock file (no other deploy under way, none killed), the files on disk are those this run would
    write (``_deploy_disk.written_config``), ``decide`` neither recreates, verifies nor waits, and with rollbacks
    the last snapshot is this configuration. Anything else goes the way of a change: the lock, a second read under
    it, the writes and the checks.
    """
    disk = (service or {}).get("disk") or {}
    if disk.get("lock_file", True):
        return {"unchanged": False, "reason": "the project directory's lock file exists"}
    config = written_config(disk, settings, placement, api_key, (service or {}).get("engine"))
    if config is None:
        return {"unchanged": False, "reason": "the files on disk are not those of this configuration"}
    converge = decide(service, config, False, bool(settings.get("verify_always")),
                      settings.get("container_name") or "ai-llm")
    if converge["recreate"] or converge["verify"] or converge["wait"]:
        return {"unchanged": False, "reason": converge["reason"] or "a verification is asked for"}
    if settings.get("rollback") and disk.get("snapshot_hash") != config["config_hash"]:
        return {"unchanged": False, "reason": "the last snapshot is not this configuration"}
    return {"unchanged": True, "config": config, "converge": converge}


def vram_rows(devices, baseline, after, plan_memory, tolerance_mib):
    """Per GPU: the memory ai-llm took (after minus the baseline without it) against the plan (its total without
    the margin it keeps free). ``[{index, planned_mib, used_mib, ok}]``."""
    def by_index(items):
        return {g.get("index"): g for g in items or []}

    before, now, planned = by_index(baseline), by_index(after), by_index((plan_memory or {}).get("gpus"))
    rows = []
    for dev in devices or []:
        dev = int(dev)
        plan = planned.get(dev) or {}
        used = int(now.get(dev, {}).get("memory_used_mib") or 0) - int(before.get(dev, {}).get("memory_used_mib") or 0)
        if "total_mib" in plan:
            want = float(plan.get("total_mib") or 0) - float(plan.get("margin_mib") or 0)
            rows.append({"index": dev, "planned_mib": int(round(want)), "used_mib": used,
                         "ok": abs(used - want) <= float(tolerance_mib)})
        else:
            rows.append({"index": dev, "planned_mib": None, "used_mib": used, "ok": True})
    return rows


# The role's default -ngl: every layer of any model this role serves is offloaded, as the plan assumes.
ALL_LAYERS_FROM = 99


PER_TENSOR_VERBOSITY = 5  # llama-server's -lv from which it prints the per-tensor override lines (DEBUG)


def log_expectations(plan, topology, settings, expected_tensors=None):
    """The buffers llama-server's log must show, per buffer type, from ``moe_offload_plan``'s result: the
    arguments ``expect_model_buffers``, ``expect_kv_buffers``, ``expect_rs_buffers`` and ``expect_compute_buffers``
    of ``llama_server_log``, each a dict of MiB (``{}`` for none). llama.cpp prints these lines at its default
    verbosity (llama-model.cpp ``llama_model::load_tensors``, llama-kv-cache.cpp ``llama_kv_cache``,
    llama-memory-recurrent.cpp, llama-context.cpp ``llama_context::sched_reserve``), so they prove a deploy
    without the per-tensor lines.

    On GPUs: each device's model, KV and RS buffer equal to the plan, its compute buffer at most the plan's (an
    upper estimate). On a host without GPU: the CPU KV, RS and compute buffers (the weights are the mapped file).
    Nothing when the server does not run as planned: no plan, extra arguments (they may change the batch, the
    cache types or the layers) or an -ngl that may offload fewer layers than all (under 99, or
    auto). Zero-sized buffers are left out (llama.cpp
    prints no line for a cache the model does not have).

    ``expect_tensors`` is ``expected_tensors`` where the log can show them: on GPUs always (hidden per-tensor lines
    fall back on the device buffers), on a host without GPU only from ``-lv 5``: there every tensor is in host
    memory whatever the pattern, and no buffer line tells a moved tensor from a mapped one. ``None`` otherwise."""
    plan = plan or {}
    memory = plan.get("memory")
    keys = ("expect_model_buffers", "expect_kv_buffers", "expect_rs_buffers", "expect_compute_buffers")
    expect = dict((k, {}) for k in keys)
    verbosity = settings.get("log_verbosity")
    per_tensor = verbosity not in (None, "") and int(verbosity) >= PER_TENSOR_VERBOSITY
    expect["expect_tensors"] = (list(expected_tensors or []) if topology != "cpu" or per_tensor else None)
    if plan.get("skipped") or plan.get("failed") or not isinstance(memory, dict) or settings.get("extra_args"):
        return expect
    layers = str(settings.get("n_gpu_layers", ALL_LAYERS_FROM)).strip()
    if layers != "all" and not (layers.isdigit() and int(layers) >= ALL_LAYERS_FROM):
        return expect
    if topology == "cpu" or not plan.get("devices"):
        rows = [("CPU", memory.get("host") or {}, ("kv", "recurrent", "compute"))]
    else:
        rows = [(device["device"], gpu, ("model", "kv", "recurrent", "compute"))
                for device, gpu in zip(plan["devices"], memory.get("gpus") or [])]
    for name, figures, parts in rows:
        for part, key in zip(("model", "kv", "recurrent", "compute"), keys):
            value = float(figures.get(part + "_mib") or 0)
            if part in parts and value > 0:
                expect[key][name] = round(value, 2)
    return expect


def verification_problem(log, pattern, vram=None, parity=None, tolerance_mib=0, seed=None):
    """Why the recreated server does not prove what was deployed, in one line; ``""`` when it does."""
    log = log or {}
    if log.get("load_error"):
        return "the model failed to load: %s" % log["load_error"]
    if pattern and log.get("per_tensor_lines_visible") and not log.get("overridden"):
        return "the pattern matched no tensors: llama-server's log shows no tensor overridden to CPU for %s" % (
            json.dumps(pattern))
    if log.get("failed") or not log.get("verified"):
        return log.get("msg") or "llama_server_log did not verify the placement"
    bad = [r for r in vram or [] if not r.get("ok")]
    if bad:
        return "GPU memory taken by ai-llm is far from the plan (tolerance %s MiB): %s" % (tolerance_mib, "; ".join(
            "GPU %s: %s MiB used, %s MiB planned" % (r["index"], r["used_mib"], r["planned_mib"]) for r in bad))
    if parity and parity.get("before") and parity.get("after") and parity["before"] != parity["after"]:
        return "output parity failed: the same prompt (greedy, seed %s) gave %s before and %s after" % (
            seed, json.dumps(parity["before"].get("tokens")), json.dumps(parity["after"].get("tokens")))
    return ""


def failure_cause(failed_result, failed_task=None):
    """The cause of a failed task in one line: its message, or for a command the end of what it printed
    (``Argument list too long`` rather than ``non-zero return code``)."""
    result = failed_result or {}
    msg = str(result.get("msg") or "").strip()
    if msg.startswith("llm_server: "):
        msg = msg[len("llm_server: "):]
    if result.get("cause"):
        return str(result["cause"])
    if not msg or msg.startswith("non-zero return code") or msg == "MODULE FAILURE":
        printed = str(result.get("stderr") or result.get("module_stderr") or result.get("stdout") or "")
        lines = [line.strip() for line in printed.splitlines() if line.strip()]
        cmd = result.get("cmd")
        cmd = " ".join(cmd) if isinstance(cmd, list) else (cmd or (failed_task or {}).get("name") or "a command")
        if lines:
            shown = cmd if len(cmd) <= 120 else cmd[:117] + "..."
            return "%s failed (rc=%s): %s" % (shown, result.get("rc"), " | ".join(lines[-3:]))
    return msg or "the task %s failed" % ((failed_task or {}).get("name") or "?")


def parity_text(settings, parity, note=None):
    """The parity line of the result: identical, off, or why there was no baseline."""
    if not settings.get("parity_check"):
        return "off"
    parity = parity or {}
    if parity.get("after"):
        return "identical: %d tokens %s" % (len(parity["after"].get("tokens") or []),
                                            json.dumps(parity["after"].get("content") or ""))
    return note or "no baseline (nothing served before this deploy)"
