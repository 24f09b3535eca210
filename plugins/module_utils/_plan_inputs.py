# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a plan is made from, checked: the model's facts (``load_facts``: a path, or the ``model`` summary of a
``gguf_info`` result without opening the file), the GPUs (``normalize_gpus``: ``gpu_info``'s result or a list) and
the host's memory (``normalize_host``: ``host_info``'s result). ``PlanError`` says what is wrong with an input.
Standard library only: this runs on target hosts (Python >= 3.9).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._cuda_context import checked_measurements, context_of
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_devices import normalize_pci_bus_id
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_facts import MemoryModelError, model_facts
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_json import SummaryError, read_summary
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._nvidia_smi import GPU_EXTRA_KEYS, GPU_KEYS, mig_without_instances
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._tensor_classes import classify_model
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.error import GGUFError
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.model import read_model

GPU_INPUT_KEYS = GPU_KEYS + GPU_EXTRA_KEYS


class PlanError(ValueError):
    """Input that cannot be planned, or a plan that does not fit: ``str()`` says why; ``details`` has numbers."""

    def __init__(self, message, details=None):
        super().__init__(message)
        self.details = details or {}


def load_facts(gguf):
    """``ModelFacts`` of a GGUF path, or of a ``gguf_info`` result (its ``model`` summary: the file is not read
    again; a result without one, such as ``{files: [...]}``, is read from its first file)."""
    if isinstance(gguf, dict):
        summary = gguf.get("model") if "model" in gguf else (gguf if "tensors" in gguf and "version" in gguf
                                                             else None)
        if summary is not None:
            try:
                arch, metadata, tensors, files, warnings = read_summary(summary, "gguf.model")
            except SummaryError as exc:
                raise PlanError(str(exc)) from None
            return _facts(arch, metadata, tensors, files[0] if files else "gguf.model", warnings)
        files = gguf.get("files") or ([gguf["path"]] if gguf.get("path") else [])
        if not files:
            raise PlanError("gguf is a dict without files or model: pass a path or the registered result of gguf_info")
        path = files[0]
    elif isinstance(gguf, str) and gguf:
        path = gguf
    else:
        raise PlanError("gguf must be a path or the result of gguf_info, got %r" % (gguf,))
    try:
        model = read_model(path)
    except GGUFError as exc:  # (the reader turns every OSError of the files into a GGUFError)
        raise PlanError(str(exc)) from None
    return _facts(model.architecture, model.metadata, model.tensors, path, model.warnings)


def _facts(architecture, metadata, tensors, path, warnings):
    layout = classify_model(architecture, metadata, tensors)
    try:
        return model_facts(metadata, tensors, layout, path=path, warnings=list(warnings))
    except MemoryModelError as exc:
        raise PlanError("%s: %s" % (path, exc)) from None


@dataclass(frozen=True)
class Gpu:
    """One GPU as the plan sees it: ``memory_free_mib`` counts what the running server holds as free and, planned for
    a CUDA build, leaves out the CUDA context the new server creates (``context_mib``, ``context_source``: measured,
    table or assumed; ``_cuda_context``)."""

    name: str
    index: int
    uuid: str | None
    memory_total_mib: float | None
    memory_free_mib: float
    held_mib: float = 0
    pci_bus_id: str | None = None   # normalized (_llama_devices.normalize_pci_bus_id): 0000:01:00.0
    context_mib: float = 0
    context_source: str = ""


def _number(value, where):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or not math.isfinite(value):
        raise PlanError("%s must be a number of MiB >= 0, got %r" % (where, value))
    return value


