# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whether a recreated ai-llm proves what was deployed: the buffers its log must show (from the plan), the GPU
memory it took against the plan, and the verdict over the log, the GPU memory and the parity answers.

Standard library only. Runs on the controller (the action ``llm_server_verify``) on the results of
``moe_offload_plan``, ``llama_server_log`` and ``gpu_info``.
"""

from __future__ import annotations

import json


def vram_rows(devices, baseline, after, plan_memory, tolerance_mib, plan_devices=None):
    """Per GPU: the memory ai-llm took (after minus the baseline without it) against the plan (its total without
    the margin it keeps free, plus the CUDA context it counted on that GPU: ``cuda_context_mib`` of the plan's
    ``plan_devices``). ``[{index, planned_mib, used_mib, ok}]``."""
    def by_index(items):
        return {g.get("index"): g for g in items or []}

    before, now, planned = by_index(baseline), by_index(after), by_index((plan_memory or {}).get("gpus"))
    context = by_index(plan_devices)
    rows = []
    for dev in devices or []:
        dev = int(dev)
        plan = planned.get(dev) or {}
        used = int(now.get(dev, {}).get("memory_used_mib") or 0) - int(before.get(dev, {}).get("memory_used_mib") or 0)
        if "total_mib" in plan:
            want = float(plan.get("total_mib") or 0) - float(plan.get("margin_mib") or 0) + float(
                context.get(dev, {}).get("cuda_context_mib") or 0)
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
    upper estimate), and with fewer layers on the GPUs than all the CPU KV and RS buffers of the others. On a host
    without GPU: the CPU KV, RS and compute buffers (the weights are the mapped file).
    Nothing when the server does not run as planned: no plan, extra arguments (they may change the batch, the
    cache types or the layers) or an -ngl (``settings["n_gpu_layers"]``) other than the plan's: the plan sizes every
    layer unless its ``n_gpu_layers`` says how many, and under 99, or auto, may offload fewer. Zero-sized buffers
    are left out (llama.cpp prints no line for a cache the model does not have).

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
    planned = plan.get("n_gpu_layers")
    if planned is not None:
        if layers != str(planned):
            return expect
    elif layers != "all" and not (layers.isdigit() and int(layers) >= ALL_LAYERS_FROM):
        return expect
    if topology == "cpu" or not plan.get("devices"):
        rows = [("CPU", memory.get("host") or {}, ("kv", "recurrent", "compute"))]
    else:
        rows = [(device["device"], gpu, ("model", "kv", "recurrent", "compute"))
                for device, gpu in zip(plan["devices"], memory.get("gpus") or [])]
        if planned is not None:  # the caches of the blocks -ngl leaves on the host are in CPU buffers
            rows.append(("CPU", memory.get("host") or {}, ("kv", "recurrent")))
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


def log_args(plan, placement, settings):
    """The options of ``llama_server_log`` that prove the placement: the container, the expected tensors and
    buffers (``log_expectations``; an empty expectation is left out), on GPUs with a memory plan the model MiB the
    GPUs must hold in all, and the devices llama-server must use (``expect_devices``: the plan's devices with the
    PCI bus id of each card; none on a host without GPU)."""
    plan = plan or {}
    layers = placement.get("n_gpu_layers") or settings.get("n_gpu_layers", ALL_LAYERS_FROM)
    expect = log_expectations(plan, placement.get("topology"), dict(settings, n_gpu_layers=layers),
                              placement.get("expected_tensors"))
    tensors = expect.pop("expect_tensors")
    args = {"fail_on_mismatch": False}
    if tensors is not None:
        args["expect_tensors"] = tensors
    args.update((k, v) for k, v in expect.items() if v)
    memory = plan.get("memory")
    if placement.get("topology") != "cpu" and memory is not None:
        args["expect_gpu_model_mib"] = round(sum(g.get("model_mib") for g in memory.get("gpus") or []), 2)
    if placement.get("topology") == "cpu":
        args["expect_devices"] = []
    elif isinstance(plan.get("devices"), list) and not (plan.get("skipped") or plan.get("failed")):
        args["expect_devices"] = [{"device": d.get("device"), "pci_bus_id": d.get("pci_bus_id"), "name": d.get("name")}
                                  for d in plan["devices"]]
    return args


def parity_answer(answer):
    """``{tokens, content}`` of a ``/completion`` answer (a registered ``uri`` result), ``None`` unless it is 200."""
    answer = answer or {}
    if answer.get("status") != 200:
        return None
    body = answer.get("json") or {}
    return {"tokens": body.get("tokens", []), "content": body.get("content", "")}


def parity_note(before):
    """Why there is no baseline for the parity check: the old configuration's answer was not 200."""
    before = before or {}
    if before.get("skipped") or "status" not in before or before.get("status") == 200:
        return ""
    return "no baseline: the old configuration answered /completion with %s" % before["status"]


def parity_request(settings):
    """The body of the parity prompt's ``/completion`` request: greedy (temperature 0, top_k 1, the fixed seed)."""
    return {"prompt": settings["parity_prompt"], "n_predict": settings["parity_n_predict"], "temperature": 0,
            "top_k": 1, "seed": settings["parity_seed"], "cache_prompt": False, "return_tokens": True}
