# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The predicted speed of one placement (decode and prompt tokens per second) and its calibration against a
measured speed, from the header alone.

``speed_terms`` counts what a placement reads and computes, without any rate: per decoded token and per prompt
micro-batch, the bytes each GPU and the host read, the bytes copied over PCIe, the graph splits and, per prompt
micro-batch, the floating-point operations each device computes. ``bandwidths`` gathers the rates (a GPU's datasheet
peak bandwidth from ``GPU_PEAK_BANDWIDTH`` and compute rate from ``GPU_PEAK_FLOPS`` or given figures; the host's
bandwidth given, calibrated, measured by ``host_info`` or assumed, its compute rate given, calibrated or assumed;
PCIe; the cost of one split; a fixed overhead per graph evaluation). ``predict`` divides the one by the other;
``calibrate`` solves the host's effective bandwidth (and, from placements that differ, the split cost and the
overhead) from measured decode speeds, then the host's compute rate from measured prompt speeds, so that the
prediction meets what ``_speed_check`` measured. Units are explicit: bytes, bytes per second, FLOP, FLOP per second,
seconds.

Decode (one token a step) is bound by memory bandwidth: each device reads its dense weights whole and, of each
routed-expert tensor, ``n_expert_used / n_expert`` of it (the router picks that many experts a token); experts kept
in host memory are computed by the CPU from host memory (llama.cpp does not copy them for a batch of one). A prompt
micro-batch of at least ``OP_OFFLOAD_MIN_BATCH`` tokens copies host-resident weights to the GPU that computes them
(ggml/src/ggml-backend.cpp ``ggml_backend_sched_backend_id_from_cur``: an op on a weight in a host buffer goes to the
first backend whose ``offload_op`` accepts it; ggml-cuda accepts from ``GGML_OP_OFFLOAD_MIN_BATCH`` = 32 tokens on),
so the prompt pays the PCIe copy of every CPU-resident expert tensor once per micro-batch. A prompt micro-batch is
also bound by compute: its matrix products (ggml_mul_mat for a dense weight, ggml_mul_mat_id for the routed experts,
``2 x rows x columns`` FLOP a token a weight matrix: a multiply and an add per element) over the device's compute
rate. Decode is not charged compute (one token a step reads each weight once: memory bound), but pays a fixed
overhead per graph evaluation (building and scheduling the graph, sampling), which is what a model too small to be
bandwidth-bound is made of. Standard library only: this runs on target hosts (Python >= 3.9).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._compute_buffers import OP_OFFLOAD_MIN_BATCH
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._gpu_specs import (  # noqa: F401 (GB, TFLOPS: users)
    GB, GPU_PEAK_BANDWIDTH, GPU_PEAK_FLOPS, TFLOPS, UNKNOWN_GPU_BANDWIDTH, UNKNOWN_GPU_FLOPS)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._kv_cache import (
    cache_cells, kv_cache_bytes, recurrent_state_bytes)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._memory_estimate import is_input_tensor, tensor_places

DEFAULT_PCIE_BANDWIDTH = 25 * GB  # PCIe 4.0 x16: 31.5 GB/s on the wire, about 25 GB/s in host-to-device copies
DEFAULT_HOST_BANDWIDTH = 40 * GB  # assumed effective host memory bandwidth when none is given, measured or calibrated
DEFAULT_SPLIT_SECONDS = 100e-6  # assumed cost of one graph split (a device change: a synchronisation and a copy)
# Assumed fixed cost of one graph evaluation (a decoded token or a prompt micro-batch: graph build, scheduling,
# sampling). No figure is derived for it: at 0 it is folded into the host bandwidth a calibration solves, until
# measurements enough to tell it apart (three placements, see calibrate) calibrate it.
DEFAULT_TOKEN_SECONDS = 0.0

