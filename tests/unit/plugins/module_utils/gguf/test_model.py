"""A GGUF model (plugins/module_utils/gguf/model.py): one file, or every shard of a split model as llama.cpp's
gguf-split writes them (``<base>-NNNNN-of-MMMMM.gguf``, 1-based; ``split.no`` 0-based and ``split.count`` in each
shard, ``split.tensors.count`` and the model's keys in the first: llama.cpp's examples/gguf-split/gguf-split.cpp and
src/llama-model-loader.cpp); and property tests of the whole reader.
"""
from __future__ import annotations

import functools
import os
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.error import GGUFError
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.header import GGUFFile, read_gguf
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.model import (
    GGUFModel, find_split_files, read_model)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.types import GGML_TYPES
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.values import (
    KEEP_LISTS, KEEP_NUMBERS, SkippedArray)
from tests.helpers.gguf_files import (
    ALL_SCALARS, ARRAY, BIG_ARRAYS, BOOL, F32V, F64, I32, I64, SCALARS, SMALL_ARRAYS, SOME_TENSORS, STRING, U8, U16,
    U32, VT, Gguf, cross_check, expect_error, field_offsets, memory_below, model_file, patch, shard, split_model,
    write_gguf)

G = Gguf()


def test_gguf_file_and_model_repr_and_tensor_names(tmp_path):
    path, data_offset, _o = model_file(tmp_path / "m.gguf", [("general.architecture", STRING, G.s("llama"))],
                                       [("a", (8,)), ("b", (16,))])
    gf = read_gguf(path)
    assert repr(gf) == "GGUFFile(path=%r, version=3, byte_order='little', 1 keys, 2 tensors)" % path
    model = read_model(path)
    size = data_offset + 32 + 64
    assert (model.tensor_names, os.path.getsize(path)) == (["a", "b"], size)
    assert repr(model) == "GGUFModel(architecture='llama', 1 files, 2 tensors, %d bytes)" % size
    assert isinstance(gf, GGUFFile) and isinstance(model, GGUFModel)


# --------------------------------------------------------------------------- split models


@pytest.fixture
def split_files(tmp_path, endian):
    return write_gguf(tmp_path / "model.gguf", ALL_SCALARS + BIG_ARRAYS, SOME_TENSORS, endian=endian,
                      split_max_tensors=2)


def test_split_names_with_odd_characters_and_numbers_of_any_width(tmp_path):
    files = write_gguf(tmp_path / "50%d model.v2.gguf", [], SOME_TENSORS, split_max_tensors=3)
    assert find_split_files(files[1]) == files and len(files) == 2
    assert len(read_model(files[0]).tensors) == len(SOME_TENSORS)
    files = split_model(tmp_path, [["a"], ["b"]], width=6)
    assert [os.path.basename(f) for f in files] == ["m-000001-of-000002.gguf", "m-000002-of-000002.gguf"]
    assert find_split_files(files[1]) == files


def test_read_model_split(split_files, endian):
    assert [os.path.basename(f) for f in split_files] == ["model-%05d-of-00003.gguf" % i for i in (1, 2, 3)]
    for shard in split_files + [Path(f) for f in split_files]:
        assert find_split_files(shard) == split_files
    model = read_model(split_files[2])
    assert model.files == split_files
    assert model.architecture == "testarch"
    assert model.metadata == model.shards[0].metadata
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


@pytest.mark.parametrize("name", ["m-0001-of-0002.gguf", "m-00001-of-00002.gguf.part", "-00001-of-00002.gguf",
                                  "m-00001-of-00002.GGUF", "m.gguf", "m-00001-00002.gguf"])
def test_names_that_are_not_shard_names(tmp_path, name):
    assert find_split_files(tmp_path / name) == [str(tmp_path / name)]


@pytest.mark.parametrize("no,count", [(0, 3), (4, 3), (1, 0)])
def test_shard_number_outside_1_to_count(tmp_path, no, count):
    path = str(tmp_path / ("m-%05d-of-%05d.gguf" % (no, count)))
    expect_error(path, 0, "the file name says shard %d of %d" % (no, count), reader=find_split_files)


def test_a_missing_shard_is_named(tmp_path):
    files = split_model(tmp_path, [["a"], ["b"], ["c"]])
    os.remove(files[1])
    expect_error(files[2], 0, "shard 2 of 3 is missing: %s" % files[1], reader=read_model)
    os.mkdir(files[1])  # a directory is not a shard
    expect_error(files[0], 0, "shard 2 of 3 is missing: %s" % files[1], reader=find_split_files)


COUNT_1, COUNT_2 = ("split.count", U16, G.pack("H", 1)), ("split.count", U8, b"\2")
NOT_INTEGERS = [(F32V, G.pack("f", 2.0), "float32"), (F64, G.pack("d", 2.0), "float64"),
                (ARRAY, G.arr(U8, 1, b"\2"), "array"), (STRING, G.s("2"), "string"), (BOOL, b"\1", "bool")]


