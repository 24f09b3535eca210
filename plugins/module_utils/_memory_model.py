# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How much memory llama-server allocates on each GPU and on the host, from the GGUF header alone.

Standard library only: this runs on target hosts. See docs/memory-model.md for the formulas and where
each one comes from in llama.cpp. Weights, KV cache, recurrent state and output buffer are exact
(they are what llama.cpp allocates); the compute buffer is an estimate.

Inputs: ``model_facts(metadata, tensors, layout)`` turns the reader's metadata and tensor infos and the
classification's ``ModelLayout`` into a ``ModelFacts``; ``estimate(facts, ...)`` gives the bytes per device.
"""

from __future__ import annotations

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import (
    BLOCK_RE, CACHE_TYPES, LLAMA_MAX_LAYERS, MAX_BLOCKS, PLAIN_TYPE_IDS,
)

MIB = 1 << 20
DEFAULT_MARGIN_MIB = 1024  # llama.cpp's --fit keeps this much free per device (driver, CUDA context)
N_CTX_PAD = 256  # llama.cpp pads the context to a multiple of this
KQ_MASK_PAD = 64  # ... and the tokens of the KQ mask to a multiple of this
OP_OFFLOAD_MIN_BATCH = 32  # CUDA offloads an op on host weights to the GPU from this many tokens on

# Where a backend puts tensors: byte alignment of each tensor in a buffer and, for CUDA, the extra
# row padding of quantized matrices (MATRIX_ROW_PADDING = 512 elements, once per tensor).
BACKENDS = {"cuda": (128, 512), "cpu": (32, 0), "rpc": (32, 0), "vulkan": (64, 0)}

# Global tensors of llama.cpp's input layer: they always stay in host memory.
INPUT_TENSOR_BASES = ("token_embd", "token_types", "position_embd", "per_layer_token_embd")


class MemoryModelError(ValueError):
    """Input the memory model cannot size: ``str()`` says what and what to do."""


def row_bytes(type_name, n):
    """Bytes of a row of ``n`` elements of the cache type ``type_name`` (ggml_row_size)."""
    try:
        block, size = CACHE_TYPES[type_name]
    except KeyError:
        raise MemoryModelError("unknown cache type %r (llama-server knows %s)" % (
            type_name, ", ".join(sorted(CACHE_TYPES))))
    if n % block:
        raise MemoryModelError("a KV row of %d elements is not a multiple of the %d-element blocks of %s: "
                               "llama.cpp cannot use that cache type for this model" % (n, block, type_name))
    return n // block * size


def pad(value, multiple):
    return (value + multiple - 1) // multiple * multiple


def mib(nbytes):
    """Bytes to MiB, rounded to 0.01 as llama.cpp prints them."""
    return round(nbytes / float(MIB), 2)


class TensorFacts(object):
    """What the memory model needs of one tensor."""

    __slots__ = ("name", "nbytes", "block", "type_id", "shape", "expert")

    def __init__(self, name, nbytes, block, type_id, shape, expert):
        self.name = name
        self.nbytes = nbytes
        self.block = block
        self.type_id = type_id
        self.shape = shape
        self.expert = expert


class ModelFacts(object):
    """The numbers of a model the formulas use; see ``model_facts``."""

    def __init__(self, **kw):
        self.architecture = kw["architecture"]
        self.block_count = kw["block_count"]
        self.n_embd = kw["n_embd"]
        self.n_vocab = kw["n_vocab"]
        self.n_head = kw["n_head"]  # {block: query heads} of the attention blocks
        self.kv_heads = kw["kv_heads"]  # {block: KV heads} of the attention blocks
        self.context_length = kw["context_length"]
        self.kv_blocks = kw["kv_blocks"]  # {block: (n_embd_k_gqa, n_embd_v_gqa)}
        self.recurrent_blocks = kw["recurrent_blocks"]  # {block: (n_embd_r, n_embd_s)} in F32 elements
        self.ssm = kw["ssm"]  # {d_conv, d_inner, d_state, n_group, n_head} or {}
        self.expert_used_count = kw["expert_used_count"]
        self.n_ff_exp = kw["n_ff_exp"]
        self.tensors = kw["tensors"]  # [TensorFacts]
        self.expert_tensors_by_block = kw["expert_tensors_by_block"]
        self.sliding_window = kw["sliding_window"]
        self.warnings = kw["warnings"]

    @property
    def tensor_names(self):
        return [t.name for t in self.tensors]

    @property
    def expert_blocks(self):
        return sorted(self.expert_tensors_by_block)

    def expert_bytes_by_block(self):
        sizes = dict((t.name, t.nbytes) for t in self.tensors)
        return dict((b, sum(sizes.get(n, 0) for n in names)) for b, names in self.expert_tensors_by_block.items())


def _int(value):
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _dim(value):
    """A size from the metadata: a whole number > 0, else ``None`` (treated as missing)."""
    value = _int(value)
    return value if value is not None and value > 0 else None


def _per_block(metadata, key, block_count):
    """A per-layer value: ``{block: int >= 0}`` from a scalar or an array, or ``None`` when absent/invalid."""
    value = metadata.get(key)
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        values = [_int(v) for v in value]
        if len(values) != block_count or any(v is None or v < 0 for v in values):
            return None
        return dict(enumerate(values))
    scalar = _int(value)
    return None if scalar is None or scalar < 0 else dict((b, scalar) for b in range(block_count))


def _count(value):
    """Length of a metadata array, also of a reader's ``SkippedArray`` (``.count``)."""
    if value is None:
        return None
    count = getattr(value, "count", None)
    if isinstance(count, int):
        return count
    try:
        return len(value)
    except TypeError:
        return None