# Assumed effective host compute rate (FLOP/s) of llama.cpp's CPU matrix products when none is given or calibrated:
# a few cores of 256-bit FMA (16 FP32 FLOP a cycle each at about 3 GHz) at a fraction of their peak.
DEFAULT_HOST_FLOPS = 100 * 10 ** 9
OUTPUT_TENSOR = "output.weight"  # the logits' matrix product runs only for the tokens that want logits

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
    """What one placement reads and computes, rates aside. Decode, per token: ``decode_gpu_bytes`` (one entry per GPU
    of the plan), ``decode_host_bytes``, ``decode_splits``. Prompt, per micro-batch of ``ubatch_tokens``:
    ``prompt_gpu_bytes``, ``prompt_host_bytes``, ``prompt_pcie_bytes`` (host-resident weights copied to the GPU),
    ``prompt_splits``, ``prompt_gpu_flops`` (one entry per GPU) and ``prompt_host_flops`` (FLOP of the matrix
    products each computes). ``context_tokens``: the tokens of the slot's context a decoded token attends to."""

    decode_gpu_bytes: tuple
    decode_host_bytes: int
    decode_splits: int
    ubatch_tokens: int
    prompt_gpu_bytes: tuple
    prompt_host_bytes: int
    prompt_pcie_bytes: int
    prompt_splits: int
    context_tokens: int
    prompt_gpu_flops: tuple = ()
    prompt_host_flops: int = 0

    def as_dict(self):
        return {"decode_gpu_bytes": list(self.decode_gpu_bytes), "decode_host_bytes": self.decode_host_bytes,
                "decode_splits": self.decode_splits, "ubatch_tokens": self.ubatch_tokens,
                "prompt_gpu_bytes": list(self.prompt_gpu_bytes), "prompt_host_bytes": self.prompt_host_bytes,
                "prompt_pcie_bytes": self.prompt_pcie_bytes, "prompt_splits": self.prompt_splits,
                "context_tokens": self.context_tokens, "prompt_gpu_flops": list(self.prompt_gpu_flops),
                "prompt_host_flops": self.prompt_host_flops}


def expert_share(facts):
    """The share of each routed-expert tensor a token reads: ``n_expert_used / n_expert`` (1 when unknown)."""
    if facts.n_expert > 0 and 0 < facts.expert_used_count <= facts.n_expert:
        return facts.expert_used_count / float(facts.n_expert)
    return 1.0


def experts_hit(share, tokens):
    """The expected share of a block's experts that at least one of ``tokens`` tokens is routed to, each token
    choosing ``share`` of them at random: ``1 - (1 - share) ** tokens`` (real routing is skewed: fewer are hit)."""
    return 1.0 - (1.0 - share) ** tokens


