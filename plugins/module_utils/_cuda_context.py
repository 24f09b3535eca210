# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The CUDA context of llama-server on each GPU: what its process holds there beyond the buffers its log reports
(the driver's primary context with its kernels, cuBLAS's handles and workspace, ggml's memory pool).

llama.cpp's ``--fit`` reads each device's free memory in the server's own process (common/fit.cpp
``common_get_device_memory_data_impl``: ``ggml_backend_dev_memory``, which on CUDA calls ``cudaSetDevice`` and
``cudaMemGetInfo`` and so creates the primary context first: https://github.com/ggml-org/llama.cpp/pull/20595
"Free VRAM is queried later by FIT through its own cudaSetDevice path"), and keeps its margin
(``fit_params_target``, 1024 MiB per device, common/common.h) out of that. The plan reads nvidia-smi before the
server starts, when no context exists: it takes the context off the free memory first, then keeps its margin.

The context per card: measured on the host after a verified start (``measure``, recorded in verification.json),
else the figure of ``CONTEXT_MIB`` for the card, else ``ASSUMED_CONTEXT_MIB``. Standard library only: this runs on
target hosts (Python >= 3.9).
"""

from __future__ import annotations

import math

# The primary context alone (what cudaMemGetInfo creates), by the exact name nvidia-smi prints. The cost scales with
# the card's SM count ("So the cost scales with SM count", PR #23604 below), so one card of an architecture does not
# speak for another of it: the table names cards, not classes.
CONTEXT_MIB = {
    # ServeurpersoCom's llama-gpu-meminfo on Linux, a plain cudaMemGetInfo against NVML's read of the same card:
    # "cudaMemGetInfo permanently eats: RTX PRO 6000 (Blackwell): 555 MiB, RTX 4060 Ti (Ada): 107 MiB"
    # (https://github.com/ggml-org/llama.cpp/pull/23604, comment of 2026-05-24; driver and CUDA release not given).
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition": 555,
    "NVIDIA GeForce RTX 4060 Ti": 107,
    # sammcj, 2 x RTX 3090, driver 610.43.03, torch 2.7.1+cu128: a process that only created its context held "a
    # flat 256 MiB" per nvidia-smi (https://github.com/invoke-ai/InvokeAI/issues/9413).
    "NVIDIA GeForce RTX 3090": 256,
}
# A card the table does not name: an assumption, not a measurement. The largest figure above; llama.cpp's
# PR #20595 gives the primary context as "120-550 MB depending on GPU" (measured on an RTX PRO 6000 Blackwell).
ASSUMED_CONTEXT_MIB = 555
SOURCES = ("measured", "table", "assumed")


def measure(devices, gpus, log):
    """The context of each device a started llama-server uses: the GPU memory its process tree holds there
    (``gpus``: ``gpu_info``'s GPUs with ``memory_held_by_pid_mib``) minus the buffers its log reports for that
    device (``log``: ``llama_server_log``'s result; the model, KV, recurrent state and compute buffers named as the
    device, ``CUDA0``...). ``devices``: the plan's devices (``device``, ``index``, ``uuid``, ``name``).

    Returns ``[{index, uuid, name, device, held_mib, buffers_mib, context_mib}]``; a device where nvidia-smi shows
    no memory of the process (a driver that hides the pids of a container) or less than its buffers is left out:
    that is no measurement."""
    log = log or {}
    by_index = {g.get("index"): g for g in gpus or []}
    rows = []
    for device in devices or []:
        gpu = by_index.get(device.get("index")) or {}
        held = gpu.get("memory_held_by_pid_mib")
        if not isinstance(held, (int, float)) or isinstance(held, bool) or held <= 0:
            continue
        name = device.get("device")
        buffers = sum(float((log.get(kind) or {}).get(name) or 0)
                      for kind in ("model_buffers", "kv_buffers", "rs_buffers", "compute_buffers"))
        if held < buffers:
            continue
        rows.append({"index": device.get("index"), "uuid": device.get("uuid") or gpu.get("uuid"),
                     "name": device.get("name") or gpu.get("name"), "device": name, "held_mib": held,
                     "buffers_mib": round(buffers, 2), "context_mib": int(round(held - buffers))})
    return rows


def checked_measurements(measured, where="cuda_context"):
    """``measured`` (a list of ``{name, context_mib, uuid, index}``, as ``measure`` returns and verification.json
    keeps) checked; ``ValueError`` naming the item and field that is wrong."""
    if measured is None:
        return []
    if not isinstance(measured, list):
        raise ValueError("%s must be a list of {name, context_mib, uuid, index}, got %r" % (where, measured))
    for position, item in enumerate(measured):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            raise ValueError("%s[%d] must be a dict with the card's name, got %r" % (where, position, item))
        value = item.get("context_mib")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError("%s[%d].context_mib must be a number of MiB >= 0, got %r" % (where, position, value))
    return measured


def context_of(name, uuid=None, index=None, measured=()):
    """``(MiB, source)`` of the context on the card ``name``: a measurement of that card (the same uuid; without
    uuids the same index), ``measured``; else the table's figure, ``table``; else the assumption, ``assumed``. A
    measurement of another card (another name) never counts."""
    for item in measured or ():
        if item.get("name") != name:
            continue
        same = item.get("uuid") == uuid if uuid and item.get("uuid") else item.get("index") == index
        if same:
            return item["context_mib"], "measured"
    if name in CONTEXT_MIB:
        return CONTEXT_MIB[name], "table"
    return ASSUMED_CONTEXT_MIB, "assumed"
