# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The devices llama.cpp says it uses (its ``using device`` lines), and whether they are the planned cards.

Standard library only (runs on target hosts, Python >= 3.9).

llama.cpp prints one line per device a model is loaded on, at INFO level (``LLAMA_LOG_INFO``), before the tensors
are loaded: src/llama.cpp ``llama_prepare_model_devices`` (b10435; ``llama_model_load_from_file_impl`` in older
builds) prints ``"%s: using device %s (%s) (%s) - %zu MiB free\\n"`` with the device name (``CUDA0``), its
description (the card's name; ``host:port`` for an RPC device), ``props.device_id`` or ``"unknown id"`` when the
backend gives none, and the free memory in MiB. Forms seen in real logs:

* ``llama_prepare_model_devices: using device RPC0 (127.0.0.1:18850) (unknown id) - 24105 MiB free`` (the real
  llama-server of b10435 with an ggml-rpc-server device, tests/data/llama_logs/b10435_rpc_server_killed_lv4.log);
* ``llama_model_load_from_file_impl: using device CUDA0 (NVIDIA GeForce RTX 5060 Ti) (0000:01:00.0) - 15055 MiB
  free`` (https://github.com/lmstudio-ai/lmstudio-bug-tracker/issues/1360);
* ``llama_model_load_from_file_impl: using device CUDA0 (NVIDIA GeForce RTX 3090) - 22532 MiB free`` (build 6096,
  no id: https://github.com/ggml-org/llama.cpp/issues/15125).

The CUDA backend's id is the card's PCI bus id from ``cudaDeviceGetPCIBusId``, "[domain]:[bus]:[device].[function]"
in hexadecimal (https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__DEVICE.html), ``0000:01:00.0``;
nvidia-smi's ``pci.bus_id`` is "domain:bus:device.function, in hex" with an 8-digit domain, ``00000000:01:00.0``
(``nvidia-smi --help-query-gpu``). ``normalize_pci_bus_id`` brings both to one form: lower case, a domain of at
least 4 hex digits, ``0000:01:00.0``.

CUDA numbers the cards fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` is set
(https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#env-vars), where nvidia-smi numbers them in PCI
bus order: ``device_problem`` compares each ``CUDA<n>`` of the log with the card the plan gave that device.
"""
from __future__ import annotations

import re

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_build import BUILD

__all__ = ["USING_DEVICE", "parse_using_device", "normalize_pci_bus_id", "device_problem"]

USING_DEVICE = "using device "
UNKNOWN_ID = "unknown id"
# " - 24105 MiB free" at the end of the line (searched from a literal: linear in the line)
_FREE = re.compile(r" - (\d{1,15}) MiB free$")
_PCI = re.compile(r"([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})\.([0-7])")


def normalize_pci_bus_id(text):
    """``0000:01:00.0`` for a PCI bus id in either spelling (``00000000:01:00.0`` of nvidia-smi,
    ``0000:01:00.0`` of CUDA, any case); ``None`` for anything else."""
    if not isinstance(text, str):
        return None
    m = _PCI.fullmatch(text.strip())
    if not m:
        return None
    domain, bus, device, function = (int(part, 16) for part in m.groups())
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


def parse_using_device(msg):
    """The device of a ``using device`` line (the message, prefixes removed), or ``None`` for another line.

    ``{device, description, id, pci_bus_id, free_mib}``: ``id`` as printed (``"unknown id"``, a PCI id) or ``None``
    when the build prints none; ``pci_bus_id`` the id normalised (``normalize_pci_bus_id``) or ``None``."""
    at = msg.find(USING_DEVICE)
    if at < 0:
        return None
    rest = msg[at + len(USING_DEVICE):]
    free = _FREE.search(rest)
    if not free:
        return None
    device, _sep, tail = rest[:free.start()].partition(" ")
    if not device or not (tail.startswith("(") and tail.endswith(")")):
        return None
    description, ident = tail[1:-1], None
    cut = tail.rfind(") (")
    if cut > 0:
        last = tail[cut + 3:-1]
        if last == UNKNOWN_ID or normalize_pci_bus_id(last):
            description, ident = tail[1:cut], last
    return {"device": device, "description": description, "id": ident,
            "pci_bus_id": normalize_pci_bus_id(ident), "free_mib": int(free.group(1))}


def _is_cuda(name):
    return name.startswith("CUDA")


def _missing_cause(parsed):
    """Why a log that should show CUDA devices shows none."""
    model = parsed.get("model_buffers") or {}
    if model and not any(_is_cuda(name) for name in model):
        return ("the log has no 'using device CUDA<n>' line and every model buffer is in host memory "
                f"({', '.join(sorted(model))}): the container sees no GPU (is the GPU given to the container?)")
    if not model:
        return ("the log has no 'using device' line and no model buffer line: its verbosity is too low to show "
                "llama.cpp's INFO lines (raise llm_server_log_verbosity)")
    return "the log has no 'using device CUDA<n>' line although it shows GPU buffers"


def _card(planned):
    name = planned.get("name")
    return f"the {name}" if name else "the card"


def device_problem(parsed, planned):
    """Why the devices of a parsed log (``parse_log``'s ``devices``) are not the planned ones, or ``""``.

    ``planned``: the plan's devices in order, ``[{device, pci_bus_id, name}]`` (``[]``: a CPU plan, which expects
    no CUDA device). Each planned ``CUDA<n>`` must be logged with the PCI bus id of its card; a device without a
    PCI id in the plan, or another backend's (an RPC device prints ``(unknown id)``), is checked by its name only. The log must
    name exactly the planned devices."""
    logged = list(parsed.get("devices") or [])
    names = [d["device"] for d in logged]
    want = [dict(p) for p in planned or []]
    if not want:
        gpus = [n for n in names if _is_cuda(n)]
        return f"the plan uses no GPU but llama-server uses {', '.join(gpus)}" if gpus else ""
    if not logged:
        if any(_is_cuda(str(p.get("device"))) for p in want):
            return _missing_cause(parsed)
        return ""
    by_name = dict((d["device"], d) for d in logged)
    problems = []
    for p in want:
        name = str(p.get("device"))
        got = by_name.get(name)
        if got is None:
            problems.append(f"{name} is not among the devices llama-server uses ({', '.join(names)})")
            continue
        card = normalize_pci_bus_id(p.get("pci_bus_id")) if _is_cuda(name) else None
        if card is None:
            continue
        if got["pci_bus_id"] is None:
            if got["id"] == UNKNOWN_ID:
                problems.append(f"{name} is logged with an unknown id: its card cannot be checked")
            else:
                problems.append(f"{name} is logged without a PCI id: this llama.cpp build is too old to print one "
                                f"(the collection models build {BUILD})")
        elif got["pci_bus_id"] != card:
            problems.append(f"{name} is {got['pci_bus_id']} ({got['description']}), the plan put {_card(p)} at "
                            f"{card} there: is CUDA_DEVICE_ORDER=PCI_BUS_ID set?")
    extra = [n for n in names if n not in set(str(p.get("device")) for p in want)]
    if extra:
        problems.append(f"llama-server also uses {', '.join(extra)}, which the plan does not")
    return "; ".join(problems)