def matmul_flops(tensor, tokens, share):
    """FLOP of ``tokens`` tokens through the matrix products of ``tensor`` (``TensorFacts``): ``2 x rows x columns``
    a token for a weight matrix of at least two dimensions (ggml_mul_mat; a routed-expert tensor, ggml_mul_mat_id,
    for ``share`` of its experts); 0 for a vector (a norm or bias: element-wise, not counted) and for the token
    embedding (get_rows copies a row). The output matrix runs for one token a micro-batch: the prompt's logits are
    computed for its last token only."""
    if len(tensor.shape) < 2 or is_input_tensor(tensor.name):
        return 0.0
    elements = 1
    for dim in tensor.shape:
        elements *= dim
    used = 1 if tensor.name == OUTPUT_TENSOR else tokens
    return 2.0 * elements * (share if tensor.expert else 1.0) * used


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
    ``experts_hit``; host-resident weights go over PCIe to the first GPU with op offload (and are read and computed
    there), else the CPU reads them (experts for ``experts_hit``) and computes them. The FLOP of each tensor are
    ``matmul_flops`` for the micro-batch's tokens.
    """
    places, placement = tensor_places(facts, cpu_tensors, split, n_devices, device_tensors, options.n_gpu_layers)
    devices = placement["devices_by_block"]
    cells = cache_cells(facts, options)
    context = min(context_tokens or cells.cells, cells.cells)
    ubatch = max(1, min(prompt_tokens or cells.ubatch, cells.ubatch))
    share = expert_share(facts)
    hit = experts_hit(share, ubatch)
    offload = bool(n_devices) and options.op_offload and ubatch >= OP_OFFLOAD_MIN_BATCH
    decode, prompt, flops = [0.0] * n_devices, [0.0] * n_devices, [0.0] * n_devices
    host_decode = host_prompt = pcie = host_flops = 0.0
    cpu_blocks, moved_blocks = set(), set()
    for tensor, device in places:
        if device is None and is_input_tensor(tensor.name):
            continue  # get_rows reads one row of n_embd per token: a few KiB, not counted
        read = tensor.nbytes * (share if tensor.expert else 1.0)
        read_prompt = tensor.nbytes * (hit if tensor.expert else 1.0)
        work = matmul_flops(tensor, ubatch, share)
        if device is None:
            host_decode += read
            if tensor.block is not None:
                cpu_blocks.add(tensor.block)
            if offload:
                pcie += tensor.nbytes
                prompt[0] += tensor.nbytes
                flops[0] += work
            else:
                host_prompt += read_prompt
                host_flops += work
            continue
        decode[device] += read
        prompt[device] += read_prompt
        flops[device] += work
        if tensor.block is not None and tensor.block < len(devices) and devices[tensor.block] != device:
            moved_blocks.add(tensor.block)
    per_cell, block_cells, recurrent = _state_rows(facts, options)
    for block in set(per_cell) | set(recurrent):
        step = per_cell.get(block, 0) * min(context, block_cells.get(block, 0)) + recurrent.get(block, 0)
        batch = per_cell.get(block, 0) * min(ubatch, block_cells.get(block, 0)) + recurrent.get(block, 0)
        if n_devices and devices[block] is not None:
            decode[devices[block]] += step
            prompt[devices[block]] += batch
        else:
            host_decode += step
            host_prompt += batch
    if n_devices:
        # the blocks -ngl leaves on the host run first, on the CPU beside the input layer: they add no device
        # change of their own for decode; with op offload a prompt's products of their weights go to the GPU
        host_blocks = set(b for b, d in enumerate(devices) if d is None)
        boundaries = len(set(d for d in devices + [placement["output_device"]] if d is not None)) - 1
        cpu_blocks -= host_blocks
        fixed = BASE_SPLITS + SPLITS_PER_MOVED_BLOCK * len(moved_blocks) + boundaries
        decode_splits = fixed + DECODE_SPLITS_PER_CPU_BLOCK * len(cpu_blocks)
        prompt_splits = fixed + (PROMPT_SPLITS_PER_CPU_BLOCK if offload else DECODE_SPLITS_PER_CPU_BLOCK) * len(
            cpu_blocks) + (PROMPT_SPLITS_PER_CPU_BLOCK * len(host_blocks) if offload else 0)
    else:
        decode_splits = prompt_splits = 0  # one backend: the graph is one split
    return SpeedTerms(tuple(int(round(b)) for b in decode), int(round(host_decode)), decode_splits, ubatch,
                      tuple(int(round(b)) for b in prompt), int(round(host_prompt)), int(round(pcie)), prompt_splits,
                      context, tuple(int(round(f)) for f in flops), int(round(host_flops)))


# --------------------------------------------------------------------------- the rates

@dataclass(frozen=True)
class Bandwidths:
    """The rates a prediction divides by: ``gpus`` (bytes/s, one per GPU of the plan), ``host`` (bytes/s),
    ``pcie`` (bytes/s), ``split_seconds`` (one graph split), ``gpu_flops`` (FLOP/s, one per GPU), ``host_flops``
    (FLOP/s), ``token_seconds`` (the fixed cost of one graph evaluation), where each comes from (``sources``:
    ``gpus`` and ``gpu_flops`` lists, ``host``, ``pcie``, ``split``, ``host_flops``, ``token``), whether a
    calibration gave the host's bandwidth, the split or the overhead figure (``calibrated``) and the host's compute
    rate (``prompt_calibrated``)."""

    gpus: tuple
    host: float
    pcie: float
    split_seconds: float
    sources: dict
    calibrated: bool
    gpu_flops: tuple = ()
    host_flops: float = float(DEFAULT_HOST_FLOPS)
    token_seconds: float = DEFAULT_TOKEN_SECONDS
    prompt_calibrated: bool = False


def _rate(value, where):
    """A positive finite number, or ``None`` when not given; ``SpeedModelError`` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise SpeedModelError("%s must be a number > 0, got %r" % (where, value))
    return float(value)


