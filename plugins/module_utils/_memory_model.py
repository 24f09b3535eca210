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
        if window is None or window <= 0:
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
        elif _int(pattern) is not None and _int(pattern) >= 0:  # (no rule that reads the key is dense_first)
            blocks = swa_pattern(_int(pattern), block_count)
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
    ffn: dict = field(default_factory=dict)  # {block: n_ff} of the dense FFN blocks (the up projection's width)
    ffn_gated: frozenset = frozenset()  # dense FFN blocks with a separate gate projection (ffn_gate)
    ffn_fused: frozenset = frozenset()  # dense FFN blocks whose up projection holds gate and up (phi3)
    shexp: dict = field(default_factory=dict)  # {block: n_ff_shexp} of the shared experts
    shexp_gated: frozenset = frozenset()  # shared experts with a gate projection
    experts_gated: bool = False  # routed experts with a gate (ffn_gate_exps, ffn_gate_up_exps)
    expert_probs_bias: bool = False  # a selection bias (exp_probs_b) on the router's probabilities
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

    ffn = _ffn_widths(metadata, arch, layout, shape, block_shape)
    names = set(by_name)
    return ModelFacts(
        architecture=arch, block_count=block_count, n_embd=n_embd, n_vocab=n_vocab,
        context_length=_int(metadata.get(arch + ".context_length")), kv_blocks=kv_blocks, n_head=kv["n_head"],
        kv_heads=kv["kv_heads"], q_width=kv["q_width"], mla=kv["mla"], sliding_window=sliding, kv_reused=kv_reused,
        recurrent_blocks=recurrent_blocks, ssm=ssm, memory=memory, tensors=tuple(facts_tensors),
        expert_used_count=layout.expert_used_count or 0,
        experts_gated=any(".ffn_gate" in n for n in expert_names),
        expert_probs_bias=any(n.endswith(".exp_probs_b.bias") for n in names), **ffn,
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
    """The FFN shapes the compute estimate needs, from the projections' shapes (``ne[1]`` of up/gate, ``ne[0]``
    of down): dense FFN widths per block and which blocks have a gate or a fused gate+up projection (up twice as
    wide as down's input), shared-expert widths and gates, the expert count and the expert FFN width."""
    ffn, shexp = {}, {}
    gated, fused, shexp_gated = set(), set(), set()
    for block in range(min(layout.block_count, MAX_BLOCKS)):
        up, gate = block_shape(block, "ffn_up"), block_shape(block, "ffn_gate")
        if up or gate:
            ffn[block] = (up or gate)[1]
            down = block_shape(block, "ffn_down")
            if up and gate:
                gated.add(block)
            elif up and down and up[1] == 2 * down[0]:
                fused.add(block)
        up, gate = block_shape(block, "ffn_up_shexp"), block_shape(block, "ffn_gate_shexp")
        if up or gate:
            shexp[block] = (up or gate)[1]
            if up and gate:
                shexp_gated.add(block)
    n_expert = layout.expert_count or 0
    n_ff_exp = _int(metadata.get(arch + ".expert_feed_forward_length")) or 0
    if not n_ff_exp:
        for names in layout.expert_tensors_by_block.values():
            for name in names:
                dims = shape(name, 2)
                if dims and "_down_" in name:  # every MoE block has one (ffn_down_exps: {n_ff_exp, n_embd, n_expert})
                    n_ff_exp = dims[0]
                if n_ff_exp:
                    break
            if n_ff_exp:
                break
    return {"ffn": ffn, "ffn_gated": frozenset(gated), "ffn_fused": frozenset(fused), "shexp": shexp,
            "shexp_gated": frozenset(shexp_gated), "n_expert": n_expert, "n_ff_exp": max(n_ff_exp, 0)}


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

def _cache_type(type_name):
    """``(elements per block, bytes per block)`` of a KV cache type; an unknown name is an error."""
    try:
        return CACHE_TYPES[type_name]
    except KeyError:
        raise MemoryModelError("unknown cache type %r (llama-server knows %s)" % (
            type_name, ", ".join(sorted(CACHE_TYPES)))) from None


def row_bytes(type_name, n):
    """Bytes of a row of ``n`` elements of the cache type ``type_name`` (ggml_row_size)."""
    block, size = _cache_type(type_name)
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


def _check_head_blocks(facts, cache_type_k, cache_type_v):
    """llama-context.cpp ``llama_init_from_model`` refuses a cache type whose block does not divide the head size
    ("K cache type q8_0 with block size 32 does not divide n_embd_head_k=16"); MLA caches no V."""
    head_k, head_v = _head_dims(facts)
    for side, type_name, head in (("K", cache_type_k, head_k), ("V", cache_type_v, 0 if facts.mla else head_v)):
        block = _cache_type(type_name)[0]
        if head and head % block:
            raise MemoryModelError(
                "%s cache type %s with block size %d does not divide the head size %d (n_embd_head_%s): a head is "
                "not a multiple of its blocks, and llama.cpp refuses to create the context; use another "
                "cache_type_%s" % (side, type_name, block, head, side.lower(), side.lower()))


def kv_cache_bytes(facts, ctx_size, parallel=1, cache_type_k="f16", cache_type_v="f16", kv_unified=False, *,
                   ubatch=512, batch=DEFAULT_BATCH, swa_full=False, flash_attn=True):
    """KV cache bytes of each block that owns a cache: ``{block: bytes}``.

    llama-kv-cache.cpp ``llama_kv_cache::llama_kv_cache``: per layer a K tensor ``[n_embd_k_gqa, kv_size,
    n_stream]`` and a V tensor ``[n_embd_v_gqa, kv_size, n_stream]``; without flash attention the V cache is
    transposed and every layer's V row is ``n_embd_v_gqa_max()`` wide; MLA has no V tensor. Sliding blocks
    use the SWA cache's cells.
    """
    _check_head_blocks(facts, cache_type_k, cache_type_v)
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
#
# llama-context.cpp llama_context::sched_reserve reserves the graph of one worst-case micro-batch
# (llama_context::graph_reserve). ggml-backend.cpp ggml_backend_sched_split_graph gives each device a copy of every
# graph input its nodes read (the hidden state, positions, KQ masks, KV row indices), allocated when its split
# starts, and keeps the graph inputs themselves on the CPU backend. ggml-alloc.c ggml_gallocr_alloc_graph_impl
# hands a tensor's memory back after its last consumer ran, and computes element-wise ops (ggml_op_can_inplace)
# in the memory of an input that has no other consumer. A device's compute buffer is therefore its input copies
# plus the tensors alive at the worst node of its blocks. The estimate takes, for each kind of block, the tensors
# llama-graph.cpp has alive at that block's worst node, and counts a freed tensor as a hole that a larger one
# cannot reuse, so it is never under what the allocator reserves.

F32 = 4
I32 = 4
I64 = 8


@dataclass(frozen=True)
class GraphShape:
    """The micro-batch the compute buffers are reserved for (llama_context::sched_reserve): ``tokens`` (n_ubatch,
    rounded up to a multiple of the slots by llama_context::graph_reserve), ``seqs`` (one per slot), ``outputs``
    (llama-server asks for one logits row per slot: n_outputs_max) and the caches' ``cells``."""

    tokens: int
    seqs: int
    outputs: int
    cells: CacheCells


def graph_shape(facts, ctx_size, parallel=1, kv_unified=False, ubatch=512, batch=DEFAULT_BATCH, swa_full=False):
    cells = cache_cells(facts, ctx_size, parallel, kv_unified, ubatch, batch, swa_full)
    seqs = max(1, parallel)
    tokens = pad(min(cells.ubatch, cells.n_ctx), seqs)
    return GraphShape(tokens, seqs, min(seqs, tokens), cells)


# Architectures whose graph keeps only the output rows (inp_out_ids) before the last block's feed-forward part:
# src/models/<arch>.cpp has ``if (il == n_layer - 1 && inp_out_ids)`` without further conditions (llama.cpp b10435).
# The others (nemotron_h, gpt-oss, deepseek2, qwen3next, gemma4...) run the whole micro-batch through it.
OUTPUT_ROWS_ARCHS = frozenset((
    "afmoe", "apertus", "arcee", "arctic", "arwkv7", "baichuan", "bailingmoe", "bailingmoe2", "bitnet", "bloom",
    "chameleon", "chatglm", "codeshell", "cohere2", "command-r", "dbrx", "deci", "deepseek", "dots1", "ernie4_5-moe",
    "exaone", "exaone-moe", "exaone4", "falcon", "falcon-h1", "gemma", "gemma2", "gemma3", "glm4", "glm4moe", "gpt2",
    "gptneox", "granite", "granitehybrid", "graniteswitch", "grok", "grovemoe", "hunyuan-moe", "hunyuan_vl",
    "internlm2", "jais", "jais2", "jamba", "kimi-linear", "laguna", "lfm2", "llama", "llama4", "maincoder", "mamba",
    "mellum", "minicpm3", "minimax-m2", "minimax-m3", "mistral3", "mpt", "muse-glimmer", "nanbeige", "nemotron",
    "olmo", "olmo2", "olmoe", "openelm", "orion", "pangu-embedded", "phi2", "phi3", "plamo", "plamo2", "plamo3", "plm",
    "qwen", "qwen2", "qwen2moe", "qwen2vl", "qwen3", "qwen3moe", "qwen3vl", "qwen3vlmoe", "refact", "rwkv6",
    "rwkv6qwen2", "rwkv7", "seed_oss", "smallthinker", "smollm3", "stablelm", "starcoder", "starcoder2", "talkie",
    "xverse"))


def _attention_blocks(facts, blocks=None):
    return [b for b in sorted(facts.kv_blocks) + list(facts.kv_reused) if blocks is None or b in blocks]


def _head_dims(facts):
    """``(head_dim_k, head_dim_v)`` of the first attention block (llama_hparams::n_embd_head_k / _v)."""
    for block, (k, v) in sorted(facts.kv_blocks.items()):
        hkv = facts.kv_heads.get(block) or 1
        return k // hkv, v // hkv
    return 0, 0


def _rotations(facts, cache_type_k, cache_type_v):
    """llama-kv-cache.cpp llama_kv_cache::llama_kv_cache: a quantized K (V) cache with head sizes that are multiples
    of 64 rotates Q and K (V and the attention output) with a Hadamard matrix (attn_rot_k, attn_rot_v). Returns
    the sides of the two rotation matrices (build_input_k_rot: the largest power of two from 64 that divides
    the K head size; build_input_v_rot: 64), 0 when there is none."""
    head_k, head_v = _head_dims(facts)
    k_side = v_side = 0
    if not facts.mla and _cache_type(cache_type_k)[0] > 1 and head_k and head_k % 64 == 0:
        k_side = 64
        while head_k % (2 * k_side) == 0:
            k_side *= 2
    if not facts.mla and _cache_type(cache_type_v)[0] > 1 and head_v and head_v % 64 == 0:
        v_side = 64
    return k_side, v_side


def _cache_inputs(facts, shape, flash_attn, sliding, rotations=(0, 0)):
    """The graph inputs of one KV cache: the KQ mask, ``n_kv x n_tokens`` in F16 with flash attention and F32
    without (llama-graph.cpp build_attn_inp_kq_mask), the I64 rows K and V are written to
    (llama-kv-cache.cpp llama_kv_cache::build_input_k_idxs / build_input_v_idxs: one per token, one per token and
    V element when the V cache is transposed; MLA writes no V) and the F32 rotation matrices."""
    cells = shape.cells.swa_cells if sliding else shape.cells.cells
    mask = cells * shape.tokens * (2 if flash_attn else F32)
    widest_v = max([v for _k, v in facts.kv_blocks.values()] + [0])
    v_rows = 0 if (facts.mla or not widest_v) else (1 if flash_attn else widest_v)
    return mask + shape.tokens * I64 * (1 + v_rows) + sum(side * side * F32 for side in rotations)


def _input_bytes(facts, shape, flash_attn, blocks=None, has_output=True, rotations=(0, 0)):
    """The graph inputs the nodes of ``blocks`` read, with the hidden state they start from (the token embeddings,
    or the previous device's output): inp_pos (llm_graph_context::build_inp_pos), the inputs of each cache its
    attention blocks use, s_copy of the recurrent state
    (build_rs_inp) and inp_out_ids on the output device."""
    total = facts.n_embd * shape.tokens * F32
    attention = _attention_blocks(facts, blocks)
    if attention:
        total += shape.tokens * I32
        for cache in _caches(facts, attention):
            total += _cache_inputs(facts, shape, flash_attn, cache == "swa", rotations)
    if any(blocks is None or b in blocks for b in facts.recurrent_blocks):
        total += shape.seqs * I32
    if has_output:
        total += shape.outputs * I32
    return total


def _caches(facts, attention):
    """The caches (``"full"``, ``"swa"``) the attention blocks ``attention`` read."""
    swa = facts.swa_blocks
    return set("swa" if b in swa else "full" for b in attention)


def _attention_bytes(facts, block, tokens):
    """Bytes of Q, K, V and of the heads' output of one attention block for ``tokens`` rows."""
    k, v = facts.kv_blocks.get(block, (0, 0))  # a block reading another's cache projects only Q
    heads = facts.n_head.get(block) or 1
    hkv = facts.kv_heads.get(block) or 1
    q = facts.q_width.get(block) or heads * k // hkv
    out = heads * k if facts.mla else (heads * v // hkv if v else q)  # MLA: the latent output of every head
    return q * tokens * F32, k * tokens * F32, v * tokens * F32, out * tokens * F32


def _attention_peak(facts, block, shape, flash_attn, rotations=(0, 0)):
    """llm_graph_context::build_attn with a KV cache. The graph computes Q (projection, rotation, and with a
    quantized K cache its Hadamard product), then V, then K (added together: "so that they are not reordered"), and
    writes K and V into the cache (ggml_set_rows). The normed input lives until K's projection. Flash attention:
    the rotated Q beside the heads' output (n_head x head_dim_v). Without it: the KQ scores of every head over the
    cache's cells (ggml_soft_max_ext works in place), allocated beyond the region the projections used, their
    product with V and its contiguous copy. Then the
    output projection beside the heads' output (and its Hadamard product with a quantized V cache). MLA absorbs Q
    into the latent space of the one cached K head."""
    tokens = shape.tokens
    embd = facts.n_embd * tokens * F32
    q, k, v, out = _attention_bytes(facts, block, tokens)
    if facts.mla:
        heads = facts.n_head.get(block) or 1
        q_attn = heads * (k // tokens // F32) * tokens * F32
        phases = [embd + q + 2 * q_attn + 2 * k]
    else:
        q_attn = q
        v_rot = v if rotations[1] else 0
        phases = [embd + 2 * q, embd + q + k + v + v_rot, q + v + v_rot + 2 * k]
    project = max(phases)
    phases += [q_attn + out, out + embd]
    if rotations[1]:
        phases.append(2 * out)
    if not flash_attn:  # the scores do not fit in what the projections freed: they go after it
        cells = shape.cells.swa_cells if block in facts.swa_blocks else shape.cells.cells
        scores = cells * tokens * (facts.n_head.get(block) or 1) * F32
        phases += [project + scores, scores + 2 * out]
    return max(phases)


def _ffn_live(width, gated, fused, tokens):
    """The activations alive at a feed-forward's worst node (llm_graph_context::build_ffn): with a gate, gate, up
    and their GLU product (ggml_swiglu_split / ggml_geglu_split, not in place); with a fused gate+up projection,
    its output and the GLU half; otherwise up, whose activation (gelu, silu, relu, relu squared) runs in place."""
    size = width * tokens * F32
    if gated:
        return 3 * size
    if fused:
        return size + size // 2
    return size


def _moe_peak(facts, tokens, normed, routed_here=True, experts_here=True):
    """llm_graph_context::build_moe_ffn for ``tokens`` rows; ``normed``: the room of its normed input. Routing: the
    router's logits with their probabilities in place, the biased copy (exp_probs_b) and the argsort of every
    expert, whose top-k view selects the experts up to down. The weights of the selected experts and their sum.
    Then the experts' activations (``_ffn_live`` of n_ff_exp x n_expert_used), down's input beside its output
    (n_embd x n_expert_used) and the first of the adds that sum the experts. ``routed_here=False``: a device that
    only computes the expert products of another device's block holds copies of the normed input and of the
    argsort, the activations and down. ``experts_here=False``: the experts' products run elsewhere (host-resident
    experts without op offload, experts placed on another device); this device routes and gets down's output."""
    embd = facts.n_embd * tokens * F32
    used = max(1, facts.expert_used_count)
    router = max(facts.n_expert, used) * tokens * F32
    act = facts.n_ff_exp * used * tokens * F32
    down = facts.n_embd * used * tokens * F32
    live = _ffn_live(facts.n_ff_exp * used, facts.experts_gated, False, tokens)
    if not routed_here:
        return embd + router + max(live, act + down)
    weights = 2 * used * tokens * F32 + 2 * tokens * F32
    routing = (2 + int(facts.expert_probs_bias)) * router
    if not experts_here:
        return normed + weights + max(routing, router + down, down + embd)
    return normed + weights + max(routing, router + live, router + act + down, down + embd)


def _ssm_peak(facts, shape):
    """llm_build_mamba_base::build_mamba2_layer: ssm_in's output (z, xBC and dt) lives until z is made contiguous.
    Beside it: the conv states of the batch (build_rs), their concatenation with xBC and ggml_ssm_conv's output;
    then that output, dt, ggml_ssm_scan's y and final states and x * D (y + x * D is added in place); then y, the
    contiguous z and their GLU product."""
    s = facts.ssm
    tokens, seqs = shape.tokens, shape.seqs
    embd = facts.n_embd * tokens * F32
    conv_dim = s["d_inner"] + 2 * s["n_group"] * s["d_state"]
    in_proj = (2 * s["d_inner"] + 2 * s["n_group"] * s["d_state"] + s["n_head"]) * tokens * F32
    states = (s["d_conv"] - 1) * conv_dim * seqs * F32
    conv_x = conv_dim * (tokens + (s["d_conv"] - 1) * seqs) * F32
    xbc = conv_dim * tokens * F32
    inner = s["d_inner"] * tokens * F32
    scan = inner + s["d_state"] * s["d_inner"] * seqs * F32
    return embd + in_proj + max(states + conv_x + xbc, xbc + s["n_head"] * tokens * F32 + scan + inner,
                                scan + 2 * inner)


def _block_parts(facts, block, shape, flash_attn=True, rotations=(0, 0), experts_here=True, hybrid=False):
    """The tensors alive at the worst node of one block, ``(attention, the rest)``: the residual stream beside the
    largest working set of its attention and of its other parts (dense FFN, routed experts, shared experts beside
    the routed experts' sum, Mamba); 0 for a part the block does not have.

    After attention the feed-forward parts start with a hole where the heads' output was (the residual is
    allocated beside it): their normed input fills it when it is as large, else both count. On the last block of
    an ``OUTPUT_ROWS_ARCHS`` model they see only the output rows. ``experts_here=False``: the routed experts'
    products of this block run elsewhere (``_moe_peak``). ``hybrid``: the device holds blocks of different kinds;
    the state rows of a later recurrent block are made early (build_rs) and can hold a region another kind of
    block freed. Attention and a dense FFN make few, large tensors, so such a part also counts one hole, smaller
    than its largest tensor (else the allocator, which tries the holes first, ggml-alloc.c ggml_dyn_tallocr_alloc,
    would have put that tensor there); the routed experts' and Mamba's many small tensors fill it."""
    embd = facts.n_embd * shape.tokens * F32
    parts = [(0, 0)]
    tokens = shape.tokens
    normed = embd
    attention = 0
    if block in facts.kv_blocks or block in facts.kv_reused:
        sizes = _attention_bytes(facts, block, tokens)
        attention = embd + _attention_peak(facts, block, shape, flash_attn, rotations)
        attention += max(sizes + (embd,)) if hybrid else 0
        normed = sizes[3] if sizes[3] >= embd else sizes[3] + embd
    if block == facts.block_count - 1 and facts.architecture in OUTPUT_ROWS_ARCHS:
        tokens = shape.outputs
        normed = max(normed - embd, 0) + facts.n_embd * tokens * F32
    rows = facts.n_embd * tokens * F32
    if block in facts.ffn:
        live = _ffn_live(facts.ffn[block], block in facts.ffn_gated, block in facts.ffn_fused, tokens)
        parts.append((normed + live, max(facts.ffn[block] * tokens * F32, rows)))
    if block in facts.expert_tensors_by_block and facts.n_ff_exp:
        parts.append((_moe_peak(facts, tokens, normed, experts_here=experts_here), 0))
    if block in facts.shexp:
        live = _ffn_live(facts.shexp[block], block in facts.shexp_gated, False, tokens)
        parts.append((normed + rows + live, max(facts.shexp[block] * tokens * F32, rows)))
    if block in facts.recurrent_blocks and facts.ssm:
        ssm = facts.ssm
        in_proj = 2 * ssm["d_inner"] + 2 * ssm["n_group"] * ssm["d_state"] + ssm["n_head"]
        parts.append((_ssm_peak(facts, shape), in_proj * shape.tokens * F32))
    rest = max(peak + (hole if hybrid else 0) for peak, hole in parts)
    return attention, embd + rest if rest else 0


def block_peak(facts, block, shape, flash_attn=True, rotations=(0, 0), experts_here=True, hybrid=False):
    """The tensors alive at the worst node of one block (``_block_parts``)."""
    return max(_block_parts(facts, block, shape, flash_attn, rotations, experts_here, hybrid))


def _block_kind(facts, block):
    return (block in facts.kv_blocks or block in facts.kv_reused, block in facts.ffn,
            block in facts.expert_tensors_by_block, block in facts.recurrent_blocks)


def _output_peak(facts, shape):
    """After the last block: the residual stream, the output norm and the logits (n_vocab x n_outputs)."""
    return 2 * facts.n_embd * shape.tokens * F32 + facts.n_vocab * shape.outputs * F32


def _expert_tokens(facts, shape, block):
    """The rows the routed experts of ``block`` compute."""
    last = block == facts.block_count - 1 and facts.architecture in OUTPUT_ROWS_ARCHS
    return shape.outputs if last else shape.tokens


def compute_buffer_bytes(facts, ctx_size, parallel=1, ubatch=512, flash_attn=True, kv_unified=False,
                         blocks=None, has_output=True, cpu_expert_bytes_max=0, op_offload=True, *,
                         batch=DEFAULT_BATCH, swa_full=False, foreign_expert_blocks=(), copies=1,
                         cache_type_k="f16", cache_type_v="f16", remote_expert_blocks=()):
    """An upper estimate of one device's compute buffer (see the notes above and docs/memory-model.md).

    ``blocks``: the blocks on this device (all by default); ``has_output``: the output layer is on it;
    ``foreign_expert_blocks``: blocks of another device whose experts this device holds (it computes their
    products); ``remote_expert_blocks``: blocks of this device whose experts' products run elsewhere (on the host
    without op offload, or on another device); ``copies``: the input copies of a pipeline-parallel graph
    (llama.cpp keeps 4 on several GPUs without tensor overrides, ggml-backend.cpp GGML_SCHED_MAX_COPIES, and
    never frees them). With op offload, CUDA computes the products of host-resident experts from 32 tokens on and
    copies each weight in as the input of a split of its own: the room of the largest host-resident block's experts is added (``cpu_expert_bytes_max``).
    """
    shape = graph_shape(facts, ctx_size, parallel, kv_unified, ubatch, batch, swa_full)
    rotations = _rotations(facts, cache_type_k, cache_type_v)
    blocks = set(range(facts.block_count)) if blocks is None else set(blocks)
    remote = set(remote_expert_blocks)
    hybrid = len(set(_block_kind(facts, b) for b in blocks)) > 1

    # The input copies stay for the device's whole graph: a mask freed after the last attention block that reads
    # it leaves a region the next tensors do not always fit in.
    peaks = [_moe_peak(facts, _expert_tokens(facts, shape, b), 0, routed_here=False)
             for b in foreign_expert_blocks if b in facts.expert_tensors_by_block and facts.n_ff_exp]
    peaks += [block_peak(facts, b, shape, flash_attn, rotations, b not in remote, hybrid) for b in blocks]
    if has_output:
        peaks.append(_output_peak(facts, shape))
    offload_copy = cpu_expert_bytes_max if (op_offload and shape.tokens >= OP_OFFLOAD_MIN_BATCH) else 0
    return copies * _input_bytes(facts, shape, flash_attn, blocks, has_output, rotations) + max(peaks + [0]) \
        + offload_copy


def host_compute_bytes(facts, ctx_size, parallel=1, ubatch=512, batch=DEFAULT_BATCH, cpu_expert_blocks=(),
                       op_offload=True, *, kv_unified=False, swa_full=False, flash_attn=True, copies=1,
                       cache_type_k="f16", cache_type_v="f16"):
    """The host's compute buffer beside GPUs (CUDA_Host memory on a CUDA build). The scheduler keeps every graph
    input on the CPU backend (ggml-backend.cpp ggml_backend_sched_backend_id_from_cur, GGML_TENSOR_FLAG_INPUT):
    the token ids and the embeddings input (llm_graph_context::build_inp_embd), the positions, each cache's KQ mask
    and row indices, s_copy and inp_out_ids, ``copies`` times in a pipeline-parallel graph. token_embd stays on the
    host, so the embedding rows are looked up there; when the GPU does not compute the host-resident experts (no op
    offload, or micro-batches under 32 tokens) the host computes their products from copies of the normed input
    and of the expert ids."""
    shape = graph_shape(facts, ctx_size, parallel, kv_unified, ubatch, batch, swa_full)
    rotations = _rotations(facts, cache_type_k, cache_type_v)
    inputs = shape.tokens * I32 + _input_bytes(facts, shape, flash_attn, rotations=rotations)
    work = [facts.n_embd * shape.tokens * F32]
    if facts.n_ff_exp and not (op_offload and shape.tokens >= OP_OFFLOAD_MIN_BATCH):
        work += [_moe_peak(facts, _expert_tokens(facts, shape, b), 0, routed_here=False) for b in cpu_expert_blocks
                 if b in facts.expert_tensors_by_block]
    return copies * inputs + max(work)


def cpu_compute_bytes(facts, ctx_size, parallel=1, ubatch=512, batch=DEFAULT_BATCH, *, kv_unified=False,
                      swa_full=False, flash_attn=True, cache_type_k="f16", cache_type_v="f16"):
    """The compute buffer of a host without GPU: one CPU buffer holds the graph inputs, the embedding rows and the
    worst node of every block and of the output layer; blocks of different kinds count their holes, as on a
    device (``_block_parts``)."""
    shape = graph_shape(facts, ctx_size, parallel, kv_unified, ubatch, batch, swa_full)
    rotations = _rotations(facts, cache_type_k, cache_type_v)
    hybrid = len(set(_block_kind(facts, b) for b in range(facts.block_count))) > 1
    peaks = [block_peak(facts, b, shape, flash_attn, rotations, True, hybrid) for b in range(facts.block_count)]
    return shape.tokens * I32 + _input_bytes(facts, shape, flash_attn, rotations=rotations) \
        + facts.n_embd * shape.tokens * F32 + max(peaks + [_output_peak(facts, shape)])


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
    shape = graph_shape(facts, ctx_size, parallel, kv_unified, ubatch, batch, swa_full)
    offloaded = op_offload and shape.tokens >= OP_OFFLOAD_MIN_BATCH  # the GPU computes host-resident experts
    gpus = []
    for device in range(n_devices):
        blocks = [b for b, d in enumerate(devices) if d == device]
        cpu_expert_max = max([sum(sizes[n] for n in facts.expert_tensors_by_block.get(b, ()) if n in cpu)
                              for b in blocks] + [0])
        foreign = sorted(b for b, names in facts.expert_tensors_by_block.items()
                         if devices[b] != device and any(moved.get(n) == device for n in names))
        # blocks whose experts' products all run elsewhere: on the host, or on the device holding them
        remote = [b for b in blocks if facts.expert_tensors_by_block.get(b) and all(
            (n in cpu and not offloaded) or moved.get(n, device) != device for n in facts.expert_tensors_by_block[b])]
        entry = {
            "model": gpu_weights[device],
            "kv": sum(kv.get(b, 0) for b in blocks),
            "recurrent": sum(rs.get(b, 0) for b in blocks),
            "compute": compute_buffer_bytes(facts, ctx_size, parallel, ubatch, fa, kv_unified, blocks,
                                            device == output_device, cpu_expert_max, op_offload, batch=batch,
                                            swa_full=swa_full, foreign_expert_blocks=foreign, copies=copies,
                                            cache_type_k=cache_type_k, cache_type_v=cache_type_v,
                                            remote_expert_blocks=remote),
            "margin": int(margin_mib * MIB),
        }
        entry["total"] = sum(entry.values())
        for key in list(entry):
            entry[key + "_mib"] = mib(entry[key])
        gpus.append(entry)
    host = {"model": host_weights, "kv": 0, "recurrent": 0, "output": output_buffer_bytes(facts, parallel)}
    inputs = dict(kv_unified=kv_unified, swa_full=swa_full, flash_attn=fa, cache_type_k=cache_type_k,
                  cache_type_v=cache_type_v)
    if n_devices == 0:
        host["kv"], host["recurrent"] = sum(kv.values()), sum(rs.values())
        host["compute"] = cpu_compute_bytes(facts, ctx_size, parallel, ubatch, batch, **inputs)
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
