# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The offload decision: which GPU(s), where each block's routed experts go, and the proof.

Standard library only: this runs on target hosts (Python >= 3.9). ``load_facts(gguf)`` reads a model (a path, or
the ``model`` summary of a ``gguf_info`` result without opening the file); ``plan(facts, gpus, ...)`` sizes every
candidate placement with the memory model (``_memory_estimate``) and returns what ``moe_offload_plan`` reports.

Placements: one GPU, the layers split over several GPUs (``--tensor-split`` in proportion to free memory), and that
split with the experts of chosen blocks put on a chosen GPU (``-ot 'blk\\.(...)\\.ffn_.*_exps\\.weight=CUDA1'``),
filling each card's headroom after its own layers. The plan with the fewest expert bytes in host memory wins.
Block order for ``auto``: lowest block index first, the blocks llama.cpp's ``--n-cpu-moe N`` moves.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import MIB, mib
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._compute_buffers import OP_OFFLOAD_MIN_BATCH
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import CACHE_TYPES, OFFLOAD_MODES
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._gguf import GGUFError, read_model
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._kv_cache import N_CTX_PAD, pad, validate_context
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._memory_estimate import estimate
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_facts import MemoryModelError, model_facts
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_summary import SummaryError, read_summary
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._nvidia_smi import GPU_EXTRA_KEYS, GPU_KEYS
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_pattern import (
    PatternError, block_expert_pattern, check_pattern, pattern_problem)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._tensor_classes import classify_model

MAX_PARALLEL = 256
GPU_INPUT_KEYS = GPU_KEYS + GPU_EXTRA_KEYS
# Device names of llama.cpp's backends: CUDA<n> numbers the GPUs the container sees, in order.
DEVICE_PREFIX = {"cuda": "CUDA", "vulkan": "Vulkan", "rpc": "RPC", "cpu": "CPU"}


class PlanError(ValueError):
    """Input that cannot be planned, or a plan that does not fit: ``str()`` says why; ``details`` has numbers."""

    def __init__(self, message, details=None):
        super().__init__(message)
        self.details = details or {}


# --------------------------------------------------------------------------- inputs

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
    """One GPU as the plan sees it: ``memory_free_mib`` counts what the running server holds as free."""

    name: str
    index: int
    uuid: str | None
    memory_total_mib: float | None
    memory_free_mib: float
    held_mib: float = 0


def _number(value, where):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or not math.isfinite(value):
        raise PlanError("%s must be a number of MiB >= 0, got %r" % (where, value))
    return value


def normalize_gpus(gpus, gpu_indices=None):
    """A ``gpu_info`` result or a list of ``{name, memory_total_mib, memory_free_mib}`` -> a list of ``Gpu``.

    An empty list is a CPU host. ``gpu_indices`` keeps only those GPUs (the ones the container gets).
    """
    if isinstance(gpus, dict):
        if "gpus" not in gpus:
            raise PlanError("gpus is a dict without a gpus list: pass the registered result of gpu_info or a list")
        gpus = gpus["gpus"]
    if not isinstance(gpus, list):
        raise PlanError("gpus must be the registered result of gpu_info or a list of {name, memory_total_mib, "
                        "memory_free_mib}, got %r" % (gpus,))
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
        if gpu.get("mig_devices"):
            raise PlanError("gpus[%d] (%s) is in MIG mode: plan for one MIG device by passing a gpus list with its "
                            "memory" % (position, gpu.get("name")))
        index = gpu.get("index", position)
        result.append(Gpu(gpu.get("name") or "GPU %d" % position, index, gpu.get("uuid"), total,
                          free + (held or 0), held or 0))
    if gpu_indices is not None:
        known = [g.index for g in result]
        wrong = [i for i in gpu_indices if i not in known]
        if wrong:
            raise PlanError("gpu_indices %s are not among the GPUs (%s)" % (
                ", ".join(str(i) for i in wrong), ", ".join(str(i) for i in known) or "none"))
        result = [g for g in result if g.index in set(gpu_indices)]
    return result


@dataclass(frozen=True)
class Host:
    """What the host offers: ``available_mib`` (MemAvailable, plus what the running server holds, capped by a
    cgroup limit), ``total_mib`` and how it was found."""

    available_mib: float
    total_mib: float | None
    held_mib: float
    limited_by: str


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
    return Host(round(available, 2), total, held, limited_by)


