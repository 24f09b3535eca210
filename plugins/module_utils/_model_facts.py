# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The facts of a model that its memory depends on, read from the GGUF header alone.

``model_facts(metadata, tensors, layout)`` turns the reader's metadata and tensor infos and the classification's
``ModelLayout`` into a frozen ``ModelFacts``: widths, heads, caches per block, the sliding-window layout
(``SWA_RULES``, the architecture tables of llama.cpp's hyperparameter loaders), recurrent state widths, FFN and
expert shapes and every tensor's size. The estimates (``_kv_cache``, ``_compute_buffers``, ``_memory_estimate``)
only read these facts. Standard library only: this runs on target hosts (Python >= 3.9).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import as_int
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import BLOCK_RE, LLAMA_MAX_LAYERS, MAX_BLOCKS
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.keys import (
    LLM, SSM, WKV, Attention, General, ShortConv, Tokenizer, arch_key)

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
    key = metadata.get(arch_key(Attention.SLIDING_WINDOW, arch))
    window = as_int(key) if key is not None else None
    pattern = metadata.get(arch_key(Attention.SLIDING_WINDOW_PATTERN, arch))
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
            flags = [as_int(v, bool_as_int=True) for v in pattern]
            if len(flags) != block_count or any(v is None for v in flags):
                raise MemoryModelError("%s.attention.sliding_window_pattern has %d entries, not one flag for each of "
                                       "the %d blocks" % (arch, len(flags), block_count))
            blocks = frozenset(b for b, flag in enumerate(flags) if flag)
            how = "%s.attention.sliding_window_pattern" % arch
        elif as_int(pattern) is not None and as_int(pattern) >= 0:  # (no rule that reads the key is dense_first)
            blocks = swa_pattern(as_int(pattern), block_count)
            how = "set_swa_pattern(%d) from %s.attention.sliding_window_pattern" % (as_int(pattern), arch)
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

    def bytes_by_block(self):
        """``{block: bytes of all its weights}``."""
        sizes = {}
        for tensor in self.tensors:
            if tensor.block is not None:
                sizes[tensor.block] = sizes.get(tensor.block, 0) + tensor.nbytes
        return sizes

    @property
    def swa_blocks(self):
        return self.sliding_window.blocks if self.sliding_window else frozenset()

    @property
    def dense(self):
        """No routed experts: a dense model."""
        return not self.expert_tensors_by_block


def _dim(value):
    """A size from the metadata: a whole number > 0, else ``None`` (treated as missing)."""
    value = as_int(value)
    return value if value is not None and value > 0 else None


def _per_block(metadata, key, block_count):
    """A per-layer value: ``{block: int >= 0}`` from a scalar or an array, or ``None`` when absent/invalid."""
    value = metadata.get(key)
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        values = [as_int(v) for v in value]
        if len(values) != block_count or any(v is None or v < 0 for v in values):
            return None
        return dict(enumerate(values))
    scalar = as_int(value)
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


class _Shapes:
    """The tensor shapes of a model by name."""

    def __init__(self, tensors):
        self.by_name = dict((t.name, t) for t in tensors)

    def of(self, name, dims=1):
        """The shape of a tensor with at least ``dims`` dimensions, all > 0 (``None`` otherwise)."""
        tensor = self.by_name.get(name)
        value = tuple(tensor.shape) if tensor is not None and tensor.shape else ()
        return value if len(value) >= dims and all(n > 0 for n in value) else None

    def block(self, block, base):
        return self.of("blk.%d.%s.weight" % (block, base), 2)


def model_facts(metadata, tensors, layout, path="", warnings=()):
    """Gather the numbers of the formulas from a GGUF's ``metadata``, its ``tensors`` and its ``layout``.

    ``tensors``: objects with ``.name``, ``.shape``, ``.nbytes`` (and ``.type_id`` when known), such as the
    reader's ``TensorInfo``. ``layout``: ``_tensor_classes.classify_model``'s ``ModelLayout``. ``path`` and
    ``warnings`` (the reader's) are kept in the facts. Metadata the formulas need but the file lacks is taken
    from the tensor shapes, with a warning; raises ``MemoryModelError`` when neither gives it.
    """
    metadata = metadata or {}
    arch = layout.architecture or metadata.get(General.ARCHITECTURE) or ""
    notes = list(warnings)
    block_count = layout.block_count
    if block_count > MAX_BLOCKS:
        raise MemoryModelError("%d blocks is implausible (llama.cpp loads at most %d): check %s.block_count and the "
                               "blk.N tensor names" % (block_count, LLAMA_MAX_LAYERS, arch))
    shapes = _Shapes(tensors)
    expert_names = set(layout.expert_tensors)
    n_embd, n_vocab = _embedding(metadata, arch, shapes, notes)
    attention = list(layout.layer_kinds.get("attention", []))
    sliding = _sliding_window(metadata, arch, block_count, set(attention), notes)
    kv = _attention_widths(metadata, arch, n_embd, attention, sliding, shapes.block, notes)
    kv_reused, kv_blocks = _kv_owners(metadata, arch, block_count, attention, kv["widths"])
    recurrent = list(layout.layer_kinds.get("recurrent", []))
    ssm, recurrent_blocks = {}, {}
    if recurrent:  # conv state and SSM/WKV state, F32
        n_embd_r, n_embd_s, ssm = _recurrent_widths(metadata, arch, n_embd, recurrent[0], shapes.of, shapes.block,
                                                    notes)
        recurrent_blocks = dict((b, (n_embd_r, n_embd_s)) for b in recurrent)
    memory, kv_blocks, recurrent_blocks = _memory_layout(arch, kv_blocks, recurrent_blocks, sliding)
    facts_tensors = _tensor_facts(tensors, expert_names, notes)
    ffn = _ffn_widths(metadata, arch, layout, shapes.of, shapes.block)
    return ModelFacts(
        architecture=arch, block_count=block_count, n_embd=n_embd, n_vocab=n_vocab,
        context_length=as_int(metadata.get(arch_key(LLM.CONTEXT_LENGTH, arch))), kv_blocks=kv_blocks,
        n_head=kv["n_head"], kv_heads=kv["kv_heads"], q_width=kv["q_width"], mla=kv["mla"], sliding_window=sliding,
        kv_reused=kv_reused, recurrent_blocks=recurrent_blocks, ssm=ssm, memory=memory, tensors=facts_tensors,
        expert_used_count=layout.expert_used_count or 0,
        experts_gated=any(".ffn_gate" in n for n in expert_names),
        expert_probs_bias=any(n.endswith(".exp_probs_b.bias") for n in shapes.by_name), **ffn,
        expert_tensors_by_block=dict((b, list(n)) for b, n in layout.expert_tensors_by_block.items()
                                     if b is not None),
        tensor_class=dict(layout.tensor_class), path=path,
        warnings=notes + list(getattr(layout, "warnings", []) or []))


def _embedding(metadata, arch, shapes, notes):
    """``(n_embd, n_vocab)``: the embedding width and the vocabulary, from the metadata or the embedding tensor."""
    n_embd = _dim(metadata.get(arch_key(LLM.EMBEDDING_LENGTH, arch)))
    embd_shape = shapes.of("token_embd.weight") or shapes.of("output.weight")
    if n_embd is None:
        if not embd_shape:
            raise MemoryModelError("%s.embedding_length is missing and there is no token_embd/output tensor "
                                   "to read it from" % arch)
        n_embd = embd_shape[0]
        notes.append("%s.embedding_length missing: %d taken from the embedding tensor" % (arch, n_embd))
    n_vocab = _count(metadata.get(Tokenizer.LIST)) or _dim(metadata.get(arch_key(LLM.VOCAB_SIZE, arch)))
    if not n_vocab:
        if not embd_shape or len(embd_shape) < 2:
            raise MemoryModelError("the vocabulary size is unknown: no tokenizer.ggml.tokens, no %s.vocab_size "
                                   "and no token_embd/output tensor" % arch)
        n_vocab = embd_shape[1]
        notes.append("vocabulary size missing: %d taken from the embedding tensor" % n_vocab)
    return n_embd, n_vocab


def _kv_owners(metadata, arch, block_count, attention, widths):
    """``(kv_reused, kv_blocks)``: blocks from n_layer_kv_from_start on read the cache of an earlier block and own
    none (llama-hparams.cpp llama_hparams::has_kv): gemma3n sets 20, gemma4 n_layer - attention.shared_kv_layers."""
    shared = as_int(metadata.get(arch_key(Attention.SHARED_KV_LAYERS, arch)))
    kv_from = block_count - shared if shared and 0 < shared < block_count else 20 if arch == "gemma3n" else None
    kv_reused = tuple(b for b in attention if kv_from is not None and b >= kv_from)
    return kv_reused, dict((b, w) for b, w in widths.items() if b not in kv_reused)


def _memory_layout(arch, kv_blocks, recurrent_blocks, sliding):
    """``(memory, kv_blocks, recurrent_blocks)`` as llama_model::create_memory lays the memory out."""
    if arch in NO_CACHE_ARCHS:
        return "none", {}, {}
    if recurrent_blocks and not kv_blocks:
        return "recurrent", kv_blocks, recurrent_blocks
    memory = ("hybrid" if recurrent_blocks else "kv") + ("_iswa" if sliding else "")
    return "iswa" if memory == "kv_iswa" else memory, kv_blocks, recurrent_blocks


def _tensor_facts(tensors, expert_names, notes):
    """A ``TensorFacts`` per tensor; a tensor of unknown type counts 0 bytes, with a warning."""
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
    return tuple(facts_tensors)


def _attention_widths(metadata, arch, n_embd, attention, sliding, block_shape, notes):
    """KV widths of the attention blocks: ``head_count_kv[i] * key_length`` / ``value_length`` (the ``_swa``
    lengths on sliding blocks, llama_hparams::n_embd_head_k(il)), or the attn_k/attn_v shapes."""
    block_count = max(max(attention) + 1 if attention else 0, _block_count(metadata, arch))
    head_kv = _per_block(metadata, arch_key(Attention.HEAD_COUNT_KV, arch), block_count)
    head_kv_invalid = head_kv is None and metadata.get(arch_key(Attention.HEAD_COUNT_KV, arch)) is not None
    head = _per_block(metadata, arch_key(Attention.HEAD_COUNT, arch), block_count) or {}
    lengths = dict((name, _dim(metadata.get(arch_key(key, arch)))) for name, key in (
        ("key_length", Attention.KEY_LENGTH), ("value_length", Attention.VALUE_LENGTH),
        ("key_length_swa", Attention.KEY_LENGTH_SWA), ("value_length_swa", Attention.VALUE_LENGTH_SWA)))
    # Multi-head latent attention (deepseek2 converted with *_mla keys): llama.cpp caches only the compressed
    # K (kv_lora_rank + rope dims, one KV head); V is a view of it, so the V cache has no bytes
    # (llama-kv-cache.cpp llama_kv_cache::llama_kv_cache: has_v = !is_mla).
    mla = bool(_dim(metadata.get(arch_key(Attention.KEY_LENGTH_MLA, arch)))
               and _dim(metadata.get(arch_key(Attention.VALUE_LENGTH_MLA, arch))))
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
    return _dim(metadata.get(arch_key(LLM.BLOCK_COUNT, arch))) or 0


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
    n_ff_exp = as_int(metadata.get(arch_key(LLM.EXPERT_FEED_FORWARD_LENGTH, arch))) or 0
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
    head_size = _dim(metadata.get(arch_key(WKV.HEAD_SIZE, arch)))
    if head_size:
        shift = as_int(metadata.get(arch_key(LLM.TOKEN_SHIFT_COUNT, arch)))
        shift = 2 if shift is None or shift < 0 else shift
        return shift * n_embd, n_embd * head_size, {}
    l_cache = _dim(metadata.get(arch_key(ShortConv.L_CACHE, arch)))
    if l_cache:
        return n_embd * (l_cache - 1), 0, {}
    d_conv = _dim(metadata.get(arch_key(SSM.CONV_KERNEL, arch)))
    d_inner = _dim(metadata.get(arch_key(SSM.INNER_SIZE, arch)))
    d_state = _dim(metadata.get(arch_key(SSM.STATE_SIZE, arch)))
    n_group = as_int(metadata.get(arch_key(SSM.GROUP_COUNT, arch)))
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
           "n_head": _dim(metadata.get(arch_key(SSM.TIME_STEP_RANK, arch))) or 0}
    return (d_conv - 1) * (d_inner + 2 * n_group * d_state), d_state * d_inner, ssm
