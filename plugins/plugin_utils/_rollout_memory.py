# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The memory of one host in the rollout report: per GPU what the plan reserved and what llama-server took, and
the host RAM, drawn from the host's ``llm_server_result`` (its ``plan``, ``buffers`` and ``vram``).

Standard library only. ``memory_views`` gives what ``rollout.md`` lists and ``rollout.html`` draws;
``device_buffers`` reads llama-server's buffers in each shape they come in. Bad input raises ``ReportError``
naming the host and the field.
"""

from __future__ import annotations

import re

# llama.cpp's GPU backend buffer names: <backend><device number> (CUDA0, Vulkan1, ROCm0...); everything else
# (CPU, CPU_Mapped, CPU_REPACK, AMX, CUDA_Host) lives in host memory.
GPU_BUFFER = re.compile(r"^(CUDA|ROCm|Vulkan|SYCL|MUSA|CANN|Metal|OpenCL|RPC\[.*\])(\d+)$")


class ReportError(ValueError):
    """Input the report cannot use: ``str()`` names the host and the field."""


PLANNED_KINDS = (("model", "model_mib"), ("kv", "kv_mib"), ("recurrent", "recurrent_mib"),
                 ("compute", "compute_mib"), ("margin", "margin_mib"))
KIND_LABELS = {"model": "weights", "kv": "KV cache", "recurrent": "recurrent state", "compute": "compute",
               "margin": "margin", "other": "other (CUDA context...)", "free": "free", "overflow": "missing",
               "experts": "routed experts"}


def _number(value, where):
    """``value`` as a float (``None`` stays ``None``), or ``ReportError`` naming ``where``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ReportError("%s is %r, not a number of MiB" % (where, value))
    try:
        return float(value)
    except ValueError:
        raise ReportError("%s is %r, not a number of MiB" % (where, value)) from None


def _mapping(value, where):
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ReportError("%s is %s, not a dict" % (where, type(value).__name__))
    return value


def device_buffers(buffers, where="buffers"):
    """llama-server's buffers as ``{device: {model, kv, rs, compute}}`` (MiB).

    Takes them kind first (``{"model": {"CUDA0": 1369.4}, "kv": {...}}``, the shape of ``llama_server_log``'s
    ``*_buffers``), device first (``{"CUDA0": {"model": 1369.4, "kv": 768.0}}``) or as a list of
    ``{"device": ..., "model": ...}``.
    """
    if buffers is None:
        return {}
    if isinstance(buffers, list):
        items = {}
        for i, item in enumerate(buffers):
            item = _mapping(item, "%s[%d]" % (where, i))
            name = str(item.get("device") or item.get("buffer") or i)
            items[name] = {k: v for k, v in item.items() if k not in ("device", "buffer")}
        buffers = items
    buffers = _mapping(buffers, where)
    kinds = {"model": "model", "kv": "kv", "rs": "rs", "recurrent": "rs", "compute": "compute"}
    out = {}
    if buffers and all(key in kinds for key in buffers):
        for kind, per_device in buffers.items():
            for device, mib in _mapping(per_device, "%s.%s" % (where, kind)).items():
                out.setdefault(str(device), {})[kinds[kind]] = _number(mib, "%s.%s.%s" % (where, kind, device))
        return out
    for device, per_kind in buffers.items():
        for kind, mib in _mapping(per_kind, "%s.%s" % (where, device)).items():
            if kind in kinds:
                out.setdefault(str(device), {})[kinds[kind]] = _number(mib, "%s.%s.%s" % (where, device, kind))
    return out


def memory_views(result, host="host"):
    """What the page draws for one host: per GPU the planned and measured stacks, and the host RAM.

    ``{"gpus": [{index, name, available, planned: [(kind, MiB)...], planned_total, overflow,
    measured: [(kind, MiB)...] or None, measured_total, used, vram_ok}], "host": {available, planned, measured}
    or None}``. Planned comes from ``plan.gpus`` (weights, KV, recurrent, compute, margin, then the free rest
    of ``free_mib``); measured from llama-server's own buffers for that device (``CUDA<i>`` for the i-th GPU
    of the plan) and, when the role measured it, the GPU memory the container took (``vram[].used_mib``: what
    exceeds the buffers is ``other``).
    """
    result = _mapping(result, "%s: llm_server_result" % host)
    where = "%s: llm_server_result" % host
    plan = _mapping(result.get("plan"), where + ".plan")
    gpus = plan.get("gpus") or []
    if not isinstance(gpus, list):
        raise ReportError("%s.plan.gpus is %s, not a list" % (where, type(gpus).__name__))
    buffers = device_buffers(result.get("buffers"), where + ".buffers")
    by_number = {}
    host_side = 0.0
    host_seen = False
    for device, kinds in buffers.items():
        match = GPU_BUFFER.match(device)
        if match:
            by_number.setdefault(int(match.group(2)), {}).update(kinds)
        elif kinds.get("model") is not None:
            host_side += kinds["model"]
            host_seen = True
    vram = result.get("vram") or []
    if not isinstance(vram, list):
        vram = []       # the role writes a sentence instead of rows where it measured nothing
    views = []
    for i, gpu in enumerate(gpus):
        gwhere = "%s.plan.gpus[%d]" % (where, i)
        gpu = _mapping(gpu, gwhere)
        planned = [(kind, _number(gpu.get(key), "%s.%s" % (gwhere, key)) or 0.0) for kind, key in PLANNED_KINDS]
        total = _number(gpu.get("total_mib"), gwhere + ".total_mib")
        total = sum(pair[1] for pair in planned) if total is None else total
        available = _number(gpu.get("free_mib"), gwhere + ".free_mib")
        free_after = None if available is None else available - total
        planned.append(("free", max(free_after or 0.0, 0.0)))
        row = next((r for r in vram if isinstance(r, dict) and r.get("index") == gpu.get("index")), None) \
            if gpu.get("index") is not None else None  # (without an index, the row in the same place)
        if row is None and i < len(vram) and isinstance(vram[i], dict):
            row = vram[i]
        used = _number((row or {}).get("used_mib"), "%s.vram[%d].used_mib" % (where, i))
        logged = by_number.get(i)
        measured = None
        measured_total = used
        if logged or used is not None:
            measured = [(kind, (logged or {}).get(key)) for kind, key in
                        (("model", "model"), ("kv", "kv"), ("recurrent", "rs"), ("compute", "compute"))]
            measured = [(kind, mib or 0.0) for kind, mib in measured]
            in_buffers = sum(pair[1] for pair in measured)
            if used is not None and used > in_buffers:
                measured.append(("other", used - in_buffers))
            measured_total = used if used is not None else in_buffers
            if available is not None:
                measured.append(("free", max(available - measured_total, 0.0)))
        views.append({
            "index": gpu.get("index", i), "name": gpu.get("name"), "available": available,
            "planned": planned, "planned_total": total,
            "overflow": max(-free_after, 0.0) if free_after is not None else 0.0,
            "measured": measured, "measured_total": measured_total, "used": used,
            "vram_ok": (row or {}).get("ok"),
        })
    ram = _mapping(plan.get("host"), where + ".plan.host")
    experts = _number(ram.get("experts_mib"), where + ".plan.host.experts_mib")
    available = _number(ram.get("available_mib"), where + ".plan.host.available_mib")
    host_view = None
    if experts is not None or available is not None or host_seen:
        host_view = {"available": available, "planned": experts, "measured": host_side if host_seen else None}
    return {"gpus": views, "host": host_view}