def _seconds(value, where):
    """A finite number >= 0, or ``None`` when not given; ``SpeedModelError`` otherwise."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not math.isfinite(value) or value < 0):
        raise SpeedModelError("%s must be a number >= 0, got %r" % (where, value))
    return None if value is None else float(value)


def _gpu_rate(name, given, table, unknown, option):
    """``(rate, source)`` of a GPU by the name nvidia-smi prints: ``given`` (``{name: rate}``, the option
    ``option``) first, then ``table`` (``_gpu_specs``: the exact name, never a prefix, which would read a 3090 Ti as
    a 3090), else ``unknown``, assumed."""
    given = given or {}
    if name in given:
        return _rate(given[name], "%s[%r]" % (option, name)), "given"
    if name in table:
        return float(table[name]), "datasheet peak of %s" % name
    return float(unknown), "assumed: %s is not in the table" % name


def gpu_bandwidth(name, given=None):
    """``(bytes/s, source)`` of a GPU: ``given`` (``{name: bytes/s}``), else ``GPU_PEAK_BANDWIDTH``, else assumed."""
    return _gpu_rate(name, given, GPU_PEAK_BANDWIDTH, UNKNOWN_GPU_BANDWIDTH, "gpu_bytes_per_second")


def gpu_flops(name, given=None):
    """``(FLOP/s, source)`` of a GPU: ``given`` (``{name: FLOP/s}``), else ``GPU_PEAK_FLOPS``, else assumed."""
    return _gpu_rate(name, given, GPU_PEAK_FLOPS, UNKNOWN_GPU_FLOPS, "gpu_flops_per_second")


CALIBRATION_KEYS = ("host_bytes_per_second", "split_seconds", "token_seconds", "host_flops_per_second", "measured")


def check_calibration(calibration):
    """``{host_bytes_per_second, split_seconds, token_seconds, host_flops_per_second, measured}`` of a
    ``calibration`` dict (each ``None`` when not given; all ``None`` for no calibration)."""
    if calibration is None:
        return dict.fromkeys(CALIBRATION_KEYS)
    if not isinstance(calibration, dict):
        raise SpeedModelError("calibration must be a dict with host_bytes_per_second, split_seconds, token_seconds "
                              "and/or host_flops_per_second, got %r" % (calibration,))
    unknown = sorted(set(calibration) - set(CALIBRATION_KEYS))
    if unknown:
        raise SpeedModelError("calibration has unknown key(s) %s (known: %s)" % (
            ", ".join(unknown), ", ".join(CALIBRATION_KEYS)))
    found = {"host_bytes_per_second": _rate(calibration.get("host_bytes_per_second"),
                                            "calibration.host_bytes_per_second"),
             "split_seconds": _seconds(calibration.get("split_seconds"), "calibration.split_seconds"),
             "token_seconds": _seconds(calibration.get("token_seconds"), "calibration.token_seconds"),
             "host_flops_per_second": _rate(calibration.get("host_flops_per_second"),
                                            "calibration.host_flops_per_second"),
             "measured": calibration.get("measured")}
    if all(found[k] is None for k in CALIBRATION_KEYS[:4]):
        raise SpeedModelError("calibration gives none of host_bytes_per_second, split_seconds, token_seconds and "
                              "host_flops_per_second")
    return found


def _gpu_table(name_of_option, given):
    if given is not None and not isinstance(given, dict):
        raise SpeedModelError("%s must map GPU names (as nvidia-smi prints them) to a rate, got %r"
                              % (name_of_option, given))
    return given


def bandwidths(gpu_names, options, measured_host=None):
    """The ``Bandwidths`` of a plan's GPUs (their names, in plan order) for ``options`` (``gpu_bytes_per_second``,
    ``gpu_flops_per_second``, ``host_bytes_per_second``, ``host_flops_per_second``, ``pcie_bytes_per_second``,
    ``calibration``) and ``measured_host`` (bytes/s that ``host_info`` measured, or ``None``). The host's bandwidth:
    given, else calibrated, else measured, else assumed; its compute rate: given, else calibrated, else assumed."""
    gpus = [gpu_bandwidth(name, _gpu_table("gpu_bytes_per_second", options.gpu_bytes_per_second))
            for name in gpu_names]
    compute = [gpu_flops(name, _gpu_table("gpu_flops_per_second", options.gpu_flops_per_second))
               for name in gpu_names]
    calibrated = check_calibration(options.calibration)
    host_given = _rate(options.host_bytes_per_second, "host_bytes_per_second")
    measured_host = _rate(measured_host, "the host's measured memory bandwidth")
    if host_given is not None:
        host, host_source = host_given, "given"
    elif calibrated["host_bytes_per_second"] is not None:
        host, host_source = calibrated["host_bytes_per_second"], "calibrated"
    elif measured_host is not None:
        host, host_source = measured_host, "measured by host_info"
    else:
        host, host_source = float(DEFAULT_HOST_BANDWIDTH), "assumed"
    flops_given = _rate(options.host_flops_per_second, "host_flops_per_second")
    if flops_given is not None:
        flops, flops_source = flops_given, "given"
    elif calibrated["host_flops_per_second"] is not None:
        flops, flops_source = calibrated["host_flops_per_second"], "calibrated"
    else:
        flops, flops_source = float(DEFAULT_HOST_FLOPS), "assumed"
    pcie = _rate(options.pcie_bytes_per_second, "pcie_bytes_per_second")
    split, split_source = ((calibrated["split_seconds"], "calibrated") if calibrated["split_seconds"] is not None
                           else (DEFAULT_SPLIT_SECONDS, "assumed"))
    token, token_source = ((calibrated["token_seconds"], "calibrated") if calibrated["token_seconds"] is not None
                           else (DEFAULT_TOKEN_SECONDS, "assumed"))
    return Bandwidths(tuple(rate for rate, _source in gpus), host, pcie or float(DEFAULT_PCIE_BANDWIDTH), split,
                      {"gpus": [source for _rate_, source in gpus], "host": host_source,
                       "pcie": "given" if pcie else "default (PCIe 4.0 x16)", "split": split_source,
                       "gpu_flops": [source for _rate_, source in compute], "host_flops": flops_source,
                       "token": token_source},
                      "calibrated" in (host_source, split_source, token_source),
                      tuple(rate for rate, _source in compute), flops, token, flops_source == "calibrated")


# --------------------------------------------------------------------------- prediction and calibration

def decode_seconds(terms, rates):
    """Seconds per decoded token: each device's bytes over its bandwidth, the splits, the fixed overhead."""
    return (sum(b / r for b, r in zip(terms.decode_gpu_bytes, rates.gpus)) + terms.decode_host_bytes / rates.host
            + terms.decode_splits * rates.split_seconds + rates.token_seconds)


