# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How much memory llama-server allocates on each GPU and on the host, from the GGUF header alone.

Standard library only: this runs on target hosts (Python >= 3.9). See docs/memory-model.md for the formulas
and where each one comes from in llama.cpp. Weights, KV cache, recurrent state and output buffer are exact
(they are what llama.cpp allocates); the compute buffers are an upper estimate.

``model_facts(metadata, tensors, layout)`` turns the reader's metadata and tensor infos and the classification's
``ModelLayout`` into a ``ModelFacts``; ``estimate(facts, ...)`` gives the bytes per device and on the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import (
    BLOCK_RE, CACHE_TYPES, LLAMA_MAX_LAYERS, MAX_BLOCKS, PLAIN_TYPE_IDS,
)

MIB = 1 << 20
DEFAULT_MARGIN_MIB = 1024  # llama.cpp's --fit keeps this much free per device (driver, CUDA context)
DEFAULT_HOST_MARGIN_MIB = 1024  # the server process itself on the host: binary, libraries, CUDA runtime
DEFAULT_BATCH = 2048  # llama-server's -b (common/common.h n_batch)
N_CTX_PAD = 256  # llama-context.cpp llama_context::llama_context: n_ctx and n_ctx_seq are padded to 256
SWA_PAD = 256  # llama-kv-cache-iswa.cpp llama_kv_cache_iswa::llama_kv_cache_iswa: "SWA cache is always padded to 256"
KQ_MASK_PAD = 64  # the tokens of the KQ mask are padded to a multiple of this (GGML_KQ_MASK_PAD)
OP_OFFLOAD_MIN_BATCH = 32  # CUDA offloads an op on host weights to the GPU from this many tokens on
PIPELINE_COPIES = 4  # ggml-backend.h GGML_SCHED_MAX_COPIES: input copies of a pipeline-parallel multi-GPU graph

# Where a backend puts tensors: byte alignment of each tensor in a buffer and, for CUDA, the extra
# row padding of quantized matrices (MATRIX_ROW_PADDING = 512 elements, once per tensor).
BACKENDS = {"cuda": (128, 512), "cpu": (32, 0), "rpc": (32, 0), "vulkan": (64, 0)}

# Global tensors of llama.cpp's input layer: they always stay in host memory.
INPUT_TENSOR_BASES = ("token_embd", "token_types", "position_embd", "per_layer_token_embd")

# Architectures llama.cpp runs without any memory module (llama-model.cpp llama_model::create_memory: res = nullptr).
NO_CACHE_ARCHS = frozenset((
    "bert", "jina-bert-v2", "jina-bert-v3", "nomic-bert", "nomic-bert-moe", "neo-bert", "eurobert",
    "wavtokenizer-dec", "modern-bert", "gemma-embedding", "dream", "llada", "llada-moe", "rnd1"))


class MemoryModelError(ValueError):
    """Input the memory model cannot size: ``str()`` says what and what to do."""


# --------------------------------------------------------------------------- sliding-window attention rules

@dataclass(frozen=True)
class SwaRule:
    """What an architecture's hyperparameter loader sets for sliding-window attention.

    llama.cpp: src/llama-model.cpp ``llama_model::load_hparams`` (since 2026 ``load_arch_hparams`` in
    src/models/<arch>.cpp) sets ``hparams.swa_type``, ``hparams.n_swa`` and calls
    ``hparams.set_swa_pattern(period, dense_first)`` (src/llama-hparams.cpp): layer ``il`` slides when
    ``period == 0`` or ``il % period < period - 1`` (``il % period != 0`` with ``dense_first``).
    """

    kind: str = "standard"  # llama_swa_type: standard (a window) or chunked (llama4's attention chunks)
    period: int = 0  # set_swa_pattern(period); 0 without a fixed period (the pattern key gives the layers)
    dense_first: bool = False
    window: int = 0  # the window llama.cpp sets itself: a default, or a fixed value with fixed_window
    fixed_window: bool = False  # the window key only switches SWA on/off, it does not change the window
    needs_key: bool = True  # SWA only when <arch>.attention.sliding_window is there and > 0
    reads_pattern_key: bool = False  # <arch>.attention.sliding_window_pattern: a period or one flag per layer
    blocks: int = 0  # only models with this many blocks (exaone4: SWA only for the 64-block 32B)


