# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The offload decision: which GPU(s), where each block's routed experts go, and the proof.

Standard library only: this runs on target hosts (Python >= 3.9). ``plan(facts, gpus, host, options)`` takes the
inputs ``_plan_inputs`` checks and one ``_plan_options.Options``, sizes every candidate placement
(``_plan_placement``) with the memory model (``_memory_estimate``) and returns what ``moe_offload_plan`` reports,
with its reason in words (``_plan_reason``). A later plan's calibration from a measured speed: ``_plan_calibration``.

Placements: one GPU, the layers split over several GPUs (``--tensor-split`` in proportion to free memory), and that
split with the experts of chosen blocks put on a chosen GPU (``-ot 'blk\\.(...)\\.ffn_.*_exps\\.weight=CUDA1'``),
filling each card's headroom after its own layers. The plan with the fewest expert bytes in host memory wins.
Block order for ``auto``: lowest block index first, the blocks llama.cpp's ``--n-cpu-moe N`` moves.
"""

from __future__ import annotations

import re
from dataclasses import replace

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import mib
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import CACHE_TYPES, OFFLOAD_MODES
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._kv_cache import validate_context
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_facts import MemoryModelError
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_pattern import block_expert_pattern
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._pattern_check import check_pattern
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._pattern_syntax import PatternError, pattern_problem
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_inputs import PlanError, normalize_gpus, normalize_host
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import GOALS
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_placement import Candidate, Sizer, placements
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_reason import blocks_text, reason, split_text
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._speed_model import SpeedModelError

# Device names of llama.cpp's backends: CUDA<n> numbers the GPUs the container sees, in order.
DEVICE_PREFIX = {"cuda": "CUDA", "vulkan": "Vulkan", "rpc": "RPC", "cpu": "CPU"}


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
    if options.goal not in GOALS:
        raise PlanError("unknown goal %r (one of %s)" % (options.goal, ", ".join(GOALS)))
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
                    ", ".join(str(b) for b in wrong), blocks_text(facts.expert_blocks)))
        elif (isinstance(cpu_expert_layers, bool) or not isinstance(cpu_expert_layers, int) or cpu_expert_layers < 0
              or cpu_expert_layers > len(facts.expert_blocks)):
            raise PlanError("cpu_expert_layers must be a count from 0 to %d (the MoE blocks) or a list of block "
                            "indices, got %r" % (len(facts.expert_blocks), cpu_expert_layers))
    elif cpu_expert_layers is not None:
        raise PlanError("cpu_expert_layers only goes with mode layers")
    if mode in ("all", "layers") and facts.dense:
        raise PlanError("the model has no routed experts: there is nothing to move (use mode none or auto)")
    return []


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
    devices = normalize_gpus(gpus, options.gpu_devices, options)
    host_memory = normalize_host(host)
    options = _layers_option(facts, options)
    warnings = list(facts.warnings)
    warnings += _check_options(facts, options)
    user_check, fixed_cpu = _user_pattern(facts, options.pattern, warnings)
    try:
        best, tried = _best_candidate(facts, devices, host_memory, options, fixed_cpu)
        sizer, blocks, moved = best.sizer, best.cpu_blocks, best.moved
        # what the GPUs would hold with every expert beside its layer, at the -ngl asked for
        baseline = Sizer(facts, best.gpus, best.shares, options, host_memory, fixed_cpu).estimate([])
        headroom = {"this_plan": sizer.largest(blocks, moved, options.ctx_size, options.parallel),
                    "all_experts_on_cpu": sizer.largest(facts.expert_blocks, {}, options.ctx_size, options.parallel)}
    except (MemoryModelError, SpeedModelError) as exc:
        raise PlanError(str(exc), {"warnings": warnings}) from None
    answer = _answer(facts, best, baseline, headroom, options, user_check)
    answer["candidates"] = [c.summary(c is best) for c in tried]
    answer["warnings"] = warnings + [w for w in best.result["warnings"] if "training context" not in w]
    if options.flash and not best.result["flash_attn"]:
        answer["warnings"].append(
            "with -ngl %d and flash_attn auto llama.cpp turns flash attention off (it runs the attention of a block "
            "left on the host on the GPU): the plan is sized without it" % best.n_gpu_layers)
    answer["reason"] = reason(facts, answer, best, baseline, host_memory, options, tried)
    if not answer["fits"]:
        answer["reason"] += _layers_hint(facts, best, options, host_memory, fixed_cpu)
        raise PlanError(answer["reason"], answer)
    return answer


def _layers_hint(facts, best, options, host_memory, fixed_cpu):
    """For a plan of goal fit that does not fit: the fewer layers on the GPUs that goal speed would weigh and that
    fit, in a sentence; ``""`` when none does or goal speed would weigh none."""
    if options.goal != "fit" or not best.gpus or options.mode != "auto" or fixed_cpu is not None or \
            options.n_gpu_layers is not None:
        return ""
    for cpu_blocks in ([], list(facts.expert_blocks)):
        layered = _fewer_layers(facts, best.gpus, best.shares, options, host_memory, cpu_blocks)
        if layered is not None and layered.fits(layered.estimate(cpu_blocks)):
            return " Fewer layers on the GPU fit: goal speed weighs them (-ngl %d%s)." % (
                layered.options.n_gpu_layers, " with every expert in host memory" if cpu_blocks else "")
    return ""


def _layers_option(facts, options):
    """``options`` with ``n_gpu_layers`` ``None`` when it offloads every layer (the blocks and the output layer);
    ``PlanError`` for a count that is not one."""
    layers = options.n_gpu_layers
    if layers is None:
        return options
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 0:
        raise PlanError("n_gpu_layers must be a count of layers >= 0, got %r" % (layers,))
    return replace(options, n_gpu_layers=None) if layers > facts.block_count else options


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
    GPUs), each with its predicted speed: ``(best, tried)``, the ``Candidate`` that fits with the fewest expert
    bytes in host memory (goal ``speed``: with the highest predicted decode speed) and every one weighed."""
    tried = []
    for label, used, shares in placements(devices, options.gpu_index, options.split):
        sizer = Sizer(facts, used, shares, options, host_memory, fixed_cpu)
        blocks = _blocks_of(facts, fixed_cpu) if fixed_cpu is not None else sizer.choose_blocks(
            options.mode, options.cpu_expert_layers)
        tried.append(Candidate(label, used, shares, sizer, blocks, {}, sizer.estimate(blocks)))
        if label == "split" and options.mode == "auto" and fixed_cpu is None and options.experts_per_gpu and blocks:
            filled = sizer.fill_gpus()
            if filled is not None:
                cpu_blocks, moved = filled
                tried.append(Candidate(label, used, shares, sizer, cpu_blocks, moved,
                                       sizer.estimate(cpu_blocks, moved)))
        if (options.goal == "speed" and used and options.mode == "auto" and fixed_cpu is None
                and options.n_gpu_layers is None and not sizer.fits(sizer.estimate([]))):
            # fewer layers with every expert beside its layer; and, when even every expert in host memory does not
            # fit, fewer layers with every expert there
            every = list(facts.expert_blocks)
            for cpu_blocks in [[]] + ([every] if every and not sizer.gpu_fits(sizer.estimate(every)) else []):
                layered = _fewer_layers(facts, used, shares, options, host_memory, cpu_blocks)
                if layered is not None:
                    tried.append(Candidate(label, used, shares, layered, cpu_blocks, {},
                                           layered.estimate(cpu_blocks)))
    for candidate in tried:
        candidate.rate(options, host_memory)
    return min(tried, key=lambda c: c.key(options.goal)), tried


