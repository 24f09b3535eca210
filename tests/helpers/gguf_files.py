"""GGUF files for the reader's tests, two ways: assembled byte by byte (``Gguf``, ``model_file``, ``shard``), so
that every field is where the test puts it, and written by gguf-py's ``GGUFWriter`` (``write_gguf``), patched at
offsets that gguf-py's ``GGUFReader`` locates (``field_offsets``, ``patch``) and cross-checked against it
(``cross_check``), so that the reader under test never finds its own fields."""
from __future__ import annotations

import contextlib
import math
import os
import struct
import tracemalloc
from pathlib import Path

import gguf
import numpy as np
import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.error import GGUFError
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.header import read_gguf
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.values import SkippedArray, ValueReader

PREFIX = {"little": "<", "big": ">"}
U8, I8, U16, I16, U32, I32, F32V, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
F32, Q8_0 = 0, 8  # ggml type ids (ggml.h enum ggml_type)
MIB = 1 << 20
# A value of every scalar type: (value type, struct code, value), each at or near its type's limits.
SCALARS = [(U8, "B", 200), (I8, "b", -100), (U16, "H", 60000), (I16, "h", -30000), (U32, "I", 4000000000),
           (I32, "i", -2000000000), (F32V, "f", 1.5), (BOOL, "?", True), (U64, "Q", 2 ** 64 - 2), (I64, "q", -2 ** 62),
           (F64, "d", 2.25)]
VT = gguf.GGUFValueType
Q = gguf.GGMLQuantizationType
ENDIAN = {"little": gguf.GGUFEndian.LITTLE, "big": gguf.GGUFEndian.BIG}


# --------------------------------------------------------------------------- assembled byte by byte

class Gguf:
    """Bytes of a GGUF file in one byte order."""

    def __init__(self, endian="little"):
        self.e = PREFIX[endian]

    def pack(self, fmt, *values):
        return struct.pack(self.e + fmt, *values)

    def s(self, text):
        raw = text if isinstance(text, bytes) else text.encode()
        return self.pack("Q", len(raw)) + raw

    def header(self, n_tensors, n_kv, version=3):
        return b"GGUF" + self.pack("IQQ", version, n_tensors, n_kv)

    def kv(self, key, vtype, payload):
        return self.s(key) + self.pack("I", vtype) + payload

    def arr(self, itype, count, body):
        return self.pack("IQ", itype, count) + body

    def info(self, name, shape, type_id, offset):
        return self.s(name) + self.pack("I", len(shape)) + self.pack("%dq" % len(shape), *shape) + \
            self.pack("IQ", type_id, offset)