SWA_RULES = {
    "gemma2": SwaRule(period=2, window=4096, needs_key=False),  # n_swa = 4096 unless the key says otherwise
    "gemma3": SwaRule(period=6),
    "gemma3n": SwaRule(period=5),
    "cohere2": SwaRule(period=4, reads_pattern_key=True),
    "olmo2": SwaRule(period=4),
    "exaone4": SwaRule(period=4, window=4096, needs_key=False, blocks=64),
    "gpt-oss": SwaRule(period=2),
    "llama4": SwaRule(kind="chunked", period=4, window=8192, fixed_window=True, needs_key=False,
                      reads_pattern_key=True),
    "smallthinker": SwaRule(period=4, dense_first=True, window=4096, fixed_window=True),
    "afmoe": SwaRule(period=4, reads_pattern_key=True),
    "plamo3": SwaRule(period=8, reads_pattern_key=True),
    "gemma4": SwaRule(reads_pattern_key=True),
    "mimo2": SwaRule(reads_pattern_key=True),
    "step35": SwaRule(reads_pattern_key=True),
}
# llama.cpp switches the window of these off (phi3: "Phi SWA is currently disabled", swa_type NONE).
NO_SWA_ARCHS = frozenset(("phi3",))


@dataclass(frozen=True)
class SlidingWindow:
    """The sliding-window layout llama.cpp gives a model: which attention blocks slide, and how far."""

    kind: str  # "standard" or "chunked"
    window: int  # n_swa
    blocks: frozenset  # the attention blocks with a sliding window
    rule: str  # where the layout comes from, for people


def swa_pattern(period, block_count, dense_first=False):
    """The sliding blocks of ``set_swa_pattern(period, dense_first)`` (src/llama-hparams.cpp)."""
    if dense_first:
        return frozenset(b for b in range(block_count) if period == 0 or b % period != 0)
    return frozenset(b for b in range(block_count) if period == 0 or b % period < period - 1)


def _sliding_window(metadata, arch, block_count, attention_blocks, warnings):
    """The ``SlidingWindow`` of a model, ``None`` when every attention block has a full cache."""
    key = metadata.get(arch + ".attention.sliding_window")
    window = _int(key) if key is not None else None
    pattern = metadata.get(arch + ".attention.sliding_window_pattern")
    rule = SWA_RULES.get(arch)
    if arch in NO_SWA_ARCHS or not attention_blocks:
        return None
    if rule is None:
        if not window or window < 0:
            return None
        if pattern is None:
            warnings.append("%s.attention.sliding_window is %d but llama.cpp's layer pattern for %s is not known here: "
                            "every attention block is sized for the full context (an over-estimate)"
                            % (arch, window, arch))
            return None
        rule = SwaRule(reads_pattern_key=True)
    if rule.blocks and block_count != rule.blocks:
        return None
    if window is not None and window <= 0:
        return None  # the key is there and says no window (llama4: "found_swa && n_swa == 0")
    if window is None and rule.needs_key:
        return None
    n_swa = rule.window if (rule.fixed_window or window is None) else window
    how = "set_swa_pattern(%d%s)" % (rule.period, ", dense_first" if rule.dense_first else "")
    blocks = swa_pattern(rule.period, block_count, rule.dense_first) if rule.period else None
    if rule.reads_pattern_key and pattern is not None:
        if isinstance(pattern, (list, tuple)):
            flags = [int(v) if isinstance(v, bool) else _int(v) for v in pattern]
            if len(flags) != block_count or any(v is None for v in flags):
                raise MemoryModelError("%s.attention.sliding_window_pattern has %d entries, not one flag for each of "
                                       "the %d blocks" % (arch, len(flags), block_count))
            blocks = frozenset(b for b, flag in enumerate(flags) if flag)
            how = "%s.attention.sliding_window_pattern" % arch
        elif _int(pattern) is not None and _int(pattern) >= 0:
            blocks = swa_pattern(_int(pattern), block_count, rule.dense_first)
            how = "set_swa_pattern(%d) from %s.attention.sliding_window_pattern" % (_int(pattern), arch)
    if blocks is None:
        warnings.append("%s uses a sliding window of %d but its sliding_window_pattern is missing: every attention "
                        "block is sized for the full context (an over-estimate)" % (arch, n_swa))
        return None
    blocks = frozenset(b for b in blocks if b in attention_blocks)
    if not blocks or not n_swa:
        return None
    return SlidingWindow(rule.kind, n_swa, blocks, "%s of %s" % (how, arch))


# --------------------------------------------------------------------------- the facts of a model

@dataclass(frozen=True)
class TensorFacts:
    """What the memory model needs of one tensor."""

    name: str
    nbytes: int
    block: int | None
    type_id: int | None
    shape: tuple
    expert: bool