def _prompt_memory_seconds(terms, rates):
    """Seconds per prompt micro-batch the host's compute aside: bytes over bandwidths, the PCIe copies, the GPUs'
    FLOP over their compute rates, the splits, the fixed overhead."""
    return (sum(b / r for b, r in zip(terms.prompt_gpu_bytes, rates.gpus)) + terms.prompt_host_bytes / rates.host
            + terms.prompt_pcie_bytes / rates.pcie + terms.prompt_splits * rates.split_seconds + rates.token_seconds
            + sum(f / r for f, r in zip(terms.prompt_gpu_flops, rates.gpu_flops)))


def prompt_seconds(terms, rates):
    """Seconds per prompt micro-batch: each device's bytes over its bandwidth and FLOP over its compute rate, the
    PCIe copies, the splits and the fixed overhead."""
    return _prompt_memory_seconds(terms, rates) + terms.prompt_host_flops / rates.host_flops


def _gb(nbytes):
    return "%.2f GB" % (nbytes / float(GB))


def _rates_text(terms, rates, gpu_labels):
    parts = ["%s %s at %.0f GB/s (%s)" % (label, _gb(b), r / GB, source) for label, b, r, source in zip(
        gpu_labels, terms.decode_gpu_bytes, rates.gpus, rates.sources["gpus"])]
    if terms.decode_host_bytes or not parts:
        parts.append("host %s at %.0f GB/s (%s)" % (_gb(terms.decode_host_bytes), rates.host / GB,
                                                    rates.sources["host"]))
    return ", ".join(parts)


