# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The predicted speed of one placement (decode and prompt tokens per second) and its calibration against a
measured speed, from the header alone.

``speed_terms`` counts what a placement reads, without any bandwidth: per decoded token and per prompt
micro-batch, the bytes each GPU and the host read, the bytes copied over PCIe and the graph splits. ``bandwidths``
gathers the rates (a GPU's datasheet peak from ``GPU_PEAK_BANDWIDTH`` or a given figure, the host's given,
calibrated, measured by ``host_info`` or assumed, PCIe, the cost of one split). ``predict`` divides the one by the
other; ``calibrate`` solves the host's effective bandwidth (and, from placements that differ, the split cost) so that
the prediction meets what ``_speed_check`` measured. Units are explicit: bytes, bytes per second, seconds.

Decode (one token a step) is bound by memory bandwidth: each device reads its dense weights whole and, of each
routed-expert tensor, ``n_expert_used / n_expert`` of it (the router picks that many experts a token); experts kept
in host memory are computed by the CPU from host memory (llama.cpp does not copy them for a batch of one). A prompt
micro-batch of at least ``OP_OFFLOAD_MIN_BATCH`` tokens copies host-resident weights to the GPU that computes them
(ggml/src/ggml-backend.cpp ``ggml_backend_sched_backend_id_from_cur``: an op on a weight in a host buffer goes to the
first backend whose ``offload_op`` accepts it; ggml-cuda accepts from ``GGML_OP_OFFLOAD_MIN_BATCH`` = 32 tokens on),
so the prompt pays the PCIe copy of every CPU-resident expert tensor once per micro-batch. The compute of a prompt is
not counted: the prompt figure is what memory and PCIe allow, an upper bound. Standard library only: this runs on
target hosts (Python >= 3.9).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._compute_buffers import OP_OFFLOAD_MIN_BATCH
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._kv_cache import (
    cache_cells, kv_cache_bytes, recurrent_state_bytes)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._memory_estimate import is_input_tensor, tensor_places

GB = 10 ** 9  # bandwidths are quoted in decimal gigabytes per second

# Vendors' datasheet peak memory bandwidth, bytes/s, keyed by the name nvidia-smi prints (--query-gpu=name). These
# are peak figures: kernels reach less, and the calibration puts what they do not explain into the split cost.
GPU_PEAK_BANDWIDTH = {
    "NVIDIA RTX A5500": 768 * GB,
    "NVIDIA GeForce RTX 4090": 1008 * GB,
    "NVIDIA GeForce RTX 3090": 936 * GB,
    "NVIDIA A100-SXM4-80GB": 2039 * GB,
    "NVIDIA A100-PCIE-40GB": 1555 * GB,
    "NVIDIA H100 80GB HBM3": 3350 * GB,
    "NVIDIA H100 PCIe": 2000 * GB,
    "NVIDIA H200": 4800 * GB,
    "NVIDIA L40S": 864 * GB,
    "NVIDIA RTX 6000 Ada Generation": 960 * GB,
}
UNKNOWN_GPU_BANDWIDTH = 500 * GB  # assumed for a GPU the table does not name and no figure is given for
DEFAULT_PCIE_BANDWIDTH = 25 * GB  # PCIe 4.0 x16: 31.5 GB/s on the wire, about 25 GB/s in host-to-device copies
DEFAULT_HOST_BANDWIDTH = 40 * GB  # assumed effective host memory bandwidth when none is given, measured or calibrated
DEFAULT_SPLIT_SECONDS = 100e-6  # assumed cost of one graph split (a device change: a synchronisation and a copy)

# Graph splits (ggml-backend.cpp ggml_backend_sched_split_graph: a split is a run of nodes on one backend; llama.cpp
# prints their count as "graph splits"). A measured rule, from one project's sweep of --n-cpu-moe on one GPU: a
# decoded token has 4 + 2 x N splits and a prompt micro-batch 4 + 3 x N, N the blocks whose experts sit in host
# memory. Experts on another GPU than their block's add a device change there and back (2), as the CPU's do, and each
# boundary between the GPUs of a layer split adds one.
BASE_SPLITS = 4
DECODE_SPLITS_PER_CPU_BLOCK = 2
PROMPT_SPLITS_PER_CPU_BLOCK = 3  # with op offload; without it the CPU computes them as for decode (2)
SPLITS_PER_MOVED_BLOCK = 2


