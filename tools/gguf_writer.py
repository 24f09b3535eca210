"""Write GGUF files with gguf-py (llama.cpp's own GGUFWriter): the tensors to write, their ggml types and sizes, and
the file, or the shards of a split model, with seeded random weights or a sparse data region. The model writers
(``gguf_models`` and its families) build on it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

import numpy as np

import gguf
from gguf import GGMLQuantizationType as Q

ENDIANS = {"little": gguf.GGUFEndian.LITTLE, "big": gguf.GGUFEndian.BIG}


class Tensor(NamedTuple):
    """One tensor to write: name, shape in ggml ``ne`` order (fastest dimension first), ggml type."""
    name: str
    ne: tuple
    qtype: Q


def ggml_type(value) -> Q:
    """A ggml type from a name (``"f32"``, ``"q8_0"``, ``"Q4_K"``), an id or a ``GGMLQuantizationType``."""
    if isinstance(value, Q):
        return value
    if isinstance(value, int):
        return Q(value)
    return Q[str(value).upper()]


def tensor_nbytes(ne: Sequence[int], qtype: Q) -> int:
    """Bytes of a tensor of shape ``ne`` (ggml order) and type ``qtype``."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    if ne[0] % block:
        raise ValueError("row length %d is not a multiple of the %s block (%d)" % (ne[0], qtype.name, block))
    n = 1
    for d in ne:
        n *= int(d)
    return n // block * size


def simple_types(expert_type, other_type="f32"):
    """Vectors, norms, SSM A/D, conv and router in F32; routed experts ``expert_type``; rest ``other_type``."""
    expert_type, other_type = ggml_type(expert_type), ggml_type(other_type)

    def types(suffix: str, bid: int, ne: tuple) -> Q:
        if (len(ne) == 1 or suffix.endswith(".bias") or "norm" in suffix or suffix in ("ssm_a", "ssm_d", "ssm_conv1d.weight")
                or suffix.startswith("ffn_gate_inp")):
            return Q.F32
        if "_exps" in suffix or "_chexps" in suffix:
            return expert_type
        return other_type
    return types


# --------------------------------------------------------------------------- writing

def _random_weights(rng: np.random.Generator, t: Tensor) -> np.ndarray:
    """f32 values for ``t`` that keep a random model numerically tame."""
    shape = tuple(int(d) for d in reversed(t.ne))
    name = t.name
    if name.endswith("norm.weight") or name.endswith(".ssm_d"):
        return np.ones(shape, dtype=np.float32)
    if name.endswith(".ssm_a"):
        return -rng.uniform(0.5, 2.0, size=shape).astype(np.float32)
    if name.endswith(".bias") or name.endswith("_sinks"):
        return (rng.standard_normal(shape) * 0.01).astype(np.float32)
    return (rng.standard_normal(shape) * 0.02).astype(np.float32)


def _encode(data: np.ndarray, qtype: Q) -> np.ndarray:
    if qtype == Q.F32:
        return data
    if qtype == Q.F16:
        return data.astype(np.float16)
    return gguf.quants.quantize(data, qtype)


def write_tensors(path, arch: str, add_kv: Callable[[gguf.GGUFWriter], None], tensors: Sequence[Tensor], *,
                  endian: str = "little", data: bool = True, seed: int = 0, shards: int = 1):
    """Write ``tensors`` with metadata from ``add_kv``.

    ``data=True``: random weights (seeded) are written. ``data=False``: only header, metadata and tensor
    infos are written and each file is truncated to its full size (a sparse file, the data reads as zeros).
    ``shards > 1``: ``path`` is ``DIR/BASE.gguf`` and the files are ``BASE-0000i-of-0000n.gguf``, split by
    size, with ``split.*`` keys in every shard and the model metadata only in the first.
    Returns the path, or the list of shard paths.
    """
    path = Path(path)
    w = gguf.GGUFWriter(path, arch, endianess=ENDIANS[endian])
    add_kv(w)
    rng = np.random.default_rng(seed)
    total = sum(tensor_nbytes(t.ne, t.qtype) for t in tensors)
    done = 0
    for t in tensors:
        if shards > 1 and len(w.tensors) < shards and done >= total * len(w.tensors) / shards and w.tensors[-1]:
            w.tensors.append({})  # start the next shard (what GGUFWriter does itself for split_max_size)
        nbytes = tensor_nbytes(t.ne, t.qtype)
        if data:
            w.add_tensor(t.name, _encode(_random_weights(rng, t), t.qtype), raw_dtype=None if t.qtype in (Q.F32, Q.F16) else t.qtype)
        else:
            w.add_tensor_info(t.name, tuple(reversed(t.ne)), np.dtype(np.float32), nbytes, raw_dtype=t.qtype)
        done += nbytes
    if shards > 1 and len(w.tensors) != shards:
        raise ValueError("cannot split %d tensors into %d shards" % (len(tensors), shards))
    files = w.format_shard_names(path)
    w.write_header_to_file(path)
    w.write_kv_data_to_file()
    if data:
        w.write_tensors_to_file()
        w.close()
    else:
        w.write_ti_data_to_file()
        sizes = []
        for fout, shard in zip(w.fout, w.tensors):
            start = gguf.GGUFWriter.ggml_pad(fout.tell(), w.data_alignment)
            sizes.append(start + sum(gguf.GGUFWriter.ggml_pad(ti.nbytes, w.data_alignment) for ti in shard.values()))
        w.close()
        for f, size in zip(files, sizes):
            os.truncate(f, size)
    return [str(f) for f in files] if shards > 1 else str(path)