def _compute_text(terms, rates, gpu_labels):
    parts = ["%s %.3g GFLOP at %.1f TFLOP/s (%s)" % (label, f / 1e9, r / TFLOPS, source) for label, f, r, source in
             zip(gpu_labels, terms.prompt_gpu_flops, rates.gpu_flops, rates.sources["gpu_flops"]) if f]
    if terms.prompt_host_flops or not parts:
        parts.append("host %.3g GFLOP at %.0f GFLOP/s (%s)" % (
            terms.prompt_host_flops / 1e9, rates.host_flops / 1e9, rates.sources["host_flops"]))
    return ", ".join(parts)


def predict(terms, rates, gpu_labels=None):
    """``{decode_tokens_per_second, prompt_tokens_per_second, from, calibrated, prompt_calibrated}`` of ``terms``
    at ``rates``: ``calibrated`` when a calibration gave the host's bandwidth, the split cost or the overhead,
    ``prompt_calibrated`` when it gave the host's compute rate (a prompt figure on an assumed one is not)."""
    labels = gpu_labels or ["GPU %d" % i for i in range(len(rates.gpus))]
    decode = decode_seconds(terms, rates)
    prompt = prompt_seconds(terms, rates)
    text = "decode reads per token %s, %d graph splits at %.0f us (%s), %.0f us overhead a graph evaluation (%s), " \
        "at a context of %d tokens; prompt: micro-batches of %d tokens" % (
            _rates_text(terms, rates, labels), terms.decode_splits, rates.split_seconds * 1e6, rates.sources["split"],
            rates.token_seconds * 1e6, rates.sources["token"], terms.context_tokens, terms.ubatch_tokens)
    if terms.prompt_pcie_bytes:
        text += ", %s copied over PCIe each at %.0f GB/s (%s)" % (
            _gb(terms.prompt_pcie_bytes), rates.pcie / GB, rates.sources["pcie"])
    text += ", computing %s" % _compute_text(terms, rates, labels)
    return {"decode_tokens_per_second": round(1.0 / decode, 2) if decode > 0 else None,
            "prompt_tokens_per_second": round(terms.ubatch_tokens / prompt, 1) if prompt > 0 else None,
            "from": text, "calibrated": rates.calibrated,
            "prompt_calibrated": rates.prompt_calibrated}


# The figures a set of decode measurements can solve, in the order they are taken: the host's bandwidth (as its
# inverse, seconds a byte), the split cost, the overhead. n measurements solve the first n whose column is not all 0.
_UNKNOWNS = ("host_bytes_per_second", "split_seconds", "token_seconds")


def _solve(matrix, vector):
    """The least-squares solution of ``matrix x = vector`` (rows of floats), by the normal equations and Gaussian
    elimination with partial pivoting on columns scaled to unit length; ``None`` when the columns are (close to)
    linearly dependent."""
    n = len(matrix[0])
    norms = [math.sqrt(sum(row[j] ** 2 for row in matrix)) for j in range(n)]
    scaled = [[row[j] / norms[j] for j in range(n)] for row in matrix]
    gram = [[sum(row[i] * row[j] for row in scaled) for j in range(n)]
            + [sum(row[i] * v for row, v in zip(scaled, vector))] for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(gram[r][col]))
        if abs(gram[pivot][col]) < 1e-9:
            return None
        gram[col], gram[pivot] = gram[pivot], gram[col]
        for r in range(n):
            if r != col:
                factor = gram[r][col] / gram[col][col]
                gram[r] = [a - factor * b for a, b in zip(gram[r], gram[col])]
    return [gram[j][n] / gram[j][j] / norms[j] for j in range(n)]


def _measurement(item, rates):
    """``(terms, decode tokens/s, prompt tokens/s or None, Bandwidths of its GPUs)`` of one measurement."""
    terms, decode = item[0], item[1]
    prompt = item[2] if len(item) > 2 else None
    own = item[3] if len(item) > 3 and item[3] is not None else rates
    return (terms, _rate(decode, "the measured decode_tokens_per_second"),
            _rate(prompt, "the measured prompt_tokens_per_second"), own)