class SpeedModelError(ValueError):
    """Figures the speed model cannot use or a measurement it cannot be calibrated on; ``str()`` says why."""


@dataclass(frozen=True)
class SpeedTerms:
    """What one placement reads, bandwidth aside. Decode, per token: ``decode_gpu_bytes`` (one entry per GPU of the
    plan), ``decode_host_bytes``, ``decode_splits``. Prompt, per micro-batch of ``ubatch_tokens``:
    ``prompt_gpu_bytes``, ``prompt_host_bytes``, ``prompt_pcie_bytes`` (host-resident weights copied to the GPU),
    ``prompt_splits``. ``context_tokens``: the tokens of the slot's context a decoded token attends to."""

    decode_gpu_bytes: tuple
    decode_host_bytes: int
    decode_splits: int
    ubatch_tokens: int
    prompt_gpu_bytes: tuple
    prompt_host_bytes: int
    prompt_pcie_bytes: int
    prompt_splits: int
    context_tokens: int

    def as_dict(self):
        return {"decode_gpu_bytes": list(self.decode_gpu_bytes), "decode_host_bytes": self.decode_host_bytes,
                "decode_splits": self.decode_splits, "ubatch_tokens": self.ubatch_tokens,
                "prompt_gpu_bytes": list(self.prompt_gpu_bytes), "prompt_host_bytes": self.prompt_host_bytes,
                "prompt_pcie_bytes": self.prompt_pcie_bytes, "prompt_splits": self.prompt_splits,
                "context_tokens": self.context_tokens}


def expert_share(facts):
    """The share of each routed-expert tensor a token reads: ``n_expert_used / n_expert`` (1 when unknown)."""
    if facts.n_expert > 0 and 0 < facts.expert_used_count <= facts.n_expert:
        return facts.expert_used_count / float(facts.n_expert)
    return 1.0


def experts_hit(share, tokens):
    """The expected share of a block's experts that at least one of ``tokens`` tokens is routed to, each token
    choosing ``share`` of them at random: ``1 - (1 - share) ** tokens`` (real routing is skewed: fewer are hit)."""
    return 1.0 - (1.0 - share) ** tokens


def _state_rows(facts, options):
    """``(kv bytes per cell of one stream {block: bytes}, cells per stream {block: cells}, recurrent bytes of one
    slot {block: bytes})``: what a token of one slot reads of the caches."""
    cells = cache_cells(facts, options)
    per_cell, block_cells = {}, {}
    for block, nbytes in kv_cache_bytes(facts, options).items():
        block_cells[block] = cells.swa_cells if block in facts.swa_blocks else cells.cells
        per_cell[block] = nbytes / float(block_cells[block] * cells.streams)
    slots = max(1, options.parallel)
    recurrent = dict((b, n / float(slots)) for b, n in recurrent_state_bytes(facts, options.parallel).items())
    return per_cell, block_cells, recurrent