def _check_options(facts, options):
    """The warnings of ``options`` for ``facts``; ``PlanError`` for options that cannot be planned."""
    warnings = []
    for name in ("cache_type_k", "cache_type_v"):
        if getattr(options, name) not in CACHE_TYPES:
            raise PlanError("unknown %s %r: llama-server knows %s" % (
                name, getattr(options, name), ", ".join(sorted(CACHE_TYPES))))
    try:
        validate_context(options.ctx_size, options.parallel, options.ubatch)
    except MemoryModelError as exc:
        raise PlanError(str(exc)) from None
    if facts.context_length and options.ctx_size > facts.context_length:
        warnings.append("ctx_size %d is beyond the model's training context of %d tokens" % (
            options.ctx_size, facts.context_length))
    for name in ("margin_mib", "host_margin_mib"):
        value = getattr(options, name)
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise PlanError("%s must be >= 0, got %r" % (name, value))
    return warnings + _check_choice(facts, options.mode, options.cpu_expert_layers, options.pattern)


def _check_choice(facts, mode, cpu_expert_layers, pattern):
    """``PlanError`` for a mode, cpu_expert_layers and pattern that do not go together or do not fit the model."""
    if mode not in OFFLOAD_MODES:
        raise PlanError("unknown mode %r (one of %s)" % (mode, ", ".join(OFFLOAD_MODES)))
    if pattern is not None and (mode != "auto" or cpu_expert_layers is not None):
        raise PlanError("give either pattern (it decides what moves to host memory) or mode %s%s, not both" % (
            mode, " with cpu_expert_layers" if cpu_expert_layers is not None else ""))
    if mode == "layers":
        if cpu_expert_layers is None:
            raise PlanError("mode layers needs cpu_expert_layers: a count of MoE blocks or a list of block indices")
        if isinstance(cpu_expert_layers, list):
            wrong = [b for b in cpu_expert_layers if b not in facts.expert_tensors_by_block]
            if wrong:
                raise PlanError("cpu_expert_layers names block(s) %s that hold no routed experts (MoE blocks: %s)" % (
                    ", ".join(str(b) for b in wrong), _blocks_text(facts.expert_blocks)))
        elif (isinstance(cpu_expert_layers, bool) or not isinstance(cpu_expert_layers, int) or cpu_expert_layers < 0
              or cpu_expert_layers > len(facts.expert_blocks)):
            raise PlanError("cpu_expert_layers must be a count from 0 to %d (the MoE blocks) or a list of block "
                            "indices, got %r" % (len(facts.expert_blocks), cpu_expert_layers))
    elif cpu_expert_layers is not None:
        raise PlanError("cpu_expert_layers only goes with mode layers")
    if mode in ("all", "layers") and facts.dense:
        raise PlanError("the model has no routed experts: there is nothing to move (use mode none or auto)")
    return []


def _blocks_text(blocks):
    return ", ".join(str(b) for b in blocks) if blocks else "none"


# --------------------------------------------------------------------------- sizing one placement