@dataclass(frozen=True)
class ModelFacts:
    """The numbers of a model the formulas use; built once by ``model_facts`` and never changed."""

    architecture: str
    block_count: int
    n_embd: int
    n_vocab: int
    context_length: int | None
    kv_blocks: dict  # {block: (n_embd_k_gqa, n_embd_v_gqa)} of the blocks that own a KV cache
    n_head: dict = field(default_factory=dict)  # {block: query heads} of the attention blocks
    kv_heads: dict = field(default_factory=dict)  # {block: KV heads} of the attention blocks
    q_width: dict = field(default_factory=dict)  # {block: n_head * head_dim_k} (the Q projection)
    mla: bool = False
    sliding_window: SlidingWindow | None = None
    kv_reused: tuple = ()  # attention blocks that read an earlier block's cache (n_layer_kv_from_start)
    recurrent_blocks: dict = field(default_factory=dict)  # {block: (n_embd_r, n_embd_s)} in F32 elements
    ssm: dict = field(default_factory=dict)  # {d_conv, d_inner, d_state, n_group, n_head} or {}
    memory: str = "kv"  # llama_model::create_memory: kv, iswa, hybrid, hybrid_iswa, recurrent or none
    ffn: dict = field(default_factory=dict)  # {block: n_ff} of the dense FFN blocks
    shexp: dict = field(default_factory=dict)  # {block: n_ff_shexp} of the shared experts
    n_expert: int = 0
    expert_used_count: int = 0
    n_ff_exp: int = 0
    tensors: tuple = ()  # (TensorFacts, ...)
    expert_tensors_by_block: dict = field(default_factory=dict)
    tensor_class: dict = field(default_factory=dict)
    path: str = ""
    warnings: list = field(default_factory=list)

    @cached_property
    def tensor_names(self):
        return [t.name for t in self.tensors]

    @property
    def expert_blocks(self):
        return sorted(self.expert_tensors_by_block)

    @cached_property
    def expert_names(self):
        return sorted(n for names in self.expert_tensors_by_block.values() for n in names)

    def expert_bytes_by_block(self):
        sizes = dict((t.name, t.nbytes) for t in self.tensors)
        return dict((b, sum(sizes.get(n, 0) for n in names)) for b, names in self.expert_tensors_by_block.items())

    @property
    def swa_blocks(self):
        return self.sliding_window.blocks if self.sliding_window else frozenset()

    @property
    def dense(self):
        """No routed experts: a dense model."""
        return not self.expert_tensors_by_block


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


def model_facts(metadata, tensors, layout, path="", warnings=()):
    """Gather the numbers of the formulas from a GGUF's ``metadata``, its ``tensors`` and its ``layout``.

    ``tensors``: objects with ``.name``, ``.shape``, ``.nbytes`` (and ``.type_id`` when known), such as the
    reader's ``TensorInfo``. ``layout``: ``_tensor_classes.classify_model``'s ``ModelLayout``. ``path`` and
    ``warnings`` (the reader's) are kept in the facts. Metadata the formulas need but the file lacks is taken
    from the tensor shapes, with a warning; raises ``MemoryModelError`` when neither gives it.
    """
    metadata = metadata or {}
    arch = layout.architecture or metadata.get("general.architecture") or ""
    notes = list(warnings)
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
        notes.append("%s.embedding_length missing: %d taken from the embedding tensor" % (arch, n_embd))
    n_vocab = _count(metadata.get("tokenizer.ggml.tokens")) or _dim(metadata.get(arch + ".vocab_size"))
    if not n_vocab:
        if not embd_shape or len(embd_shape) < 2:
            raise MemoryModelError("the vocabulary size is unknown: no tokenizer.ggml.tokens, no %s.vocab_size "
                                   "and no token_embd/output tensor" % arch)
        n_vocab = embd_shape[1]
        notes.append("vocabulary size missing: %d taken from the embedding tensor" % n_vocab)

    attention = list(layout.layer_kinds.get("attention", []))
    sliding = _sliding_window(metadata, arch, block_count, set(attention), notes)
    kv = _attention_widths(metadata, arch, n_embd, attention, sliding, block_shape, notes)

    # Blocks from n_layer_kv_from_start on read the cache of an earlier block and own none (llama-hparams.cpp
    # llama_hparams::has_kv): gemma3n sets 20, gemma4 n_layer - attention.shared_kv_layers.
    shared = _int(metadata.get(arch + ".attention.shared_kv_layers"))
    kv_from = block_count - shared if shared and 0 < shared < block_count else 20 if arch == "gemma3n" else None
    kv_reused = tuple(b for b in attention if kv_from is not None and b >= kv_from)
    kv_blocks = dict((b, widths) for b, widths in kv["widths"].items() if b not in kv_reused)

    # Recurrent blocks: conv state and SSM/WKV state, F32.
    recurrent = list(layout.layer_kinds.get("recurrent", []))
    ssm = {}
    recurrent_blocks = {}
    if recurrent:
        n_embd_r, n_embd_s, ssm = _recurrent_widths(metadata, arch, n_embd, recurrent[0], shape, block_shape, notes)
        recurrent_blocks = dict((b, (n_embd_r, n_embd_s)) for b in recurrent)

    if arch in NO_CACHE_ARCHS:
        memory, kv_blocks, recurrent_blocks = "none", {}, {}
    elif recurrent_blocks and not kv_blocks:
        memory = "recurrent"
    else:
        memory = ("hybrid" if recurrent_blocks else "kv") + ("_iswa" if sliding else "")
        memory = "iswa" if memory == "kv_iswa" else memory

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
        notes.append("%d tensor(s) of unknown type counted as 0 bytes (%s): the weights are underestimated"
                     % (len(unknown), ", ".join(unknown[:3])))

    ffn, shexp, n_expert, n_ff_exp = _ffn_widths(metadata, arch, layout, shape, block_shape)
    return ModelFacts(
        architecture=arch, block_count=block_count, n_embd=n_embd, n_vocab=n_vocab,
        context_length=_int(metadata.get(arch + ".context_length")), kv_blocks=kv_blocks, n_head=kv["n_head"],
        kv_heads=kv["kv_heads"], q_width=kv["q_width"], mla=kv["mla"], sliding_window=sliding, kv_reused=kv_reused,
        recurrent_blocks=recurrent_blocks, ssm=ssm, memory=memory, ffn=ffn, shexp=shexp, n_expert=n_expert,
        expert_used_count=layout.expert_used_count or 0, n_ff_exp=n_ff_exp, tensors=tuple(facts_tensors),
        expert_tensors_by_block=dict((b, list(n)) for b, n in layout.expert_tensors_by_block.items()
                                     if b is not None),
        tensor_class=dict(layout.tensor_class), path=path,
        warnings=notes + list(getattr(layout, "warnings", []) or []))