def speed_terms(facts, options, cpu_tensors=(), split=None, n_devices=1, device_tensors=None, context_tokens=None,
                prompt_tokens=None):
    """The ``SpeedTerms`` of one placement: the tensors placed as ``_memory_estimate.tensor_places`` places them,
    the server settings of ``options`` (``_plan_options.Options``).

    ``context_tokens``: the tokens in the slot's cache while it decodes (default: a full slot, the cells of one
    stream); ``prompt_tokens``: the prompt's length (default: one whole micro-batch, ``-ub``). Per decoded token a
    tensor is read whole, a routed-expert tensor for ``expert_share`` (token_embd's one row, llama.cpp's get_rows,
    is not counted), the KV cache of each attention block for ``min(context_tokens, its cells)`` cells and the
    recurrent state of one slot whole. Per prompt micro-batch a GPU reads its dense weights whole and its experts for
    ``experts_hit``; host-resident weights go over PCIe to the first GPU with op offload (and are read there), else
    the CPU reads them (experts for ``experts_hit``).
    """
    places, placement = tensor_places(facts, cpu_tensors, split, n_devices, device_tensors)
    devices = placement["devices_by_block"]
    cells = cache_cells(facts, options)
    context = min(context_tokens or cells.cells, cells.cells)
    ubatch = max(1, min(prompt_tokens or cells.ubatch, cells.ubatch))
    share = expert_share(facts)
    hit = experts_hit(share, ubatch)
    offload = bool(n_devices) and options.op_offload and ubatch >= OP_OFFLOAD_MIN_BATCH
    decode, prompt = [0.0] * n_devices, [0.0] * n_devices
    host_decode = host_prompt = pcie = 0.0
    cpu_blocks, moved_blocks = set(), set()
    for tensor, device in places:
        if device is None and is_input_tensor(tensor.name):
            continue  # get_rows reads one row of n_embd per token: a few KiB, not counted
        read = tensor.nbytes * (share if tensor.expert else 1.0)
        read_prompt = tensor.nbytes * (hit if tensor.expert else 1.0)
        if device is None:
            host_decode += read
            if tensor.block is not None:
                cpu_blocks.add(tensor.block)
            if offload:
                pcie += tensor.nbytes
                prompt[0] += tensor.nbytes
            else:
                host_prompt += read_prompt
            continue
        decode[device] += read
        prompt[device] += read_prompt
        if tensor.block is not None and tensor.block < len(devices) and devices[tensor.block] != device:
            moved_blocks.add(tensor.block)
    per_cell, block_cells, recurrent = _state_rows(facts, options)
    for block in set(per_cell) | set(recurrent):
        step = per_cell.get(block, 0) * min(context, block_cells.get(block, 0)) + recurrent.get(block, 0)
        batch = per_cell.get(block, 0) * min(ubatch, block_cells.get(block, 0)) + recurrent.get(block, 0)
        if n_devices:
            decode[devices[block]] += step
            prompt[devices[block]] += batch
        else:
            host_decode += step
            host_prompt += batch
    if n_devices:
        boundaries = len(set(devices + [placement["output_device"]])) - 1
        fixed = BASE_SPLITS + SPLITS_PER_MOVED_BLOCK * len(moved_blocks) + boundaries
        decode_splits = fixed + DECODE_SPLITS_PER_CPU_BLOCK * len(cpu_blocks)
        prompt_splits = fixed + (PROMPT_SPLITS_PER_CPU_BLOCK if offload else DECODE_SPLITS_PER_CPU_BLOCK) * len(
            cpu_blocks)
    else:
        decode_splits = prompt_splits = 0  # one backend: the graph is one split
    return SpeedTerms(tuple(int(round(b)) for b in decode), int(round(host_decode)), decode_splits, ubatch,
                      tuple(int(round(b)) for b in prompt), int(round(host_prompt)), int(round(pcie)), prompt_splits,
                      context)


# --------------------------------------------------------------------------- the rates

@dataclass(frozen=True)
class Bandwidths:
    """The rates a prediction divides by: ``gpus`` (bytes/s, one per GPU of the plan), ``host`` (bytes/s),
    ``pcie`` (bytes/s), ``split_seconds`` (one graph split), where each comes from (``sources``: ``gpus`` a list,
    ``host``, ``pcie``, ``split``) and whether a calibration gave the host's or the split's figure."""

    gpus: tuple
    host: float
    pcie: float
    split_seconds: float
    sources: dict
    calibrated: bool