@pytest.mark.parametrize("count, keys, bad, reason", [
    (2, [("split.no", U16, G.pack("H", 0))], None, "split.count is missing; the file name says shard 1 of 2"),
    (2, [("split.count", U32, G.pack("I", 3))], 0, "split.count is 3 but the file name says shard 1 of 2"),
    (2, [COUNT_2, ("split.no", I64, G.pack("q", 1))], 1,
     "split.no is 1 but the file name says shard 1 of 2 (split.no is 0-based)"),
    (1, [COUNT_1, ("split.no", U16, G.pack("H", 1))], 1,
     "split.no is 1 but the file name says shard 1 of 1 (split.no is 0-based)"),
] + [(1, [("split.count", vtype, payload)], 0, "split.count must be an integer, not " + name)
     for vtype, payload, name in NOT_INTEGERS])
def test_split_keys_must_match_the_file_name(tmp_path, count, keys, bad, reason):
    """The first shard's keys against its name: ``bad`` is the refused key (None: the missing one)."""
    first = split_model(tmp_path, [["a"], ["b"]][:count])[0]
    shard(first, 0, count, ["a"], keys=keys)
    at = 0 if bad is None else 24 + sum(len(G.kv(*kv)) for kv in keys[:bad])
    expect_error(first, at, reason, reader=read_model)


def test_split_count_must_match_the_name(split_files, endian):
    kv, _t = field_offsets(split_files[2])
    # key: u64 length + "split.count" (11 bytes); then u32 type, then the u16 value
    patch(split_files[2], kv["split.count"] + 8 + 11 + 4, "H", 4, endian)
    expect_error(split_files[0], kv["split.count"], "split.count is 4 but the file name says shard 3 of 3",
                 reader=read_model, in_file=split_files[2])


@pytest.mark.parametrize("vtype,code", [(vtype, code) for vtype, code, _v in SCALARS if code in "bBhHiIqQ"])
def test_split_keys_may_be_of_any_integer_type(tmp_path, vtype, code):
    first = shard(tmp_path / "m-00001-of-00002.gguf", 0, 2, ["a"],
                  keys=[("split.count", vtype, G.pack(code, 2)), ("split.no", vtype, G.pack(code, 0))])
    second = shard(tmp_path / "m-00002-of-00002.gguf", 1, 2, ["b"],
                   keys=[("split.count", vtype, G.pack(code, 2)), ("split.no", vtype, G.pack(code, 1))])
    assert [t.name for t in read_model(first).tensors] == ["a", "b"]
    assert read_model(second).files == [first, second]


@pytest.mark.parametrize("name, keys, metadata", [
    # a single shard's name: the split keys are checked only when present
    ("m-00001-of-00001.gguf", [], {}),
    ("m-00001-of-00001.gguf", [COUNT_1, ("split.no", U16, G.pack("H", 0))], {"split.count": 1, "split.no": 0}),
    # a plain name: a split.count of 0 or 1 is one file
    ("m.gguf", [], {}),
    ("m.gguf", [("split.count", U16, G.pack("H", 0))], {"split.count": 0}),
    ("m.gguf", [COUNT_1], {"split.count": 1}),
])
def test_one_file_with_or_without_split_keys(tmp_path, name, keys, metadata):
    model = read_model(shard(tmp_path / name, 0, 1, ["a"], keys=keys))
    assert (model.files, model.tensor_names, model.metadata) == ([str(tmp_path / name)], ["a"], metadata)


def test_a_plain_name_with_a_split_count_over_1(tmp_path):
    keys = [("general.architecture", STRING, G.s("llama")), ("split.count", U16, G.pack("H", 2))]
    path = shard(tmp_path / "m.gguf", 0, 1, ["a"], keys=keys)
    expect_error(path, 24 + len(G.kv(*keys[0])), "split.count is 2 but the file name has no -NNNNN-of-MMMMM "
                 "part, so the other shards cannot be found", reader=read_model)


def test_a_tensor_in_two_shards_is_refused(tmp_path):
    files = split_model(tmp_path, [["a", "b"], ["b"]])
    second = read_gguf(files[1], 1)
    expect_error(files[0], second.tensors[0].info_offset, "tensor 'b' is also in %s" % files[0], reader=read_model,
                 in_file=files[1])


def test_split_tensors_count_is_checked_for_several_shards(tmp_path):
    files = split_model(tmp_path, [["a", "b"], ["c"]])
    keys = [("split.no", U16, G.pack("H", 0)), ("split.count", U16, G.pack("H", 2)),
            ("split.tensors.count", I32, G.pack("i", 4))]
    shard(files[0], 0, 2, ["a", "b"], keys=keys)
    expect_error(files[0], 24 + len(G.kv(*keys[0])) + len(G.kv(*keys[1])),
                 "split.tensors.count is 4 but the 2 shards hold 3 tensors", reader=read_model)
    # one file: the count is not checked
    single = shard(tmp_path / "one.gguf", 0, 1, ["a"], keys=[("split.tensors.count", I32, G.pack("i", 4))])
    assert [t.name for t in read_model(single).tensors] == ["a"]


