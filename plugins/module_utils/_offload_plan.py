# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The offload decision: which GPU(s), where each block's routed experts go, and the proof.

Standard library only: this runs on target hosts (Python >= 3.9). ``plan(facts, gpus, host, options)`` takes the
inputs ``_plan_inputs`` checks and one ``_plan_options.Options``, sizes every candidate placement with the memory
model (``_memory_estimate``) and returns what ``moe_offload_plan`` reports, with its reason in words
(``_plan_reason``).

Placements: one GPU, the layers split over several GPUs (``--tensor-split`` in proportion to free memory), and that
split with the experts of chosen blocks put on a chosen GPU (``-ot 'blk\\.(...)\\.ffn_.*_exps\\.weight=CUDA1'``),
filling each card's headroom after its own layers. The plan with the fewest expert bytes in host memory wins.
Block order for ``auto``: lowest block index first, the blocks llama.cpp's ``--n-cpu-moe N`` moves.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import MIB, mib
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import CACHE_TYPES, OFFLOAD_MODES
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._kv_cache import N_CTX_PAD, pad, validate_context
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._memory_estimate import estimate, host_layer_blocks
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_facts import MemoryModelError
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_pattern import block_expert_pattern
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._pattern_check import check_pattern
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._pattern_syntax import PatternError, pattern_problem
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_inputs import (
    PlanError, normalize_gpus, normalize_host)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import GOALS, MAX_PARALLEL
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_reason import blocks_text, reason, split_text
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._speed_model import (
    SpeedModelError, bandwidths, calibrate, predict, speed_terms)

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

    def tensors(self, cpu_blocks=(), moved=None):
        """``(cpu_tensors, device_tensors)`` of a placement: the names in host memory (a user's pattern's, else the
        experts of ``cpu_blocks``) and ``{name: device position}`` of the experts of the ``moved`` blocks."""
        by_block = self.facts.expert_tensors_by_block
        if self.fixed_cpu is not None:
            cpu = self.fixed_cpu
        else:
            cpu = [n for b in cpu_blocks for n in by_block.get(b, ())]
        return cpu, dict((n, d) for b, d in (moved or {}).items() for n in by_block.get(b, ()))

    def estimate(self, cpu_blocks=(), moved=None, ctx_size=None, parallel=None):
        """``moved``: ``{block: device position}`` for experts on another GPU than their layer's."""
        cpu, device_tensors = self.tensors(cpu_blocks, moved)
        result = estimate(self.facts, self.options.at(ctx_size, parallel), cpu_tensors=cpu, split=self.split,
                          n_devices=len(self.gpus), device_tensors=device_tensors)
        for gpu, entry in zip(self.gpus, result["gpus"]):
            entry["free_after"] = int(gpu.memory_free_mib * MIB) - entry["total"]
            entry["free_after_mib"] = _free_after_mib(entry["free_after"])
        host = result["host"]
        host["available_mib"] = self.host.available_mib if self.host else None
        host["free_after"] = int(self.host.available_mib * MIB) - host["total"] if self.host else None
        host["free_after_mib"] = _free_after_mib(host["free_after"]) if self.host else None
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
    speed: dict | None = None  # _speed_model.predict's figures, set by rate()
    terms: object = None  # the _speed_model.SpeedTerms they come from

    @property
    def n_gpu_layers(self):
        """The ``-ngl`` this placement is sized for, ``None`` for every layer."""
        return self.sizer.options.n_gpu_layers

    def host_expert_bytes(self):
        sizes = self.sizer.facts.expert_bytes_by_block()
        if self.sizer.fixed_cpu is not None:
            experts = set(self.sizer.facts.expert_names)
            return sum(t.nbytes for t in self.sizer.facts.tensors if t.name in experts and t.name in
                       set(self.sizer.fixed_cpu))
        host_blocks = set(self.cpu_blocks) | set(host_layer_blocks(self.sizer.facts.block_count, self.n_gpu_layers))
        return sum(sizes.get(b, 0) for b in host_blocks)  # the experts moved and those of blocks -ngl leaves there

    def key(self, goal="fit"):
        """Fitting first, then the fewest expert bytes in host memory, the fewest overrides, one GPU, every layer on
        the GPUs; with goal ``speed`` the highest predicted decode speed of a placement that fits comes before the
        expert bytes."""
        fit_key = (self.host_expert_bytes(), len(self.moved), 0 if self.label == "single" else 1,
                   0 if self.n_gpu_layers is None else 1)
        if goal == "speed":
            fits = self.sizer.fits(self.result)
            return (not fits, -(self.speed["decode_tokens_per_second"] or 0) if fits else 0) + fit_key
        return (not self.sizer.fits(self.result),) + fit_key

    def rate(self, options, host):
        """Predict this placement's speed (``speed`` and ``terms``) at the plan's context and micro-batch."""
        cpu, device_tensors = self.sizer.tensors(self.cpu_blocks, self.moved)
        self.terms = speed_terms(self.sizer.facts, self.sizer.options, cpu, self.shares, len(self.gpus),
                                 device_tensors)  # (the sizer's options carry the candidate's -ngl)
        rates = bandwidths([g.name for g in self.gpus], options, host.bandwidth_bytes_per_second if host else None)
        self.speed = predict(self.terms, rates, ["GPU %d" % g.index for g in self.gpus])

    def summary(self, chosen):
        """What the plan reports of a candidate it weighed."""
        return {"placement": self.label, "gpu_devices": [g.index for g in self.gpus],
                "tensor_split": split_text(self.shares) if self.label == "split" else "",
                "cpu_expert_layers": list(self.cpu_blocks), "device_override_blocks": sorted(self.moved),
                "n_gpu_layers": self.n_gpu_layers, "fits": self.sizer.fits(self.result),
                "host_expert_mib": mib(self.host_expert_bytes()), "speed": dict(self.speed), "chosen": chosen}


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
        baseline = _Sizer(facts, best.gpus, best.shares, options, host_memory, fixed_cpu).estimate([])
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