def model_facts(metadata, tensors, layout):
    """Gather the numbers of the formulas from a GGUF's ``metadata``, its ``tensors`` and its ``layout``.

    ``tensors``: objects with ``.name``, ``.shape``, ``.nbytes`` (and ``.type_id`` when known), such as the
    reader's ``TensorInfo``. ``layout``: ``_tensor_classes.classify_model``'s ``ModelLayout``.
    Metadata the formulas need but the file lacks is taken from the tensor shapes, with a warning;
    raises ``MemoryModelError`` when neither gives it.
    """
    metadata = metadata or {}
    arch = layout.architecture or metadata.get("general.architecture") or ""
    warnings = []
    block_count = layout.block_count
    if block_count > MAX_BLOCKS:
        raise MemoryModelError("%d blocks is implausible (llama.cpp loads at most %d): check %s.block_count and the "
                               "blk.N tensor names" % (block_count, LLAMA_MAX_LAYERS, arch))
    by_name = dict((t.name, t) for t in tensors)
    expert_names = set(layout.expert_tensors)

    def shape(name, dims=1):
        """The shape of a tensor with at least ``dims`` dimensions, all > 0 (``None`` otherwise)."""
        tensor = by_name.get(name)
        value = tuple(tensor.shape) if tensor is not None and tensor.shape else ()
        return value if len(value) >= dims and all(n > 0 for n in value) else None

    def block_shape(block, base):
        return shape("blk.%d.%s.weight" % (block, base), 2)

    # Embedding width and vocabulary.
    n_embd = _dim(metadata.get(arch + ".embedding_length"))
    embd_shape = shape("token_embd.weight") or shape("output.weight")
    if n_embd is None:
        if not embd_shape:
            raise MemoryModelError("%s.embedding_length is missing and there is no token_embd/output tensor "
                                   "to read it from" % arch)
        n_embd = embd_shape[0]
        warnings.append("%s.embedding_length missing: %d taken from the embedding tensor" % (arch, n_embd))
    n_vocab = _count(metadata.get("tokenizer.ggml.tokens")) or _dim(metadata.get(arch + ".vocab_size"))
    if not n_vocab:
        if not embd_shape or len(embd_shape) < 2:
            raise MemoryModelError("the vocabulary size is unknown: no tokenizer.ggml.tokens, no %s.vocab_size "
                                   "and no token_embd/output tensor" % arch)
        n_vocab = embd_shape[1]
        warnings.append("vocabulary size missing: %d taken from the embedding tensor" % n_vocab)
    context_length = _int(metadata.get(arch + ".context_length"))

    # Attention blocks: KV widths from key_length/value_length x head_count_kv, or from attn_k/attn_v shapes.
    attention = list(layout.layer_kinds.get("attention", []))
    head_kv = _per_block(metadata, arch + ".attention.head_count_kv", block_count)
    head_kv_invalid = head_kv is None and metadata.get(arch + ".attention.head_count_kv") is not None
    head = _per_block(metadata, arch + ".attention.head_count", block_count) or {}
    key_length = _dim(metadata.get(arch + ".attention.key_length"))
    value_length = _dim(metadata.get(arch + ".attention.value_length"))
    # Multi-head latent attention (deepseek2 converted with *_mla keys): llama.cpp caches only the compressed
    # K (kv_lora_rank + rope dims, one KV head); V is a view of it, so the V cache has no bytes.
    mla = bool(_dim(metadata.get(arch + ".attention.key_length_mla"))
               and _dim(metadata.get(arch + ".attention.value_length_mla")))
    kv_blocks = {}
    kv_heads = {}
    n_head = {}
    fell_back = []
    for block in attention:
        hkv = head_kv.get(block) if head_kv else None
        if hkv is None and head_kv is None and head.get(block):
            hkv = head[block]  # llama.cpp: head_count_kv defaults to head_count
        n_head[block] = head.get(block) or hkv or 0
        k_width = v_width = None
        if hkv and head.get(block) and n_embd:
            k_width = hkv * (key_length or n_embd // head[block])
            v_width = hkv * (value_length or n_embd // head[block])
        k_shape, v_shape = block_shape(block, "attn_k"), block_shape(block, "attn_v")
        if (k_width is None or key_length is None or value_length is None or head_kv_invalid) and k_shape and v_shape:
            if k_width is not None and (k_width, v_width) != (k_shape[1], v_shape[1]):
                fell_back.append(block)
            elif k_width is None:
                fell_back.append(block)
            k_width, v_width = k_shape[1], v_shape[1]
        if k_width is None:
            raise MemoryModelError("block %d is an attention block but neither the metadata (%s.attention."
                                   "head_count_kv, key_length, value_length) nor attn_k/attn_v tensors give its "
                                   "KV width" % (block, arch))
        kv_blocks[block] = (k_width, 0 if mla else v_width)
        kv_heads[block] = hkv or 1
    if fell_back:
        warnings.append("KV widths of blocks %s taken from the attn_k/attn_v tensor shapes (metadata "
                        "incomplete)" % ", ".join(str(b) for b in fell_back))

    # Recurrent (Mamba-2) blocks: conv state (d_conv-1) x conv channels, SSM state d_state x d_inner, F32.
    recurrent = list(layout.layer_kinds.get("recurrent", []))
    ssm = {}
    recurrent_blocks = {}
    if recurrent:
        n_embd_r, n_embd_s, ssm = _recurrent_widths(metadata, arch, n_embd, recurrent[0], shape, block_shape,
                                                    warnings)
        recurrent_blocks = dict((b, (n_embd_r, n_embd_s)) for b in recurrent)

    # Tensors.
    facts_tensors = []
    unknown = []
    for tensor in tensors:
        nbytes = tensor.nbytes
        if nbytes is None:
            unknown.append(tensor.name)
            nbytes = 0
        match = BLOCK_RE.match(tensor.name)
        facts_tensors.append(TensorFacts(tensor.name, nbytes, int(match.group(1)) if match else None,
                                         getattr(tensor, "type_id", None), tuple(tensor.shape or ()),
                                         tensor.name in expert_names))
    if unknown:
        warnings.append("%d tensor(s) of unknown type counted as 0 bytes (%s): the weights are underestimated"
                        % (len(unknown), ", ".join(unknown[:3])))

    n_ff_exp = _int(metadata.get(arch + ".expert_feed_forward_length")) or 0
    if not n_ff_exp:
        for names in layout.expert_tensors_by_block.values():
            for name in names:
                if "down" in name and shape(name):
                    n_ff_exp = shape(name)[0]
                    break
            if n_ff_exp:
                break
    sliding_window = _int(metadata.get(arch + ".attention.sliding_window")) or 0
    if sliding_window:
        warnings.append("the model uses sliding-window attention (window %d): its KV cache is sized here for the "
                        "full context, which overestimates the SWA layers" % sliding_window)
    return ModelFacts(
        architecture=arch, block_count=block_count, n_embd=n_embd, n_vocab=n_vocab, n_head=n_head,
        context_length=context_length, kv_heads=kv_heads, kv_blocks=kv_blocks, recurrent_blocks=recurrent_blocks, ssm=ssm,
        expert_used_count=layout.expert_used_count or 0, n_ff_exp=n_ff_exp, tensors=facts_tensors,
        expert_tensors_by_block=dict((b, list(n)) for b, n in layout.expert_tensors_by_block.items()
                                     if b is not None),
        sliding_window=sliding_window, warnings=warnings + list(getattr(layout, "warnings", []) or []))


def _recurrent_widths(metadata, arch, n_embd, first, shape, block_shape, warnings):
    """``(n_embd_r, n_embd_s, ssm)``: F32 elements of a recurrent block's R and S states per sequence.

    llama.cpp's ``llama_hparams::n_embd_r()`` / ``n_embd_s()``: RWKV (``wkv.head_size``) keeps
    ``token_shift_count * n_embd`` and ``n_embd * head_size``; LFM2 short convolutions (``shortconv.l_cache``)
    ``n_embd * (l_cache - 1)`` and nothing; Mamba ``(d_conv - 1) * (d_inner + 2 * n_group * d_state)`` and
    ``d_state * d_inner`` (``n_group`` is 0 for Mamba-1, which has no groups).
    """
    head_size = _dim(metadata.get(arch + ".wkv.head_size"))
    if head_size:
        shift = _int(metadata.get(arch + ".token_shift_count"))
        shift = 2 if shift is None or shift < 0 else shift
        return shift * n_embd, n_embd * head_size, {}
    l_cache = _dim(metadata.get(arch + ".shortconv.l_cache"))
    if l_cache:
        return n_embd * (l_cache - 1), 0, {}
    d_conv = _dim(metadata.get(arch + ".ssm.conv_kernel"))
    d_inner = _dim(metadata.get(arch + ".ssm.inner_size"))
    d_state = _dim(metadata.get(arch + ".ssm.state_size"))
    n_group = _int(metadata.get(arch + ".ssm.group_count"))
    n_group = n_group if n_group is not None and n_group >= 0 else 0
    if None in (d_conv, d_inner, d_state):
        conv = shape("blk.%d.ssm_conv1d.weight" % first, 2)
        norm = shape("blk.%d.ssm_norm.weight" % first, 2)
        out = block_shape(first, "ssm_out")
        if not conv or not out:
            raise MemoryModelError("the recurrent blocks lack %s.ssm.conv_kernel/inner_size/state_size and "
                                   "the ssm_conv1d/ssm_out tensors to read them from" % arch)
        d_conv, conv_dim, d_inner = conv[0], conv[1], out[0]
        n_group = norm[1] if norm else 1
        d_state = (conv_dim - d_inner) // (2 * n_group)
        if d_state <= 0:
            raise MemoryModelError("the recurrent blocks lack %s.ssm.* metadata and the ssm tensor shapes do not "
                                   "give a state size (conv channels %d, inner size %d)" % (arch, conv_dim, d_inner))
        warnings.append("%s.ssm.* metadata missing: d_conv=%d d_inner=%d d_state=%d n_group=%d taken from "
                        "the ssm tensor shapes" % (arch, d_conv, d_inner, d_state, n_group))
    ssm = {"d_conv": d_conv, "d_inner": d_inner, "d_state": d_state, "n_group": n_group,
           "n_head": _dim(metadata.get(arch + ".ssm.time_step_rank")) or 0}
    return (d_conv - 1) * (d_inner + 2 * n_group * d_state), d_state * d_inner, ssm


# --------------------------------------------------------------------------- context, KV and recurrent state

def context_cells(ctx_size, parallel, kv_unified):
    """``(n_ctx, cells per stream, streams)`` as llama.cpp sizes them.

    n_ctx is padded to 256; without a unified cache every slot has its own stream of n_ctx / parallel cells,
    padded to 256 again (llama_context: ``n_ctx_seq = pad(n_ctx / n_seq_max, 256)``, then
    ``n_ctx = n_ctx_seq * n_seq_max``: ``-c 513 -np 2`` allocates 2 x 512 cells).
    """
    n_ctx = pad(ctx_size, N_CTX_PAD)
    if kv_unified:
        return n_ctx, n_ctx, 1
    streams = max(1, parallel)
    cells = pad(n_ctx // streams, N_CTX_PAD)
    return cells * streams, cells, streams


def kv_cache_bytes(facts, ctx_size, parallel=1, cache_type_k="f16", cache_type_v="f16", kv_unified=False):
    """KV cache bytes of each attention block: ``{block: bytes}``."""
    cells, streams = context_cells(ctx_size, parallel, kv_unified)[1:]
    return dict((block, (row_bytes(cache_type_k, k) + row_bytes(cache_type_v, v)) * cells * streams)
                for block, (k, v) in facts.kv_blocks.items())


def recurrent_state_bytes(facts, parallel=1):
    """Recurrent state bytes of each recurrent block, F32, one cell per sequence: ``{block: bytes}``."""
    cells = max(1, parallel)
    return dict((block, (r + s) * 4 * cells) for block, (r, s) in facts.recurrent_blocks.items())


def output_buffer_bytes(facts, parallel=1):
    """The logits buffer in host memory: one row of n_vocab floats per sequence (llama-server's default)."""
    return facts.n_vocab * 4 * max(1, parallel)


# --------------------------------------------------------------------------- where the weights go

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


def layer_devices(block_count, split=None, n_devices=1):
    """The device of each block and of the output layer, as llama.cpp's ``-ngl all`` assigns them.

    Block ``i`` (and the output layer as ``i == block_count``) goes to the first device whose cumulative
    split fraction exceeds ``i / (block_count + 1)``. Returns ``(devices_by_block, output_device)``.
    """
    cumulative = normalize_split(split, n_devices)
    layers = block_count + 1

    def device(i):
        position = float(i) / layers
        for index, bound in enumerate(cumulative):
            if position < bound:
                return index
        return n_devices - 1
    return [device(i) for i in range(block_count)], device(block_count)


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


def weight_bytes(facts, cpu_tensors=(), split=None, n_devices=1, backend="cuda"):
    """Model weights per GPU and on the host for the tensors overridden to CPU.

    Returns ``(gpu_bytes list, host_bytes, detail)``: the input layer (token_embd) stays on the host as in
    llama.cpp; the output layer goes to the device of ``block_count``; without an ``output.weight`` llama.cpp
    puts a copy of token_embd there (tied embeddings).
    """
    alignment, row_padding = BACKENDS[backend]
    cpu = set(cpu_tensors)
    devices, output_device = layer_devices(facts.block_count, split, n_devices)
    gpu = [0] * n_devices
    host = 0
    host_experts = 0
    names = set(facts.tensor_names)
    for tensor in facts.tensors:
        if tensor.name in cpu or is_input_tensor(tensor.name):
            host += tensor.nbytes
            if tensor.expert:
                host_experts += tensor.nbytes
            continue
        device = devices[tensor.block] if tensor.block is not None and tensor.block < len(devices) else output_device
        gpu[device] += _alloc_bytes(tensor, alignment, row_padding)
    if "output.weight" not in names:
        for tensor in facts.tensors:
            if tensor.name == "token_embd.weight":
                gpu[output_device] += _alloc_bytes(tensor, alignment, row_padding)
    return gpu, host, {"devices_by_block": devices, "output_device": output_device, "host_expert_bytes": host_experts}


# --------------------------------------------------------------------------- compute buffer (estimate)

def compute_buffer_bytes(facts, ctx_size, parallel=1, ubatch=512, flash_attn=True, kv_unified=False,
                         blocks=None, has_output=True, cpu_expert_bytes_max=0, op_offload=True):
    """An estimate of one GPU's compute buffer (see docs/memory-model.md).

    The scheduler reserves the graph of the largest micro-batch (``ubatch`` tokens, at most the context) and
    reuses memory between layers, so the buffer is about the largest layer's live tensors plus what lives for
    the whole graph: the hidden state, the KQ mask (it grows with the context), the logits of the output layer
    and, when op offload is on, the copy of the largest CPU-resident expert block the GPU computes with.
    ``blocks``: the blocks on this device (all by default).
    """
    n_ctx, cells, streams = context_cells(ctx_size, parallel, kv_unified)
    tokens = min(ubatch, n_ctx)
    blocks = set(range(facts.block_count)) if blocks is None else set(blocks)
    f32 = 4
    hidden = facts.n_embd * tokens * f32
    peaks = [0]
    attention = [b for b in facts.kv_blocks if b in blocks]
    mask = 0
    if attention:
        mask = cells * pad(tokens, KQ_MASK_PAD) * (2 if flash_attn else f32)
        for block in attention:
            heads = facts.n_head.get(block) or 1
            hkv = facts.kv_heads.get(block) or 1
            k, v = facts.kv_blocks[block]
            qkv = (heads * k // hkv + k + v) * tokens * f32
            if flash_attn:
                peaks.append(qkv + heads * v // hkv * tokens * f32)
            else:  # the KQ scores of every head (soft_max works in place)
                peaks.append(qkv + cells * tokens * heads * f32)
    if any(b in blocks for b in facts.recurrent_blocks) and facts.ssm:
        s = facts.ssm
        conv_dim = s["d_inner"] + 2 * s["n_group"] * s["d_state"]
        in_proj = (2 * s["d_inner"] + 2 * s["n_group"] * s["d_state"] + s["n_head"]) * tokens * f32
        conv = conv_dim * (tokens + s["d_conv"] - 1) * f32
        # scan output, gate and norm (3 x d_inner per token) and the states of the batch
        scan = (3 * s["d_inner"] * tokens + s["d_state"] * s["d_inner"] * max(1, parallel)) * f32
        peaks.append(in_proj + conv + scan)
    if any(b in blocks for b in facts.expert_tensors_by_block) and facts.n_ff_exp:
        used = max(1, facts.expert_used_count)
        # up (and gate) results of the used experts, then down's result before the weighted sum
        peaks.append((2 * facts.n_ff_exp + facts.n_embd) * used * tokens * f32)
    logits = facts.n_vocab * max(1, parallel) * f32 if has_output else 0
    offload_copy = cpu_expert_bytes_max if (op_offload and tokens >= OP_OFFLOAD_MIN_BATCH) else 0
    return hidden + mask + max(peaks) + logits + offload_copy


# --------------------------------------------------------------------------- everything, per device

def estimate(facts, ctx_size, parallel=1, cache_type_k="f16", cache_type_v="f16", ubatch=512, flash_attn="auto",
             kv_unified=False, mmap=True, op_offload=True, cpu_tensors=(), split=None, n_devices=1,
             margin_mib=DEFAULT_MARGIN_MIB, backend="cuda"):
    """Bytes and MiB on each GPU and on the host for one configuration.

    Returns a dict: ``gpus`` (one dict per device: ``model``, ``kv``, ``recurrent``, ``compute``, ``margin``,
    ``total`` in bytes and the same keys with ``_mib``), ``host`` (``model``, ``output`` and ``_mib``),
    ``devices_by_block``, ``output_device``, ``flash_attn`` (bool), ``n_ctx``, ``warnings``.
    """
    validate_context(ctx_size, parallel, ubatch)
    fa = flash_attn in (True, "on", "auto", "true", "enabled")
    if not fa and cache_type_v not in ("f32", "f16", "bf16"):
        raise MemoryModelError("a quantized V cache (cache_type_v=%s) needs flash attention: set flash_attn to "
                               "on or auto, or use cache_type_v f16" % cache_type_v)
    gpu_weights, host_weights, placement = weight_bytes(facts, cpu_tensors, split, n_devices, backend)
    devices = placement["devices_by_block"]
    output_device = placement["output_device"]
    kv = kv_cache_bytes(facts, ctx_size, parallel, cache_type_k, cache_type_v, kv_unified)
    rs = recurrent_state_bytes(facts, parallel)
    cpu = set(cpu_tensors)
    sizes = dict((t.name, t.nbytes) for t in facts.tensors)
    gpus = []
    for device in range(n_devices):
        blocks = [b for b, d in enumerate(devices) if d == device]
        cpu_expert_max = max([sum(sizes.get(n, 0) for n in facts.expert_tensors_by_block.get(b, ()) if n in cpu)
                              for b in blocks] + [0])
        entry = {
            "model": gpu_weights[device],
            "kv": sum(kv.get(b, 0) for b in blocks),
            "recurrent": sum(rs.get(b, 0) for b in blocks),
            "compute": compute_buffer_bytes(facts, ctx_size, parallel, ubatch, fa, kv_unified, blocks,
                                            device == output_device, cpu_expert_max, op_offload),
            "margin": int(margin_mib * MIB),
        }
        entry["total"] = sum(entry.values())
        for key in list(entry):
            entry[key + "_mib"] = mib(entry[key])
        gpus.append(entry)
    host = {"model": host_weights, "output": output_buffer_bytes(facts, parallel), "mmap": bool(mmap)}
    host["model_mib"], host["output_mib"] = mib(host["model"]), mib(host["output"])
    warnings = []
    if facts.context_length and ctx_size > facts.context_length:
        warnings.append("ctx_size %d is beyond the model's training context (%d): quality may drop" % (
            ctx_size, facts.context_length))
    return {"gpus": gpus, "host": host, "devices_by_block": devices, "output_device": output_device,
            "flash_attn": fa, "n_ctx": context_cells(ctx_size, parallel, kv_unified)[0], "warnings": warnings}


def validate_context(ctx_size, parallel, ubatch=512):
    for name, value in (("ctx_size", ctx_size), ("parallel", parallel), ("ubatch", ubatch)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise MemoryModelError("%s must be a whole number >= 1, got %r" % (name, value))
    if pad(ctx_size, N_CTX_PAD) // parallel < 1:
        raise MemoryModelError("ctx_size %d cannot hold %d parallel slots" % (ctx_size, parallel))