def _rate(value, where):
    """A positive finite number, or ``None`` when not given; ``SpeedModelError`` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise SpeedModelError("%s must be a number > 0, got %r" % (where, value))
    return float(value)


def gpu_bandwidth(name, given=None):
    """``(bytes/s, source)`` of a GPU by the name nvidia-smi prints: ``given`` (``{name: bytes/s}``) first, then the
    datasheet table (the exact name, else the longest table name it starts with: "NVIDIA H200 NVL"), else assumed."""
    given = given or {}
    if name in given:
        return _rate(given[name], "gpu_bytes_per_second[%r]" % name), "given"
    if name in GPU_PEAK_BANDWIDTH:
        return float(GPU_PEAK_BANDWIDTH[name]), "datasheet peak of %s" % name
    prefixes = [known for known in GPU_PEAK_BANDWIDTH if name.startswith(known + " ")]
    if prefixes:
        known = max(prefixes, key=len)
        return float(GPU_PEAK_BANDWIDTH[known]), "datasheet peak of %s" % known
    return float(UNKNOWN_GPU_BANDWIDTH), "assumed: %s is not in the table" % name


def check_calibration(calibration):
    """``(host bytes/s or None, split seconds or None, measured)`` of a ``calibration`` dict (``None``: none)."""
    if calibration is None:
        return None, None, None
    if not isinstance(calibration, dict):
        raise SpeedModelError("calibration must be a dict with host_bytes_per_second and/or split_seconds, got %r"
                              % (calibration,))
    unknown = sorted(set(calibration) - {"host_bytes_per_second", "split_seconds", "measured"})
    if unknown:
        raise SpeedModelError("calibration has unknown key(s) %s (known: host_bytes_per_second, split_seconds, "
                              "measured)" % ", ".join(unknown))
    host = _rate(calibration.get("host_bytes_per_second"), "calibration.host_bytes_per_second")
    split = calibration.get("split_seconds")
    if split is not None and (isinstance(split, bool) or not isinstance(split, (int, float))
                              or not math.isfinite(split) or split < 0):
        raise SpeedModelError("calibration.split_seconds must be a number >= 0, got %r" % (split,))
    if host is None and split is None:
        raise SpeedModelError("calibration gives neither host_bytes_per_second nor split_seconds")
    return host, None if split is None else float(split), calibration.get("measured")


def bandwidths(gpu_names, options, measured_host=None):
    """The ``Bandwidths`` of a plan's GPUs (their names, in plan order) for ``options`` (``gpu_bytes_per_second``,
    ``host_bytes_per_second``, ``pcie_bytes_per_second``, ``calibration``) and ``measured_host`` (bytes/s that
    ``host_info`` measured, or ``None``). The host's figure: given, else calibrated, else measured, else assumed."""
    given = options.gpu_bytes_per_second
    if given is not None and not isinstance(given, dict):
        raise SpeedModelError("gpu_bytes_per_second must map GPU names (as nvidia-smi prints them) to bytes per "
                              "second, got %r" % (given,))
    gpus = [gpu_bandwidth(name, given) for name in gpu_names]
    calibrated_host, calibrated_split, _measured = check_calibration(options.calibration)
    host_given = _rate(options.host_bytes_per_second, "host_bytes_per_second")
    measured_host = _rate(measured_host, "the host's measured memory bandwidth")
    if host_given is not None:
        host, host_source = host_given, "given"
    elif calibrated_host is not None:
        host, host_source = calibrated_host, "calibrated"
    elif measured_host is not None:
        host, host_source = measured_host, "measured by host_info"
    else:
        host, host_source = float(DEFAULT_HOST_BANDWIDTH), "assumed"
    pcie = _rate(options.pcie_bytes_per_second, "pcie_bytes_per_second")
    split, split_source = ((calibrated_split, "calibrated") if calibrated_split is not None
                           else (DEFAULT_SPLIT_SECONDS, "assumed"))
    calibrated = host_source == "calibrated" or split_source == "calibrated"
    return Bandwidths(tuple(rate for rate, _source in gpus), host, pcie or float(DEFAULT_PCIE_BANDWIDTH), split,
                      {"gpus": [source for _rate_, source in gpus], "host": host_source,
                       "pcie": "given" if pcie else "default (PCIe 4.0 x16)", "split": split_source}, calibrated)


# --------------------------------------------------------------------------- prediction and calibration

def decode_seconds(terms, rates):
    """Seconds per decoded token: each device's bytes over its bandwidth, plus the splits."""
    return (sum(b / r for b, r in zip(terms.decode_gpu_bytes, rates.gpus)) + terms.decode_host_bytes / rates.host
            + terms.decode_splits * rates.split_seconds)


def prompt_seconds(terms, rates):
    """Seconds per prompt micro-batch: each device's bytes over its bandwidth, the PCIe copies, the splits."""
    return (sum(b / r for b, r in zip(terms.prompt_gpu_bytes, rates.gpus)) + terms.prompt_host_bytes / rates.host
            + terms.prompt_pcie_bytes / rates.pcie + terms.prompt_splits * rates.split_seconds)


def _gb(nbytes):
    return "%.2f GB" % (nbytes / float(GB))


def _rates_text(terms, rates, gpu_labels):
    parts = ["%s %s at %.0f GB/s (%s)" % (label, _gb(b), r / GB, source) for label, b, r, source in zip(
        gpu_labels, terms.decode_gpu_bytes, rates.gpus, rates.sources["gpus"])]
    if terms.decode_host_bytes or not parts:
        parts.append("host %s at %.0f GB/s (%s)" % (_gb(terms.decode_host_bytes), rates.host / GB,
                                                    rates.sources["host"]))
    return ", ".join(parts)


