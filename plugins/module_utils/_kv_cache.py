# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The context and the caches llama.cpp allocates for a model: cells per stream of the full and the
sliding-window KV cache, the KV cache bytes per block, the recurrent state per block and the logits buffer. Exact:
these are the tensors llama.cpp creates (src/llama-context.cpp, src/llama-kv-cache.cpp,
src/llama-kv-cache-iswa.cpp, src/llama-memory-recurrent.cpp). Standard library only: this runs on target hosts
(Python >= 3.9).
"""

from __future__ import annotations

from dataclasses import dataclass

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import CACHE_TYPES
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_facts import MemoryModelError
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import DEFAULT_BATCH

N_CTX_PAD = 256  # llama-context.cpp llama_context::llama_context: n_ctx and n_ctx_seq are padded to 256
SWA_PAD = 256  # llama-kv-cache-iswa.cpp llama_kv_cache_iswa::llama_kv_cache_iswa: "SWA cache is always padded to 256"


def cache_type(type_name):
    """``(elements per block, bytes per block)`` of a KV cache type; an unknown name is an error."""
    try:
        return CACHE_TYPES[type_name]
    except KeyError:
        raise MemoryModelError("unknown cache type %r (llama-server knows %s)" % (
            type_name, ", ".join(sorted(CACHE_TYPES)))) from None


def row_bytes(type_name, n):
    """Bytes of a row of ``n`` elements of the cache type ``type_name`` (ggml_row_size)."""
    block, size = cache_type(type_name)
    if n % block:
        raise MemoryModelError("a KV row of %d elements is not a multiple of the %d-element blocks of %s: "
                               "llama.cpp cannot use that cache type for this model" % (n, block, type_name))
    return n // block * size


def pad(value, multiple):
    return (value + multiple - 1) // multiple * multiple


def context_cells(ctx_size, parallel, kv_unified):
    """``(n_ctx, cells per stream, streams)`` as llama.cpp sizes them.

    llama-context.cpp ``llama_context::llama_context``: ``n_ctx = pad(n_ctx, 256)``; without a unified cache
    every slot has its own stream of ``n_ctx_seq = pad(n_ctx / n_seq_max, 256)`` cells and
    ``n_ctx = n_ctx_seq * n_seq_max`` (``-c 513 -np 2`` allocates 2 x 512 cells).
    """
    n_ctx = pad(ctx_size, N_CTX_PAD)
    if kv_unified:
        return n_ctx, n_ctx, 1
    streams = max(1, parallel)
    cells = pad(n_ctx // streams, N_CTX_PAD)
    return cells * streams, cells, streams


def micro_batch(ctx_size, ubatch=512, batch=DEFAULT_BATCH):
    """The tokens of one micro-batch: llama-context.cpp ``n_batch = min(n_ctx, n_batch)``,
    ``n_ubatch = min(n_batch, n_ubatch)`` (n_ctx as given, before padding)."""
    return max(1, min(ubatch, batch, ctx_size))


@dataclass(frozen=True)
class CacheCells:
    """The cells of each cache: ``cells`` per stream of the full cache, ``swa_cells`` per stream of the SWA
    cache (0 without one), ``streams``, ``n_ctx`` (all cells of the full cache) and the micro-batch ``ubatch``."""

    n_ctx: int
    cells: int
    streams: int
    swa_cells: int
    ubatch: int


def cache_cells(facts, options):
    """The cells of the full and of the sliding-window cache for ``options`` (``_plan_options.Options``).

    llama-kv-cache-iswa.cpp ``llama_kv_cache_iswa::llama_kv_cache_iswa`` (and llama-memory-hybrid-iswa.cpp for
    hybrids) with ``kv_size = n_ctx_seq`` (llama-model.cpp ``llama_model::create_memory``):
    ``size_swa = pad(min(size_base, n_swa * (unified ? n_seq_max : 1) + n_ubatch), 256)``, or ``size_base``
    with ``--swa-full``. Both caches have one stream per slot unless unified. Chunked attention (llama4) is
    sized the same way with its chunk as the window.
    """
    n_ctx, cells, streams = context_cells(options.ctx_size, options.parallel, options.kv_unified)
    n_ubatch = micro_batch(options.ctx_size, options.ubatch, options.batch)
    swa = 0
    if facts.sliding_window:
        seqs = max(1, options.parallel) if options.kv_unified else 1
        swa = cells if options.swa_full else pad(min(cells, facts.sliding_window.window * seqs + n_ubatch), SWA_PAD)
    return CacheCells(n_ctx, cells, streams, swa, n_ubatch)


def _check_head_blocks(facts, cache_type_k, cache_type_v):
    """llama-context.cpp ``llama_init_from_model`` refuses a cache type whose block does not divide the head size
    ("K cache type q8_0 with block size 32 does not divide n_embd_head_k=16"); MLA caches no V."""
    head_k, head_v = head_dims(facts)
    for side, type_name, head in (("K", cache_type_k, head_k), ("V", cache_type_v, 0 if facts.mla else head_v)):
        block = cache_type(type_name)[0]
        if head and head % block:
            raise MemoryModelError(
                "%s cache type %s with block size %d does not divide the head size %d (n_embd_head_%s): a head is "
                "not a multiple of its blocks, and llama.cpp refuses to create the context; use another "
                "cache_type_%s" % (side, type_name, block, head, side.lower(), side.lower()))


def kv_cache_bytes(facts, options):
    """KV cache bytes of each block that owns a cache for ``options``: ``{block: bytes}``.

    llama-kv-cache.cpp ``llama_kv_cache::llama_kv_cache``: per layer a K tensor ``[n_embd_k_gqa, kv_size,
    n_stream]`` and a V tensor ``[n_embd_v_gqa, kv_size, n_stream]``; without flash attention the V cache is
    transposed and every layer's V row is ``n_embd_v_gqa_max()`` wide; MLA has no V tensor. Sliding blocks
    use the SWA cache's cells.
    """
    cache_type_k, cache_type_v = options.cache_type_k, options.cache_type_v
    _check_head_blocks(facts, cache_type_k, cache_type_v)
    cc = cache_cells(facts, options)
    widest_v = max([v for _k, v in facts.kv_blocks.values()] + [0])
    swa = facts.swa_blocks
    result = {}
    for block, (k, v) in facts.kv_blocks.items():
        v_width = v if (options.flash or not v) else widest_v
        cells = cc.swa_cells if block in swa else cc.cells
        result[block] = (row_bytes(cache_type_k, k) + (row_bytes(cache_type_v, v_width) if v_width else 0)) \
            * cells * cc.streams
    return result


def recurrent_state_bytes(facts, parallel=1):
    """Recurrent state bytes of each recurrent block, F32, one cell per sequence: ``{block: bytes}``
    (llama-memory-recurrent.cpp: ``mem_size = max(1, n_seq_max)`` cells of ``n_embd_r() + n_embd_s()``)."""
    cells = max(1, parallel)
    return dict((block, (r + s) * 4 * cells) for block, (r, s) in facts.recurrent_blocks.items())


def output_buffer_bytes(facts, parallel=1):
    """The logits buffer in host memory: one row of n_vocab floats per sequence (llama-server's default)."""
    return facts.n_vocab * 4 * max(1, parallel)


def head_dims(facts):
    """``(head_dim_k, head_dim_v)`` of the first attention block (llama_hparams::n_embd_head_k / _v)."""
    for block, (k, v) in sorted(facts.kv_blocks.items()):
        hkv = facts.kv_heads.get(block) or 1
        return k // hkv, v // hkv
    return 0, 0


def validate_context(ctx_size, parallel, ubatch=512):
    for name, value in (("ctx_size", ctx_size), ("parallel", parallel), ("ubatch", ubatch)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise MemoryModelError("%s must be a whole number >= 1, got %r" % (name, value))
    if pad(ctx_size, N_CTX_PAD) // parallel < 1:
        raise MemoryModelError("ctx_size %d cannot hold %d parallel slots" % (ctx_size, parallel))