def normalize_gpus(gpus, gpu_devices=None, options=None):
    """A ``gpu_info`` result or a list of ``{name, memory_total_mib, memory_free_mib}`` -> a list of ``Gpu``.

    With ``options`` (``_plan_options.Options``) of the CUDA backend, each GPU's free memory leaves out its CUDA
    context: ``options.cuda_context``'s measurement of that card, else its card's figure (``_cuda_context``).

    An empty list is a CPU host. ``gpu_devices`` keeps only those GPUs (the ones the container gets). When every
    GPU has a ``pci_bus_id`` they are ordered by it: the order of nvidia-smi and of CUDA with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so that the plan's ``CUDA<n>`` is the n-th card of that order.
    """
    if isinstance(gpus, dict):
        if "gpus" not in gpus:
            raise PlanError("gpus is a dict without a gpus list: pass the registered result of gpu_info or a list")
        gpus = gpus["gpus"]
    if not isinstance(gpus, list):
        raise PlanError("gpus must be the registered result of gpu_info or a list of {name, memory_total_mib, "
                        "memory_free_mib}, got %r" % (gpus,))
    try:
        measured = checked_measurements(getattr(options, "cuda_context", None))
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    cuda = options is not None and options.backend == "cuda"
    result = []
    for position, gpu in enumerate(gpus):
        if not isinstance(gpu, dict):
            raise PlanError("gpus[%d] must be a dict with name, memory_total_mib and memory_free_mib" % position)
        unknown = sorted(set(gpu) - set(GPU_INPUT_KEYS))
        if unknown:
            raise PlanError("gpus[%d] has unknown field(s) %s (known: %s)" % (
                position, ", ".join(unknown), ", ".join(GPU_INPUT_KEYS)))
        total, used, free, held = (_number(gpu.get(key), "gpus[%d].%s" % (position, key)) for key in (
            "memory_total_mib", "memory_used_mib", "memory_free_mib", "memory_held_by_pid_mib"))
        if free is None and total is not None and used is not None:
            free = total - used
            if free < 0:
                raise PlanError("gpus[%d]: memory_used_mib %r is more than memory_total_mib %r" % (
                    position, used, total))
        if free is None:
            raise PlanError("gpus[%d] (%s) reports no free memory (nvidia-smi printed [N/A]?): give "
                            "memory_free_mib in a gpus list" % (position, gpu.get("name") or "unnamed"))
        refusal = mig_without_instances(gpu)
        if refusal:
            raise PlanError("gpus[%d]: %s" % (position, refusal))
        if gpu.get("mig_devices"):
            raise PlanError("gpus[%d] (%s) is in MIG mode: plan for one MIG device by passing a gpus list with its "
                            "memory" % (position, gpu.get("name")))
        index = gpu.get("index", position)
        bus = gpu.get("pci_bus_id")
        if bus is not None and normalize_pci_bus_id(bus) is None:
            raise PlanError("gpus[%d].pci_bus_id must be a PCI bus id such as 00000000:01:00.0, got %r" % (
                position, bus))
        name = gpu.get("name") or "GPU %d" % position
        context, source = context_of(name, gpu.get("uuid"), index, measured) if cuda else (0, "")
        result.append(Gpu(name, index, gpu.get("uuid"), total, free + (held or 0) - context, held or 0,
                          normalize_pci_bus_id(bus), context, source))
    if result and all(g.pci_bus_id for g in result):
        result.sort(key=lambda g: tuple(int(part, 16) for part in g.pci_bus_id.replace(".", ":").split(":")))
    if gpu_devices is not None:
        known = [g.index for g in result]
        wrong = [i for i in gpu_devices if i not in known]
        if wrong:
            raise PlanError("gpu_devices %s are not among the GPUs (%s)" % (
                ", ".join(str(i) for i in wrong), ", ".join(str(i) for i in known) or "none"))
        result = [g for g in result if g.index in set(gpu_devices)]
    return result


@dataclass(frozen=True)
class Host:
    """What the host offers: ``available_mib`` (MemAvailable, plus what the running server holds, capped by a
    cgroup limit), ``total_mib``, how it was found and the memory bandwidth ``host_info`` measured (bytes/s)."""

    available_mib: float
    total_mib: float | None
    held_mib: float
    limited_by: str
    bandwidth_bytes_per_second: float | None = None  # what host_info's copy probe measured


def normalize_host(host):
    """A ``host_info`` result or ``{memory_available_mib, memory_total_mib}`` -> ``Host``; ``None`` -> ``None``."""
    if host is None:
        return None
    if not isinstance(host, dict):
        raise PlanError("host must be the registered result of host_info or a dict with memory_available_mib, "
                        "got %r" % (host,))
    available = _number(host.get("memory_available_mib"), "host.memory_available_mib")
    if available is None:
        raise PlanError("host has no memory_available_mib: pass the registered result of host_info")
    total = _number(host.get("memory_total_mib"), "host.memory_total_mib")
    held = _number(host.get("memory_held_by_pid_mib"), "host.memory_held_by_pid_mib") or 0
    available += held
    limited_by = "MemAvailable"
    cgroup = host.get("cgroup")
    if isinstance(cgroup, dict) and cgroup.get("limit_mib") is not None:
        limit = _number(cgroup.get("limit_mib"), "host.cgroup.limit_mib")
        usage = _number(cgroup.get("usage_mib"), "host.cgroup.usage_mib") or 0
        if limit - usage + held < available:
            available, limited_by = limit - usage + held, "the cgroup limit of %.0f MiB" % limit
    bandwidth = host.get("memory_bandwidth_mb_per_s")
    if bandwidth is not None and (isinstance(bandwidth, bool) or not isinstance(bandwidth, (int, float))
                                  or not math.isfinite(bandwidth) or bandwidth <= 0):
        raise PlanError("host.memory_bandwidth_mb_per_s must be a number of MB/s > 0, got %r" % (bandwidth,))
    return Host(round(available, 2), total, held, limited_by, bandwidth * 1e6 if bandwidth else None)