class _Sizer:
    """Sizes one placement (GPUs + split) for any CPU blocks, experts on other GPUs, context and slots."""

    def __init__(self, facts, gpus, split, options, host, fixed_cpu=None):
        self.facts = facts
        self.gpus = gpus
        self.split = split
        self.options = options
        self.host = host
        self.fixed_cpu = fixed_cpu  # the tensors a user's pattern moves, instead of whole blocks

    def estimate(self, cpu_blocks=(), moved=None, ctx_size=None, parallel=None):
        """``moved``: ``{block: device position}`` for experts on another GPU than their layer's."""
        by_block = self.facts.expert_tensors_by_block
        if self.fixed_cpu is not None:
            cpu = self.fixed_cpu
        else:
            cpu = [n for b in cpu_blocks for n in by_block.get(b, ())]
        device_tensors = dict((n, d) for b, d in (moved or {}).items() for n in by_block.get(b, ()))
        result = estimate(self.facts, self.options.at(ctx_size, parallel), cpu_tensors=cpu, split=self.split,
                          n_devices=len(self.gpus), device_tensors=device_tensors)
        for gpu, entry in zip(self.gpus, result["gpus"]):
            entry["free_after"] = int(gpu.memory_free_mib * MIB) - entry["total"]
            entry["free_after_mib"] = mib(entry["free_after"])
        host = result["host"]
        host["available_mib"] = self.host.available_mib if self.host else None
        host["free_after"] = int(self.host.available_mib * MIB) - host["total"] if self.host else None
        host["free_after_mib"] = mib(host["free_after"]) if self.host else None
        return result

    @staticmethod
    def gpu_fits(result):
        return all(entry["free_after"] >= 0 for entry in result["gpus"])

    @staticmethod
    def host_fits(result):
        return result["host"]["free_after"] is None or result["host"]["free_after"] >= 0

    def fits(self, result):
        return self.gpu_fits(result) and self.host_fits(result)

    def choose_blocks(self, mode, cpu_expert_layers):
        """The CPU blocks of a mode; for auto the fewest, lowest-index-first blocks that fit."""
        order = self.facts.expert_blocks
        if mode == "none":
            return []
        if mode == "all" or (mode == "auto" and not self.gpus):
            return list(order)
        if mode == "layers":
            if isinstance(cpu_expert_layers, list):
                return sorted(set(cpu_expert_layers))
            return list(order[:cpu_expert_layers])
        chosen = []
        result = self.estimate(chosen)
        while not self.gpu_fits(result) and len(chosen) < len(order):
            # Relieve the devices that are short, lowest block first on each.
            devices_by_block = result["devices_by_block"]
            short = set(i for i, entry in enumerate(result["gpus"]) if entry["free_after"] < 0)
            candidates = [b for b in order if b not in chosen and devices_by_block[b] in short]
            if not candidates:
                break  # the short device holds no more experts: moving others does not help it
            chosen.append(candidates[0])
            result = self.estimate(chosen)
        return sorted(chosen)

    def fill_gpus(self):
        """Experts per GPU: start with every expert on the host, then give each GPU the experts its headroom
        holds, first those of its own blocks (no override needed), then those of other GPUs' blocks (an
        ``-ot ...=CUDA<n>`` override), lowest block first. Returns ``(cpu_blocks, moved)`` or ``None`` when even
        every expert on the host does not fit."""
        cpu = list(self.facts.expert_blocks)
        moved = {}
        result = self.estimate(cpu)
        if not self.gpu_fits(result):
            return None
        own = result["devices_by_block"]
        for block in list(cpu):
            trial = [b for b in cpu if b != block]
            attempt = self.estimate(trial, moved)
            if self.gpu_fits(attempt):
                cpu, result = trial, attempt
        for block in list(cpu):
            by_room = sorted(range(len(self.gpus)), key=lambda d: -result["gpus"][d]["free_after"])
            for device in by_room:
                if device == own[block]:
                    continue
                trial, trial_moved = [b for b in cpu if b != block], {**moved, block: device}
                attempt = self.estimate(trial, trial_moved)
                if self.gpu_fits(attempt):
                    cpu, moved, result = trial, trial_moved, attempt
                    break
        return cpu, moved

    def largest(self, cpu_blocks, moved, ctx_size, parallel):
        """Largest ctx_size (at ``parallel``) and largest parallel (at ``ctx_size``) that fit, 0 when none."""
        limit = max(self.facts.context_length or 0, ctx_size)
        low, high = 0, limit // N_CTX_PAD
        while low < high:  # largest multiple of 256 that fits
            mid = (low + high + 1) // 2
            if mid * N_CTX_PAD >= parallel and self.fits(self.estimate(cpu_blocks, moved, mid * N_CTX_PAD,
                                                                          parallel)):
                low = mid
            else:
                high = mid - 1
        max_ctx = low * N_CTX_PAD
        low, high = 0, min(MAX_PARALLEL, pad(ctx_size, N_CTX_PAD))
        while low < high:
            mid = (low + high + 1) // 2
            if self.fits(self.estimate(cpu_blocks, moved, ctx_size, mid)):
                low = mid
            else:
                high = mid - 1
        return {"max_ctx_size": max_ctx, "max_parallel": low, "ctx_size_capped_at": limit}


