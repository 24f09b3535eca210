"""Property tests of the GGUF reader: random valid files read back equal (and equal to GGUFReader's view);
random mutations of valid files raise nothing but GGUFError, with bounded memory."""
from __future__ import annotations

import os
import shutil
import struct
import tempfile
import tracemalloc

import gguf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import GGML_TYPES
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._gguf import (
    GGUFError,
    KEEP_LISTS,
    KEEP_NUMBERS,
    SkippedArray,
    read_gguf,
    read_model,
)
from test_gguf_reader import ALL_SCALARS, BIG_ARRAYS, SMALL_ARRAYS, SOME_TENSORS, cross_check, write_gguf

VT = gguf.GGUFValueType
F32 = st.floats(width=32, allow_nan=False)
SCALAR_VALUES = {
    VT.UINT8: st.integers(0, 2 ** 8 - 1), VT.INT8: st.integers(-2 ** 7, 2 ** 7 - 1),
    VT.UINT16: st.integers(0, 2 ** 16 - 1), VT.INT16: st.integers(-2 ** 15, 2 ** 15 - 1),
    VT.UINT32: st.integers(0, 2 ** 32 - 1), VT.INT32: st.integers(-2 ** 31, 2 ** 31 - 1),
    VT.UINT64: st.integers(0, 2 ** 64 - 1), VT.INT64: st.integers(-2 ** 63, 2 ** 63 - 1),
    VT.FLOAT32: F32, VT.FLOAT64: st.floats(allow_nan=False), VT.BOOL: st.booleans(),
    VT.STRING: st.text(max_size=40),
}
# GGUFWriter types the elements of nested arrays from their Python type: int -> INT32, float -> FLOAT32.
NESTED_LEAVES = st.one_of(st.lists(st.integers(-2 ** 31, 2 ** 31 - 1), min_size=1, max_size=4),
                          st.lists(F32, min_size=1, max_size=4),
                          st.lists(st.text(max_size=5), min_size=1, max_size=4))


@st.composite
def kv_pairs(draw):
    """(key, value, type[, sub_type]) of every kind, arrays long enough to be skipped now and then."""
    keys = draw(st.lists(st.text(min_size=1, max_size=12), max_size=8, unique=True))
    pairs = []
    for key in keys:
        kind = draw(st.sampled_from(["scalar", "array", "nested"]))
        if kind == "scalar":
            vtype = draw(st.sampled_from(sorted(SCALAR_VALUES)))
            pairs.append(("k." + key, draw(SCALAR_VALUES[vtype]), vtype))
        elif kind == "array":
            vtype = draw(st.sampled_from(sorted(SCALAR_VALUES)))
            limit = KEEP_LISTS if vtype == VT.STRING else KEEP_NUMBERS
            size = draw(st.sampled_from([1, 2, 5, limit, limit + 1]))
            element = SCALAR_VALUES[vtype] if size < 10 else st.just(draw(SCALAR_VALUES[vtype]))
            pairs.append(("k." + key, draw(st.lists(element, min_size=size, max_size=size)), VT.ARRAY, vtype))
        else:
            depth = draw(st.integers(1, 3))
            value = draw(st.lists(NESTED_LEAVES, min_size=1, max_size=3))
            for _i in range(depth - 1):
                value = [value]
            pairs.append(("k." + key, value, VT.ARRAY))
    return pairs


@st.composite
def tensor_infos(draw):
    names = draw(st.lists(st.text(min_size=1, max_size=20), max_size=6, unique=True))
    tensors = []
    for name in names:
        type_id = draw(st.sampled_from(sorted(GGML_TYPES)))
        block = GGML_TYPES[type_id][1]
        rest = draw(st.lists(st.integers(1, 3), max_size=3))
        tensors.append(("t." + name, tuple([block * draw(st.integers(1, 2))] + rest), type_id))
    return tensors


def expected_value(value, vtype, sub_type=None):
    """What the reader returns for a value written by GGUFWriter."""
    if vtype != VT.ARRAY:
        return struct.unpack("f", struct.pack("f", value))[0] if vtype == VT.FLOAT32 else value
    if sub_type is None:  # nested: element types from Python types
        return value
    limit = KEEP_LISTS if sub_type == VT.STRING else KEEP_NUMBERS
    if len(value) > limit:
        return SkippedArray(int(sub_type), len(value))
    return [expected_value(v, sub_type) for v in value]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(kvs=kv_pairs(), tensors=tensor_infos(), endian=st.sampled_from(["little", "big"]),
       alignment=st.sampled_from([None, 1, 8, 64, 4096]))