def _attention_widths(metadata, arch, n_embd, attention, sliding, block_shape, notes):
    """KV widths of the attention blocks: ``head_count_kv[i] * key_length`` / ``value_length`` (the ``_swa``
    lengths on sliding blocks, llama_hparams::n_embd_head_k(il)), or the attn_k/attn_v shapes."""
    block_count = max(attention) + 1 if attention else 0
    head_kv = _per_block(metadata, arch + ".attention.head_count_kv", max(block_count, _block_count(metadata, arch)))
    head_kv_invalid = head_kv is None and metadata.get(arch + ".attention.head_count_kv") is not None
    head = _per_block(metadata, arch + ".attention.head_count", max(block_count, _block_count(metadata, arch))) or {}
    lengths = dict((name, _dim(metadata.get(arch + ".attention." + name)))
                   for name in ("key_length", "value_length", "key_length_swa", "value_length_swa"))
    # Multi-head latent attention (deepseek2 converted with *_mla keys): llama.cpp caches only the compressed
    # K (kv_lora_rank + rope dims, one KV head); V is a view of it, so the V cache has no bytes
    # (llama-kv-cache.cpp llama_kv_cache::llama_kv_cache: has_v = !is_mla).
    mla = bool(_dim(metadata.get(arch + ".attention.key_length_mla"))
               and _dim(metadata.get(arch + ".attention.value_length_mla")))
    swa_blocks = sliding.blocks if sliding else frozenset()
    widths, kv_heads, n_head, q_width = {}, {}, {}, {}
    fell_back = []
    for block in attention:
        key_length = (block in swa_blocks and lengths["key_length_swa"]) or lengths["key_length"]
        value_length = (block in swa_blocks and lengths["value_length_swa"]) or lengths["value_length"]
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
            if k_width is None or (k_width, v_width) != (k_shape[1], v_shape[1]):
                fell_back.append(block)
            k_width, v_width = k_shape[1], v_shape[1]
        if k_width is None:
            raise MemoryModelError("block %d is an attention block but neither the metadata (%s.attention."
                                   "head_count_kv, key_length, value_length) nor attn_k/attn_v tensors give its "
                                   "KV width" % (block, arch))
        widths[block] = (k_width, 0 if mla else v_width)
        kv_heads[block] = hkv or 1
        q_shape = block_shape(block, "attn_q")
        q_width[block] = q_shape[1] if q_shape else max(n_head[block], 1) * (key_length or k_width // kv_heads[block])
    if fell_back:
        notes.append("KV widths of blocks %s taken from the attn_k/attn_v tensor shapes (metadata "
                     "incomplete)" % ", ".join(str(b) for b in fell_back))
    return {"widths": widths, "kv_heads": kv_heads, "n_head": n_head, "q_width": q_width, "mla": mla}


def _block_count(metadata, arch):
    return _dim(metadata.get(arch + ".block_count")) or 0


def _ffn_widths(metadata, arch, layout, shape, block_shape):
    """Dense FFN widths per block, shared-expert widths per block, the expert count and the expert FFN width,
    from the up (or gate) projections' shapes (``ne[1]``)."""
    ffn, shexp = {}, {}
    for block in range(min(layout.block_count, MAX_BLOCKS)):
        for base in ("ffn_up", "ffn_gate"):
            dims = block_shape(block, base)
            if dims:
                ffn[block] = dims[1]
                break
        for base in ("ffn_up_shexp", "ffn_gate_shexp"):
            dims = block_shape(block, base)
            if dims:
                shexp[block] = dims[1]
                break
    n_expert = layout.expert_count or 0
    n_ff_exp = _int(metadata.get(arch + ".expert_feed_forward_length")) or 0
    if not n_ff_exp:
        for names in layout.expert_tensors_by_block.values():
            for name in names:
                dims = shape(name, 2)
                if dims and "_down_" in name:
                    n_ff_exp = dims[0]
                elif dims and "_gate_up_" in name:
                    n_ff_exp = dims[1] // 2
                if n_ff_exp:
                    break
            if n_ff_exp:
                break
    return ffn, shexp, n_expert, max(n_ff_exp, 0)


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

def row_bytes(type_name, n):
    """Bytes of a row of ``n`` elements of the cache type ``type_name`` (ggml_row_size)."""
    try:
        block, size = CACHE_TYPES[type_name]
    except KeyError:
        raise MemoryModelError("unknown cache type %r (llama-server knows %s)" % (
            type_name, ", ".join(sorted(CACHE_TYPES)))) from None
    if n % block:
        raise MemoryModelError("a KV row of %d elements is not a multiple of the %d-element blocks of %s: "
                               "llama.cpp cannot use that cache type for this model" % (n, block, type_name))
    return n // block * size


def pad(value, multiple):
    return (value + multiple - 1) // multiple * multiple


def mib(nbytes):
    """Bytes to MiB, rounded to 0.01 as llama.cpp prints them."""
    return round(nbytes / float(MIB), 2)


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


def cache_cells(facts, ctx_size, parallel=1, kv_unified=False, ubatch=512, batch=DEFAULT_BATCH, swa_full=False):
    """The cells of the full and of the sliding-window cache.

    llama-kv-cache-iswa.cpp ``llama_kv_cache_iswa::llama_kv_cache_iswa`` (and llama-memory-hybrid-iswa.cpp for
    hybrids) with ``kv_size = n_ctx_seq`` (llama-model.cpp ``llama_model::create_memory``):
    ``size_swa = pad(min(size_base, n_swa * (unified ? n_seq_max : 1) + n_ubatch), 256)``, or ``size_base``
    with ``--swa-full``. Both caches have one stream per slot unless unified. Chunked attention (llama4) is
    sized the same way with its chunk as the window.
    """
    n_ctx, cells, streams = context_cells(ctx_size, parallel, kv_unified)
    n_ubatch = micro_batch(ctx_size, ubatch, batch)
    swa = 0
    if facts.sliding_window:
        seqs = max(1, parallel) if kv_unified else 1
        swa = cells if swa_full else pad(min(cells, facts.sliding_window.window * seqs + n_ubatch), SWA_PAD)
    return CacheCells(n_ctx, cells, streams, swa, n_ubatch)


def kv_cache_bytes(facts, ctx_size, parallel=1, cache_type_k="f16", cache_type_v="f16", kv_unified=False, *,
                   ubatch=512, batch=DEFAULT_BATCH, swa_full=False, flash_attn=True):
    """KV cache bytes of each block that owns a cache: ``{block: bytes}``.

    llama-kv-cache.cpp ``llama_kv_cache::llama_kv_cache``: per layer a K tensor ``[n_embd_k_gqa, kv_size,
    n_stream]`` and a V tensor ``[n_embd_v_gqa, kv_size, n_stream]``; without flash attention the V cache is
    transposed and every layer's V row is ``n_embd_v_gqa_max()`` wide; MLA has no V tensor. Sliding blocks
    use the SWA cache's cells.
    """
    cc = cache_cells(facts, ctx_size, parallel, kv_unified, ubatch, batch, swa_full)
    widest_v = max([v for _k, v in facts.kv_blocks.values()] + [0])
    swa = facts.swa_blocks
    result = {}
    for block, (k, v) in facts.kv_blocks.items():
        v_width = v if (flash_attn or not v) else widest_v
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


def weight_bytes(facts, cpu_tensors=(), split=None, n_devices=1, backend="cuda", device_tensors=None):
    """Model weights per GPU and on the host.

    ``cpu_tensors``: the names an ``-ot ...=CPU`` pattern moves to the host; ``device_tensors``: ``{name: device}``
    for the names an ``-ot ...=CUDA<n>`` pattern puts on another GPU than their layer's. Returns
    ``(gpu_bytes list, host_bytes, detail)``: the input layer (token_embd) stays on the host as in llama.cpp; the
    output layer goes to the device of ``block_count``; without an ``output.weight`` llama.cpp puts a copy of
    token_embd there (tied embeddings). With ``n_devices == 0`` (a CPU host) every tensor is on the host.
    """
    alignment, row_padding = BACKENDS[backend]
    cpu = set(cpu_tensors)
    moved = dict(device_tensors or {})
    if n_devices == 0:
        host = sum(t.nbytes for t in facts.tensors)
        return [], host, {"devices_by_block": [], "output_device": None,
                          "host_expert_bytes": sum(t.nbytes for t in facts.tensors if t.expert)}
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
        if tensor.name in moved:
            device = moved[tensor.name]
        elif tensor.block is not None and tensor.block < len(devices):
            device = devices[tensor.block]
        else:
            device = output_device
        gpu[device] += _alloc_bytes(tensor, alignment, row_padding)
    if "output.weight" not in names:
        for tensor in facts.tensors:
            if tensor.name == "token_embd.weight":
                gpu[output_device] += _alloc_bytes(tensor, alignment, row_padding)
    return gpu, host, {"devices_by_block": devices, "output_device": output_device, "host_expert_bytes": host_experts}


# --------------------------------------------------------------------------- compute buffers (upper estimate)

F32 = 4


def _moe_bytes(facts, tokens, with_router=True):
    """The routed experts' live tensors (llama-graph.cpp ``llm_graph_context::build_moe_ffn``): router logits,
    probabilities and the argsort of every expert (the ids view keeps it alive through the expert products),
    the selected weights, up, gate and the activation of each used expert, and down's result."""
    used = max(1, facts.expert_used_count)
    n_expert = max(facts.n_expert, used)
    router = (2 * n_expert + used) * tokens * F32 if with_router else used * 2 * tokens * F32
    return router + (3 * facts.n_ff_exp + facts.n_embd) * used * tokens * F32


def compute_buffer_bytes(facts, ctx_size, parallel=1, ubatch=512, flash_attn=True, kv_unified=False,
                         blocks=None, has_output=True, cpu_expert_bytes_max=0, op_offload=True, *,
                         batch=DEFAULT_BATCH, swa_full=False, foreign_expert_blocks=(), copies=1):
    """An upper estimate of one device's compute buffer (see docs/memory-model.md).

    llama-context.cpp ``llama_context::sched_reserve`` reserves the graph of the largest micro-batch
    (``n_ubatch`` tokens) and ggml-alloc.c reuses a tensor's memory once its last consumer ran, so the buffer is
    what lives for the whole graph on this device (its input hidden state, the residual stream, the KQ masks of
    the full and of the sliding-window cache), the largest of the layers' working sets (attention, dense FFN,
    routed and shared experts, Mamba), the logits of one row per sequence on the output device and, when op
    offload is on, the copy of the largest host-resident expert block the GPU computes with.

    ``blocks``: the blocks on this device (all by default); ``foreign_expert_blocks``: blocks of another device
    whose experts this device holds (it computes their products); ``copies``: the input copies of a
    pipeline-parallel graph (llama.cpp uses 4 on several GPUs without tensor overrides).
    """
    cc = cache_cells(facts, ctx_size, parallel, kv_unified, ubatch, batch, swa_full)
    tokens = min(cc.ubatch, cc.n_ctx)
    blocks = set(range(facts.block_count)) if blocks is None else set(blocks)
    embd = facts.n_embd * tokens * F32
    attention = [b for b in sorted(facts.kv_blocks) + list(facts.kv_reused) if b in blocks]
    swa = facts.swa_blocks
    masks = _mask_bytes(facts, cc, attention, 2 if flash_attn else F32)
    peaks = [0]
    for block in attention:
        k, v = facts.kv_blocks.get(block, (0, 0))  # a block reading another's cache projects only Q
        heads = facts.n_head.get(block) or 1
        hkv = facts.kv_heads.get(block) or 1
        q = facts.q_width.get(block) or heads * k // hkv
        out = max(q, heads * v // hkv) * tokens * F32
        work = embd + (q + k + v) * tokens * F32 + out
        if not flash_attn:  # the KQ scores of every head (soft_max works in place) and the merged heads' copy
            work += (cc.swa_cells if block in swa else cc.cells) * tokens * heads * F32 + out
        peaks.append(work)
    for block in blocks:
        if block in facts.ffn:
            peaks.append(2 * embd + 3 * facts.ffn[block] * tokens * F32)
        if block in facts.shexp:
            peaks.append(3 * embd + 3 * facts.shexp[block] * tokens * F32)
        if block in facts.expert_tensors_by_block and facts.n_ff_exp:
            peaks.append(embd + _moe_bytes(facts, tokens))
    for block in foreign_expert_blocks:
        if block in facts.expert_tensors_by_block and facts.n_ff_exp:
            peaks.append(embd + _moe_bytes(facts, tokens, with_router=False))
    if any(b in blocks for b in facts.recurrent_blocks) and facts.ssm:
        s = facts.ssm
        conv_dim = s["d_inner"] + 2 * s["n_group"] * s["d_state"]
        in_proj = (2 * s["d_inner"] + 2 * s["n_group"] * s["d_state"] + s["n_head"]) * tokens * F32
        conv = conv_dim * (tokens + s["d_conv"] - 1) * F32
        # scan output, gate and norm (3 x d_inner per token) and the states of the batch
        scan = (3 * s["d_inner"] * tokens + s["d_state"] * s["d_inner"] * max(1, parallel)) * F32
        peaks.append(embd + in_proj + conv + scan)
    logits = facts.n_vocab * max(1, parallel) * F32 if has_output else 0
    offload_copy = cpu_expert_bytes_max if (op_offload and tokens >= OP_OFFLOAD_MIN_BATCH) else 0
    return copies * (embd + masks) + embd + max(peaks) + logits + offload_copy


def _mask_bytes(facts, cells, attention, per_cell):
    """The KQ masks of the caches ``attention`` blocks use: ``cells x pad(tokens per stream, 64) x streams``
    elements each (llama-graph.cpp ``build_attn_inp_kv`` / ``build_attn_inp_kv_iswa``)."""
    tokens = min(cells.ubatch, cells.n_ctx)
    rows = pad(max(1, tokens // cells.streams), KQ_MASK_PAD) * cells.streams
    swa = facts.swa_blocks
    total = 0
    if any(b not in swa for b in attention):
        total += cells.cells * rows * per_cell
    if any(b in swa for b in attention):
        total += cells.swa_cells * rows * per_cell
    return total


def host_compute_bytes(facts, ctx_size, parallel=1, ubatch=512, batch=DEFAULT_BATCH, cpu_expert_blocks=(),
                       op_offload=True, *, kv_unified=False, swa_full=False, flash_attn=True, copies=1):
    """The host's compute buffer beside GPUs. ggml-backend.c ``ggml_backend_sched`` keeps the graph's inputs on the
    CPU backend (``GGML_TENSOR_FLAG_INPUT``): the token ids, positions and KQ masks (F32, and their F16 cast with
    flash attention), ``copies`` times in a pipeline-parallel graph; the embedding rows are looked up on the host
    (token_embd stays there); and when the GPU does not compute host-resident experts (no op offload, or
    micro-batches under 32 tokens), those experts' working set."""
    cells = cache_cells(facts, ctx_size, parallel, kv_unified, ubatch, batch, swa_full)
    tokens = min(cells.ubatch, cells.n_ctx)
    attention = sorted(facts.kv_blocks) + list(facts.kv_reused)
    inputs = 3 * tokens * F32 + _mask_bytes(facts, cells, attention, F32 + (2 if flash_attn else 0))
    total = copies * inputs + facts.n_embd * tokens * F32
    if cpu_expert_blocks and facts.n_ff_exp and not (op_offload and tokens >= OP_OFFLOAD_MIN_BATCH):
        total += 2 * facts.n_embd * tokens * F32 + _moe_bytes(facts, tokens, with_router=False)
    return total


# --------------------------------------------------------------------------- everything, per device

def estimate(facts, ctx_size, parallel=1, cache_type_k="f16", cache_type_v="f16", ubatch=512, flash_attn="auto",
             kv_unified=False, mmap=True, op_offload=True, cpu_tensors=(), split=None, n_devices=1,
             margin_mib=DEFAULT_MARGIN_MIB, backend="cuda", *, batch=DEFAULT_BATCH, swa_full=False,
             device_tensors=None, host_margin_mib=DEFAULT_HOST_MARGIN_MIB):
    """Bytes and MiB on each GPU and on the host for one configuration.

    Returns a dict: ``gpus`` (one dict per device: ``model``, ``kv``, ``recurrent``, ``compute``, ``margin``,
    ``total`` in bytes and the same keys with ``_mib``), ``host`` (``model``, ``kv``, ``recurrent``, ``output``,
    ``compute``, ``margin``, ``total``, their ``_mib``, ``mmap`` and ``pinned``), ``devices_by_block``,
    ``output_device``, ``flash_attn`` (bool), ``n_ctx``, ``cells`` (``CacheCells``), ``warnings``.
    ``n_devices == 0`` sizes a CPU host: everything is in host memory.
    """
    validate_context(ctx_size, parallel, ubatch)
    fa = flash_attn in (True, "on", "auto", "true", "enabled")
    if not fa and cache_type_v not in ("f32", "f16", "bf16"):
        raise MemoryModelError("a quantized V cache (cache_type_v=%s) needs flash attention: set flash_attn to "
                               "on or auto, or use cache_type_v f16" % cache_type_v)
    moved = dict(device_tensors or {})
    gpu_weights, host_weights, placement = weight_bytes(facts, cpu_tensors, split, n_devices, backend, moved)
    devices = placement["devices_by_block"]
    output_device = placement["output_device"]
    cache = dict(ubatch=ubatch, batch=batch, swa_full=swa_full)
    kv = kv_cache_bytes(facts, ctx_size, parallel, cache_type_k, cache_type_v, kv_unified, flash_attn=fa, **cache)
    rs = recurrent_state_bytes(facts, parallel)
    cpu = set(cpu_tensors)
    sizes = dict((t.name, t.nbytes) for t in facts.tensors)
    # Several GPUs without any tensor override run pipeline-parallel (llama-context.cpp: n_devices > 1, all
    # layers offloaded, split mode layer, no tensor overrides): each split's inputs are kept 4 times.
    copies = PIPELINE_COPIES if n_devices > 1 and backend == "cuda" and not cpu and not moved else 1
    gpus = []
    for device in range(n_devices):
        blocks = [b for b, d in enumerate(devices) if d == device]
        cpu_expert_max = max([sum(sizes.get(n, 0) for n in facts.expert_tensors_by_block.get(b, ()) if n in cpu)
                              for b in blocks] + [0])
        foreign = sorted(b for b, names in facts.expert_tensors_by_block.items()
                         if devices[b] != device and any(moved.get(n) == device for n in names))
        entry = {
            "model": gpu_weights[device],
            "kv": sum(kv.get(b, 0) for b in blocks),
            "recurrent": sum(rs.get(b, 0) for b in blocks),
            "compute": compute_buffer_bytes(facts, ctx_size, parallel, ubatch, fa, kv_unified, blocks,
                                            device == output_device, cpu_expert_max, op_offload, batch=batch,
                                            swa_full=swa_full, foreign_expert_blocks=foreign, copies=copies),
            "margin": int(margin_mib * MIB),
        }
        entry["total"] = sum(entry.values())
        for key in list(entry):
            entry[key + "_mib"] = mib(entry[key])
        gpus.append(entry)
    host = {"model": host_weights, "kv": 0, "recurrent": 0, "output": output_buffer_bytes(facts, parallel)}
    inputs = dict(kv_unified=kv_unified, swa_full=swa_full, flash_attn=fa)
    if n_devices == 0:
        host["kv"], host["recurrent"] = sum(kv.values()), sum(rs.values())
        host["compute"] = compute_buffer_bytes(facts, ctx_size, parallel, ubatch, fa, kv_unified, None, True, 0,
                                               False, batch=batch, swa_full=swa_full) \
            + host_compute_bytes(facts, ctx_size, parallel, ubatch, batch, **inputs)
    else:
        cpu_blocks = sorted(set(b for b, names in facts.expert_tensors_by_block.items() if cpu.intersection(names)))
        host["compute"] = host_compute_bytes(facts, ctx_size, parallel, ubatch, batch, cpu_blocks, op_offload,
                                             copies=copies, **inputs)
    host["margin"] = int(host_margin_mib * MIB)
    host["total"] = sum(host.values())
    for key in list(host):
        host[key + "_mib"] = mib(host[key])
    # --no-mmap on a CUDA build: host weights go to a pinned CUDA_Host buffer (locked, never swapped);
    # with mmap they stay in the page cache of the model file.
    host["mmap"] = bool(mmap)
    host["pinned"] = not mmap and n_devices > 0 and backend == "cuda"
    warnings = []
    if facts.context_length and ctx_size > facts.context_length:
        warnings.append("ctx_size %d is beyond the model's training context (%d): quality may drop" % (
            ctx_size, facts.context_length))
    cells = cache_cells(facts, ctx_size, parallel, kv_unified, ubatch, batch, swa_full)
    return {"gpus": gpus, "host": host, "devices_by_block": devices, "output_device": output_device,
            "flash_attn": fa, "n_ctx": cells.n_ctx, "cells": cells, "warnings": warnings}


def validate_context(ctx_size, parallel, ubatch=512):
    for name, value in (("ctx_size", ctx_size), ("parallel", parallel), ("ubatch", ubatch)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise MemoryModelError("%s must be a whole number >= 1, got %r" % (name, value))
    if pad(ctx_size, N_CTX_PAD) // parallel < 1:
        raise MemoryModelError("ctx_size %d cannot hold %d parallel slots" % (ctx_size, parallel))