@dataclass
class _Candidate:
    label: str  # single, split or cpu
    gpus: list
    shares: list | None
    sizer: _Sizer
    cpu_blocks: list
    moved: dict  # {block: device position} of experts on another GPU than their layer's
    result: dict

    def host_expert_bytes(self):
        sizes = self.sizer.facts.expert_bytes_by_block()
        if self.sizer.fixed_cpu is not None:
            experts = set(self.sizer.facts.expert_names)
            return sum(t.nbytes for t in self.sizer.facts.tensors if t.name in experts and t.name in
                       set(self.sizer.fixed_cpu))
        return sum(sizes[b] for b in self.cpu_blocks)  # (only MoE blocks are ever placed on the CPU)

    def key(self):
        """Fitting first, then the fewest expert bytes in host memory, the fewest overrides, one GPU."""
        return (not self.sizer.fits(self.result), self.host_expert_bytes(), len(self.moved),
                0 if self.label == "single" else 1)


def _placements(gpus, gpu_index, split):
    """Candidate ``(label, gpus, shares)`` placements, in the order they are preferred."""
    if not gpus:
        if gpu_index is not None:
            raise PlanError("gpu_index %r is not among the GPUs (none: a CPU host)" % gpu_index)
        return [("cpu", [], None)]
    if gpu_index is not None:
        chosen = [d for d in gpus if d.index == gpu_index]
        if not chosen:
            raise PlanError("gpu_index %r is not among the GPUs (%s)" % (
                gpu_index, ", ".join(str(d.index) for d in gpus)))
        if split not in (None, "none"):
            raise PlanError("give either gpu_index (serve from one GPU) or split (spread over all), not both")
        return [("single", chosen, None)]
    if len(gpus) == 1:
        return [("single", gpus, None)]
    proportional = [max(d.memory_free_mib, 0) for d in gpus]
    if split == "auto":
        return [("split", gpus, proportional)]
    if isinstance(split, list):
        if len(split) != len(gpus) or any(isinstance(s, bool) or not isinstance(s, (int, float)) or s < 0
                                          for s in split) or not sum(split):
            raise PlanError("split must give one share >= 0 per GPU (%d GPUs), got %r" % (len(gpus), split))
        return [("split", gpus, list(split))]
    if split not in (None, "none"):
        raise PlanError("split must be auto, none or a list of shares, got %r" % (split,))
    best = max(gpus, key=lambda d: d.memory_free_mib)
    candidates = [("single", [best], None)]
    if split is None:
        candidates.append(("split", gpus, proportional))
    return candidates


# --------------------------------------------------------------------------- the plan

def plan(facts, gpus, host, options):
    """Decide where the experts go. Returns the dict ``moe_offload_plan`` reports (see its RETURN).

    ``gpus``: ``gpu_info``'s result or a list (empty: a CPU host); ``host``: ``host_info``'s result or
    ``{memory_available_mib}`` (``None``: host memory is not checked); ``options``: the ``_plan_options.Options``
    of the server and the planner (``options.pattern``: a user's pattern, checked and sized instead of the mode's
    choice; ``options.device_names``: llama.cpp's name of each GPU in plan order, default ``CUDA0``, ``CUDA1``...).
    Raises ``PlanError`` for bad input and when even the lightest plan does not fit (``details`` has the numbers of
    that plan and the warnings).
    """
    devices = normalize_gpus(gpus, options.gpu_indices)
    host_memory = normalize_host(host)
    warnings = list(facts.warnings)
    warnings += _check_options(facts, options)
    user_check, fixed_cpu = _user_pattern(facts, options.pattern, warnings)
    try:
        best = _best_candidate(facts, devices, host_memory, options, fixed_cpu)
        sizer, blocks, moved = best.sizer, best.cpu_blocks, best.moved
        baseline = sizer.estimate([])
        headroom = {"this_plan": sizer.largest(blocks, moved, options.ctx_size, options.parallel),
                    "all_experts_on_cpu": sizer.largest(facts.expert_blocks, {}, options.ctx_size, options.parallel)}
    except MemoryModelError as exc:
        raise PlanError(str(exc), {"warnings": warnings}) from None
    answer = _answer(facts, best, baseline, headroom, options, user_check)
    answer["warnings"] = warnings + [w for w in best.result["warnings"] if "training context" not in w]
    answer["reason"] = _reason(facts, answer, best, baseline, host_memory, options)
    if not answer["fits"]:
        raise PlanError(answer["reason"], answer)
    return answer


