"""Random GGUF layouts for every MoE architecture gguf-py knows.

For each architecture of ``gguf.constants.MODEL_TENSORS`` with routed-expert tensor kinds
(``FFN_{GATE,UP,DOWN}_EXP``, ``FFN_GATE_UP_EXP``, ``FFN_*_CHEXP``) a random model is written with the
architecture's real tensor names for a few blocks: each block gets a mixer (attention or recurrent, among the
families the architecture has) and a feed-forward part (MoE or dense), random ggml types (respecting the block
size in ``ne0``), random shard counts (each shard a full GGUF with ``split.*`` keys, metadata in the first only,
as gguf-split writes them) and a random byte order. Only headers are written (sparse files).

The expected answer is computed from gguf-py's own tensor kinds, never from the code under test.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import gguf
from gguf.constants import MODEL_ARCH_NAMES, MODEL_TENSOR as T, MODEL_TENSORS, TENSOR_NAMES

from tools import gguf_writer

EXPERT_KINDS = frozenset((T.FFN_GATE_EXP, T.FFN_UP_EXP, T.FFN_DOWN_EXP, T.FFN_GATE_UP_EXP,
                          T.FFN_GATE_CHEXP, T.FFN_UP_CHEXP, T.FFN_DOWN_CHEXP))
MOE_COMPANIONS = frozenset((T.FFN_GATE_INP, T.FFN_EXP_PROBS_B, T.FFN_GATE_INP_SHEXP, T.FFN_GATE_SHEXP,
                            T.FFN_UP_SHEXP, T.FFN_DOWN_SHEXP, T.FFN_NORM_EXP)
                           + tuple(k for k in T if k.name.startswith("FFN_LATENT")))
DENSE_KINDS = frozenset((T.FFN_GATE, T.FFN_UP, T.FFN_DOWN))
VT = gguf.GGUFValueType
QUANTS = ("Q4_K", "Q5_K", "Q6_K", "Q8_0", "IQ4_XS", "MXFP4", "BF16", "F16", "Q4_0", "F32")
# Architectures whose block kinds llama.cpp (and the collection) read from per-layer arrays.
METADATA_KIND_ARCHS = ("nemotron_h", "nemotron_h_moe")

N_EMBD = 256
N_FF = 256
# a block's part -> its block kind, and the tensor families that make it
PART_KINDS = {"attention": "attention", "recurrent": "recurrent", "moe": "moe", "dense": "dense_ffn"}
PART_FAMILIES = {"attention": ["attention"], "recurrent": ["recurrent"], "moe": ["experts", "moe"], "dense": ["dense"]}


def moe_architectures():
    """Names of the gguf-py architectures that list routed-expert tensor kinds."""
    return sorted(MODEL_ARCH_NAMES[a] for a, kinds in MODEL_TENSORS.items()
                  if EXPERT_KINDS & set(kinds) and MODEL_ARCH_NAMES[a] != "clip")


def dense_architectures():
    """Text architectures without any MoE tensor kind (attention + dense FFN)."""
    return sorted(MODEL_ARCH_NAMES[a] for a, kinds in MODEL_TENSORS.items()
                  if not set(kinds) & (EXPERT_KINDS | MOE_COMPANIONS) and T.ATTN_Q in kinds
                  and {T.FFN_UP, T.FFN_DOWN} <= set(kinds) and MODEL_ARCH_NAMES[a] != "clip")


def family(kind):
    """The block family of a tensor kind: experts, moe, dense, attention, recurrent, nextn, common."""
    for kinds, name in ((EXPERT_KINDS, "experts"), (MOE_COMPANIONS, "moe"), (DENSE_KINDS, "dense")):
        if kind in kinds:
            return name
    stem = TENSOR_NAMES[kind].split("{bid}.", 1)[-1]
    if stem.startswith("nextn."):
        return "nextn"
    if stem.startswith(("ssm_", "time_mix_", "shortconv")):
        return "norm" if stem.endswith("norm") else "recurrent"
    if stem.startswith(("attn_", "indexer.")) and not stem.endswith("norm") and "_norm" not in stem:
        return "attention"
    return "common"


def _qtype(rng, ne0):
    while True:
        q = gguf.GGMLQuantizationType[rng.choice(QUANTS)]
        if ne0 % gguf.GGML_QUANT_SIZES[q][0] == 0:
            return q


@dataclass
class Layout:
    """What a random model is and what gguf_info must say about it."""

    arch: str
    tensors: list   # [(name, ne, qtype)]
    blocks: int
    kinds: dict     # {block: set of kinds}
    experts: list   # sorted names
    metadata: dict  # {key: (value, GGUFValueType or None)}

    @property
    def names(self):
        return [t[0] for t in self.tensors]

    @property
    def total_bytes(self):
        return sum(gguf_writer.tensor_nbytes(ne, q) for _n, ne, q in self.tensors)


def make_layout(arch_name, seed, moe=True):
    """A random model of ``arch_name`` (its real tensor names) and its expected classification."""
    rng = random.Random(seed)
    kinds = MODEL_TENSORS[next(a for a, n in MODEL_ARCH_NAMES.items() if n == arch_name)]
    globals_ = [TENSOR_NAMES[k] for k in kinds if "{bid}" not in TENSOR_NAMES[k]
                and not TENSOR_NAMES[k].startswith(("v.", "a.", "mm.", "enc.", "dec."))]
    by_family = {}
    for kind in (k for k in kinds if TENSOR_NAMES[k].startswith("blk.{bid}.")):
        by_family.setdefault(family(kind), []).append(kind)
    mixers = [f for f in ("attention", "recurrent") if by_family.get(f)]
    ffns = [f for f in ("moe", "dense") if (f == "moe" and by_family.get("experts")) or by_family.get(f)]
    ffns = ffns if moe else ["dense"]
    n_blocks = rng.randint(2, 13)
    n_expert = rng.choice((2, 4, 8))
    metadata_kinds = arch_name in METADATA_KIND_ARCHS
    if metadata_kinds:  # one kind per block (llama.cpp's rule for nemotron_h)
        plan = [rng.choice(mixers + ffns) for _b in range(n_blocks)]
    else:  # a mixer and an FFN per block
        plan = [(rng.choice(mixers) if mixers else None, rng.choice(ffns)) for _b in range(n_blocks)]
    if moe:  # at least one MoE block
        b = rng.randrange(n_blocks)
        plan[b] = "moe" if metadata_kinds else (plan[b][0], "moe")
    tensors = []
    expected_kinds = {}
    experts = []
    biases = rng.random() < 0.3 or arch_name == "gpt-oss"

    def add(name, ne, q=None):
        tensors.append((name, tuple(ne), q or (_qtype(rng, ne[0]) if len(ne) > 1 else gguf.GGMLQuantizationType.F32)))

    for name in globals_:
        matrix = name.startswith(("token_embd", "output", "per_layer_token_embd")) and "norm" not in name
        add(name + ".weight", (N_EMBD, 512) if matrix else (N_EMBD,))
    for b in range(n_blocks):
        parts = [plan[b]] if metadata_kinds else [p for p in plan[b] if p]
        expected_kinds[b] = {PART_KINDS[part] for part in parts}
        fams = ["common"] + [fam for part in parts for fam in PART_FAMILIES[part]]
        if b == n_blocks - 1:
            fams.append("nextn")
        seen = set()
        for fam in fams:
            for kind in by_family.get(fam, ()):
                stem = TENSOR_NAMES[kind].format(bid=b)
                if stem in seen:
                    continue
                seen.add(stem)
                if fam == "experts":
                    width = 2 * N_FF if kind == T.FFN_GATE_UP_EXP else N_FF
                    ne = (N_FF, N_EMBD, n_expert) if kind in (T.FFN_DOWN_EXP, T.FFN_DOWN_CHEXP) else \
                        (N_EMBD, width, n_expert)
                    add(stem + ".weight", ne)
                    experts.append(stem + ".weight")
                    if biases:
                        add(stem + ".bias", (ne[1], n_expert), gguf.GGMLQuantizationType.F32)
                        experts.append(stem + ".bias")
                elif stem.endswith(("ssm_a", "ssm_d")):
                    add(stem, (16,))
                elif "norm" in stem.rsplit(".", 1)[-1] or stem.endswith(("_b", "sinks", "scale")):
                    add(stem + ".weight", (N_EMBD,))
                else:
                    add(stem + ".weight", (N_EMBD, N_FF))
                    if rng.random() < 0.15:
                        add(stem + ".bias", (N_FF,), gguf.GGMLQuantizationType.F32)
    rng.shuffle(tensors)
    numbers = [("block_count", n_blocks), ("embedding_length", N_EMBD), ("context_length", 4096)]
    numbers += [("expert_count", n_expert), ("expert_used_count", min(2, n_expert))] if moe else []
    metadata = {"%s.%s" % (arch_name, key): (value, VT.UINT32) for key, value in numbers}
    if metadata_kinds:
        metadata[arch_name + ".attention.head_count_kv"] = ([2 if p == "attention" else 0 for p in plan], VT.ARRAY)
        metadata[arch_name + ".feed_forward_length"] = ([N_FF if p in ("moe", "dense") else 0 for p in plan], VT.ARRAY)
    return Layout(arch_name, tensors, n_blocks, expected_kinds, sorted(experts), metadata)


def write_layout(layout, directory, seed, shards=None, endian=None):
    """Write ``layout`` as a sparse header-only model; returns the list of files (first = shard 1).

    Shards are split by size as ``tools/gguf_writer.py`` does (gguf-py's writer: every shard a full GGUF with
    ``split.no``/``split.count``/``split.tensors.count``, the metadata in the first only).
    """
    rng = random.Random(seed)
    shards = shards or rng.randint(1, min(5, len(layout.tensors)))
    endian = endian or rng.choice(("little", "big"))
    Path(directory).mkdir(parents=True, exist_ok=True)
    path = Path(directory) / ("%s-layout-%d.gguf" % (layout.arch, seed))

    def add_kv(w):
        for key, (value, vtype) in layout.metadata.items():
            if vtype == VT.ARRAY:
                w.add_array(key, value)
            else:
                w.add_key_value(key, value, vtype)
    tensors = [gguf_writer.Tensor(name, ne, q) for name, ne, q in layout.tensors]
    result = gguf_writer.write_tensors(  # the project's one GGUF writer
        path, layout.arch, add_kv, tensors, endian=endian, data=False, shards=shards)
    return result if isinstance(result, list) else [result]
