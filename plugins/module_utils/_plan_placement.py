# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A placement of the model on the GPUs and the host, sized: which GPUs (one, or the layers split over several), the
blocks whose routed experts stay in host memory, the experts put on another GPU than their layer's, and what each
device then holds.

Standard library only: this runs on target hosts (Python >= 3.9). ``placements`` lists the candidates in the order
they are preferred, ``Sizer`` sizes one with the memory model (``_memory_estimate``) and chooses its blocks, and
``Candidate`` is one weighed by ``_offload_plan.plan``, with its predicted speed (``_speed_model``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import MIB, mib
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._kv_cache import N_CTX_PAD, pad
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._memory_estimate import estimate, host_layer_blocks
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_inputs import PlanError
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import MAX_PARALLEL
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_reason import split_text
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._speed_model import bandwidths, predict, speed_terms


class Sizer:
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
class Candidate:
    label: str  # single, split or cpu
    gpus: list
    shares: list | None
    sizer: Sizer
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


def placements(gpus, gpu_index, split):
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


def _free_after_mib(nbytes):
    """``free_after`` in MiB for the report and the reason: a device short by less than 0.005 MiB reads -0.01, not
    0.0, so that what the plan says agrees with the byte count it decided by."""
    value = mib(nbytes)
    return -0.01 if nbytes < 0 and value >= 0 else value