def test_architecture_must_be_a_string(tmp_path):
    path = shard(tmp_path / "m.gguf", 0, 1, ["a"], keys=[("general.architecture", U32, G.pack("I", 5))])
    model = read_model(path)
    assert (model.architecture, model.warnings) == (None, ["%s: no string general.architecture" % path])


def test_model_warnings_gather_every_shard_then_the_architecture(tmp_path):
    first, second = split_model(tmp_path, [["a"], ["b"]])
    shard(first, 0, 2, ["a"], keys=[("split.no", U16, G.pack("H", 0)), COUNT_2, ("s", STRING, G.s(b"\xff"))])
    shard(second, 1, 2, ["b"], keys=[("split.no", U16, G.pack("H", 1)), COUNT_2, ("t", STRING, G.s(b"\xfe"))])
    assert read_model(second).warnings == [
        "key '%s': a string value is not valid UTF-8 (decoded with replacement characters)" % k for k in "st"] + [
        "%s: no string general.architecture" % first]


# --------------------------------------------------------------------------- properties: random valid files read
# back equal (and equal to GGUFReader's view); random mutations raise nothing but GGUFError, with bounded memory


FLOATS32 = st.floats(width=32, allow_nan=False)
SCALAR_VALUES = {
    VT.UINT8: st.integers(0, 2 ** 8 - 1), VT.INT8: st.integers(-2 ** 7, 2 ** 7 - 1),
    VT.UINT16: st.integers(0, 2 ** 16 - 1), VT.INT16: st.integers(-2 ** 15, 2 ** 15 - 1),
    VT.UINT32: st.integers(0, 2 ** 32 - 1), VT.INT32: st.integers(-2 ** 31, 2 ** 31 - 1),
    VT.UINT64: st.integers(0, 2 ** 64 - 1), VT.INT64: st.integers(-2 ** 63, 2 ** 63 - 1),
    VT.FLOAT32: FLOATS32, VT.FLOAT64: st.floats(allow_nan=False), VT.BOOL: st.booleans(),
    VT.STRING: st.text(max_size=40),
}
# GGUFWriter types the elements of nested arrays from their Python type: int -> INT32, float -> FLOAT32.
NESTED_LEAVES = st.one_of(st.lists(st.integers(-2 ** 31, 2 ** 31 - 1), min_size=1, max_size=4),
                          st.lists(FLOATS32, min_size=1, max_size=4),
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
    if vtype == VT.FLOAT32:
        return struct.unpack("f", struct.pack("f", value))[0]
    if vtype != VT.ARRAY or sub_type is None:  # nested arrays: element types from Python types
        return value
    limit = KEEP_LISTS if sub_type == VT.STRING else KEEP_NUMBERS
    if len(value) > limit:
        return SkippedArray(int(sub_type), len(value))
    return [expected_value(v, sub_type) for v in value]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(kvs=kv_pairs(), tensors=tensor_infos(), endian=st.sampled_from(["little", "big"]),
       alignment=st.sampled_from([None, 1, 8, 64, 4096]))
def test_random_valid_files_read_back(kvs, tensors, endian, alignment):
    with tempfile.TemporaryDirectory() as folder:
        path = write_gguf(os.path.join(folder, "r.gguf"), kvs, tensors, endian=endian, alignment=alignment)[0]
        gf = read_gguf(path)
        assert gf.byte_order == endian and gf.alignment == (alignment or 32)
        for kv in kvs:
            assert gf.metadata[kv[0]] == expected_value(*kv[1:]), kv[0]
            assert gf.value_types[kv[0]] == kv[2]
        assert [(t.name, t.shape, t.type_id) for t in gf.tensors] == [tuple(t) for t in tensors]
        cross_check(path, gf)  # the sizes too


@functools.lru_cache(maxsize=None)
def base_file(endian):
    """A valid file with scalars, small, nested and skipped arrays and tensors (written once per byte order)."""
    with tempfile.TemporaryDirectory() as folder:
        path = write_gguf(os.path.join(folder, "base.gguf"), ALL_SCALARS + SMALL_ARRAYS[:15] + BIG_ARRAYS[:2],
                          SOME_TENSORS, endian=endian)[0]
        return Path(path).read_bytes(), read_gguf(path).data_offset


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
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "m.gguf")
        Path(path).write_bytes(data)
        with memory_below(32 << 20):  # bounded: no count from the file was trusted
            try:
                read_model(path)
            except GGUFError as err:
                assert err.path == path and 0 <= err.offset <= max(len(data), 24)
                assert str(err).startswith("%s: at byte %d: " % (path, err.offset)) and err.reason
