# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tensor classes and block kinds of a GGUF model, from its tensor names and metadata.

Standard library only: this runs on target hosts.

Every tensor gets one class of ``TENSOR_CLASSES``; every block (``blk.N.``) gets the kinds of
``BLOCK_KINDS`` it holds (a block can have several: attention + MoE, for instance).
The routed experts are the tensors that an offload pattern moves to host memory:
``blk.N.ffn_{gate,up,down,gate_up}_{exps,chexps}.*`` (stacked experts, weights and biases) and the
old per-expert layout ``blk.N.ffn_{gate,up,down}.E.weight``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import as_int
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import BLOCK_RE, MAX_BLOCKS, block_index
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.keys import LLM, Attention, arch_key

TENSOR_CLASSES = (
    "routed_experts",
    "shared_experts",
    "router",
    "attention",
    "recurrent",
    "dense_ffn",
    "token_embd",
    "output",
    "norm",
    "other",
)

BLOCK_KINDS = ("attention", "recurrent", "moe", "dense_ffn")

# Architectures whose block kinds are defined by per-layer metadata arrays: llama.cpp's
# src/llama-model.cpp load_hparams (LLM_ARCH_NEMOTRON_H, LLM_ARCH_NEMOTRON_H_MOE) sets
# recurrent_layer_arr[i] = (n_head_kv(i) == 0 && n_ff(i) == 0).
METADATA_KIND_ARCHS = ("nemotron_h", "nemotron_h_moe")
# Stacked routed experts (weights, biases, scales...) and the old one-tensor-per-expert layout.
_ROUTED_RE = re.compile(r"^ffn_(gate|up|down|gate_up)_(ch)?exps(\.|$)|^ffn_(gate|up|down)\.[0-9]+\.")
_ROUTER_BASES = ("ffn_gate_inp", "exp_probs_b", "ffn_exp_probs_b")
_RECURRENT_PREFIXES = ("ssm_", "time_mix_", "shortconv")
_DENSE_FFN_PREFIXES = ("ffn_", "channel_mix_")


def _is_norm(base):
    return any(token.endswith("norm") for token in base.split("_"))


def classify_tensor(name):
    """The class (one of ``TENSOR_CLASSES``) of one tensor, from its name alone."""
    match = BLOCK_RE.match(name)
    if match is None:
        base = name.split(".", 1)[0]
        if _is_norm(base):
            return "norm"
        if base in ("token_embd", "per_layer_token_embd", "token_types", "position_embd"):
            return "token_embd"
        if base == "output":
            return "output"
        return "other"
    rest = name[match.end():]
    if _ROUTED_RE.search(rest):
        return "routed_experts"
    # Multi-token-prediction heads (glm4moe, deepseek) keep their sub-layer names after "nextn.".
    if rest.startswith("nextn."):
        rest = rest[len("nextn."):]
    base = rest.split(".", 1)[0]
    tokens = base.split("_")
    if "shexp" in tokens:  # ffn_{gate,up,down}_shexp and the shared expert's gate ffn_gate_inp_shexp
        return "shared_experts"
    if base in _ROUTER_BASES:
        return "router"
    if _is_norm(base):
        return "norm"
    if base.startswith("attn_"):
        return "attention"
    if base.startswith(_RECURRENT_PREFIXES):
        return "recurrent"
    if base.startswith(_DENSE_FFN_PREFIXES):
        return "dense_ffn"
    return "other"


@dataclass(frozen=True)
class ModelLayout:
    """What a model is made of (built by ``classify_model``).

    ``block_kinds``: block -> sorted kinds; ``layer_kinds``: kind -> sorted blocks of that kind (every kind of
    ``BLOCK_KINDS`` is a key); ``tensor_class``: name -> class; ``bytes_by_class``: class -> bytes (every class
    of ``TENSOR_CLASSES``); ``expert_tensors``: sorted routed-expert names; ``expert_tensors_by_block``:
    block -> sorted routed-expert names.
    """

    architecture: str
    block_count: int
    block_kinds: dict
    layer_kinds: dict
    tensor_class: dict
    bytes_by_class: dict
    total_bytes: int
    expert_tensors: list
    expert_tensors_by_block: dict
    expert_count: int
    expert_used_count: int
    expert_shared_count: int
    warnings: list = field(default_factory=list)

    def __repr__(self):
        return f"ModelLayout({self.architecture!r}, blocks={self.block_count}, experts={len(self.expert_tensors)} tensors)"