def _user_pattern(facts, pattern, warnings):
    """``(check, tensors)`` of a user's pattern: its verdict and the tensors it moves; ``(None, None)`` without."""
    if pattern is None:
        return None, None
    check = check_pattern(pattern, facts.tensor_names, facts.expert_names, facts.tensor_class)
    if pattern_problem(pattern) if pattern else "the pattern is empty":
        raise PlanError("pattern %r cannot be used: %s" % (pattern, check["verdict"]),
                        {"pattern_check": _public_check(check), "warnings": warnings})
    regex = re.compile(pattern)
    return check, [n for n in facts.tensor_names if regex.search(n)]


def _best_candidate(facts, devices, host_memory, options, fixed_cpu):
    """Every placement sized with the mode's blocks (and, split over GPUs in mode auto, with experts put on other
    GPUs): the ``_Candidate`` that fits with the fewest expert bytes in host memory."""
    tried = []
    for label, used, shares in _placements(devices, options.gpu_index, options.split):
        sizer = _Sizer(facts, used, shares, options, host_memory, fixed_cpu)
        blocks = _blocks_of(facts, fixed_cpu) if fixed_cpu is not None else sizer.choose_blocks(
            options.mode, options.cpu_expert_layers)
        tried.append(_Candidate(label, used, shares, sizer, blocks, {}, sizer.estimate(blocks)))
        if label == "split" and options.mode == "auto" and fixed_cpu is None and options.experts_per_gpu and blocks:
            filled = sizer.fill_gpus()
            if filled is not None:
                cpu_blocks, moved = filled
                tried.append(_Candidate(label, used, shares, sizer, cpu_blocks, moved,
                                        sizer.estimate(cpu_blocks, moved)))
    return min(tried, key=lambda c: c.key())


def _answer(facts, best, baseline, headroom, options, user_check):
    """The plan's result without its warnings and reason."""
    sizer, blocks, moved, result = best.sizer, best.cpu_blocks, best.moved, best.result
    fixed_cpu = sizer.fixed_cpu
    names = _device_names(best.gpus, options.backend, options.device_names)
    if fixed_cpu is not None:
        cpu_pattern, proof = options.pattern, _public_check(user_check)
    else:
        cpu_pattern, proof = _proved_pattern(facts, blocks)
    overrides = _device_overrides(facts, moved, best.gpus, names)
    return {
        "offload": bool(blocks) or bool(fixed_cpu), "pattern": cpu_pattern,
        "override_tensor": cpu_pattern + "=CPU" if cpu_pattern else "",
        "cpu_expert_layers": blocks, "n_cpu_moe": _n_cpu_moe(facts, blocks) if fixed_cpu is None else None,
        "device_overrides": overrides,
        "tensor_overrides": ",".join("%s=%s" % (o["pattern"], o["device"]) for o in overrides),
        "devices": [{"device": n, "index": g.index, "uuid": g.uuid, "name": g.name} for g, n in zip(best.gpus, names)],
        "memory": _memory_report(best.gpus, result), "fits": sizer.fits(result),
        "vram_saved_mib": mib(sum(e["total"] for e in baseline["gpus"]) - sum(e["total"] for e in result["gpus"])),
        "headroom": headroom, "placement": best.label,
        "tensor_split": _split_text(best.shares) if best.label == "split" else "",
        "visible_devices": ",".join(str(d.uuid or d.index) for d in best.gpus),
        "gpu_indices": [d.index for d in best.gpus], "pattern_check": proof,
        "kv_cache": _kv_report(facts, result["cells"]), "n_ctx": result["n_ctx"],
    }


def _blocks_of(facts, names):
    """The MoE blocks all of whose routed experts are among ``names``."""
    names = set(names)
    return sorted(b for b, experts in facts.expert_tensors_by_block.items() if experts and set(experts) <= names)


def _public_check(check):
    """``check_pattern``'s verdict with ``matched`` as a count and the matched names as ``tensors``."""
    return {"ok": check["ok"], "matched": len(check["matched"]), "tensors": check["matched"],
            "missed": check["missed"], "non_expert": check["non_expert"], "verdict": check["verdict"]}


def _proved_pattern(facts, blocks):
    wanted = sorted(n for b in blocks for n in facts.expert_tensors_by_block.get(b, ()))
    if not wanted:
        return "", {"ok": True, "matched": 0, "tensors": [], "missed": [], "non_expert": [],
                    "verdict": "no tensor moves"}
    pattern = _exact_pattern(facts, blocks)
    check = check_pattern(pattern, facts.tensor_names, wanted, facts.tensor_class)
    return pattern, _public_check(check)