def predict(terms, rates, gpu_labels=None):
    """``{decode_tokens_per_second, prompt_tokens_per_second, from, calibrated}`` of ``terms`` at ``rates``."""
    labels = gpu_labels or ["GPU %d" % i for i in range(len(rates.gpus))]
    decode = decode_seconds(terms, rates)
    prompt = prompt_seconds(terms, rates)
    text = "decode reads per token %s, %d graph splits at %.0f us (%s), at a context of %d tokens; prompt: " \
        "micro-batches of %d tokens" % (_rates_text(terms, rates, labels), terms.decode_splits,
                                        rates.split_seconds * 1e6, rates.sources["split"], terms.context_tokens,
                                        terms.ubatch_tokens)
    if terms.prompt_pcie_bytes:
        text += ", %s copied over PCIe each at %.0f GB/s (%s)" % (_gb(terms.prompt_pcie_bytes), rates.pcie / GB,
                                                                 rates.sources["pcie"])
    text += ", compute not counted (an upper bound)"
    return {"decode_tokens_per_second": round(1.0 / decode, 2) if decode > 0 else None,
            "prompt_tokens_per_second": round(terms.ubatch_tokens / prompt, 1) if prompt > 0 else None,
            "from": text, "calibrated": rates.calibrated}


def calibrate(measurements, rates):
    """The host's effective bandwidth and the split cost that make the decode prediction meet measured speeds.

    ``measurements``: ``(terms, decode_tokens_per_second)`` pairs, each placement's ``SpeedTerms`` for the context
    it was measured at. Per token ``t = G + B / host + S * split`` (``G`` the GPUs' part at ``rates``, ``B`` the host
    bytes, ``S`` the splits). One measurement solves the host bandwidth with ``rates.split_seconds`` held (or, with
    nothing read from host memory, the split cost); two or more whose ``B`` and ``S`` are not in proportion solve
    both by least squares. Returns ``{host_bytes_per_second, split_seconds}`` (``None`` for a figure not solved);
    ``SpeedModelError`` when the measurements cannot give a positive figure."""
    rows = []
    for terms, measured in measurements:
        rate = _rate(measured, "the measured decode_tokens_per_second")
        gpu_part = sum(b / r for b, r in zip(terms.decode_gpu_bytes, rates.gpus))
        rows.append((float(terms.decode_host_bytes), float(terms.decode_splits), 1.0 / rate - gpu_part, rate))
    if not rows:
        raise SpeedModelError("no measurement to calibrate on")
    bb = sum(b * b for b, _s, _r, _m in rows)
    ss = sum(s * s for _b, s, _r, _m in rows)
    bs = sum(b * s for b, s, _r, _m in rows)
    det = bb * ss - bs * bs
    if len(rows) > 1 and bb and ss and det > 1e-9 * bb * ss:
        inverse = (ss * sum(b * r for b, _s, r, _m in rows) - bs * sum(s * r for _b, s, r, _m in rows)) / det
        split = (bb * sum(s * r for _b, s, r, _m in rows) - bs * sum(b * r for b, _s, r, _m in rows)) / det
        if inverse <= 0 or split < 0:
            raise SpeedModelError("the measurements give no positive host bandwidth and split cost (1/host %.3g "
                                  "s/byte, split %.3g s): they do not follow the model's terms" % (inverse, split))
        return {"host_bytes_per_second": round(1.0 / inverse), "split_seconds": split}
    if bb:
        rest = sum(b * (r - s * rates.split_seconds) for b, s, r, _m in rows)
        if rest <= 0:
            raise SpeedModelError("measured %.2f tokens/s is faster than the GPUs and %d split(s) of %.0f us alone "
                                  "allow: no host bandwidth explains it" % (
                                      rows[0][3], rows[0][1], rates.split_seconds * 1e6))
        return {"host_bytes_per_second": round(bb / rest), "split_seconds": None}
    if ss:
        split = sum(s * r for _b, s, r, _m in rows) / ss
        if split <= 0:
            raise SpeedModelError("measured %.2f tokens/s is faster than the GPUs' bandwidth alone allows"
                                  % rows[0][3])
        return {"host_bytes_per_second": None, "split_seconds": split}
    raise SpeedModelError("the placement reads nothing from host memory and has no graph split: nothing to calibrate")