def _fewer_layers(facts, gpus, shares, options, host_memory, cpu_blocks=()):
    """The ``Sizer`` of the most layers (``-ngl`` from ``block_count`` down to 1) that fit on ``gpus`` with the
    experts of ``cpu_blocks`` in host memory and every other expert beside its layer, the first blocks' weights, KV
    cache and recurrent state left on the host (with none moved, what users ran before ``-ot``). ``None`` when not
    even one layer fits on the GPUs (whether the host holds the rest is the candidate's ``fits``)."""
    # from the most layers down, each sized (a millisecond each): fewer layers need less memory, except where an
    # attention block reaches the host and flash attention turns off (see _memory_estimate.resolved_options)
    for layers in range(facts.block_count, 0, -1):
        trial = Sizer(facts, gpus, shares, replace(options, n_gpu_layers=layers), host_memory)
        if trial.gpu_fits(trial.estimate(cpu_blocks)):
            return trial
    return None


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
        "devices": [{"device": n, "index": g.index, "uuid": g.uuid, "name": g.name, "pci_bus_id": g.pci_bus_id} for g, n in zip(best.gpus, names)],
        "memory": _memory_report(best.gpus, result), "fits": sizer.fits(result),
        "vram_saved_mib": mib(sum(e["total"] for e in baseline["gpus"]) - sum(e["total"] for e in result["gpus"])),
        "headroom": headroom, "placement": best.label,
        "tensor_split": split_text(best.shares) if best.label == "split" else "",
        "visible_devices": ",".join(str(d.uuid or d.index) for d in best.gpus),
        "gpu_devices": [d.index for d in best.gpus], "pattern_check": proof,
        "kv_cache": _kv_report(facts, result["cells"]), "n_ctx": result["n_ctx"],
        "speed": dict(best.speed, terms=best.terms.as_dict()), "goal": options.goal,
        "n_gpu_layers": best.n_gpu_layers,
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
        raise PlanError("no exact pattern for the experts of blocks %s: %s" % (blocks_text(blocks), exc)) from None
    check = check_pattern(pattern, facts.tensor_names, wanted, facts.tensor_class)
    if not check["ok"]:
        raise PlanError("the pattern %s does not match exactly the experts of blocks %s: %s" % (
            pattern, blocks_text(blocks), check["verdict"]))
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
