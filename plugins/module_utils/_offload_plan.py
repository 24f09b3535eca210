# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The offload decision: which GPU(s), which blocks' routed experts go to host memory, and the proof.

Standard library only: this runs on target hosts. ``plan(facts, gpus, ...)`` sizes every candidate with the
memory model (``_memory_model``) and returns what ``moe_offload_plan`` reports. Block order for ``auto``:
lowest block index first, the blocks llama.cpp's ``--n-cpu-moe N`` moves (docs/memory-model.md says why).
"""

from __future__ import annotations

import math

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _memory_model as mm
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import CACHE_TYPES, OFFLOAD_MODES
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._gguf import GGUFError, read_model
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_pattern import (
    PatternError, block_expert_pattern, check_pattern)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._tensor_classes import classify_model

GPU_FIELDS = ("name", "memory_total_mib", "memory_free_mib", "memory_used_mib", "index", "uuid", "pci_bus_id",
              "driver_version", "compute_capability", "mig_devices")
MAX_PARALLEL = 256


class PlanError(ValueError):
    """Input that cannot be planned, or a plan that does not fit: ``str()`` says why; ``details`` has numbers."""

    def __init__(self, message, details=None):
        super(PlanError, self).__init__(message)
        self.details = details or {}


def load_facts(gguf):
    """``ModelFacts`` of a GGUF path, or of a ``gguf_info`` result (its first file is read again)."""
    if isinstance(gguf, dict):
        files = gguf.get("files") or ([gguf["path"]] if gguf.get("path") else [])
        if not files:
            raise PlanError("gguf is a dict without files: pass a path or the registered result of gguf_info")
        path = files[0]
    elif isinstance(gguf, str) and gguf:
        path = gguf
    else:
        raise PlanError("gguf must be a path or the result of gguf_info, got %r" % (gguf,))
    try:
        model = read_model(path)
    except GGUFError as exc:
        raise PlanError(str(exc))
    except (IOError, OSError) as exc:
        raise PlanError("%s: %s" % (path, exc))
    layout = classify_model(model.architecture, model.metadata, model.tensors)
    try:
        facts = mm.model_facts(model.metadata, model.tensors, layout)
    except mm.MemoryModelError as exc:
        raise PlanError("%s: %s" % (path, exc))
    facts.path = path
    facts.tensor_class = layout.tensor_class
    facts.warnings = list(model.warnings) + facts.warnings
    return facts


def normalize_gpus(gpus):
    """A ``gpu_info`` result or a list of ``{name, memory_total_mib, memory_free_mib}`` -> list of dicts."""
    if isinstance(gpus, dict):
        if "gpus" not in gpus:
            raise PlanError("gpus is a dict without a gpus list: pass the registered result of gpu_info or a list")
        gpus = gpus["gpus"]
    if not isinstance(gpus, list):
        raise PlanError("gpus must be the registered result of gpu_info or a list of {name, memory_total_mib, "
                        "memory_free_mib}, got %r" % (gpus,))
    if not gpus:
        raise PlanError("there is no GPU to plan for (gpus is empty): this host serves from the CPU, so there is "
                        "nothing to offload; run llama-server without -ngl or give the GPUs")
    result = []
    for position, gpu in enumerate(gpus):
        if not isinstance(gpu, dict):
            raise PlanError("gpus[%d] must be a dict with name, memory_total_mib and memory_free_mib" % position)
        unknown = sorted(set(gpu) - set(GPU_FIELDS))
        if unknown:
            raise PlanError("gpus[%d] has unknown field(s) %s (known: %s)" % (
                position, ", ".join(unknown), ", ".join(GPU_FIELDS)))
        for name in ("memory_free_mib", "memory_total_mib", "memory_used_mib"):
            value = gpu.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0
                                      or not math.isfinite(value)):
                raise PlanError("gpus[%d].%s must be a number of MiB >= 0, got %r" % (position, name, value))
        total = gpu.get("memory_total_mib")
        free = gpu.get("memory_free_mib")
        if free is None and total is not None and gpu.get("memory_used_mib") is not None:
            free = total - gpu["memory_used_mib"]
            if free < 0:
                raise PlanError("gpus[%d]: memory_used_mib %r is more than memory_total_mib %r" % (
                    position, gpu["memory_used_mib"], total))
        if free is None:
            raise PlanError("gpus[%d] (%s) reports no free memory (nvidia-smi printed [N/A]?): give "
                            "memory_free_mib in a gpus list" % (position, gpu.get("name") or "unnamed"))
        if gpu.get("mig_devices"):
            raise PlanError("gpus[%d] (%s) is in MIG mode: plan for one MIG device by passing a gpus list with its "
                            "memory" % (position, gpu.get("name")))
        result.append({"name": gpu.get("name") or "GPU %d" % position,
                       "index": gpu.get("index", position), "uuid": gpu.get("uuid"),
                       "memory_total_mib": total, "memory_free_mib": int(free)})
    return result


def _check_options(facts, ctx_size, parallel, cache_type_k, cache_type_v, margin_mib, mode, cpu_moe_layers):
    warnings = []
    for name, value in (("cache_type_k", cache_type_k), ("cache_type_v", cache_type_v)):
        if value not in CACHE_TYPES:
            raise PlanError("unknown %s %r: llama-server knows %s" % (name, value, ", ".join(sorted(CACHE_TYPES))))
    try:
        mm.validate_context(ctx_size, parallel)
    except mm.MemoryModelError as exc:
        raise PlanError(str(exc))
    if facts.context_length and ctx_size > facts.context_length:
        warnings.append("ctx_size %d is beyond the model's training context of %d tokens" % (
            ctx_size, facts.context_length))
    if margin_mib is None or margin_mib < 0:
        raise PlanError("margin_mib must be >= 0, got %r" % (margin_mib,))
    if mode not in OFFLOAD_MODES:
        raise PlanError("unknown mode %r (one of %s)" % (mode, ", ".join(OFFLOAD_MODES)))
    if mode == "layers":
        if cpu_moe_layers is None:
            raise PlanError("mode layers needs cpu_moe_layers: a count of MoE blocks or a list of block indices")
        if isinstance(cpu_moe_layers, list):
            wrong = [b for b in cpu_moe_layers if b not in facts.expert_tensors_by_block]
            if wrong:
                raise PlanError("cpu_moe_layers names block(s) %s that hold no routed experts (MoE blocks: %s)" % (
                    ", ".join(str(b) for b in wrong), _blocks_text(facts.expert_blocks)))
        elif not isinstance(cpu_moe_layers, int) or cpu_moe_layers < 0 or cpu_moe_layers > len(facts.expert_blocks):
            raise PlanError("cpu_moe_layers must be a count from 0 to %d (the MoE blocks) or a list of block "
                            "indices, got %r" % (len(facts.expert_blocks), cpu_moe_layers))
    elif cpu_moe_layers is not None:
        raise PlanError("cpu_moe_layers only goes with mode layers")
    return warnings


def _blocks_text(blocks):
    return ", ".join(str(b) for b in blocks) if blocks else "none"


class _Sizer(object):
    """Sizes one placement (devices + split) for any set of CPU blocks and any ctx/parallel."""

    def __init__(self, facts, devices, split, options):
        self.facts = facts
        self.devices = devices
        self.split = split
        self.options = options

    def estimate(self, cpu_blocks, ctx_size=None, parallel=None):
        opts = dict(self.options)
        if ctx_size is not None:
            opts["ctx_size"] = ctx_size
        if parallel is not None:
            opts["parallel"] = parallel
        cpu = [n for b in cpu_blocks for n in self.facts.expert_tensors_by_block.get(b, ())]
        result = mm.estimate(self.facts, cpu_tensors=cpu, split=self.split, n_devices=len(self.devices), **opts)
        for gpu, entry in zip(self.devices, result["gpus"]):
            entry["free_after"] = int(gpu["memory_free_mib"] * mm.MIB) - entry["total"]
            entry["free_after_mib"] = mm.mib(entry["free_after"])
        return result

    @staticmethod
    def fits(result):
        return all(entry["free_after"] >= 0 for entry in result["gpus"])

    def choose_blocks(self, mode, cpu_moe_layers):
        """The CPU blocks of a mode; for auto the fewest, lowest-index-first blocks that fit."""
        order = self.facts.expert_blocks
        if mode == "none":
            return []
        if mode == "all":
            return list(order)
        if mode == "layers":
            if isinstance(cpu_moe_layers, list):
                return sorted(set(cpu_moe_layers))
            return list(order[:cpu_moe_layers])
        chosen = []
        result = self.estimate(chosen)
        while not self.fits(result) and len(chosen) < len(order):
            # Relieve the devices that are short, lowest block first on each.
            devices_by_block = result["devices_by_block"]
            short = set(i for i, entry in enumerate(result["gpus"]) if entry["free_after"] < 0)
            candidates = [b for b in order if b not in chosen and devices_by_block[b] in short]
            if not candidates:
                break  # the short device holds no more experts: moving others does not help it
            chosen.append(candidates[0])
            result = self.estimate(chosen)
        return sorted(chosen)

    def largest(self, cpu_blocks, ctx_size, parallel):
        """Largest ctx_size (at ``parallel``) and largest parallel (at ``ctx_size``) that fit, 0 when none."""
        limit = max(self.facts.context_length or 0, ctx_size)
        low, high = 0, limit // mm.N_CTX_PAD
        while low < high:  # largest multiple of 256 that fits
            mid = (low + high + 1) // 2
            if mid * mm.N_CTX_PAD >= parallel and self.fits(self.estimate(cpu_blocks, mid * mm.N_CTX_PAD, parallel)):
                low = mid
            else:
                high = mid - 1
        max_ctx = low * mm.N_CTX_PAD
        low, high = 0, min(MAX_PARALLEL, mm.pad(ctx_size, mm.N_CTX_PAD))
        while low < high:
            mid = (low + high + 1) // 2
            if self.fits(self.estimate(cpu_blocks, ctx_size, mid)):
                low = mid
            else:
                high = mid - 1
        return {"max_ctx_size": max_ctx, "max_parallel": low, "ctx_size_capped_at": limit}


def _placements(devices, gpu_index, split):
    """Candidate ``(label, devices, split)`` placements, in the order they are preferred."""
    if gpu_index is not None:
        chosen = [d for d in devices if d["index"] == gpu_index]
        if not chosen:
            raise PlanError("gpu_index %r is not among the GPUs (%s)" % (
                gpu_index, ", ".join(str(d["index"]) for d in devices)))
        if split not in (None, "none"):
            raise PlanError("give either gpu_index (serve from one GPU) or split (spread over all), not both")
        return [("single", chosen, None)]
    if len(devices) == 1:
        return [("single", devices, None)]
    proportional = [max(d["memory_free_mib"], 0) for d in devices]
    if split == "auto":
        return [("split", devices, proportional)]
    if isinstance(split, list):
        if len(split) != len(devices) or any(isinstance(s, bool) or not isinstance(s, (int, float)) or s < 0
                                             for s in split) or not sum(split):
            raise PlanError("split must give one share >= 0 per GPU (%d GPUs), got %r" % (len(devices), split))
        return [("split", devices, list(split))]
    if split not in (None, "none"):
        raise PlanError("split must be auto, none or a list of shares, got %r" % (split,))
    best = max(devices, key=lambda d: d["memory_free_mib"])
    candidates = [("single", [best], None)]
    if split is None:
        candidates.append(("split", devices, proportional))
    return candidates


def plan(facts, gpus, ctx_size, parallel=1, cache_type_k="f16", cache_type_v="f16", margin_mib=mm.DEFAULT_MARGIN_MIB,
         mode="auto", cpu_moe_layers=None, gpu_index=None, split=None, ubatch=512, flash_attn="auto",
         kv_unified=False, mmap=True, op_offload=True, backend="cuda"):
    """Decide where the experts go. Returns the dict ``moe_offload_plan`` reports (see its RETURN).

    Raises ``PlanError`` for bad input and when even the lightest plan does not fit (``details`` has the
    numbers of that plan).
    """
    devices = normalize_gpus(gpus)
    warnings = list(facts.warnings)
    warnings += _check_options(facts, ctx_size, parallel, cache_type_k, cache_type_v, margin_mib, mode,
                               cpu_moe_layers)
    if mode in ("auto", "all", "layers") and not facts.expert_blocks:
        if mode != "auto":
            raise PlanError("the model has no routed experts: there is nothing to move (use mode none or auto)")
    options = dict(ctx_size=ctx_size, parallel=parallel, cache_type_k=cache_type_k, cache_type_v=cache_type_v,
                   ubatch=ubatch, flash_attn=flash_attn, kv_unified=kv_unified, mmap=mmap, op_offload=op_offload,
                   margin_mib=margin_mib, backend=backend)
    try:
        tried = []
        for label, used, shares in _placements(devices, gpu_index, split):
            sizer = _Sizer(facts, used, shares, options)
            blocks = sizer.choose_blocks(mode, cpu_moe_layers)
            result = sizer.estimate(blocks)
            tried.append((label, used, shares, sizer, blocks, result))
            if sizer.fits(result) and (mode != "auto" or not blocks):
                break
        # Prefer a placement that fits, then the one with fewer experts on CPU, then a single GPU.
        fitting = [t for t in tried if t[3].fits(t[5])]
        label, used, shares, sizer, blocks, result = min(fitting or tried, key=lambda t: (
            len(t[4]), 0 if t[0] == "single" else 1))
        fits = sizer.fits(result)
        baseline = sizer.estimate([])
        all_blocks = facts.expert_blocks
        headroom = {"this_plan": sizer.largest(blocks, ctx_size, parallel),
                    "all_experts_on_cpu": sizer.largest(all_blocks, ctx_size, parallel)}
    except mm.MemoryModelError as exc:
        raise PlanError(str(exc))
    pattern, proof = _proved_pattern(facts, blocks)
    memory = _memory_report(used, result)
    answer = {
        "offload": bool(blocks), "pattern": pattern, "override_tensor": pattern + "=CPU" if pattern else "",
        "cpu_expert_layers": blocks, "n_cpu_moe": _n_cpu_moe(facts, blocks), "memory": memory, "fits": fits,
        "vram_saved_mib": mm.mib(sum(e["total"] for e in baseline["gpus"]) - sum(e["total"] for e in result["gpus"])),
        "headroom": headroom, "placement": label,
        "tensor_split": _split_text(shares) if label == "split" else "",
        "visible_devices": ",".join(str(d["uuid"] or d["index"]) for d in used),
        "gpu_indices": [d["index"] for d in used], "pattern_check": proof, "mode": mode,
        "flash_attn": result["flash_attn"], "n_ctx": result["n_ctx"], "parallel": parallel,
        "op_offload": op_offload and ubatch >= mm.OP_OFFLOAD_MIN_BATCH,
        "warnings": warnings + [w for w in result["warnings"] if "training context" not in w],
    }
    answer["reason"] = _reason(facts, answer, used, result, baseline, mode)
    if not fits:
        raise PlanError(answer["reason"], answer)
    return answer


def _proved_pattern(facts, blocks):
    experts = sorted(n for names in facts.expert_tensors_by_block.values() for n in names)
    wanted = sorted(n for b in blocks for n in facts.expert_tensors_by_block.get(b, ()))
    if not wanted:
        return "", {"ok": True, "matched": 0, "verdict": "no tensor moves"}
    try:
        pattern = block_expert_pattern(facts.tensor_names, experts, blocks)
    except PatternError as exc:
        raise PlanError("no exact pattern for the experts of blocks %s: %s" % (_blocks_text(blocks), exc))
    check = check_pattern(pattern, facts.tensor_names, wanted, getattr(facts, "tensor_class", {}))
    if not check["ok"]:
        raise PlanError("the pattern %s does not match exactly the experts of blocks %s: %s" % (
            pattern, _blocks_text(blocks), check["verdict"]))
    return pattern, {"ok": True, "matched": len(check["matched"]), "verdict": check["verdict"]}


def _n_cpu_moe(facts, blocks):
    """The ``--n-cpu-moe N`` that moves exactly these blocks' experts, or ``None`` when none does."""
    if not blocks:
        return 0
    n = max(blocks) + 1
    return n if [b for b in facts.expert_blocks if b < n] == list(blocks) else None


