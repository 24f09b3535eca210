"""The GGUF header reader (plugins/module_utils/_gguf.py) on files written by gguf-py at test time.

Valid files are cross-checked against gguf-py's own ``GGUFReader``; malformed files are valid files with
bytes patched at offsets that ``GGUFReader`` locates, so the reader under test never finds its own fields.
"""
from __future__ import annotations

import os
import shutil
import struct
import tracemalloc
from pathlib import Path

import gguf
import numpy as np
import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _gguf
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._gguf import (
    GGUFError,
    SkippedArray,
    find_split_files,
    read_gguf,
    read_model,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import (
    GGML_TYPES,
    REMOVED_TYPE_IDS,
    REMOVED_TYPE_NAMES,
    tensor_nbytes,
)

VT = gguf.GGUFValueType
Q = gguf.GGMLQuantizationType
ENDIAN = {"little": gguf.GGUFEndian.LITTLE, "big": gguf.GGUFEndian.BIG}
PREFIX = {"little": "<", "big": ">"}


# --------------------------------------------------------------------------- writing test files

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
    assert [t.name for t in gf.tensors] == [t.name for t in ref.tensors]
    for ours, theirs in zip(gf.tensors, ref.tensors):
        assert ours.type_id == int(theirs.tensor_type)
        assert ours.type_name == theirs.tensor_type.name
        assert list(ours.shape) == [int(n) for n in theirs.shape]
        assert gf.data_offset + ours.offset == theirs.data_offset
        assert ours.nbytes == theirs.n_bytes
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


def field_offsets(path, endian="little"):
    """Byte offsets of the fields of ``path`` as gguf-py's GGUFReader finds them (for patching)."""
    ref = gguf.GGUFReader(path)
    kv = {name: f.offset for name, f in ref.fields.items()}
    tensors = {}
    for t in ref.tensors:
        start = t.field.offset
        name_len = len(t.name.encode())
        n_dims = len(t.shape)
        dims = start + 8 + name_len + 4
        tensors[t.name] = {"info": start, "n_dims": dims - 4, "ne": dims, "type": dims + 8 * n_dims,
                           "offset": dims + 8 * n_dims + 4}
    return kv, tensors


def patch(path, offset, fmt, value, endian="little"):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(struct.pack(PREFIX[endian] + fmt, value))


def patch_bytes(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def expect_error(path, offset=None, reason=None, reader=read_gguf, in_file=None):
    """``reader(path)`` raises a GGUFError naming ``in_file`` (default ``path``), ``offset`` and ``reason``."""
    with pytest.raises(GGUFError) as info:
        reader(path)
    err = info.value
    assert err.path == str(in_file or path)
    assert str(err) == "%s: at byte %d: %s" % (err.path, err.offset, err.reason)
    if offset is not None:
        assert err.offset == offset, str(err)
    if reason is not None:
        assert reason in err.reason, str(err)
    return err


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
    ("tokenizer.ggml.token_type", [1] * 5000, VT.ARRAY, VT.INT32),
    ("a.many_lists", [[1, 2]] * 100, VT.ARRAY),
]
SOME_TENSORS = [
    ("token_embd.weight", (64, 10), Q.Q8_0),
    ("blk.0.ffn_up_exps.weight", (256, 4, 3), Q.Q4_K),
    ("blk.0.attn_norm.weight", (64,), Q.F32),
    ("blk.0.ssm_a", (1, 8), Q.F32),
    ("output.weight", (64, 10), Q.F16),
]


@pytest.fixture(params=["little", "big"])
def endian(request):
    return request.param


@pytest.fixture
def full_file(tmp_path, endian):
    """A file with every value type, small, nested and large arrays and tensors of several types."""
    return write_gguf(tmp_path / "full.gguf", ALL_SCALARS + SMALL_ARRAYS + BIG_ARRAYS, SOME_TENSORS,
                      endian=endian)[0]


# --------------------------------------------------------------------------- valid files

def test_every_value_type_reads_back(full_file, endian):
    gf = read_gguf(full_file)
    assert (gf.version, gf.byte_order, gf.path) == (3, endian, full_file)
    for key, value, vtype in ALL_SCALARS:
        if vtype == VT.FLOAT32:
            assert gf.metadata[key] == pytest.approx(value)
        else:
            assert gf.metadata[key] == value and type(gf.metadata[key]) is type(value), key
        assert gf.value_types[key] == vtype
    for kv in SMALL_ARRAYS:
        key, value = kv[0], kv[1]
        assert gf.value_types[key] == VT.ARRAY
        if len(value) > _gguf.KEEP_NUMBERS:
            assert gf.metadata[key] == SkippedArray(int(VT.INT32), len(value))
        else:
            assert gf.metadata[key] == value, key
    assert gf.metadata["general.architecture"] == "testarch"
    cross_check(full_file, gf)


def test_large_arrays_are_skipped_not_built(full_file):
    md = read_gguf(full_file).metadata
    assert md["tokenizer.ggml.tokens"] == SkippedArray(int(VT.STRING), 3000)
    assert md["tokenizer.ggml.merges"] == SkippedArray(int(VT.STRING), 1400)
    assert md["tokenizer.ggml.scores"] == SkippedArray(int(VT.FLOAT32), 5000)
    assert md["tokenizer.ggml.token_type"] == SkippedArray(int(VT.INT32), 5000)
    assert md["a.many_lists"] == SkippedArray(int(VT.ARRAY), 100)
    assert len(md["tokenizer.ggml.tokens"]) == 3000
    assert md["tokenizer.ggml.tokens"].item_type_name == "string"


def test_tensor_infos(full_file):
    gf = read_gguf(full_file)
    by_name = {t.name: t for t in gf.tensors}
    assert [t.name for t in gf.tensors] == [t[0] for t in SOME_TENSORS]
    up = by_name["blk.0.ffn_up_exps.weight"]
    assert (up.shape, up.type_id, up.type_name, up.nbytes) == ((256, 4, 3), 12, "Q4_K", 144 * 4 * 3)
    assert up.n_elements == 256 * 12
    assert by_name["token_embd.weight"].nbytes == 2 * 34 * 10
    assert by_name["blk.0.attn_norm.weight"].shape == (64,)
    assert all(t.offset % gf.alignment == 0 and t.file == full_file and t.shard == 0 for t in gf.tensors)
    assert gf.data_offset % 32 == 0 and gf.alignment == 32
    assert gf.file_size == os.path.getsize(full_file)


def test_type_table_is_gguf_py_table():
    """Every id of ggml's type table (ggml.h enum ggml_type), with the block sizes llama.cpp's gguf-py uses."""
    assert set(GGML_TYPES) == {int(q) for q in gguf.GGML_QUANT_SIZES}
    for q, (block, size) in gguf.GGML_QUANT_SIZES.items():
        assert GGML_TYPES[int(q)] == (q.name, block, size)
    for removed in (4, 5, 31, 32, 33, 36, 37, 38):
        assert removed not in GGML_TYPES and removed in REMOVED_TYPE_IDS
        assert removed not in {int(q) for q in gguf.GGMLQuantizationType}  # gguf-py dropped them too


def test_every_ggml_type_as_a_tensor(tmp_path, endian):
    tensors = [("t.%s" % name, (block * 2, 3), tid) for tid, (name, block, _size) in sorted(GGML_TYPES.items())]
    path = write_gguf(tmp_path / "types.gguf", [], tensors, endian=endian)[0]
    gf = read_gguf(path)
    for t, (tid, (name, block, size)) in zip(gf.tensors, sorted(GGML_TYPES.items())):
        assert (t.type_id, t.type_name, t.nbytes) == (tid, name, 2 * size * 3)
    cross_check(path, gf)


def test_tensor_nbytes():
    assert tensor_nbytes(12, (2816, 1856, 128)) == 2816 // 256 * 144 * 1856 * 128
    assert tensor_nbytes(6, (2688, 1856, 128)) == 2688 // 32 * 22 * 1856 * 128
    assert tensor_nbytes(0, ()) == 4
    assert tensor_nbytes(0, (3, 0)) == 0
    assert tensor_nbytes(99, (32,)) is None
    with pytest.raises(ValueError, match="not a multiple"):
        tensor_nbytes(12, (2688, 1856))  # 2688 is not a multiple of 256: why Q4_K falls back to Q5_0


def test_custom_alignment(tmp_path, endian):
    path = write_gguf(tmp_path / "align.gguf", [], SOME_TENSORS, endian=endian, alignment=256)[0]
    gf = read_gguf(path)
    assert gf.alignment == 256 and gf.data_offset % 256 == 0
    assert all(t.offset % 256 == 0 for t in gf.tensors)
    cross_check(path, gf)


def test_version_2_reads_like_3(tmp_path, endian):
    path = write_gguf(tmp_path / "v2.gguf", ALL_SCALARS, SOME_TENSORS, endian=endian)[0]
    patch(path, 4, "I", 2, endian)
    gf = read_gguf(path)
    assert gf.version == 2 and gf.byte_order == endian
    assert [t.name for t in gf.tensors] == [t[0] for t in SOME_TENSORS]
    cross_check(path, gf)


def test_file_without_tensors(tmp_path):
    path = write_gguf(tmp_path / "empty.gguf", ALL_SCALARS)[0]
    gf = read_gguf(path)
    assert gf.tensors == [] and gf.metadata["t.u8"] == 255


def test_empty_array_and_zero_dim_tensor(tmp_path):
    """Things GGUFWriter refuses to write, assembled by hand: an empty array, a 0-dim tensor."""
    def s(text):
        return struct.pack("<Q", len(text)) + text.encode()
    body = b"GGUF" + struct.pack("<IQQ", 3, 2, 2)
    body += s("general.architecture") + struct.pack("<I", 8) + s("x")
    body += s("empty") + struct.pack("<IIQ", 9, 4, 0)
    body += s("scalar") + struct.pack("<IIQ", 0, 0, 0)
    body += s("nothing") + struct.pack("<IqI", 1, 0, 0) + struct.pack("<Q", 32)
    data_offset = -(-len(body) // 32) * 32
    path = tmp_path / "hand.gguf"
    path.write_bytes(body + b"\0" * (data_offset - len(body) + 64))
    gf = read_gguf(path)
    assert gf.metadata["empty"] == []
    scalar, nothing = gf.tensors
    assert (scalar.shape, scalar.nbytes, nothing.shape, nothing.nbytes) == ((), 4, (0,), 0)
    assert gf.data_offset == data_offset


# --------------------------------------------------------------------------- split models

@pytest.fixture
def split_files(tmp_path, endian):
    return write_gguf(tmp_path / "model.gguf", ALL_SCALARS + BIG_ARRAYS, SOME_TENSORS, endian=endian,
                      split_max_tensors=2)


def test_find_split_files_from_any_shard(split_files):
    assert [os.path.basename(f) for f in split_files] == ["model-%05d-of-00003.gguf" % i for i in (1, 2, 3)]
    for shard in split_files:
        assert find_split_files(shard) == split_files
        assert find_split_files(Path(shard)) == split_files


def test_split_names_with_odd_characters(tmp_path):
    files = write_gguf(tmp_path / "50%d model.v2.gguf", [], SOME_TENSORS, split_max_tensors=3)
    assert find_split_files(files[1]) == files and len(files) == 2
    assert len(read_model(files[0]).tensors) == len(SOME_TENSORS)


def test_read_model_split(split_files, endian):
    model = read_model(split_files[1])
    assert model.files == split_files
    assert model.architecture == "testarch"
    assert model.metadata["t.u8"] == 255 and model.metadata["split.count"] == 3
    assert model.metadata["tokenizer.ggml.tokens"] == SkippedArray(int(VT.STRING), 3000)
    assert [t.name for t in model.tensors] == [t[0] for t in SOME_TENSORS]
    assert [t.shard for t in model.tensors] == [0, 0, 1, 1, 2]
    assert [t.file for t in model.tensors] == [split_files[i] for i in (0, 0, 1, 1, 2)]
    assert model.file_bytes == sum(os.path.getsize(f) for f in split_files)
    assert model.warnings == []
    for number, (path, shard) in enumerate(zip(split_files, model.shards)):
        assert shard.metadata["split.no"] == number and shard.byte_order == endian
        cross_check(path, shard)


def test_single_file_model(full_file):
    model = read_model(full_file)
    assert model.files == [full_file] and len(model.tensors) == len(SOME_TENSORS)
    assert model.file_bytes == os.path.getsize(full_file) and model.architecture == "testarch"
    assert find_split_files(full_file) == [full_file]


def test_missing_shard_is_named(split_files):
    os.remove(split_files[1])
    err = expect_error(split_files[0], 0, "shard 2 of 3 is missing", reader=read_model)
    assert split_files[1] in err.reason


def test_split_no_must_match_the_name(split_files, tmp_path):
    a, b = split_files[0], split_files[1]
    os.rename(a, str(tmp_path / "tmp"))
    os.rename(b, a)
    os.rename(str(tmp_path / "tmp"), b)
    expect_error(a, None, "split.no is 1 but the file name says shard 1 of 3", reader=read_model)


def test_split_count_must_match_the_name(split_files, endian):
    kv, _t = field_offsets(split_files[2], endian)
    # key: u64 length + "split.count" (11 bytes); then u32 type, then the u16 value
    patch(split_files[2], kv["split.count"] + 8 + 11 + 4, "H", 4, endian)
    expect_error(split_files[0], kv["split.count"], "split.count is 4 but the file name says shard 3 of 3",
                 reader=read_model, in_file=split_files[2])


def test_split_tensor_count_must_match(split_files, endian):
    kv, _t = field_offsets(split_files[0], endian)
    patch(split_files[0], kv["split.tensors.count"] + 8 + 19 + 4, "i", 6, endian)
    expect_error(split_files[0], kv["split.tensors.count"], "split.tensors.count is 6", reader=read_model)


def test_shard_under_a_plain_name(split_files, tmp_path):
    plain = str(tmp_path / "renamed.gguf")
    shutil.copy(split_files[0], plain)
    expect_error(plain, None, "split.count is 3 but the file name has no -NNNNN-of-MMMMM part", reader=read_model)


def test_bad_shard_numbers_in_the_name(tmp_path):
    path = tmp_path / "m-00004-of-00003.gguf"
    path.write_bytes(b"GGUF")
    expect_error(path, 0, "the file name says shard 4 of 3", reader=find_split_files)


# --------------------------------------------------------------------------- malformed files

@pytest.fixture
def small_file(tmp_path, endian):
    return write_gguf(tmp_path / "small.gguf", ALL_SCALARS + SMALL_ARRAYS[:3] + BIG_ARRAYS[:1], SOME_TENSORS,
                      endian=endian)[0]


def test_error_names_file_offset_and_reason(small_file):
    patch_bytes(small_file, 0, b"GGML")
    err = expect_error(small_file, 0, "bad magic")
    assert str(err).startswith(small_file + ": at byte 0: bad magic")
    assert isinstance(err, Exception) and (err.path, err.offset) == (small_file, 0)


@pytest.mark.parametrize("version,reason", [(1, "version 1 is obsolete"), (4, "unsupported GGUF version 4"),
                                            (0, "unsupported GGUF version 0")])
def test_versions_rejected(small_file, endian, version, reason):
    patch(small_file, 4, "I", version, endian)
    expect_error(small_file, 4, reason)


def test_every_truncation_fails_cleanly(small_file):
    data = Path(small_file).read_bytes()
    header_end = read_gguf(small_file).data_offset
    for length in list(range(0, 200)) + list(range(200, header_end, 97)) + [header_end - 1]:
        Path(small_file).write_bytes(data[:length])
        err = expect_error(small_file)
        assert 0 <= err.offset <= max(length, 0) + 8


def test_truncated_data_region(small_file):
    gf = read_gguf(small_file)
    last = max(gf.tensors, key=lambda t: t.offset)
    os.truncate(small_file, gf.data_offset + last.offset + last.nbytes - 1)
    expect_error(small_file, last.info_offset, "lies beyond the end of the file")


@pytest.mark.parametrize("field,offset_of", [
    ("tensor_count", lambda kv, t: 8), ("kv_count", lambda kv, t: 16),
])
def test_huge_counts_fail_at_once(small_file, endian, field, offset_of):
    kv, tensors = field_offsets(small_file, endian)
    patch(small_file, offset_of(kv, tensors), "Q", 2 ** 60, endian)
    tracemalloc.start()
    try:
        err = expect_error(small_file, None, "claimed")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20
    assert "%d" % 2 ** 60 in err.reason


def test_huge_string_length(small_file, endian):
    kv, _t = field_offsets(small_file, endian)
    patch(small_file, kv["t.str"], "Q", 2 ** 60, endian)  # the key's length
    expect_error(small_file, kv["t.str"], "runs past the end of the file")
    kv, _t = field_offsets(write_gguf(small_file, ALL_SCALARS, endian=endian)[0], endian)
    patch(small_file, kv["t.str"] + 8 + 5 + 4, "Q", 2 ** 63 + 1, endian)  # the value's length
    expect_error(small_file, kv["t.str"] + 17, "string length %d runs past" % (2 ** 63 + 1))


@pytest.mark.parametrize("count", [2 ** 60, 2 ** 64 - 1, 10 ** 6])
def test_huge_array_counts(small_file, endian, count):
    kv, _t = field_offsets(small_file, endian)
    for key in ("tokenizer.ggml.tokens", "a.u8"):
        at = kv[key] + 8 + len(key) + 4
        original = Path(small_file).read_bytes()
        patch(small_file, at + 4, "Q", count, endian)
        tracemalloc.start()
        try:
            expect_error(small_file, at, "array of %d" % count)
            assert tracemalloc.get_traced_memory()[1] < 4 << 20
        finally:
            tracemalloc.stop()
        Path(small_file).write_bytes(original)


def test_string_in_a_skipped_array_runs_past_the_end(small_file, endian):
    kv, _t = field_offsets(small_file, endian)
    key = "tokenizer.ggml.tokens"
    first = kv[key] + 8 + len(key) + 4 + 4 + 8
    # element 0 is "tok0": make the length of element 7 huge
    at = first + sum(8 + len("tok%d" % i) for i in range(7))
    patch(small_file, at, "Q", 2 ** 40, endian)
    expect_error(small_file, at, "element 7 of 3000: string length %d runs past" % 2 ** 40)


def test_bad_value_types(small_file, endian):
    kv, _t = field_offsets(small_file, endian)
    patch(small_file, kv["t.u8"] + 8 + 4, "I", 13, endian)
    expect_error(small_file, kv["t.u8"] + 12, "unknown value type 13")
    small = write_gguf(small_file, SMALL_ARRAYS[:1], endian=endian)[0]
    kv, _t = field_offsets(small, endian)
    patch(small, kv["a.u8"] + 8 + 4 + 4, "I", 99, endian)
    expect_error(small, kv["a.u8"] + 16, "unknown array element type 99")


def test_nesting_depth_limit(tmp_path, endian):
    value = [7]  # MAX_DEPTH levels of arrays are fine, one more is not
    for _i in range(_gguf.MAX_DEPTH - 1):
        value = [value]
    ok = write_gguf(tmp_path / "deep.gguf", [("deep", value, VT.ARRAY)], endian=endian)[0]
    assert read_gguf(ok).metadata["deep"] == value
    deeper = write_gguf(tmp_path / "deeper.gguf", [("deep", [value], VT.ARRAY)], endian=endian)[0]
    expect_error(deeper, None, "nested deeper than %d" % _gguf.MAX_DEPTH)


def test_bad_utf8(small_file, endian):
    kv, _t = field_offsets(small_file, endian)
    patch_bytes(small_file, kv["t.str"] + 8, b"\xff")
    expect_error(small_file, kv["t.str"], "is not valid UTF-8")
    kv, _t = field_offsets(write_gguf(small_file, ALL_SCALARS, endian=endian)[0], endian)
    patch_bytes(small_file, kv["t.str"] + 8 + 5 + 4 + 8, b"\xff")  # the value: replaced, with a warning
    gf = read_gguf(small_file)
    assert gf.metadata["t.str"].startswith("\ufffd")
    assert any("not valid UTF-8" in w for w in gf.warnings)
    assert any("not valid UTF-8" in w for w in read_model(small_file).warnings)


def test_bad_utf8_tensor_name(small_file, endian):
    _kv, tensors = field_offsets(small_file, endian)
    patch_bytes(small_file, tensors["output.weight"]["info"] + 8, b"\xc3")
    expect_error(small_file, tensors["output.weight"]["info"], "name is not valid UTF-8")


def test_duplicate_key(small_file, endian):
    kv, _t = field_offsets(small_file, endian)
    patch_bytes(small_file, kv["t.i8"] + 8, b"t.u8")
    expect_error(small_file, kv["t.i8"], "duplicate key 't.u8'")


def test_duplicate_tensor_name(tmp_path, endian):
    path = write_gguf(tmp_path / "dup.gguf", [], [("a.x", (32,), Q.F32), ("a.y", (32,), Q.F32)], endian=endian)[0]
    _kv, tensors = field_offsets(path, endian)
    patch_bytes(path, tensors["a.y"]["info"] + 8, b"a.x")
    expect_error(path, tensors["a.y"]["info"], "duplicate tensor name 'a.x'")


def test_n_dims_over_4(small_file, endian):
    _kv, tensors = field_offsets(small_file, endian)
    patch(small_file, tensors["output.weight"]["n_dims"], "I", 5, endian)
    expect_error(small_file, tensors["output.weight"]["n_dims"], "n_dims 5 is more than 4")


def test_negative_dimension(small_file, endian):
    _kv, tensors = field_offsets(small_file, endian)
    patch(small_file, tensors["output.weight"]["ne"] + 8, "q", -10, endian)
    expect_error(small_file, tensors["output.weight"]["ne"], "negative dimension -10")


def test_ne0_not_a_multiple_of_the_block(small_file, endian):
    _kv, tensors = field_offsets(small_file, endian)
    info = tensors["token_embd.weight"]
    patch(small_file, info["ne"], "q", 48, endian)  # Q8_0 blocks are 32 elements
    expect_error(small_file, info["info"], "ne0 = 48 is not a multiple of the Q8_0 block size 32")


def test_unknown_type_id_is_size_unknown(small_file, endian):
    _kv, tensors = field_offsets(small_file, endian)
    patch(small_file, tensors["output.weight"]["type"], "I", 99, endian)
    gf = read_gguf(small_file)
    out = gf.tensors[-1]
    assert (out.type_id, out.type_name, out.nbytes) == (99, "unknown(99)", None)
    model = read_model(small_file)
    assert [w for w in model.warnings if "output.weight" in w and "size unknown" in w]
    assert model.tensors[-1].type_name == "unknown(99)"


@pytest.mark.parametrize("type_id,name", sorted(REMOVED_TYPE_NAMES.items()))
def test_removed_type_id_is_refused_like_llama_cpp(small_file, endian, type_id, name):
    """ggml gives the removed types blck_size 0 (ggml/src/ggml.c type_traits) and gguf_init_from_file_impl
    (ggml/src/gguf.cpp) refuses a tensor whose blck_size is 0: the file does not load, so it is an error here."""
    _kv, tensors = field_offsets(small_file, endian)
    info = tensors["output.weight"]
    patch(small_file, info["type"], "I", type_id, endian)
    err = expect_error(small_file, info["info"], "'output.weight': ggml type %d (%s) was removed" % (type_id, name))
    assert "refuses" in err.reason
    expect_error(small_file, info["info"], name, reader=read_model)


def test_misaligned_offset(small_file, endian):
    _kv, tensors = field_offsets(small_file, endian)
    info = tensors["output.weight"]
    with open(small_file, "rb") as f:
        f.seek(info["offset"])
        offset = struct.unpack(PREFIX[endian] + "Q", f.read(8))[0]
    patch(small_file, info["offset"], "Q", offset + 4, endian)
    expect_error(small_file, info["info"], "offset %d is not a multiple of the alignment 32" % (offset + 4))


def test_offset_outside_the_file(small_file, endian):
    _kv, tensors = field_offsets(small_file, endian)
    patch(small_file, tensors["blk.0.ssm_a"]["offset"], "Q", 2 ** 40, endian)
    expect_error(small_file, tensors["blk.0.ssm_a"]["info"], "lies beyond the end of the file")


def test_overlapping_tensors(small_file, endian):
    _kv, tensors = field_offsets(small_file, endian)
    patch(small_file, tensors["output.weight"]["offset"], "Q", 32, endian)  # inside token_embd.weight
    expect_error(small_file, tensors["output.weight"]["info"], "overlaps tensor 'token_embd.weight'")


@pytest.mark.parametrize("alignment,vtype,reason", [
    (48, VT.UINT32, "general.alignment 48 is not a power of two"),
    (0, VT.UINT32, "general.alignment 0 is not a power of two"),
    (64, VT.UINT64, "general.alignment must be a uint32, not uint64"),
])
def test_bad_alignment(tmp_path, endian, alignment, vtype, reason):
    path = write_gguf(tmp_path / "align.gguf", [("general.alignment", alignment, vtype)], SOME_TENSORS,
                      endian=endian)[0]
    # GGUFReader refuses these files too: the pair follows the header (24 bytes) and general.architecture
    expect_error(path, 24 + 8 + len("general.architecture") + 4 + 8 + len("testarch"), reason)


def test_not_a_file(tmp_path):
    err = expect_error(tmp_path / "missing.gguf", 0, "cannot open")
    assert "missing.gguf" in str(err)
    expect_error(tmp_path, 0, "cannot open")
    (tmp_path / "short.gguf").write_bytes(b"GGUF\x03\0\0\0")
    expect_error(tmp_path / "short.gguf", 0, "too short")


# --------------------------------------------------------------------------- time and bytes read do not follow the
# apparent size of a file: runs of empty strings and arrays are skipped at once, holes are not read


def _read_bytes():
    """Bytes this process has read through read(2)/pread(2) so far (Linux /proc/self/io ``rchar``)."""
    with open("/proc/self/io") as f:
        return int([line for line in f if line.startswith("rchar:")][0].split()[1])


def _s(text):
    return struct.pack("<Q", len(text)) + text.encode()


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux /proc/self/io")
@pytest.mark.parametrize("element", ["string", "array"])
def test_a_sparse_64_gib_header_reads_only_the_bytes_it_holds(tmp_path, element):
    """A header whose array spans a 64 GiB hole of a sparse file (empty strings, or empty uint8 arrays: zeros),
    followed by one more key: it reads back right, and only a few MiB are read, not 64 GiB."""
    hole = 64 << 30
    unit = 8 if element == "string" else 12
    count = hole // unit
    itype = 8 if element == "string" else 9
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 3) + _s("general.architecture") + struct.pack("<I", 8) + _s("x")
    head += _s("big") + struct.pack("<IIQ", 9, itype, count + 1)
    # the first element is written (not empty), then `count` empty ones lie in the hole, then the last key
    first = _s("tok") if element == "string" else struct.pack("<IQ", 5, 2) + struct.pack("<ii", 1, 2)
    after = _s("after") + struct.pack("<II", 4, 7)
    path = tmp_path / "sparse.gguf"
    with open(path, "wb") as f:
        f.write(head + first)
        f.seek(len(head + first) + count * unit)
        f.write(after)
    assert os.path.getsize(path) > hole and os.stat(path).st_blocks * 512 < 1 << 20  # really sparse
    before = _read_bytes()
    gf = read_gguf(path)
    read = _read_bytes() - before
    assert gf.metadata["big"] == SkippedArray(itype, count + 1)
    assert gf.metadata["after"] == 7 and gf.data_offset == -(-(os.path.getsize(path)) // 32) * 32
    assert read < 16 << 20, read


def test_runs_of_empty_strings_between_real_ones_read_back(tmp_path, endian):
    """The empty-run skip keeps the count right when empty and non-empty strings alternate (cross-checked)."""
    tokens = [""] * 500 + ["a"] + [""] * 3 + ["bc"] + [""] * 1000 + ["end"] + [""]
    path = write_gguf(tmp_path / "empty_runs.gguf", [("tokenizer.ggml.tokens", tokens, VT.ARRAY, VT.STRING),
                                                     ("after", 9, VT.UINT32)], SOME_TENSORS, endian=endian)[0]
    gf = read_gguf(path)
    assert gf.metadata["tokenizer.ggml.tokens"] == SkippedArray(int(VT.STRING), len(tokens))
    assert gf.metadata["after"] == 9
    cross_check(path, gf)


def test_runs_of_empty_arrays_between_real_ones_read_back(tmp_path):
    """Nested arrays: empty uint8 arrays (12 zero bytes each) among non-empty ones, assembled by hand."""
    empty = struct.pack("<IQ", 0, 0)
    one = struct.pack("<IQ", 5, 1) + struct.pack("<i", -1)
    elements = [empty] * 300 + [one] + [empty] * 2 + [one] + [empty] * 100
    body = b"GGUF" + struct.pack("<IQQ", 3, 0, 2)
    body += _s("lists") + struct.pack("<IIQ", 9, 9, len(elements)) + b"".join(elements)
    body += _s("after") + struct.pack("<II", 4, 7)
    path = tmp_path / "lists.gguf"
    path.write_bytes(body + b"\0" * 64)
    gf = read_gguf(path)
    assert gf.metadata["lists"] == SkippedArray(9, len(elements)) and gf.metadata["after"] == 7


def test_an_empty_string_run_that_overruns_the_file_names_the_element(tmp_path):
    def body(count):
        return b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _s("tokens") + struct.pack("<IIQ", 9, 8, count)
    path = tmp_path / "short_run.gguf"
    path.write_bytes(body(71) + b"\0" * (8 * 70) + struct.pack("<Q", 1000) + b"\0" * 20)
    expect_error(path, len(body(71)) + 8 * 70, "element 70 of 71: string length 1000 runs past the end")
    # 800 bytes: as many as 100 empty strings need, but the first string holds 3 bytes
    path.write_bytes(body(100) + _s("abc") + b"\0" * (8 * 98 + 5))
    expect_error(path, len(body(100)) + 11 + 8 * 98, "element 99 of 100: no room for its length (5 bytes left")


def test_kept_strings_are_bounded_in_size_and_memory(tmp_path):
    """Strings in the unwritten part of a sparse file (zeros) as long as the reader keeps: the total kept is capped
    (MAX_KEPT_BYTES), each string too (MAX_STRING), and the memory stays near that cap, not a multiple of it."""
    n = _gguf.MAX_STRING
    count = _gguf.MAX_KEPT_BYTES // n + 1
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, count)
    path = tmp_path / "strings.gguf"
    with open(path, "wb") as f:
        f.write(head)
        for i in range(count):
            f.write(_s("k%d" % i) + struct.pack("<IQ", 8, n))
            f.seek(n, os.SEEK_CUR)  # a hole: n zero bytes
        f.write(b"\0" * 64)
    tracemalloc.start()
    try:
        err = expect_error(path, None, "more than %d bytes of metadata strings" % _gguf.MAX_KEPT_BYTES)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert err.reason.startswith("key 'k")  # the value that goes over the cap
    assert peak < _gguf.MAX_KEPT_BYTES + 3 * _gguf.MAX_STRING
    with open(path, "r+b") as f:  # one string over MAX_STRING
        f.seek(len(head) + 8 + 2 + 4)
        f.write(struct.pack("<Q", n + 1))
    expect_error(path, len(head) + 8 + 2 + 4, "string of %d bytes is longer than the %d" % (n + 1, n))