def _exact_pattern(facts, blocks):
    """A pattern proved to match exactly the routed experts of ``blocks`` among every tensor of the model."""
    wanted = sorted(n for b in blocks for n in facts.expert_tensors_by_block.get(b, ()))
    try:
        pattern = block_expert_pattern(facts.tensor_names, facts.expert_names, blocks)
    except PatternError as exc:
        raise PlanError("no exact pattern for the experts of blocks %s: %s" % (_blocks_text(blocks), exc)) from None
    check = check_pattern(pattern, facts.tensor_names, wanted, facts.tensor_class)
    if not check["ok"]:
        raise PlanError("the pattern %s does not match exactly the experts of blocks %s: %s" % (
            pattern, _blocks_text(blocks), check["verdict"]))
    return pattern


def _device_names(gpus, backend, names):
    if names is not None:
        if len(names) != len(gpus) or not all(isinstance(n, str) and n and "," not in n for n in names):
            raise PlanError("device_names must give one name (without ',') per GPU of the plan (%d), got %r" % (
                len(gpus), names))
        return list(names)
    prefix = DEVICE_PREFIX.get(backend, backend.upper())
    return ["%s%d" % (prefix, position) for position in range(len(gpus))]


def _device_overrides(facts, moved, gpus, names):
    """One proved ``-ot`` item per GPU that holds experts of another GPU's blocks."""
    overrides = []
    for position in sorted(set(moved.values())):
        blocks = sorted(b for b, d in moved.items() if d == position)
        pattern = _exact_pattern(facts, blocks)
        overrides.append({"pattern": pattern, "device": names[position], "gpu_index": gpus[position].index,
                          "blocks": blocks, "tensors": sorted(n for b in blocks
                                                              for n in facts.expert_tensors_by_block[b])})
    return overrides


def _n_cpu_moe(facts, blocks):
    """The ``--n-cpu-moe N`` that moves exactly these blocks' experts, or ``None`` when none does."""
    if not blocks:
        return 0
    n = max(blocks) + 1
    return n if [b for b in facts.expert_blocks if b < n] == list(blocks) else None


def _split_text(shares):
    total = float(sum(shares))
    return ",".join(("%.3f" % (s / total)).rstrip("0").rstrip(".") or "0" for s in shares)


def _memory_report(gpus, result):
    report = []
    for gpu, entry in zip(gpus, result["gpus"]):
        report.append({"index": gpu.index, "name": gpu.name, "free_mib": gpu.memory_free_mib,
                       "held_by_pid_mib": gpu.held_mib, "model_mib": entry["model_mib"], "kv_mib": entry["kv_mib"],
                       "recurrent_mib": entry["recurrent_mib"], "compute_mib": entry["compute_mib"],
                       "margin_mib": entry["margin_mib"], "total_mib": entry["total_mib"],
                       "free_after_mib": entry["free_after_mib"]})
    host = result["host"]
    keys = ("model_mib", "kv_mib", "recurrent_mib", "output_mib", "compute_mib", "margin_mib", "total_mib",
            "available_mib", "free_after_mib", "mmap", "pinned")
    return {"gpus": report, "host": dict((k, host[k]) for k in keys)}


def _kv_report(facts, cells):
    swa = facts.sliding_window
    return {"layout": facts.memory, "cells": cells.cells, "streams": cells.streams,
            "full_blocks": sorted(b for b in facts.kv_blocks if b not in facts.swa_blocks),
            "swa_blocks": sorted(facts.swa_blocks), "swa_cells": cells.swa_cells,
            "window": swa.window if swa else 0, "window_kind": swa.kind if swa else "",
            "reused_blocks": list(facts.kv_reused), "recurrent_blocks": sorted(facts.recurrent_blocks)}


# --------------------------------------------------------------------------- the plan in words

def _contents(facts, answer, parallel):
    """What the plan counts, in words, without naming what the model does not have."""
    parts = ["the weights"]
    kv = answer["kv_cache"]
    if kv["full_blocks"] or kv["swa_blocks"]:
        text = "the KV cache for %d tokens" % answer["n_ctx"]
        if kv["swa_blocks"]:
            text += " (%d of its %d blocks keep a %s window: %d cells per slot)" % (
                len(kv["swa_blocks"]), len(kv["swa_blocks"]) + len(kv["full_blocks"]),
                "chunked" if kv["window_kind"] == "chunked" else "sliding", kv["swa_cells"])
        parts.append(text)
    if facts.recurrent_blocks:
        parts.append("the recurrent state of %d slot(s)" % parallel)
    parts.append("the compute buffer")
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def _where(candidate):
    """The GPUs of a placement with their free memory, and the split of a split placement."""
    names = " + ".join("%s (%d MiB free)" % (d.name, d.memory_free_mib) for d in candidate.gpus)
    return names if candidate.label == "single" else "%s, split %s" % (names, _split_text(candidate.shares))