def _meta_int(metadata, template, arch, default):
    """The integer metadata key ``template`` of ``arch`` (a bool as 0/1, a float not an integer), else ``default``."""
    return as_int(metadata.get(arch_key(template, arch)), default, bool_as_int=True, whole_floats=False)


def _per_layer(metadata, key, block_count):
    """A per-layer metadata array of ``block_count`` ints, or ``None``."""
    value = metadata.get(key)
    if isinstance(value, (list, tuple)) and len(value) == block_count \
            and all(isinstance(v, int) for v in value):
        return list(value)
    return None


def _kinds_from_tensors(classes_in_block):
    kinds = set()
    if "attention" in classes_in_block:
        kinds.add("attention")
    if "recurrent" in classes_in_block:
        kinds.add("recurrent")
    if "routed_experts" in classes_in_block or "router" in classes_in_block:
        kinds.add("moe")
    if "dense_ffn" in classes_in_block:
        kinds.add("dense_ffn")
    return kinds


def _kinds_from_metadata(head_count_kv, ffn_length, classes_in_block, expert_count):
    """llama.cpp's rule for nemotron_h(_moe) (src/models/nemotron-h.cpp): Mamba iff no KV heads and no FFN,
    attention iff KV heads and no FFN, else an FFN (MoE or dense) block whatever its KV head count."""
    kinds = set()
    if head_count_kv > 0 and ffn_length == 0:
        kinds.add("attention")
    if ffn_length > 0:
        if "routed_experts" in classes_in_block or "router" in classes_in_block:
            kinds.add("moe")
        elif "dense_ffn" in classes_in_block:
            kinds.add("dense_ffn")
        else:
            kinds.add("moe" if expert_count > 0 else "dense_ffn")
    if head_count_kv == 0 and ffn_length == 0:
        kinds.add("recurrent")
    return kinds


def _classify_tensors(tensors, warnings):
    """Each tensor's class, the bytes of each class, the classes of each block and the expert count of the first
    stacked routed-expert tensor (its third dimension; 0 when none)."""
    tensor_class = {}
    bytes_by_class = dict((c, 0) for c in TENSOR_CLASSES)
    classes_by_block = {}
    unknown_size = []
    stacked_experts = 0
    for tensor in tensors:
        cls = classify_tensor(tensor.name)
        tensor_class[tensor.name] = cls
        if tensor.nbytes is None:
            unknown_size.append(tensor.name)
        else:
            bytes_by_class[cls] += tensor.nbytes
        block = block_index(tensor.name)
        if block is not None:
            classes_by_block.setdefault(block, set()).add(cls)
        shape = tuple(tensor.shape or ())
        if cls == "routed_experts" and len(shape) >= 3 and not stacked_experts:
            stacked_experts = shape[2]
    if unknown_size:
        listed = ", ".join(unknown_size[:5]) + (", ..." if len(unknown_size) > 5 else "")
        warnings.append(f"{len(unknown_size)} tensor(s) of unknown size counted as 0 bytes: {listed}")
    return tensor_class, bytes_by_class, classes_by_block, stacked_experts


def _block_count(metadata, arch, tensor_blocks, warnings):
    """``<arch>.block_count``, or the blocks the tensor names count (``tensor_blocks``) where it is missing,
    implausible or smaller."""
    block_count = _meta_int(metadata, LLM.BLOCK_COUNT, arch, -1)
    if block_count > MAX_BLOCKS:
        warnings.append("%s %d is implausible (more than %d): ignored, blocks counted from the "
                        "tensor names" % (arch_key(LLM.BLOCK_COUNT, arch), block_count, MAX_BLOCKS))
        block_count = -1
    if tensor_blocks > MAX_BLOCKS:
        warnings.append("a tensor name gives block number %d (more than %d blocks): only the blocks that hold "
                        "tensors are listed" % (tensor_blocks - 1, MAX_BLOCKS))
    if block_count < 0:
        return tensor_blocks
    if tensor_blocks > block_count:
        # Extra blocks such as multi-token-prediction layers (nextn) come after the counted ones.
        warnings.append("tensors name blocks up to %d but %s is %d" % (
            tensor_blocks - 1, arch_key(LLM.BLOCK_COUNT, arch), block_count))
        return tensor_blocks
    return block_count


