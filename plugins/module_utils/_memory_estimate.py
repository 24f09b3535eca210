# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How much memory llama-server allocates on each GPU and on the host for one placement, from the header alone.

``estimate(facts, options, cpu_tensors, split, n_devices, device_tensors)`` sums, per GPU and on the host, the
weights (placed here as llama.cpp's ``-ngl all``, ``--tensor-split`` and ``-ot`` place them), the KV cache and
recurrent state (``_kv_cache``), the compute buffers (``_compute_buffers``) and the margins. Weights, KV cache,
recurrent state and output buffer are exact (they are what llama.cpp allocates); the compute buffers are an upper
estimate. docs/memory-model.md has the formulas. Standard library only: this runs on target hosts (Python >= 3.9).
"""

from __future__ import annotations

from dataclasses import replace

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import MIB, mib
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._compute_buffers import (
    OP_OFFLOAD_MIN_BATCH, compute_buffer_bytes, cpu_compute_bytes, graph_shape, host_compute_bytes)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._kv_cache import (
    cache_cells, kv_cache_bytes, output_buffer_bytes, pad, recurrent_state_bytes, validate_context)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_facts import MemoryModelError
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.types import PLAIN_TYPE_IDS

PIPELINE_COPIES = 4  # ggml-backend.h GGML_SCHED_MAX_COPIES: input copies of a pipeline-parallel multi-GPU graph

# Where a backend puts tensors: byte alignment of each tensor in a buffer and, for CUDA, the extra
# row padding of quantized matrices (MATRIX_ROW_PADDING = 512 elements, once per tensor).
BACKENDS = {"cuda": (128, 512), "cpu": (32, 0), "rpc": (32, 0), "vulkan": (64, 0)}

# Global tensors of llama.cpp's input layer: they always stay in host memory.
INPUT_TENSOR_BASES = ("token_embd", "token_types", "position_embd", "per_layer_token_embd")


def normalize_split(split, n_devices):
    """Cumulative fractions of a ``--tensor-split`` (llama.cpp: ``splits[i] = sum(split[:i+1]) / sum``)."""
    if n_devices < 1:
        raise MemoryModelError("there is no GPU to place layers on")
    split = list(split) if split else [1.0] * n_devices
    if len(split) != n_devices or any(float(s) < 0 for s in split) or sum(split) <= 0:
        raise MemoryModelError("the tensor split %r does not give a share >= 0 to each of the %d GPUs" % (
            split, n_devices))
    total = float(sum(split))
    cumulative = []
    running = 0.0
    for share in split:
        running += share
        cumulative.append(running / total)
    return cumulative


def layer_devices(block_count, split=None, n_devices=1, n_gpu_layers=None):
    """The device of each block and of the output layer, as llama.cpp's ``-ngl`` assigns them
    (llama-model.cpp ``llama_model::load_tensors``, ``get_layer_buft_list``).

    Layers are the blocks and the output layer (``i == block_count``); ``-ngl N`` offloads the last ``N`` of them
    (``N`` = ``n_gpu_layers``, ``None`` or more than ``block_count`` for all): layer ``i`` is on the host
    (``None``) when ``i < block_count + 1 - N``, else on the first device whose cumulative split fraction exceeds
    ``(i - (block_count + 1 - N)) / N``. So the output layer is the first to go to a GPU and the first blocks are
    the ones left on the host. Returns ``(devices_by_block, output_device)``.
    """
    cumulative = normalize_split(split, n_devices)
    layers = block_count + 1
    offloaded = layers if n_gpu_layers is None else max(0, min(int(n_gpu_layers), layers))
    start = layers - offloaded

    def device(i):
        if i < start:
            return None
        position = float(i - start) / offloaded
        for index, bound in enumerate(cumulative):
            if position < bound:
                return index
        return n_devices - 1
    return [device(i) for i in range(block_count)], device(block_count)


def host_layer_blocks(block_count, n_gpu_layers):
    """The blocks ``-ngl n_gpu_layers`` leaves on the host (their weights, KV cache and recurrent state), lowest
    first; none for ``None`` (every layer offloaded)."""
    if n_gpu_layers is None:
        return []
    return list(range(max(0, block_count + 1 - int(n_gpu_layers))))[:block_count]


def _alloc_bytes(tensor, alignment, row_padding):
    size = tensor.nbytes
    if row_padding and tensor.type_id is not None and tensor.type_id not in PLAIN_TYPE_IDS and tensor.shape:
        ne0 = tensor.shape[0]
        if ne0 % row_padding and tensor.shape[0] and tensor.nbytes:
            rows = 1
            for dim in tensor.shape[1:]:
                rows *= dim
            per_element = tensor.nbytes / float(ne0 * rows)
            size += int(round((row_padding - ne0 % row_padding) * per_element))
    return pad(size, alignment)


def is_input_tensor(name):
    return name.split(".", 1)[0] in INPUT_TENSOR_BASES


def tensor_places(facts, cpu_tensors=(), split=None, n_devices=1, device_tensors=None, n_gpu_layers=None):
    """Where each tensor lives, as llama.cpp's ``-ngl`` (``n_gpu_layers``, ``None`` for all), ``--tensor-split``
    and ``-ot`` place it.

    Returns ``(places, placement)``: ``places`` lists ``(tensor, device)``, ``device`` ``None`` for the host (the
    names of ``cpu_tensors`` and the input layer, token_embd, which llama.cpp keeps there), else the GPU's
    position: ``device_tensors`` (``{name: device}`` of ``-ot ...=CUDA<n>``), else the device of the tensor's block
    (``None`` for a block that ``-ngl`` leaves on the host), else the output device (the device of
    ``block_count``). Without an ``output.weight`` llama.cpp puts a copy of
    token_embd on the output device (tied embeddings): it is listed there too. ``placement`` is
    ``{devices_by_block, output_device}``. With ``n_devices == 0`` (a CPU host) every tensor is on the host.
    """
    if n_devices == 0:
        return [(t, None) for t in facts.tensors], {"devices_by_block": [], "output_device": None}
    cpu = set(cpu_tensors)
    moved = dict(device_tensors or {})
    devices, output_device = layer_devices(facts.block_count, split, n_devices, n_gpu_layers)
    places = []
    for tensor in facts.tensors:
        if tensor.name in cpu or is_input_tensor(tensor.name):
            device = None
        elif tensor.name in moved:
            device = moved[tensor.name]
        elif tensor.block is not None and tensor.block < len(devices):
            device = devices[tensor.block]
        else:
            device = output_device
        places.append((tensor, device))
    if "output.weight" not in set(facts.tensor_names):
        places += [(t, output_device) for t in facts.tensors if t.name == "token_embd.weight"]
    return places, {"devices_by_block": devices, "output_device": output_device}


def weight_bytes(facts, cpu_tensors=(), split=None, n_devices=1, backend="cuda", device_tensors=None,
                 n_gpu_layers=None):
    """Model weights per GPU and on the host, the tensors placed as ``tensor_places`` places them.

    Returns ``(gpu_bytes list, host_bytes, detail)``: on a GPU a tensor takes its backend's aligned and padded size;
    ``detail`` is ``tensor_places``' placement with ``host_expert_bytes``.
    """
    alignment, row_padding = BACKENDS[backend]
    places, placement = tensor_places(facts, cpu_tensors, split, n_devices, device_tensors, n_gpu_layers)
    gpu = [0] * n_devices
    host = 0
    host_experts = 0
    for tensor, device in places:
        if device is None:
            host += tensor.nbytes
            host_experts += tensor.nbytes if tensor.expert else 0
        else:
            gpu[device] += _alloc_bytes(tensor, alignment, row_padding)
    return gpu, host, dict(placement, host_expert_bytes=host_experts)


# --------------------------------------------------------------------------- everything, per device

def estimate(facts, options, cpu_tensors=(), split=None, n_devices=1, device_tensors=None):
    """Bytes and MiB on each GPU and on the host for the server settings of ``options`` (``_plan_options.Options``)
    and one placement: ``cpu_tensors`` (the names an ``-ot ...=CPU`` pattern moves to the host), ``split`` (the
    shares of a ``--tensor-split``), ``n_devices`` and ``device_tensors`` (``{name: device}`` of ``-ot
    ...=CUDA<n>``).

    Returns a dict: ``gpus`` (one dict per device: ``model``, ``kv``, ``recurrent``, ``compute``, ``margin``,
    ``total`` in bytes and the same keys with ``_mib``), ``host`` (``model``, ``kv``, ``recurrent``, ``output``,
    ``compute``, ``margin``, ``total``, their ``_mib``, ``mmap`` and ``pinned``), ``devices_by_block``,
    ``output_device``, ``flash_attn`` (bool), ``n_ctx``, ``cells`` (``CacheCells``), ``warnings``.
    ``n_devices == 0`` sizes a CPU host: everything is in host memory.
    """
    validate_context(options.ctx_size, options.parallel, options.ubatch)
    host_blocks = host_layer_blocks(facts.block_count, options.n_gpu_layers) if n_devices else []
    options = resolved_options(facts, options, host_blocks)
    if not options.flash and options.cache_type_v not in ("f32", "f16", "bf16"):
        raise MemoryModelError("a quantized V cache (cache_type_v=%s) needs flash attention: set flash_attn to "
                               "on or auto, or use cache_type_v f16" % options.cache_type_v)
    cpu, moved = set(cpu_tensors), dict(device_tensors or {})
    gpu_weights, host_weights, placement = weight_bytes(facts, cpu_tensors, split, n_devices, options.backend, moved,
                                                        options.n_gpu_layers)
    kv = kv_cache_bytes(facts, options)
    rs = recurrent_state_bytes(facts, options.parallel)
    # Several GPUs without any tensor override run pipeline-parallel (llama-context.cpp: n_devices > 1, all
    # layers offloaded, split mode layer, no tensor overrides): each split's inputs are kept 4 times.
    copies = PIPELINE_COPIES if (n_devices > 1 and options.backend == "cuda" and not cpu and not moved
                                 and placement["output_device"] is not None and not host_blocks) else 1
    gpus = [_gpu_entry(facts, options, device, placement, gpu_weights[device], kv, rs, cpu, moved, copies,
                       host_blocks) for device in range(n_devices)]
    host = _host_entry(facts, options, host_weights, kv, rs, cpu, n_devices, copies, host_blocks)
    warnings = []
    if facts.context_length and options.ctx_size > facts.context_length:
        warnings.append("ctx_size %d is beyond the model's training context (%d): quality may drop" % (
            options.ctx_size, facts.context_length))
    cells = cache_cells(facts, options)
    return {"gpus": gpus, "host": host, "devices_by_block": placement["devices_by_block"],
            "output_device": placement["output_device"], "flash_attn": options.flash, "n_ctx": cells.n_ctx,
            "cells": cells, "warnings": warnings}


def resolved_options(facts, options, host_blocks):
    """``options`` as llama.cpp resolves them for a placement that leaves ``host_blocks`` on the host. With
    ``-fa auto`` llama.cpp turns flash attention off when the scheduler runs a layer's flash attention on another
    device than the layer's (llama-context.cpp ``resolve_fused_ops``), which it can do for an attention block
    ``-ngl`` leaves on the host (its attention has no weights to keep it there). So a placement with such blocks is
    sized without flash attention, unless the V cache is quantized (that needs flash attention: llama.cpp then fails
    or keeps it on)."""
    if (options.flash_attn == "auto" and options.cache_type_v in ("f32", "f16", "bf16")
            and any(b in facts.kv_blocks for b in host_blocks)):
        return replace(options, flash_attn="off")
    return options


def _with_mib(entry):
    """``entry`` with its ``total`` and each value also in MiB (``<key>_mib``)."""
    entry["total"] = sum(entry.values())
    for key in list(entry):
        entry[key + "_mib"] = mib(entry[key])
    return entry


def _gpu_entry(facts, options, device, placement, weights, kv, rs, cpu, moved, copies, host_blocks):
    """What one GPU holds: its weights, the caches of its blocks, its compute buffer and the margin. With op
    offload the first GPU also computes the matrix products of the blocks ``-ngl`` leaves on the host
    (``host_blocks``), as it does those of host-resident experts."""
    devices = placement["devices_by_block"]
    sizes = dict((t.name, t.nbytes) for t in facts.tensors)
    by_block = facts.expert_tensors_by_block
    offloaded = options.op_offload and graph_shape(facts, options).tokens >= OP_OFFLOAD_MIN_BATCH
    blocks = [b for b, d in enumerate(devices) if d == device]
    cpu_expert_max = max([sum(sizes[n] for n in by_block.get(b, ()) if n in cpu) for b in blocks] + [0])
    computed_here = list(host_blocks) if offloaded and device == 0 else []
    if computed_here:
        weights_of = facts.bytes_by_block()
        cpu_expert_max = max([cpu_expert_max] + [weights_of.get(b, 0) for b in computed_here])
    host_attention = [(b, kv.get(b, 0)) for b in host_blocks if b in facts.kv_blocks] if device == 0 else []
    foreign = sorted(b for b, names in by_block.items()
                     if devices[b] != device and any(moved.get(n) == device for n in names))
    # blocks whose experts' products all run elsewhere: on the host, or on the device holding them
    remote = [b for b in blocks if by_block.get(b) and all(
        (n in cpu and not offloaded) or moved.get(n, device) != device for n in by_block[b])]
    return _with_mib({
        "model": weights,
        "kv": sum(kv.get(b, 0) for b in blocks),
        "recurrent": sum(rs.get(b, 0) for b in blocks),
        "compute": compute_buffer_bytes(facts, options, blocks, device == placement["output_device"],
                                        cpu_expert_max, foreign_expert_blocks=foreign, copies=copies,
                                        remote_expert_blocks=remote, host_blocks=computed_here,
                                        host_attention=host_attention),
        "margin": int(options.margin_mib * MIB),
    })


def _host_entry(facts, options, weights, kv, rs, cpu, n_devices, copies, host_blocks):
    """What the host holds: its weights, the logits, the caches of the blocks on the host (all without GPU; those
    ``-ngl`` leaves there beside GPUs: llama-kv-cache.cpp puts a layer's cache on its layer's device), its compute
    buffer and the margin."""
    host = {"model": weights, "kv": 0, "recurrent": 0, "output": output_buffer_bytes(facts, options.parallel)}
    if n_devices == 0:
        host["kv"], host["recurrent"] = sum(kv.values()), sum(rs.values())
        host["compute"] = cpu_compute_bytes(facts, options)
    else:
        host["kv"] = sum(kv.get(b, 0) for b in host_blocks)
        host["recurrent"] = sum(rs.get(b, 0) for b in host_blocks)
        cpu_blocks = sorted(set(b for b, names in facts.expert_tensors_by_block.items() if cpu.intersection(names)))
        host["compute"] = host_compute_bytes(facts, options, cpu_blocks, copies=copies, host_blocks=host_blocks)
    host["margin"] = int(options.host_margin_mib * MIB)
    _with_mib(host)
    # --no-mmap on a CUDA build: host weights go to a pinned CUDA_Host buffer (locked, never swapped);
    # with mmap they stay in the page cache of the model file.
    host["mmap"] = bool(options.mmap)
    host["pinned"] = not options.mmap and n_devices > 0 and options.backend == "cuda"
    return host