def _headroom_text(answer, parallel):
    here = answer["headroom"]["this_plan"]
    if not here["max_ctx_size"]:
        return ""
    if here["max_ctx_size"] >= here["ctx_size_capped_at"]:
        context = "The whole context searched (%d tokens, the training context) fits with %d slot(s)" % (
            here["ctx_size_capped_at"], parallel)
    else:
        context = "At most %d tokens of context fit with %d slot(s)" % (here["max_ctx_size"], parallel)
    if here["max_parallel"] >= MAX_PARALLEL:
        slots = "%d slots or more at this context" % MAX_PARALLEL
    else:
        slots = "at most %d slot(s) at this context" % here["max_parallel"]
    return " %s, and %s." % (context, slots)


def _host_text(answer, mmap):
    host = answer["memory"]["host"]
    how = "in the page cache of the model file (mmap)" if mmap else (
        "pinned (--no-mmap)" if host["pinned"] else "in host memory (--no-mmap)")
    return "%.0f MiB of weights are read from host memory, %s" % (host["model_mib"], how)


def _reason(facts, answer, candidate, baseline, host, options):
    """The decision in plain words: why it does not fit and what to lower, or what goes where and why."""
    if any(e["free_after_mib"] < 0 for e in answer["memory"]["gpus"]):
        return _gpu_short_text(facts, answer, candidate, options)
    if host is not None and answer["memory"]["host"]["free_after_mib"] < 0:
        return _host_short_text(answer, candidate, host, options.mode)
    if candidate.label == "cpu":
        return _cpu_text(facts, answer, host, options.parallel)
    host_note = "" if host is not None else " Host memory was not checked (give host, the result of host_info)."
    if not answer["cpu_expert_layers"] and not answer["device_overrides"] and not answer["pattern"]:
        gpus = answer["memory"]["gpus"]
        text = "Everything fits on %s: %s need %.0f MiB including the %d MiB margin" % (
            _where(candidate), _contents(facts, answer, options.parallel), sum(e["total_mib"] for e in gpus),
            gpus[0]["margin_mib"])
        if not facts.dense:
            text += ", so no expert moves to host memory and the GPU keeps full speed"
        return text + "." + _headroom_text(answer, options.parallel) + host_note
    return _offload_text(facts, answer, candidate, baseline, options) + host_note


def _gpu_short_text(facts, answer, candidate, options):
    """Why the plan does not fit on its GPUs, and what to lower."""
    gpus = answer["memory"]["gpus"]
    need = sum(e["total_mib"] for e in gpus)
    blocks = answer["cpu_expert_layers"]
    worst = min((e for e in gpus if e["free_after_mib"] < 0), key=lambda e: e["free_after_mib"])
    lower = []
    everything = answer["headroom"]["all_experts_on_cpu"]["max_ctx_size"]
    lower.append("ctx_size (at most %d fits%s)" % (everything, "" if facts.dense else " with all experts on CPU")
                 if everything else "ctx_size")
    if facts.recurrent_blocks or facts.sliding_window or len(blocks) < len(facts.expert_blocks):
        lower.append("parallel")
    lower += ["cache_type_k/cache_type_v (q8_0 halves the KV cache)", "margin_mib", "ubatch"]
    sizes = facts.expert_bytes_by_block()
    copy = max([sizes.get(b, 0) for b in blocks] + [0])
    if copy and options.op_offload and options.ubatch >= OP_OFFLOAD_MIN_BATCH:
        lower.append("op_offload (false, with llama-server --no-op-offload, frees the %.0f MiB the GPU reserves "
                     "to compute on host-resident experts, at the cost of slower prompt processing)"
                     % (copy / float(MIB)))
    if options.mode not in ("auto", "all") and len(blocks) < len(facts.expert_blocks):
        lower.insert(0, "mode (auto or all moves more experts)")
    what = "%s need %.0f MiB" % (_contents(facts, answer, options.parallel), need)
    if not facts.dense:
        what = "with %s the plan needs %.0f MiB" % (
            "the experts of %d block(s) on CPU" % len(blocks) if blocks else "everything on the GPU", need)
    return ("Does not fit on %s: %s and %.0f MiB are missing on %s. Lower %s, or use a larger GPU." % (
        _where(candidate), what, -worst["free_after_mib"], worst["name"], ", ".join(lower)))