def _expert_counts(metadata, arch, tensor_class, stacked_experts):
    """``expert_count`` (else the stacked tensors' count), ``expert_used_count`` and ``expert_shared_count``
    (else 1 when the model has shared-expert tensors)."""
    expert_count = _meta_int(metadata, LLM.EXPERT_COUNT, arch, 0)
    if not expert_count and stacked_experts:
        expert_count = stacked_experts
    expert_used_count = _meta_int(metadata, LLM.EXPERT_USED_COUNT, arch, 0)
    expert_shared_count = _meta_int(metadata, LLM.EXPERT_SHARED_COUNT, arch, -1)
    if expert_shared_count < 0:
        has_shared = any(c == "shared_experts" for c in tensor_class.values())
        expert_shared_count = 1 if has_shared else 0
    return expert_count, expert_used_count, expert_shared_count


def _per_layer_arrays(metadata, arch, tensor_blocks, warnings):
    """The per-layer ``head_count_kv`` and ``feed_forward_length`` arrays of an architecture of
    ``METADATA_KIND_ARCHS``; ``(None, None)`` for any other, or when either is not one int per block."""
    if arch not in METADATA_KIND_ARCHS:
        return None, None
    n = _meta_int(metadata, LLM.BLOCK_COUNT, arch, tensor_blocks)
    head_count_kv = _per_layer(metadata, arch_key(Attention.HEAD_COUNT_KV, arch), n)
    ffn_length = _per_layer(metadata, arch_key(LLM.FEED_FORWARD_LENGTH, arch), n)
    if head_count_kv is None or ffn_length is None:
        warnings.append("%s without per-layer head_count_kv / feed_forward_length arrays: "
                        "block kinds taken from tensor names" % arch)
        return None, None
    return head_count_kv, ffn_length


def classify_model(architecture, metadata, tensors):
    """Classify every tensor and every block of a model.

    ``tensors``: objects with ``.name``, ``.shape`` and ``.nbytes`` (``None`` = size unknown).
    Returns a ``ModelLayout``.
    """
    metadata = metadata or {}
    arch = architecture or ""
    warnings = []
    tensor_class, bytes_by_class, classes_by_block, stacked_experts = _classify_tensors(tensors, warnings)
    tensor_blocks = max(classes_by_block) + 1 if classes_by_block else 0
    block_count = _block_count(metadata, arch, tensor_blocks, warnings)
    expert_count, expert_used_count, expert_shared_count = _expert_counts(metadata, arch, tensor_class,
                                                                          stacked_experts)
    head_count_kv, ffn_length = _per_layer_arrays(metadata, arch, tensor_blocks, warnings)

    block_kinds = {}
    for block in (range(block_count) if block_count <= MAX_BLOCKS else sorted(classes_by_block)):
        classes_in_block = classes_by_block.get(block, set())
        if head_count_kv is not None and block < len(head_count_kv):
            kinds = _kinds_from_metadata(head_count_kv[block], ffn_length[block], classes_in_block, expert_count)
        else:
            kinds = _kinds_from_tensors(classes_in_block)
        block_kinds[block] = sorted(kinds)

    expert_tensors = sorted(n for n, c in tensor_class.items() if c == "routed_experts")
    by_block = {}
    for name in expert_tensors:
        by_block.setdefault(block_index(name), []).append(name)
    return ModelLayout(
        architecture=arch, block_count=block_count, block_kinds=block_kinds,
        layer_kinds={kind: [b for b in sorted(block_kinds) if kind in block_kinds[b]] for kind in BLOCK_KINDS},
        tensor_class=tensor_class, bytes_by_class=bytes_by_class, total_bytes=sum(bytes_by_class.values()),
        expert_tensors=expert_tensors, expert_tensors_by_block=by_block, expert_count=expert_count,
        expert_used_count=expert_used_count, expert_shared_count=expert_shared_count, warnings=warnings)