def test_random_valid_files_read_back(kvs, tensors, endian, alignment):
    folder = tempfile.mkdtemp()
    try:
        path = write_gguf(os.path.join(folder, "r.gguf"), kvs, tensors, endian=endian, alignment=alignment)[0]
        gf = read_gguf(path)
        assert gf.byte_order == endian and gf.alignment == (alignment or 32)
        for kv in kvs:
            assert gf.metadata[kv[0]] == expected_value(*kv[1:]), kv[0]
            assert gf.value_types[kv[0]] == kv[2]
        assert [(t.name, t.shape, t.type_id) for t in gf.tensors] == [tuple(t) for t in tensors]
        for t in gf.tensors:
            block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(t.type_id)]
            assert t.nbytes == t.n_elements // block * size
        cross_check(path, gf)
    finally:
        shutil.rmtree(folder)


# --------------------------------------------------------------------------- mutations

BASES = {}


def base_file(endian):
    """A valid file with scalars, small, nested and skipped arrays and tensors (written once per byte order)."""
    if endian not in BASES:
        folder = tempfile.mkdtemp(prefix="gguf-mutation-base-")
        path = write_gguf(os.path.join(folder, "base.gguf"), ALL_SCALARS + SMALL_ARRAYS[:15] + BIG_ARRAYS[:2],
                          SOME_TENSORS, endian=endian)[0]
        with open(path, "rb") as f:
            data = f.read()
        BASES[endian] = (data, read_gguf(path).data_offset)
        shutil.rmtree(folder)
    return BASES[endian]


HUGE = st.sampled_from([2 ** 60, 2 ** 63, 2 ** 64 - 1, 2 ** 32 - 1, 2 ** 31, 10 ** 6, 4097, 65, 5, 0])


@st.composite
def mutations(draw):
    endian = draw(st.sampled_from(["little", "big"]))
    data, header_end = base_file(endian)
    data = bytearray(data)
    for _i in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "byte", "count", "count32", "truncate"]))
        at = draw(st.integers(0, header_end - 1))
        if kind == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "byte":
            data[at] = draw(st.integers(0, 255))
        elif kind == "count":  # a huge or odd u64 anywhere in the header (counts and lengths are u64)
            data[at:at + 8] = struct.pack(("<" if endian == "little" else ">") + "Q", draw(HUGE))
        elif kind == "count32":  # n_dims, types, alignment, ...
            data[at:at + 4] = struct.pack(("<" if endian == "little" else ">") + "I", draw(HUGE) & 0xFFFFFFFF)
        else:
            del data[at:]
            break
    return bytes(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=mutations())
def test_mutations_raise_only_gguf_error(data):
    folder = tempfile.mkdtemp()
    try:
        path = os.path.join(folder, "m.gguf")
        with open(path, "wb") as f:
            f.write(data)
        tracemalloc.start()
        try:
            read_model(path)
        except GGUFError as err:
            assert err.path == path and 0 <= err.offset <= max(len(data), 24)
            assert str(err).startswith("%s: at byte %d: " % (path, err.offset)) and err.reason
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert peak < 32 << 20  # bounded: no count from the file was trusted
    finally:
        shutil.rmtree(folder)


@settings(max_examples=60, deadline=None)
@given(shard=st.integers(0, 2), at=st.integers(0, 400), value=HUGE)
def test_mutated_shard_of_a_split_model(shard, at, value):
    folder = tempfile.mkdtemp()
    try:
        files = write_gguf(os.path.join(folder, "s.gguf"), ALL_SCALARS, SOME_TENSORS, split_max_tensors=2)
        with open(files[shard], "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(min(at, size - 8))
            f.write(struct.pack("<Q", value))
        for given_shard in files:
            try:
                model = read_model(given_shard)
            except GGUFError as err:
                assert err.path in files + [given_shard]
            else:
                assert model.files == files
    finally:
        shutil.rmtree(folder)