def calibrate(measurements, rates):
    """The figures that make the prediction meet measured speeds, with ``rates`` for what is not solved.

    ``measurements``: ``(terms, decode_tokens_per_second[, prompt_tokens_per_second[, gpu_rates]])`` tuples, each
    placement's ``SpeedTerms`` for the context and prompt it was measured at and the ``Bandwidths`` of its GPUs
    (``gpu_rates``, default ``rates``; its host, split and overhead figures are not used). Decode first: per token
    ``t = G + B / host + S * split + token`` (``G`` the GPUs' part at ``rates``, ``B`` the host bytes, ``S`` the
    splits, ``token`` the overhead). One measurement solves the host bandwidth (without host bytes, the split cost;
    without either, the overhead), the others held at ``rates``; two solve the host bandwidth and the split cost
    (a 2 x 2 system; with no split in either, the overhead instead), the overhead held; three or more solve all
    three by least squares. Then the prompt: per micro-batch ``t = M + F / host_flops`` (``M`` its memory, PCIe,
    split, overhead and GPU compute terms at the solved figures, ``F`` the host's FLOP) gives the host's compute
    rate by least squares over the measurements with a prompt figure and host FLOP; not solved (``None``) when none
    has or the residual is not positive. Returns ``{host_bytes_per_second, split_seconds, token_seconds,
    host_flops_per_second}`` (``None`` for a figure not solved); ``SpeedModelError`` when the measurements are
    degenerate (the figures cannot be told apart) or give no positive figure."""
    rows = [_measurement(item, rates) for item in measurements]
    if not rows:
        raise SpeedModelError("no measurement to calibrate on")
    columns = [[float(row[0].decode_host_bytes) for row in rows], [float(row[0].decode_splits) for row in rows],
               [1.0] * len(rows)]
    held = [1.0 / rates.host, rates.split_seconds, rates.token_seconds]
    present = [j for j in range(3) if any(columns[j])]
    chosen = present[:len(rows)]
    target = [1.0 / d - sum(b / r for b, r in zip(t.decode_gpu_bytes, own.gpus)) - sum(
        columns[j][i] * held[j] for j in range(3) if j not in chosen) for i, (t, d, _p, own) in enumerate(rows)]
    solution = _solve([[columns[j][i] for j in chosen] for i in range(len(rows))], target)
    if solution is None:
        raise SpeedModelError(
            "the %d measurements are degenerate: their host bytes %s and splits %s are in proportion, so they cannot "
            "tell %s apart; measure placements that differ in splits" % (
                len(rows), [int(c) for c in columns[0]], [int(c) for c in columns[1]],
                " from ".join(_UNKNOWNS[j] for j in chosen)))
    figures = dict(zip(chosen, solution))
    if any(v <= 0 if j == 0 else v < 0 for j, v in figures.items()):
        raise SpeedModelError(
            "measured %s decode tokens/s give no positive %s (%s): the GPUs' part and the figures held (%s) leave "
            "nothing to explain, or the measurements do not follow the model's terms" % (
                ", ".join("%.2f" % row[1] for row in rows), ", ".join(_UNKNOWNS[j] for j in chosen),
                ", ".join("%.3g" % v for v in solution),
                ", ".join("%s %.3g" % (_UNKNOWNS[j], held[j]) for j in range(3) if j not in chosen) or "none"))
    solved = dict.fromkeys(_UNKNOWNS + ("host_flops_per_second",))
    for j, value in figures.items():
        solved[_UNKNOWNS[j]] = round(1.0 / value) if j == 0 else value
        held[j] = value
    prompts = [(t.prompt_host_flops, t.ubatch_tokens / p - _prompt_memory_seconds(t, replace(
        own, host=1.0 / held[0], pcie=rates.pcie, split_seconds=held[1], token_seconds=held[2])))
        for t, _d, p, own in rows if p is not None and t.prompt_host_flops]
    if prompts:
        inverse = sum(f * r for f, r in prompts) / sum(f * f for f, _r in prompts)
        if inverse > 0:
            solved["host_flops_per_second"] = round(1.0 / inverse)
    return solved