def answer_terms(facts, answer, options, context_tokens=None, prompt_tokens=None):
    """``(SpeedTerms, GPU names)`` of the placement of ``answer`` (this planner's result for ``facts`` and
    ``options``) at ``context_tokens`` and ``prompt_tokens`` (``_speed_model.speed_terms``' defaults when None)."""
    names = [d["name"] for d in answer["devices"]]
    options = replace(options, n_gpu_layers=answer.get("n_gpu_layers", options.n_gpu_layers))
    positions = dict((d["index"], p) for p, d in enumerate(answer["devices"]))
    check = answer["pattern_check"]
    cpu = list(check["tensors"]) + list(check["non_expert"]) if answer["pattern"] else []
    device_tensors = dict((n, positions[o["gpu_index"]]) for o in answer["device_overrides"] for n in o["tensors"])
    shares = [float(x) for x in answer["tensor_split"].split(",")] if answer["tensor_split"] else None
    return speed_terms(facts, options, cpu, shares, len(names), device_tensors, context_tokens, prompt_tokens), names


def _measured_terms(facts, answer, options, measured):
    """``(terms, GPU names)`` of ``answer``'s placement at ``measured``'s context (the prompt and half the generated
    tokens, the mean a decoded token attends to) and prompt."""
    prompt, predicted = int(measured["prompt_tokens"]), int(measured["predicted_tokens"])
    return answer_terms(facts, answer, options, prompt + predicted // 2, prompt)


def calibration(facts, answer, options, measured, host=None, more=()):
    """The ``calibration`` input of a later plan, from the speed ``_speed_check`` measured (``measured``:
    ``decode_tokens_per_second``, ``prompt_tokens_per_second``, ``prompt_tokens``, ``predicted_tokens``) of the
    placement of ``answer`` (this planner's result for ``facts`` and ``options``; ``host``: ``host_info``'s result)
    and of the ``more`` placements (``(answer, options, measured)`` each, on the same host and model).

    Each placement's terms are taken at its measured context and prompt and ``_speed_model.calibrate`` solves the
    host's effective bandwidth (one measurement: the split cost and the overhead held, at ``options.calibration``'s
    when it has them; two placements that differ in splits: the split cost too), then the host's compute rate from
    the prompt figures. ``PlanError`` when the measurements cannot be used."""
    host_memory = normalize_host(host)
    probe = host_memory.bandwidth_bytes_per_second if host_memory else None
    try:
        rows = []
        for one_answer, one_options, one_measured in [(answer, options, measured)] + list(more):
            terms, names = _measured_terms(facts, one_answer, one_options, one_measured)
            rows.append((terms, one_measured["decode_tokens_per_second"],
                         one_measured.get("prompt_tokens_per_second"), bandwidths(names, one_options, probe)))
        rates = rows[0][3]
        solved = calibrate(rows, rates)
    except (KeyError, TypeError, ValueError) as exc:  # (SpeedModelError is a ValueError)
        raise PlanError("cannot calibrate on %r: %s" % (measured, exc)) from None
    held = {"split_seconds": (rates.sources["split"], rates.split_seconds),
            "token_seconds": (rates.sources["token"], rates.token_seconds),
            "host_flops_per_second": (rates.sources["host_flops"], rates.host_flops)}
    for key, (source, value) in held.items():
        if solved[key] is None and source == "calibrated":
            solved[key] = value
    solved = dict((k, v) for k, v in solved.items() if v is not None)
    prompt, predicted = int(measured["prompt_tokens"]), int(measured["predicted_tokens"])
    solved["measured"] = {"decode_tokens_per_second": measured["decode_tokens_per_second"],
                          "prompt_tokens_per_second": measured.get("prompt_tokens_per_second"),
                          "prompt_tokens": prompt, "predicted_tokens": predicted, "placement": answer["placement"],
                          "gpu_devices": list(answer["gpu_devices"]),
                          "cpu_expert_layers": list(answer["cpu_expert_layers"]), "ctx_size": options.ctx_size,
                          "parallel": options.parallel, "placements": 1 + len(more)}
    return solved


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
    GPUs), each with its predicted speed: ``(best, tried)``, the ``_Candidate`` that fits with the fewest expert
    bytes in host memory (goal ``speed``: with the highest predicted decode speed) and every one weighed."""
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
        if (options.goal == "speed" and used and options.mode == "auto" and fixed_cpu is None
                and options.n_gpu_layers is None and not sizer.fits(sizer.estimate([]))):
            # fewer layers with every expert beside its layer; and, when even every expert in host memory does not
            # fit, fewer layers with every expert there
            every = list(facts.expert_blocks)
            for cpu_blocks in [[]] + ([every] if every and not sizer.gpu_fits(sizer.estimate(every)) else []):
                layered = _fewer_layers(facts, used, shares, options, host_memory, cpu_blocks)
                if layered is not None:
                    tried.append(_Candidate(label, used, shares, layered, cpu_blocks, {},
                                            layered.estimate(cpu_blocks)))
    for candidate in tried:
        candidate.rate(options, host_memory)
    return min(tried, key=lambda c: c.key(options.goal)), tried


def _fewer_layers(facts, gpus, shares, options, host_memory, cpu_blocks=()):
    """The ``_Sizer`` of the most layers (``-ngl`` from ``block_count`` down to 1) that fit on ``gpus`` with the
    experts of ``cpu_blocks`` in host memory and every other expert beside its layer, the first blocks' weights, KV
    cache and recurrent state left on the host (with none moved, what users ran before ``-ot``). ``None`` when not
    even one layer fits on the GPUs (whether the host holds the rest is the candidate's ``fits``)."""
    # from the most layers down, each sized (a millisecond each): fewer layers need less memory, except where an
    # attention block reaches the host and flash attention turns off (see _memory_estimate.resolved_options)
    for layers in range(facts.block_count, 0, -1):
        trial = _Sizer(facts, gpus, shares, replace(options, n_gpu_layers=layers), host_memory)
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


def _free_after_mib(nbytes):
    """``free_after`` in MiB for the report and the reason: a device short by less than 0.005 MiB reads -0.01, not
    0.0, so that what the plan says agrees with the byte count it decided by."""
    value = mib(nbytes)
    return -0.01 if nbytes < 0 and value >= 0 else value


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