def pad(n, alignment=32):
    return -(-n // alignment) * alignment


def write(path, data):
    Path(path).write_bytes(data)
    return str(path)


def sparse(path, pieces, size=None):
    """A file of ``pieces`` ((offset, bytes)) with holes between them, truncated or extended to ``size`` bytes."""
    with open(path, "wb") as f:
        for offset, data in pieces:
            f.seek(offset)
            f.write(data)
        if size is not None:
            f.truncate(size)
    return str(path)


@contextlib.contextmanager
def memory_below(limit):
    """The memory traced at its peak inside the block stays under ``limit`` bytes."""
    tracemalloc.start()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < limit, peak


def model_file(path, kvs=(), tensors=(), *, endian="little"):
    """A file of ``kvs`` ((key, vtype, payload)) and F32 ``tensors`` ((name, shape)) laid out one after the other
    at offsets aligned to 32 bytes. Returns (path, data_offset, offsets)."""
    g = Gguf(endian)
    offsets = []
    end = 0
    for _name, shape in tensors:
        offsets.append(pad(end))
        end = offsets[-1] + 4 * math.prod(shape)
    head = g.header(len(tensors), len(kvs)) + b"".join(g.kv(*kv) for kv in kvs)
    head += b"".join(g.info(name, shape, F32, off) for (name, shape), off in zip(tensors, offsets))
    data_offset = pad(len(head))
    return write(path, head.ljust(data_offset + end, b"\0")), data_offset, offsets


@contextlib.contextmanager
def opened(path, size=None, flags=0):
    fd = os.open(path, os.O_RDONLY | flags)
    try:
        yield ValueReader(str(path), fd, os.fstat(fd).st_size if size is None else size)
    finally:
        os.close(fd)


def shard(path, no, count, tensors, *, total=None, keys=None):
    """One shard as gguf-split writes it, unless ``keys`` are given: split.no and split.count (uint16),
    split.tensors.count (int32) and the model's keys (general.architecture llama) in the first shard only."""
    g = Gguf()
    if keys is None:
        keys = [("general.architecture", STRING, g.s("llama"))] if no == 0 else []
        keys += [("split.no", U16, g.pack("H", no)), ("split.count", U16, g.pack("H", count))]
        if no == 0:
            keys.append(("split.tensors.count", I32, g.pack("i", total)))
    return model_file(path, keys, [(name, (8,)) for name in tensors])[0]


def split_model(tmp_path, layout, width=5):
    count = len(layout)
    total = sum(len(t) for t in layout)
    return [shard(tmp_path / ("m-%0*d-of-%0*d.gguf" % (width, i + 1, width, count)), i, count, tensors, total=total)
            for i, tensors in enumerate(layout)]


def expect_error(path, offset, reason, reader=read_gguf, in_file=None):
    """``reader(path)`` raises exactly ``GGUFError(in_file or path, offset, reason)``."""
    with pytest.raises(GGUFError) as raised:
        reader(path)
    err = raised.value
    assert (err.path, err.offset, err.reason) == (str(in_file or path), offset, reason)
    return err


# --------------------------------------------------------------------------- written by gguf-py

def zeros_for(ne, qtype):
    """Zero bytes for a tensor of ggml shape ``ne`` and type ``qtype``, shaped as GGUFWriter wants them."""
    numpy_shape = tuple(reversed([int(n) for n in ne]))
    return np.zeros(gguf.quant_shape_to_byte_shape(numpy_shape, Q(qtype)), dtype=np.uint8)


def write_gguf(path, kvs=(), tensors=(), *, endian="little", arch="testarch", alignment=None,
               split_max_tensors=0):
    """Write a GGUF file with gguf-py's GGUFWriter.

    ``kvs``: (key, value, GGUFValueType[, sub_type]); ``tensors``: (name, ne in ggml order, ggml type id).
    With ``split_max_tensors`` the writer splits into ``<stem>-0000i-of-0000n.gguf`` shards.
    Returns the list of files written.
    """
    path = Path(path)
    w = gguf.GGUFWriter(path, arch, endianess=ENDIAN[endian], split_max_tensors=split_max_tensors)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for kv in kvs:
        w.add_key_value(kv[0], kv[1], kv[2], kv[3] if len(kv) > 3 else None)
    for name, ne, qtype in tensors:
        w.add_tensor(name, zeros_for(ne, qtype), raw_dtype=Q(qtype))
    files = w.format_shard_names(path)
    w.write_header_to_file(path)
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return [str(f) for f in files]


def cross_check(path, gf):
    """Compare a ``GGUFFile`` with gguf-py's ``GGUFReader`` on the same file."""
    ref = gguf.GGUFReader(path)
    assert gf.data_offset == ref.data_offset
    assert gf.alignment == ref.alignment
    ours = [(t.name, t.type_id, t.type_name, list(t.shape), gf.data_offset + t.offset, t.nbytes) for t in gf.tensors]
    assert ours == [(t.name, int(t.tensor_type), t.tensor_type.name, [int(n) for n in t.shape], t.data_offset,
                     t.n_bytes) for t in ref.tensors]
    assert set(gf.metadata) == set(ref.fields) - {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}
    for key, value in gf.metadata.items():
        field = ref.fields[key]
        assert gf.value_types[key] == int(field.types[0]), key
        if isinstance(value, SkippedArray):
            assert value.item_type == int(field.types[1]), key
            if value.item_type != VT.ARRAY:  # GGUFReader flattens nested arrays
                assert value.count == len(field.data), key
        elif field.types[0] != VT.ARRAY or all(not isinstance(v, list) for v in value):
            assert value == pytest.approx(field.contents()) if _has_float(value) else value == field.contents(), key
    return ref


def _has_float(value):
    return isinstance(value, float) or (isinstance(value, list) and any(isinstance(v, float) for v in value))


def field_offsets(path):
    """Byte offsets of the fields of ``path`` as gguf-py's GGUFReader finds them (for patching): ``{key: offset}``
    and ``{tensor name: {"info": its tensor info, "type": its ggml type}}``."""
    ref = gguf.GGUFReader(path)
    kv = {name: f.offset for name, f in ref.fields.items()}
    tensors = {}
    for t in ref.tensors:
        start = t.field.offset  # then the name (u64 length and bytes), n_dims (u32), ne (u64 each), the type
        tensors[t.name] = {"info": start, "type": start + 8 + len(t.name.encode()) + 4 + 8 * len(t.shape)}
    return kv, tensors


def patch(path, offset, fmt, value, endian="little"):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(struct.pack(PREFIX[endian] + fmt, value))


ALL_SCALARS = [
    ("t.u8", 255, VT.UINT8), ("t.i8", -128, VT.INT8), ("t.u16", 65535, VT.UINT16), ("t.i16", -32768, VT.INT16),
    ("t.u32", 2 ** 32 - 1, VT.UINT32), ("t.i32", -2 ** 31, VT.INT32), ("t.f32", 0.5, VT.FLOAT32),
    ("t.bool", True, VT.BOOL), ("t.false", False, VT.BOOL), ("t.str", "h\u00e9llo \u4e16\u754c", VT.STRING),
    ("t.empty_str", "", VT.STRING), ("t.u64", 2 ** 64 - 1, VT.UINT64), ("t.i64", -2 ** 63, VT.INT64),
    ("t.f64", -1.25e300, VT.FLOAT64),
]
SMALL_ARRAYS = [
    ("a.u8", [0, 1, 255], VT.ARRAY, VT.UINT8), ("a.i8", [-1, 2], VT.ARRAY, VT.INT8),
    ("a.u16", [1, 65535], VT.ARRAY, VT.UINT16), ("a.i16", [-3], VT.ARRAY, VT.INT16),
    ("a.u32", [7, 8, 9], VT.ARRAY, VT.UINT32), ("a.i32", [0, 0, 0, 0, 0, 2, 0, 0], VT.ARRAY, VT.INT32),
    ("a.f32", [0.25, -2.0], VT.ARRAY, VT.FLOAT32), ("a.bool", [True, False, True], VT.ARRAY, VT.BOOL),
    ("a.u64", [2 ** 63], VT.ARRAY, VT.UINT64), ("a.i64", [-5, 5], VT.ARRAY, VT.INT64),
    ("a.f64", [1e-300], VT.ARRAY, VT.FLOAT64), ("a.str", ["a", "\u00df", ""], VT.ARRAY, VT.STRING),
    ("a.nested", [[1, 2], [3]], VT.ARRAY), ("a.nested_str", [["x"], ["y", "z"]], VT.ARRAY),
    ("a.deep", [[[1.5], [2.5]], [[3.5]]], VT.ARRAY),
    ("a.layers", [0, 2, 0, 0, 0, 2] * 700, VT.ARRAY, VT.INT32),  # 4200 elements: just past KEEP_NUMBERS
    ("a.head_count_kv", [0] * 5 + [2] + [0] * 46, VT.ARRAY, VT.INT32),  # per-layer arrays are kept
]
BIG_ARRAYS = [
    ("tokenizer.ggml.tokens", ["tok%d" % i for i in range(3000)], VT.ARRAY, VT.STRING),
    ("tokenizer.ggml.merges", ["t o", "k %d" % 1] * 700, VT.ARRAY, VT.STRING),
    ("tokenizer.ggml.scores", [0.0] * 5000, VT.ARRAY, VT.FLOAT32),
    ("tokenizer.ggml.token_type", [1] * 5000, VT.ARRAY, VT.INT32), ("a.many_lists", [[1, 2]] * 100, VT.ARRAY)]
SOME_TENSORS = [("token_embd.weight", (64, 10), Q.Q8_0), ("blk.0.ffn_up_exps.weight", (256, 4, 3), Q.Q4_K),
                ("blk.0.attn_norm.weight", (64,), Q.F32), ("blk.0.ssm_a", (1, 8), Q.F32),
                ("output.weight", (64, 10), Q.F16)]