def _split_text(shares):
    total = float(sum(shares))
    return ",".join(("%.3f" % (s / total)).rstrip("0").rstrip(".") or "0" for s in shares)


def _memory_report(used, result):
    gpus = []
    for gpu, entry in zip(used, result["gpus"]):
        gpus.append({"index": gpu["index"], "name": gpu["name"], "free_mib": gpu["memory_free_mib"],
                     "model_mib": entry["model_mib"], "kv_mib": entry["kv_mib"],
                     "recurrent_mib": entry["recurrent_mib"], "compute_mib": entry["compute_mib"],
                     "margin_mib": entry["margin_mib"], "total_mib": entry["total_mib"],
                     "free_after_mib": entry["free_after_mib"]})
    host = result["host"]
    return {"gpus": gpus, "host": {"model_mib": host["model_mib"], "output_mib": host["output_mib"],
                                   "mmap": host["mmap"]}}


def _reason(facts, answer, used, result, baseline, mode):
    names = " + ".join("%s (%d MiB free)" % (d["name"], d["memory_free_mib"]) for d in used)
    need = sum(e["total_mib"] for e in answer["memory"]["gpus"])
    base_need = sum(e["total"] for e in baseline["gpus"]) / float(mm.MIB)
    where = names if answer["placement"] == "single" else "%s, split %s" % (names, answer["tensor_split"])
    blocks = answer["cpu_expert_layers"]
    if not answer["fits"]:
        missing = -min(e["free_after_mib"] for e in answer["memory"]["gpus"])
        lower = []
        lower.append("ctx_size (at most %d fits with all experts on CPU)" % answer["headroom"][
            "all_experts_on_cpu"]["max_ctx_size"] if answer["headroom"]["all_experts_on_cpu"]["max_ctx_size"]
            else "ctx_size")
        if answer["memory"]["gpus"][0]["recurrent_mib"] or len(blocks) < len(facts.expert_blocks):
            lower.append("parallel")
        lower += ["cache_type_k/cache_type_v (q8_0 halves the KV cache)", "margin_mib", "ubatch"]
        sizes = facts.expert_bytes_by_block()
        copy = max([sizes.get(b, 0) for b in blocks] + [0])
        if copy and answer["op_offload"]:
            lower.append("op_offload (false, with llama-server --no-op-offload, frees the %.0f MiB the GPU reserves "
                         "to compute on host-resident experts, at the cost of slower prompt processing)"
                         % (copy / float(mm.MIB)))
        if mode != "auto" and len(blocks) < len(facts.expert_blocks):
            lower.insert(0, "mode (auto or all moves more experts)")
        return ("Does not fit on %s: with %s the plan needs %.0f MiB and %.0f MiB are missing. Lower %s, or use a "
                "larger GPU." % (where, "the experts of %d block(s) on CPU" % len(blocks) if blocks else
                                 "everything on the GPU", need, missing, ", ".join(lower)))
    if not blocks:
        return ("Everything fits on %s: the weights, the KV cache for %d tokens, the recurrent state of %d slot(s) "
                "and the compute buffer need %.0f MiB including the %d MiB margin, so no expert moves to host memory "
                "and the GPU keeps full speed." % (where, answer["n_ctx"], answer["parallel"], need,
                                                   answer["memory"]["gpus"][0]["margin_mib"]))
    total_blocks = len(facts.expert_blocks)
    if len(blocks) == total_blocks:
        head = "All routed experts (%d MoE blocks) go to host memory" % total_blocks
    else:
        head = "The routed experts of %d of the %d MoE blocks (%s) go to host memory" % (
            len(blocks), total_blocks, _blocks_text(blocks))
    if mode == "auto":
        why = "everything on the GPU would need %.0f MiB, more than %s offers" % (base_need, where)
    else:
        why = "as mode %s asks, on %s" % (mode, where)
    return ("%s: %s. With this plan the GPU side needs %.0f MiB (%.0f MiB saved); "
            "every attention, Mamba, router and shared-expert tensor stays on the GPU, and %.0f MiB of weights "
            "are read from host memory." % (head, why, need, answer["vram_saved_mib"],
                                            answer["memory"]["host"]["model_mib"]))