def _host_short_text(answer, candidate, host, mode):
    """Why the host cannot hold its part of the plan."""
    host_report = answer["memory"]["host"]
    kept = ["%.0f MiB of weights" % host_report["model_mib"]]
    state = host_report["kv_mib"] + host_report["recurrent_mib"]
    if state:
        kept.append("%.0f MiB of KV cache and recurrent state" % state)
    kept.append("%.0f MiB of compute and output buffers" % (host_report["compute_mib"] + host_report["output_mib"]))
    kept.append("the %.0f MiB host margin" % host_report["margin_mib"])
    if candidate.label == "cpu":
        advice = "Free host memory, or lower ctx_size or parallel."
    else:
        advice = "Free host memory, or keep more of the model on the GPUs (%sa larger GPU, a smaller ctx_size)." % (
            "mode auto, " if mode != "auto" else "")
    numbers = (", ".join(kept[:-1]), kept[-1], host_report["total_mib"], host.available_mib, host.limited_by,
               -host_report["free_after_mib"], advice)
    return "The host cannot hold its part: %s and %s need %.0f MiB, but %.0f MiB are available (%s), so %.0f " \
        "MiB are missing. %s" % numbers


def _cpu_text(facts, answer, host, parallel):
    """A plan without GPU: what the host holds."""
    host_report = answer["memory"]["host"]
    text = "No GPU: llama-server computes on the CPU and keeps everything in host memory: %s need %.0f MiB " \
        "with the %.0f MiB margin" % (_contents(facts, answer, parallel), host_report["total_mib"],
                                      host_report["margin_mib"])
    text += (" (%.0f MiB available)." % host.available_mib) if host else " (host memory not checked)."
    return text + _headroom_text(answer, parallel)


def _offload_text(facts, answer, candidate, baseline, options):
    """What moves where (to host memory, to another GPU) and why."""
    blocks = answer["cpu_expert_layers"]
    need = sum(e["total_mib"] for e in answer["memory"]["gpus"])
    where = _where(candidate)
    total_blocks = len(facts.expert_blocks)
    if answer["pattern"] and not blocks and answer["offload"]:
        head = "The given pattern moves %d tensor(s) to host memory (%s)" % (
            answer["pattern_check"]["matched"] + len(answer["pattern_check"]["non_expert"]),
            answer["pattern_check"]["verdict"])
    elif len(blocks) == total_blocks:
        head = "All routed experts (%d MoE blocks) go to host memory" % total_blocks
    elif blocks:
        head = "The routed experts of %d of the %d MoE blocks (%s) go to host memory" % (
            len(blocks), total_blocks, _blocks_text(blocks))
    else:
        head = "No routed expert goes to host memory"
    if answer["device_overrides"]:
        head += "; " + "; ".join("the experts of blocks %s go to %s (GPU %d) with -ot %s=%s" % (
            _blocks_text(o["blocks"]), o["device"], o["gpu_index"], o["pattern"], o["device"])
            for o in answer["device_overrides"])
    base_need = sum(e["total"] for e in baseline["gpus"]) / float(MIB)
    if candidate.sizer.fixed_cpu is not None:
        why = "as the given pattern asks, on %s" % where
    elif options.mode == "auto":
        why = "everything on the GPU would need %.0f MiB, more than %s offers" % (base_need, where)
    else:
        why = "as mode %s asks, on %s" % (options.mode, where)
    kinds = ", recurrent" if facts.recurrent_blocks else ""
    text = "%s: %s. With this plan the GPU side needs %.0f MiB (%.0f MiB saved); every attention%s, router and " \
        "shared-expert tensor stays on the GPU" % (head, why, need, answer["vram_saved_mib"], kinds)
    if blocks or answer["pattern"]:
        text += ", and " + _host_text(answer, options.mmap)
    return text + "." + _headroom_text(answer, options.parallel)
