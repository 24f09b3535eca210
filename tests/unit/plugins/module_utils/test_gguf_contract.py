"""The exact contract of the GGUF header reader (plugins/module_utils/_gguf.py), on files assembled byte by byte.

What a valid header is and what is refused follows llama.cpp's ggml/src/gguf.cpp ``gguf_init_from_file_impl``:

* the header is the magic ``GGUF``, a u32 version, an i64 tensor count and an i64 key/value count (24 bytes);
  a version whose low 16 bits are zero (``(ctx->version & 0x0000FFFF) == 0``) is a file of the other byte order,
  version 1 is refused (``GGUFv1 is no longer supported``), and so is a version above 3;
* a key is refused when it repeats (``duplicate key``), a value type outside 0..12 is refused;
* ``general.alignment`` must be a u32 (``must be of type uint32``) and a power of two (``alignment == 0 ||
  (alignment & (alignment - 1)) != 0`` is refused); the default is ``GGUF_DEFAULT_ALIGNMENT`` 32;
* a tensor info is a name, ``n_dims`` (refused above ``GGML_MAX_DIMS`` 4), ``n_dims`` i64 dimensions (a negative
  one is refused, a shape of more than INT64_MAX elements is refused, a zero-element shape is fine), a u32 ggml
  type and a u64 offset; ``ne[0]`` must be a multiple of the type's block size, and removed types
  (``blck_size == 0``) are refused;
* the data section starts at the end of the tensor infos padded to the alignment (``GGML_PAD``).

An array's count is checked against the rest of the file at the least size of one element (``gguf_reader``
reads ``n`` values of ``sizeof(T)`` bytes; a string is at least its u64 length, an array its u32 type and u64
count). The reader's own limits (``MAX_DEPTH``, ``KEEP_NUMBERS``, ``KEEP_LISTS``, ``MAX_STRING``,
``MAX_KEPT_BYTES``) and error messages are those of its module docstring.
"""
from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
import struct
import threading
from pathlib import Path

import gguf
import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _gguf
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._gguf import (
    GGUFError,
    GGUFFile,
    GGUFModel,
    SkippedArray,
    TensorInfo,
    find_split_files,
    read_gguf,
    read_model,
)

PREFIX = {"little": "<", "big": ">"}
U8, I8, U16, I16, U32, I32, F32V, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
F32, F16, Q8_0 = 0, 1, 8  # ggml type ids (ggml.h enum ggml_type)
MIB = 1 << 20
# A value of every scalar type: (value type, struct code, value), each at or near its type's limits.
SCALARS = [(U8, "B", 200), (I8, "b", -100), (U16, "H", 60000), (I16, "h", -30000), (U32, "I", 4000000000),
           (I32, "i", -2000000000), (F32V, "f", 1.5), (BOOL, "?", True), (U64, "Q", 2 ** 64 - 2), (I64, "q", -2 ** 62),
           (F64, "d", 2.25)]


# --------------------------------------------------------------------------- assembling files

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


def nbytes(shape, type_id):
    """Bytes of a tensor, from gguf-py's table of block sizes (GGML_QUANT_SIZES)."""
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(type_id)]
    count = 1
    for n in shape:
        count *= n
    return count // block * size


def pad(n, alignment=32):
    return -(-n // alignment) * alignment


def write(path, data):
    Path(path).write_bytes(data)
    return str(path)


def model_file(path, kvs=(), tensors=(), *, endian="little", alignment=32, extra=0):
    """A file of ``kvs`` ((key, vtype, payload)) and F32 ``tensors`` ((name, shape)) laid out one after the other
    at aligned offsets; ``extra`` bytes more (or fewer) than the data needs. Returns (path, data_offset, offsets)."""
    g = Gguf(endian)
    offsets = []
    at = 0
    for _name, shape in tensors:
        offsets.append(at)
        at = pad(at + nbytes(shape, F32), alignment)
    end = offsets[-1] + nbytes(tensors[-1][1], F32) if tensors else 0
    head = g.header(len(tensors), len(kvs)) + b"".join(g.kv(*kv) for kv in kvs)
    head += b"".join(g.info(name, shape, F32, off) for (name, shape), off in zip(tensors, offsets))
    data_offset = pad(len(head), alignment)
    return write(path, head.ljust(data_offset + end + extra, b"\0")), data_offset, offsets


def expect_error(path, offset, reason, reader=read_gguf, in_file=None):
    """``reader(path)`` raises exactly ``GGUFError(in_file or path, offset, reason)``."""
    with pytest.raises(GGUFError) as raised:
        reader(path)
    err = raised.value
    assert (err.path, err.offset, err.reason) == (str(in_file or path), offset, reason)
    return err


@contextlib.contextmanager
def opened(path, size=None, flags=0):
    fd = os.open(path, os.O_RDONLY | flags)
    try:
        yield _gguf._Reader(str(path), fd, os.fstat(fd).st_size if size is None else size)
    finally:
        os.close(fd)


@pytest.fixture(params=["little", "big"])
def endian(request):
    return request.param


# --------------------------------------------------------------------------- the result types

def test_gguf_error_keeps_path_offset_and_reason_as_text_int_text():
    err = GGUFError(Path("/models/m.gguf"), "12", 404)
    assert (err.path, err.offset, err.reason) == ("/models/m.gguf", 12, "404")
    assert err.args == ("/models/m.gguf", 12, "404")
    assert str(err) == "/models/m.gguf: at byte 12: 404"
    assert isinstance(err, Exception)


def test_value_type_names_are_those_of_the_gguf_spec():
    """GGUF value type ids 0..12 (ggml/include/gguf.h enum gguf_type; gguf-py GGUFValueType)."""
    assert _gguf.VALUE_TYPE_NAMES == {int(v): v.name.lower() for v in gguf.GGUFValueType}


def test_skipped_array_names_its_item_type_and_has_its_count_as_length():
    assert [SkippedArray(t, 3).item_type_name for t in range(13)] == [
        "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string", "array", "uint64",
        "int64", "float64"]
    assert SkippedArray(13, 3).item_type_name == "13"
    assert len(SkippedArray(8, 123456)) == 123456
    assert SkippedArray(8, 5) == SkippedArray(8, 5) != SkippedArray(9, 5)


def test_tensor_info_properties_defaults_and_repr():
    t = TensorInfo("blk.0.ffn_up_exps.weight", (256, 4, 3), 12, 64, 1728)
    assert (t.file, t.shard, t.info_offset) == ("", 0, 0)
    assert (t.type_name, t.n_elements) == ("Q4_K", 3072)
    assert repr(t) == ("TensorInfo(name='blk.0.ffn_up_exps.weight', shape=(256, 4, 3), type_name='Q4_K', "
                       "offset=64, nbytes=1728, shard=0)")
    assert TensorInfo("s", (), 0, 0, 4).n_elements == 1          # a 0-dim tensor is one element (ggml ne = 1)
    assert TensorInfo("z", (0, 7), 0, 0, 0).n_elements == 0
    assert TensorInfo("u", (32,), 99, 0, None).type_name == "unknown(99)"
    # the byte of the tensor info is for messages: two infos of the same tensor compare equal
    assert TensorInfo("a", (8,), 0, 0, 32, "f", 1, 100) == TensorInfo("a", (8,), 0, 0, 32, "f", 1, 200)
    assert TensorInfo("a", (8,), 0, 0, 32, "f", 1) != TensorInfo("a", (8,), 0, 0, 32, "f", 2)


def test_gguf_file_and_model_repr_and_tensor_names(tmp_path):
    path, data_offset, _o = model_file(tmp_path / "m.gguf", [("general.architecture", STRING, Gguf().s("llama"))],
                                       [("a", (8,)), ("b", (16,))])
    gf = read_gguf(path)
    assert repr(gf) == "GGUFFile(path=%r, version=3, byte_order='little', 1 keys, 2 tensors)" % path
    model = read_model(path)
    assert model.tensor_names == ["a", "b"]
    size = os.path.getsize(path)
    assert size == data_offset + 32 + 64
    assert repr(model) == "GGUFModel(architecture='llama', 1 files, 2 tensors, %d bytes)" % size
    assert isinstance(gf, GGUFFile) and isinstance(model, GGUFModel)


# --------------------------------------------------------------------------- a whole file, field by field

def test_a_small_file_reads_back_field_by_field(tmp_path, endian):
    g = Gguf(endian)
    kvs = [g.kv("general.architecture", STRING, g.s("llama")), g.kv("n", U32, g.pack("I", 7))]
    infos = [g.info("a", (8, 2), F32, 0), g.info("b", (32,), Q8_0, 64)]
    head = g.header(2, 2) + b"".join(kvs) + b"".join(infos)
    path = write(tmp_path / "m.gguf", head.ljust(pad(len(head)) + 64 + 34, b"\0"))
    gf = read_gguf(path, 2)
    key_at = 24 + len(kvs[0])
    info_at = 24 + len(kvs[0]) + len(kvs[1])
    assert gf == GGUFFile(path, 3, endian, {"general.architecture": "llama", "n": 7},
                          {"general.architecture": STRING, "n": U32}, {"general.architecture": 24, "n": key_at},
                          [TensorInfo("a", (8, 2), F32, 0, 64, path, 2), TensorInfo("b", (32,), Q8_0, 64, 34, path, 2)],
                          32, pad(len(head)), pad(len(head)) + 98, [], 2)
    assert [t.info_offset for t in gf.tensors] == [info_at, info_at + len(infos[0])]
    assert read_gguf(path).shard == 0 and read_gguf(path).tensors[0].shard == 0
    ref = gguf.GGUFReader(path)
    assert (ref.data_offset, [int(t.n_bytes) for t in ref.tensors]) == (gf.data_offset, [64, 34])


def test_every_scalar_type_in_both_byte_orders(tmp_path, endian):
    g = Gguf(endian)
    values = SCALARS
    kvs = [g.kv("k%d" % t, t, g.pack(code, v)) for t, code, v in values]
    path = write(tmp_path / "s.gguf", g.header(0, len(kvs)) + b"".join(kvs))
    gf = read_gguf(path)
    assert gf.metadata == {"k%d" % t: v for t, _c, v in values}
    assert gf.value_types == {"k%d" % t: t for t, _c, _v in values}


# --------------------------------------------------------------------------- the 24-byte header

def test_24_bytes_is_the_shortest_header(tmp_path):
    g = Gguf()
    expect_error(write(tmp_path / "short.gguf", g.header(0, 0)[:23]), 0,
                 "file of 23 bytes is too short for a GGUF header (24 bytes)")
    expect_error(write(tmp_path / "empty.gguf", b""), 0, "file of 0 bytes is too short for a GGUF header (24 bytes)")
    path = write(tmp_path / "ok.gguf", g.header(0, 0))
    gf = read_gguf(path)
    assert (gf.metadata, gf.tensors, gf.file_size, gf.alignment) == ({}, [], 24, 32)
    assert gf.data_offset == gguf.GGUFReader(path).data_offset == 32


def test_bad_magic_is_named(tmp_path):
    path = write(tmp_path / "m.gguf", b"GGML" + Gguf().pack("IQQ", 3, 0, 0))
    expect_error(path, 0, "bad magic b'GGML': not a GGUF file")


@pytest.mark.parametrize("version,reason", [
    (1, "GGUF version 1 is obsolete and not supported (only versions 2 and 3)"),
    (4, "unsupported GGUF version 4 (only versions 2 and 3)"),
    (0xFFFF, "unsupported GGUF version 65535 (only versions 2 and 3)"),
])
def test_versions_refused(tmp_path, endian, version, reason):
    path = write(tmp_path / "m.gguf", Gguf(endian).header(0, 0, version))
    expect_error(path, 4, reason)


@pytest.mark.parametrize("version", [2, 3])
def test_versions_read_in_either_byte_order(tmp_path, endian, version):
    gf = read_gguf(write(tmp_path / "m.gguf", Gguf(endian).header(0, 0, version)))
    assert (gf.version, gf.byte_order) == (version, endian)


def test_a_pair_count_is_bounded_at_13_bytes_a_pair(tmp_path):
    """The shortest pair is a key length (8), a value type (4) and a one-byte value: 13 bytes."""
    g = Gguf()
    pair_without_value = g.s("k") + g.pack("I", U8)  # 13 bytes: the count check lets it through
    path = write(tmp_path / "m.gguf", g.header(0, 1) + pair_without_value)
    expect_error(path, 37, "unexpected end of file: 1 bytes needed, 0 left")
    write(path, g.header(0, 1) + pair_without_value[:12])
    expect_error(path, 16, "1 key/value pairs claimed, but only 12 bytes left in the file")
    write(path, g.header(0, 2) + pair_without_value + b"\x07")
    expect_error(path, 16, "2 key/value pairs claimed, but only 14 bytes left in the file")


def test_a_tensor_count_is_bounded_at_24_bytes_an_info(tmp_path):
    """The shortest tensor info is a name length (8), n_dims (4), a type (4) and an offset (8): 24 bytes."""
    g = Gguf()
    info = g.info("t", (), F32, 0)[:24]  # 25 bytes with its 1-byte name: the offset lacks a byte
    path = write(tmp_path / "m.gguf", g.header(1, 0) + info)
    expect_error(path, 41, "unexpected end of file: 8 bytes needed, 7 left")
    write(path, g.header(1, 0) + info[:23])
    expect_error(path, 8, "1 tensors claimed, but only 23 bytes left in the file")
    write(path, g.header(3, 0) + info + b"\0" * 47)
    expect_error(path, 8, "3 tensors claimed, but only 71 bytes left in the file")


def test_the_pair_count_is_checked_before_the_tensor_count(tmp_path):
    path = write(tmp_path / "m.gguf", Gguf().header(5, 5) + b"\0" * 10)
    expect_error(path, 16, "5 key/value pairs claimed, but only 10 bytes left in the file")


# --------------------------------------------------------------------------- keys and values

def test_duplicate_key_and_unknown_value_type(tmp_path, endian):
    g = Gguf(endian)
    first = g.kv("k", U8, b"\x01")
    path = write(tmp_path / "m.gguf", g.header(0, 2) + first + g.kv("k", U8, b"\x02"))
    expect_error(path, 24 + len(first), "duplicate key 'k'")
    write(path, g.header(0, 2) + first + g.kv("j", 13, b"\0" * 8))
    expect_error(path, 24 + len(first) + 9, "key 'j': unknown value type 13")


def test_keys_and_tensor_names_must_be_utf8_values_are_replaced_with_a_warning(tmp_path):
    g = Gguf()
    path = write(tmp_path / "m.gguf", g.header(0, 2) + g.kv("ok", U8, b"\0") + g.kv(b"\xff", U8, b"\0"))
    expect_error(path, 24 + 8 + 2 + 4 + 1, "key 1 is not valid UTF-8 (invalid start byte)")
    write(path, g.header(1, 0) + g.info(b"a\xff", (), F32, 0))
    expect_error(path, 24, "tensor info 0: name is not valid UTF-8 (invalid start byte)")
    write(path, g.header(0, 2) + g.kv("s", STRING, g.s(b"x\xffy"))
          + g.kv("a", ARRAY, g.arr(STRING, 2, g.s("ok") + g.s(b"\xff"))))
    gf = read_gguf(path)
    assert gf.metadata == {"s": "x\ufffdy", "a": ["ok", "\ufffd"]}
    assert gf.warnings == [
        "key 's': a string value is not valid UTF-8 (decoded with replacement characters)",
        "key 'a': a string value is not valid UTF-8 (decoded with replacement characters)",
    ]


def test_a_string_may_take_exactly_the_rest_of_the_file(tmp_path):
    g = Gguf()
    key = g.pack("Q", 5) + b"abcde"  # a key that ends the file: its value type is missing
    path = write(tmp_path / "m.gguf", g.header(0, 1) + key + b"\0" * 4)
    write(path, g.header(0, 1) + key)
    # 13 bytes are left after the header: the pair count passes; the key takes them all, then the type is missing
    expect_error(path, 37, "unexpected end of file: 4 bytes needed, 0 left")
    write(path, g.header(0, 1) + g.pack("Q", 6) + b"abcde")
    expect_error(path, 24, "key 0: string length 6 runs past the end of the file (5 bytes left)")


def test_a_string_longer_than_a_read_chunk_reads_whole_and_the_next_key_follows(tmp_path):
    g = Gguf()
    text = "0123456789" * (_gguf.CHUNK // 10 + 7)
    path = write(tmp_path / "m.gguf", g.header(0, 2) + g.kv("long", STRING, g.s(text)) + g.kv("n", U16, g.pack("H", 9)))
    assert read_gguf(path).metadata == {"long": text, "n": 9}


def test_one_string_is_bounded_by_max_string(tmp_path):
    """A string of MAX_STRING bytes is read (zeros in a sparse file); one byte more is refused."""
    g = Gguf()
    n = _gguf.MAX_STRING
    head = g.header(0, 1) + g.s("k") + g.pack("IQ", STRING, n)
    path = tmp_path / "m.gguf"
    write(path, head)
    os.truncate(path, len(head) + n + 1)
    assert read_gguf(path).metadata == {"k": "\0" * n}
    write(path, head[:-8] + g.pack("Q", n + 1))
    os.truncate(path, len(head) + n + 1)
    expect_error(str(path), len(head) - 8, "key 'k': string of %d bytes is longer than the %d this reader accepts"
                 % (n + 1, n))


def test_kept_strings_are_bounded_by_max_kept_bytes_keys_included(tmp_path):
    """Keys and values count: four 1-byte keys and values of 16 MiB - 4 bytes in all are kept; one byte more
    (a fifth key) is refused at that key."""
    g = Gguf()
    n = _gguf.MAX_STRING
    sizes = [n, n, n, n - 4]
    assert sum(sizes) + 4 == _gguf.MAX_KEPT_BYTES
    path = tmp_path / "m.gguf"

    def build(n_kv, tail):
        with open(path, "wb") as f:
            f.write(g.header(0, n_kv))
            for key, size in zip("abcd", sizes):
                f.write(g.s(key) + g.pack("IQ", STRING, size))
                f.seek(size, os.SEEK_CUR)
            f.write(tail)
            f.truncate()
        return str(path)

    gf = read_gguf(build(4, b""))
    assert {k: len(v) for k, v in gf.metadata.items()} == dict(zip("abcd", sizes))
    over = build(5, g.kv("e", U8, b"\0"))
    expect_error(over, os.path.getsize(over) - 14, "key 4: more than %d bytes of metadata strings"
                 % _gguf.MAX_KEPT_BYTES)


# --------------------------------------------------------------------------- arrays

@pytest.mark.parametrize("itype,code", [(U8, "B"), (U16, "H"), (F32V, "f"), (U64, "Q")])
def test_numeric_arrays_are_kept_up_to_keep_numbers_elements(tmp_path, endian, itype, code):
    """KEEP_NUMBERS elements are returned as a list, one more is skipped (and the key after it reads right)."""
    g = Gguf(endian)
    keep = _gguf.KEEP_NUMBERS
    kept = [i % 100 for i in range(keep)]
    body = g.kv("kept", ARRAY, g.arr(itype, keep, g.pack("%d%s" % (keep, code), *kept)))
    body += g.kv("skipped", ARRAY, g.arr(itype, keep + 1, g.pack("%d%s" % (keep + 1, code), *(kept + [1]))))
    body += g.kv("after", U32, g.pack("I", 7))
    gf = read_gguf(write(tmp_path / "m.gguf", g.header(0, 3) + body))
    assert gf.metadata == {"kept": kept, "skipped": SkippedArray(itype, keep + 1), "after": 7}


def test_string_and_nested_arrays_are_kept_up_to_keep_lists_elements(tmp_path, endian):
    g = Gguf(endian)
    keep = _gguf.KEEP_LISTS
    words = ["w%d" % i for i in range(keep + 1)]
    lists = [[i, i + 1] for i in range(keep + 1)]

    def strings(n):
        return g.arr(STRING, n, b"".join(g.s(w) for w in words[:n]))

    def arrays(n):
        return g.arr(ARRAY, n, b"".join(g.arr(I16, 2, g.pack("2h", *v)) for v in lists[:n]))
    body = g.kv("s64", ARRAY, strings(keep)) + g.kv("s65", ARRAY, strings(keep + 1))
    body += g.kv("a64", ARRAY, arrays(keep)) + g.kv("a65", ARRAY, arrays(keep + 1)) + g.kv("after", I8, b"\xfe")
    gf = read_gguf(write(tmp_path / "m.gguf", g.header(0, 5) + body))
    assert gf.metadata == {"s64": words[:keep], "s65": SkippedArray(STRING, keep + 1), "a64": lists[:keep],
                           "a65": SkippedArray(ARRAY, keep + 1), "after": -2}


@pytest.mark.parametrize("itype,size,name", [(U8, 1, "uint8"), (I16, 2, "int16"), (U32, 4, "uint32"),
                                             (F64, 8, "float64"), (STRING, 8, "string"), (ARRAY, 12, "array")])
def test_an_array_may_need_exactly_the_rest_of_the_file(tmp_path, itype, size, name):
    """The count is checked at the least size of an element; a count that fits exactly passes that check."""
    g = Gguf()
    head = g.header(0, 1) + g.kv("a", ARRAY, g.pack("IQ", itype, 3))
    path = write(tmp_path / "m.gguf", head + b"\0" * (3 * size))
    expected = {U8: [0, 0, 0], I16: [0, 0, 0], U32: [0, 0, 0], F64: [0.0, 0.0, 0.0], STRING: ["", "", ""],
                ARRAY: [[], [], []]}[itype]
    assert read_gguf(path).metadata == {"a": expected}
    write(path, head + b"\0" * (3 * size - 1))
    expect_error(path, 24 + 9 + 4, "key 'a': array of 3 %s elements needs at least %d bytes, only %d left in the file"
                 % (name, 3 * size, 3 * size - 1))


def test_unknown_array_element_type(tmp_path):
    g = Gguf()
    path = write(tmp_path / "m.gguf", g.header(0, 1) + g.kv("a", ARRAY, g.arr(13, 1, b"\0" * 16)))
    expect_error(path, 37, "key 'a': unknown array element type 13")


def _nested(g, levels, leaf):
    """``levels`` arrays one inside the other, the innermost holding ``leaf`` (one uint8)."""
    value = g.arr(U8, 1, leaf)
    for _i in range(levels - 1):
        value = g.arr(ARRAY, 1, value)
    return value


@pytest.mark.parametrize("count", [1, _gguf.KEEP_LISTS + 1])
def test_arrays_nest_up_to_max_depth_kept_or_skipped(tmp_path, endian, count):
    """The value's own array is level 1; MAX_DEPTH levels read, one more is refused where its header is, in a
    kept array and in one skipped for its length alike."""
    g = Gguf(endian)
    depth = _gguf.MAX_DEPTH
    ok = g.kv("deep", ARRAY, g.arr(ARRAY, count, _nested(g, depth - 1, b"\x05") * count))
    gf = read_gguf(write(tmp_path / "ok.gguf", g.header(0, 2) + ok + g.kv("after", U8, b"\x01")))
    value = [5]
    for _i in range(depth - 1):
        value = [value]
    assert gf.metadata == {"deep": value if count == 1 else SkippedArray(ARRAY, count), "after": 1}
    too_deep = g.kv("deep", ARRAY, g.arr(ARRAY, count, _nested(g, depth, b"\x05") * count))
    path = write(tmp_path / "deep.gguf", g.header(0, 1) + too_deep)
    # the pair's key (8 + 4 bytes) and value type (4), then one 12-byte array header a level
    expect_error(path, 24 + 8 + 4 + 4 + 12 * depth, "key 'deep': arrays nested deeper than %d" % depth)


def test_errors_inside_a_skipped_array_of_arrays_name_the_key(tmp_path, endian):
    """Inner arrays of a skipped array are walked: a bad string or an inner count too large is reported with the
    key and the byte where it is."""
    g = Gguf(endian)
    count = _gguf.KEEP_LISTS + 1
    good = g.arr(STRING, 1, g.s("t"))
    head = g.header(0, 1) + g.s("x") + g.pack("I", ARRAY) + g.pack("IQ", ARRAY, count)
    bad_string = g.arr(STRING, 1, g.pack("Q", 1000) + b"t")
    path = write(tmp_path / "m.gguf", head + good * (count - 1) + bad_string + b"\0" * 20)
    at = len(head) + len(good) * (count - 1) + 12
    expect_error(path, at, "key 'x': element 0 of 1: string length 1000 runs past the end of the file (21 bytes left)")
    inner = g.arr(ARRAY, 1, g.arr(U32, 2 ** 40, b""))
    write(path, head + good * (count - 1) + inner + b"\0" * 20)
    expect_error(path, at, "key 'x': array of %d uint32 elements needs at least %d bytes, only 20 left in the "
                 "file" % (2 ** 40, 2 ** 42))


def test_runs_of_zeros_count_only_whole_empty_elements(tmp_path, endian):
    """An empty string is 8 zero bytes and an empty uint8 array 12; zeros that run on into the next element's
    length or type are not taken for one more empty element."""
    g = Gguf(endian)
    count = _gguf.KEEP_LISTS + 3
    # a string of length 256 starts with a zero byte in little-endian, 7 zero bytes in big-endian
    strings = g.s("") * (count - 2) + g.s("x" * 256) + g.s("")
    # a uint8 array of one zero: its type (0) is 4 zero bytes, its count starts with zeros in big-endian
    arrays = g.arr(U8, 0, b"") * (count - 2) + g.arr(U8, 1, b"\0") + g.arr(U8, 0, b"")
    body = g.kv("s", ARRAY, g.arr(STRING, count, strings)) + g.kv("a", ARRAY, g.arr(ARRAY, count, arrays))
    gf = read_gguf(write(tmp_path / "m.gguf", g.header(0, 3) + body + g.kv("after", U8, b"\x09")))
    assert gf.metadata == {"s": SkippedArray(STRING, count), "a": SkippedArray(ARRAY, count), "after": 9}


def test_a_skipped_string_array_that_ends_early_names_the_element(tmp_path, endian):
    g = Gguf(endian)
    count = _gguf.KEEP_LISTS + 1
    head = g.header(0, 1) + g.kv("tok", ARRAY, g.pack("IQ", STRING, count))
    # strings of one byte then zeros that the element count claims: the last length has no room
    body = g.s("a") * (count - 2) + b"\0" * 13
    path = write(tmp_path / "m.gguf", head + body)
    at = len(head) + 9 * (count - 2) + 8
    expect_error(path, at, "key 'tok': element %d of %d: no room for its length (5 bytes left in the file)"
                 % (count - 1, count))


# --------------------------------------------------------------------------- the read size

READ_SIZES = [1, 2, 3, 5, 8, 9, 13, 31, 64, 1000]


def _straddling_file(path, endian, cut=None):
    """Every value type, a skipped string array (empty strings among strings of 1 to 10 bytes), a skipped array of
    arrays, kept arrays and two tensor infos: with a small read size, every kind of field straddles a read.
    ``cut``: the file ends that many bytes into the last string of the skipped array (10 bytes long), after the
    scalars. Returns (path, facts)."""
    g = Gguf(endian)
    count = _gguf.KEEP_LISTS + 5
    texts = ["t" * (i % 11) for i in range(count - 1)] + ["t" * 10]
    scalars = [("k%d" % t, t, g.pack(code, v)) for t, code, v in SCALARS]
    arrays = [("nums", ARRAY, g.arr(U32, 3, g.pack("3I", 7, 8, 9))),
              ("names", ARRAY, g.arr(STRING, 2, g.s("up") + g.s(""))),
              ("nested", ARRAY, g.arr(ARRAY, count, g.arr(U8, 1, b"\x05") * count)),
              ("general.architecture", STRING, g.s("llama"))]
    tok = ("tok", ARRAY, g.arr(STRING, count, b"".join(g.s(t) for t in texts)))
    if cut is not None:
        head = g.header(0, len(scalars) + 1) + b"".join(g.kv(*kv) for kv in scalars) + g.kv(*tok)
        end = len(head) - len(texts[-1])
        return write(path, head[:end + cut]), {"count": count, "at": end - 8}
    kvs = scalars + arrays + [tok]
    path, data_offset, offsets = model_file(path, kvs, [("a", (8, 2)), ("b", (32,))], endian=endian)
    return path, {"count": count, "data_offset": data_offset, "offsets": offsets}


@pytest.mark.parametrize("chunk", READ_SIZES)
def test_the_header_reads_alike_whatever_the_read_size(tmp_path, endian, monkeypatch, chunk):
    """The reader buffers its reads (CHUNK bytes): a value, a string length or a run of empty strings cut by the
    end of a read is read whole from the next one, at any read size."""
    path, facts = _straddling_file(tmp_path / "m.gguf", endian)
    whole = read_gguf(path)
    assert whole.metadata["k%d" % U64] == 2 ** 64 - 2 and whole.metadata["k%d" % F64] == 2.25
    assert whole.metadata["tok"] == SkippedArray(STRING, facts["count"])
    assert whole.metadata["nested"] == SkippedArray(ARRAY, facts["count"])
    assert (whole.metadata["nums"], whole.metadata["names"]) == ([7, 8, 9], ["up", ""])
    assert [(t.name, t.offset) for t in whole.tensors] == [("a", 0), ("b", facts["offsets"][1])]
    assert whole.data_offset == facts["data_offset"]
    monkeypatch.setattr(_gguf, "CHUNK", chunk)
    assert read_gguf(path) == whole


@pytest.mark.parametrize("chunk", READ_SIZES)
def test_a_skipped_string_cut_by_the_end_of_the_file_is_named_at_any_read_size(tmp_path, monkeypatch, chunk):
    """The last string of a skipped array lacks its last byte; with it the file would end exactly there."""
    monkeypatch.setattr(_gguf, "CHUNK", chunk)
    path, facts = _straddling_file(tmp_path / "cut.gguf", "little", cut=9)
    count = facts["count"]
    expect_error(path, facts["at"], "key 'tok': element %d of %d: string length 10 runs past the end of the file "
                                    "(9 bytes left)" % (count - 1, count))
    path, _facts = _straddling_file(tmp_path / "exact.gguf", "little", cut=10)
    assert read_gguf(path).metadata["tok"] == SkippedArray(STRING, count)


# --------------------------------------------------------------------------- alignment

@pytest.mark.parametrize("alignment", [1, 2, 64, 2 ** 31])
def test_alignment_powers_of_two_are_taken(tmp_path, alignment):
    g = Gguf()
    kv = g.kv("general.alignment", U32, g.pack("I", alignment))
    head = g.header(1, 1) + kv + g.info("t", (8,), F32, 0)
    data_offset = pad(len(head), alignment)
    if alignment > 64:
        path = tmp_path / "m.gguf"
        write(path, head)
        os.truncate(path, data_offset + 32)
    else:
        path = write(tmp_path / "m.gguf", head.ljust(data_offset + 32, b"\0"))
    gf = read_gguf(path)
    assert (gf.alignment, gf.data_offset, gf.tensors[0].nbytes) == (alignment, data_offset, 32)


@pytest.mark.parametrize("alignment", [0, 3, 6, 48, 2 ** 31 + 1])
def test_alignment_not_a_power_of_two_is_refused(tmp_path, alignment):
    g = Gguf()
    first = g.kv("general.architecture", STRING, g.s("x"))
    path = write(tmp_path / "m.gguf", g.header(0, 2) + first
                 + g.kv("general.alignment", U32, g.pack("I", alignment)))
    expect_error(path, 24 + len(first), "general.alignment %d is not a power of two" % alignment)


@pytest.mark.parametrize("vtype,code,name", [(I32, "i", "int32"), (U64, "Q", "uint64"), (U16, "H", "uint16")])
def test_alignment_must_be_a_uint32(tmp_path, vtype, code, name):
    g = Gguf()
    path = write(tmp_path / "m.gguf", g.header(0, 1) + g.kv("general.alignment", vtype, g.pack(code, 32)))
    expect_error(path, 24, "general.alignment must be a uint32, not %s" % name)


def test_the_default_alignment_is_32(tmp_path):
    g = Gguf()
    head = g.header(1, 0) + g.info("t", (8,), F32, 32)  # 57 bytes: data at 64, the tensor at 64 + 32
    path = write(tmp_path / "m.gguf", head.ljust(128, b"\0"))
    gf = read_gguf(path)
    assert (gf.alignment, gf.data_offset) == (32, 64)
    write(path, (g.header(1, 0) + g.info("t", (8,), F32, 16)).ljust(128, b"\0"))
    expect_error(path, 24, "tensor 't': offset 16 is not a multiple of the alignment 32")


# --------------------------------------------------------------------------- tensor infos

def test_n_dims_up_to_4(tmp_path, endian):
    g = Gguf(endian)
    head = g.header(1, 0) + g.info("t", (32, 1, 1, 2), F32, 0)
    path = write(tmp_path / "m.gguf", head.ljust(pad(len(head)) + 256, b"\0"))
    assert read_gguf(path).tensors[0].shape == (32, 1, 1, 2)
    head = g.header(1, 0) + g.info("t", (32, 1, 1, 2, 1), F32, 0)
    write(path, head.ljust(pad(len(head)) + 256, b"\0"))
    expect_error(path, 33, "tensor 't': n_dims 5 is more than 4")


def test_dimensions_may_be_zero_not_negative(tmp_path, endian):
    g = Gguf(endian)
    head = g.header(1, 0) + g.info("t", (0, 2 ** 62, 2 ** 62, 2 ** 62), F32, 0)
    path = write(tmp_path / "m.gguf", head.ljust(pad(len(head)), b"\0"))
    t = read_gguf(path).tensors[0]
    assert (t.shape, t.nbytes, t.n_elements) == ((0, 2 ** 62, 2 ** 62, 2 ** 62), 0, 0)
    write(path, (g.header(1, 0) + g.info("t", (32, -1), F32, 0)).ljust(128, b"\0"))
    expect_error(path, 37, "tensor 't': negative dimension -1 in shape (32, -1)")


def test_a_shape_of_int64_max_elements_passes_that_check_one_more_does_not(tmp_path):
    """gguf_init_from_file_impl refuses a shape when INT64_MAX / ne[i] < the elements so far: (2**63-1,) is
    representable (the data then lies beyond the file), (2**32, 2**31) is 2**63 elements."""
    g = Gguf()
    path = write(tmp_path / "m.gguf", (g.header(1, 0) + g.info("t", (2 ** 63 - 1,), F32, 0)).ljust(96, b"\0"))
    expect_error(path, 24, "tensor 't': data at bytes 64..%d lies beyond the end of the file (96 bytes)"
                 % (64 + 4 * (2 ** 63 - 1)))
    write(path, (g.header(1, 0) + g.info("t", (2 ** 32, 2 ** 31), F32, 0)).ljust(96, b"\0"))
    expect_error(path, 37, "tensor 't': shape (4294967296, 2147483648) has more than 2**63-1 elements")


def test_tensor_data_may_end_exactly_at_the_end_of_the_file(tmp_path, endian):
    path, data_offset, _o = model_file(tmp_path / "m.gguf", [], [("t", (8,))], endian=endian)
    assert (data_offset, os.path.getsize(path)) == (64, 96)
    assert read_gguf(path).tensors[0].nbytes == 32
    os.truncate(path, 95)
    expect_error(path, 24, "tensor 't': data at bytes 64..96 lies beyond the end of the file (95 bytes)")


def test_ne0_must_be_a_multiple_of_the_block_size(tmp_path):
    g = Gguf()
    path = write(tmp_path / "m.gguf", (g.header(1, 0) + g.info("q", (48, 2), Q8_0, 0)).ljust(256, b"\0"))
    expect_error(path, 24, "tensor 'q': ne0 = 48 is not a multiple of the Q8_0 block size 32")


def test_removed_and_unknown_type_ids(tmp_path):
    g = Gguf()
    path = write(tmp_path / "m.gguf", (g.header(1, 0) + g.info("q", (32,), 4, 0)).ljust(256, b"\0"))
    expect_error(path, 24, "tensor 'q': ggml type 4 (Q4_2) was removed from ggml; llama.cpp refuses files that use it "
                 "(convert the model again)")
    write(path, (g.header(2, 0) + g.info("q", (32,), 99, 0) + g.info("r", (8,), F32, 0)).ljust(256, b"\0"))
    gf = read_gguf(path)
    assert [(t.name, t.type_name, t.nbytes) for t in gf.tensors] == [("q", "unknown(99)", None), ("r", "F32", 32)]
    assert gf.warnings == ["%s: tensor 'q' has unknown ggml type id 99: size unknown" % path]


def test_duplicate_tensor_name(tmp_path):
    g = Gguf()
    first = g.info("t", (8,), F32, 0)
    path = write(tmp_path / "m.gguf", (g.header(2, 0) + first + g.info("t", (8,), F32, 32)).ljust(256, b"\0"))
    expect_error(path, 24 + len(first), "duplicate tensor name 't'")


def test_tensors_may_touch_but_not_overlap(tmp_path, endian):
    g = Gguf(endian)
    infos = g.info("a", (16,), F32, 0) + g.info("b", (8,), F32, 64) + g.info("c", (8,), F32, 96)
    path = write(tmp_path / "m.gguf", (g.header(3, 0) + infos).ljust(256, b"\0"))
    assert [(t.offset, t.nbytes) for t in read_gguf(path).tensors] == [(0, 64), (64, 32), (96, 32)]
    # a tensor of 32 bytes at 32 lies inside a (0..64), whatever order the infos come in
    first = g.info("b", (8,), F32, 32)
    write(path, (g.header(2, 0) + first + g.info("a", (16,), F32, 0)).ljust(256, b"\0"))
    expect_error(path, 24, "tensor 'b' (data offset 32) overlaps tensor 'a' (data offset 0, 64 bytes)")
    # c starts past b's end but inside a, which ends last: still an overlap
    infos = g.info("a", (64,), F32, 0) + g.info("b", (8,), F32, 32) + g.info("c", (8,), F32, 128)
    write(path, (g.header(3, 0) + infos).ljust(512, b"\0"))
    expect_error(path, 24 + len(g.info("a", (64,), F32, 0)),
                 "tensor 'b' (data offset 32) overlaps tensor 'a' (data offset 0, 256 bytes)")


def test_a_tensor_of_zero_bytes_overlaps_nothing(tmp_path):
    """gguf_init_from_file_impl lays a tensor of zero elements at the offset of the next one (padded size 0)."""
    g = Gguf()
    for infos in (g.info("z", (0,), F32, 0) + g.info("a", (8,), F32, 0),
                  g.info("a", (8,), F32, 0) + g.info("z", (0,), F32, 0)):
        path = write(tmp_path / "m.gguf", (g.header(2, 0) + infos).ljust(128, b"\0"))
        assert sorted((t.name, t.offset, t.nbytes) for t in read_gguf(path).tensors) == [("a", 0, 32), ("z", 0, 0)]


def test_a_tensor_of_unknown_size_counts_no_bytes_for_the_checks(tmp_path):
    g = Gguf()
    infos = g.info("u", (8,), 99, 32) + g.info("a", (8,), F32, 32)
    path = write(tmp_path / "m.gguf", (g.header(2, 0) + infos).ljust(128 + 32, b"\0"))
    assert [(t.name, t.nbytes) for t in read_gguf(path).tensors] == [("u", None), ("a", 32)]


def test_the_tensor_that_ends_last_is_the_one_an_overlap_is_checked_against(tmp_path):
    """At one offset: a tensor of unknown size (0 bytes for the checks), one I8 element (1 byte, ggml type 24),
    one F32 element (4 bytes): the F32 one overlaps the I8 one, which ends last among those before it."""
    g = Gguf()
    infos = [g.info("u", (8,), 99, 0), g.info("t", (1,), 24, 0), g.info("a", (1,), F32, 0)]
    path = write(tmp_path / "m.gguf", (g.header(3, 0) + b"".join(infos)).ljust(160, b"\0"))
    expect_error(path, 24 + len(infos[0]) + len(infos[1]),
                 "tensor 'a' (data offset 0) overlaps tensor 't' (data offset 0, 1 bytes)")


# --------------------------------------------------------------------------- what is not a regular file

def test_what_cannot_be_opened_is_named(tmp_path, monkeypatch):
    missing = tmp_path / "missing.gguf"
    expect_error(missing, 0, "cannot open: %s" % os.strerror(errno.ENOENT))
    expect_error("bad\0name.gguf", 0, "cannot open: embedded null byte")
    expect_error(tmp_path, 0, "cannot open: not a regular file (a directory)")
    # a FIFO: test_a_fifo_without_a_writer_does_not_block (in a thread, as a wrong open would block)
    monkeypatch.chdir(tmp_path)  # a short relative name: a socket's path is limited to about 100 bytes
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind("s.gguf")
        # open(2) refuses a socket itself (ENXIO); fstat would name it
        expect_error("s.gguf", 0, "cannot open: %s" % os.strerror(errno.ENXIO))
        assert _gguf._file_kind(os.stat("s.gguf").st_mode) == "a socket"
    if os.path.exists("/dev/null"):
        expect_error("/dev/null", 0, "cannot open: not a regular file (a character device)")


def test_an_io_error_is_a_gguf_error_at_the_byte_reached(tmp_path, monkeypatch):
    """A disk's I/O error (EIO, which no test machine's disk gives on demand: injected into fstat and pread) is
    a GGUFError with the exception's type and text, at byte 0 before the reading starts, else where it was."""
    path, _offset, _offsets = model_file(tmp_path / "m.gguf", [("general.architecture", STRING, Gguf().s("llama"))],
                                         [("a", (8,))])
    eio = OSError(errno.EIO, os.strerror(errno.EIO))
    reason = "OSError: [Errno %d] %s" % (errno.EIO, os.strerror(errno.EIO))

    def failing(*_args):
        raise eio

    with monkeypatch.context() as patched:
        patched.setattr(os, "fstat", failing)
        expect_error(path, 0, reason)
    reads = []

    def second_read_fails(fd, n, offset):
        reads.append(offset)
        if len(reads) > 1:
            raise eio
        return os.pread(fd, n, offset)

    monkeypatch.setattr(_gguf, "CHUNK", 16)
    monkeypatch.setattr(_gguf, "_pread", second_read_fails)
    expect_error(path, 16, reason)
    assert reads == [0, 16]


def test_file_kinds_by_mode():
    assert _gguf._file_kind(stat.S_IFBLK | 0o660) == "a block device"
    assert _gguf._file_kind(stat.S_IFCHR | 0o666) == "a character device"
    assert _gguf._file_kind(stat.S_IFSOCK | 0o755) == "a socket"
    assert _gguf._file_kind(stat.S_IFIFO | 0o600) == "a FIFO"
    assert _gguf._file_kind(stat.S_IFDIR | 0o755) == "a directory"
    assert _gguf._file_kind(stat.S_IFREG | 0o644) == "mode 100644"


def test_a_fifo_without_a_writer_does_not_block(tmp_path):
    fifo = str(tmp_path / "pipe.gguf")
    os.mkfifo(fifo)
    errors = []
    thread = threading.Thread(target=lambda: errors.append(pytest.raises(GGUFError, read_gguf, fifo).value.reason),
                              daemon=True)  # a reader that stays blocked must not hold the test process
    thread.start()
    thread.join(5)
    blocked = thread.is_alive()
    if blocked:  # let the reader go
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(5)
    assert not blocked
    assert errors == ["cannot open: not a regular file (a FIFO)"]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_no_descriptor_is_left_open(tmp_path):
    path, _d, _o = model_file(tmp_path / "m.gguf", [], [("t", (8,))])
    before = len(os.listdir("/proc/self/fd"))
    read_gguf(path)
    os.truncate(path, 10)
    pytest.raises(GGUFError, read_gguf, path)
    pytest.raises(GGUFError, read_gguf, tmp_path)
    assert len(os.listdir("/proc/self/fd")) == before


# --------------------------------------------------------------------------- the buffered reader

def test_pread_reads_at_an_offset_and_leaves_the_position(tmp_path):
    path = write(tmp_path / "f", bytes(range(32)))
    fd = os.open(path, os.O_RDONLY)
    try:
        assert _gguf._pread(fd, 4, 10) == bytes([10, 11, 12, 13])
        assert os.lseek(fd, 0, os.SEEK_CUR) == 0
    finally:
        os.close(fd)


def test_without_pread_the_reader_seeks_then_reads(tmp_path, monkeypatch):
    """Where ``os.pread`` is missing (not POSIX), ``lseek`` + ``read`` give the same bytes and the same header."""
    path, _offset, _offsets = model_file(tmp_path / "m.gguf", [("general.architecture", STRING, Gguf().s("llama"))],
                                         [("a", (8,)), ("b", (16,))])
    with_pread = read_gguf(path)
    monkeypatch.delattr(os, "pread")
    assert read_gguf(path) == with_pread
    data = write(tmp_path / "f", bytes(range(32)))
    fd = os.open(data, os.O_RDONLY)
    try:
        assert _gguf._pread(fd, 4, 10) == bytes([10, 11, 12, 13])
        assert _gguf._pread(fd, 3, 0) == bytes([0, 1, 2])
    finally:
        os.close(fd)


def test_reader_end_of_file_and_short_reads(tmp_path):
    path = write(tmp_path / "f", b"\1\0\0\0" + b"\0" * 7)
    with opened(path) as rd:
        assert (rd.u32(), rd.tell(), rd.left()) == (1, 4, 7)
        with pytest.raises(GGUFError) as raised:
            rd.u64()
        assert (raised.value.offset, raised.value.reason) == (4, "unexpected end of file: 8 bytes needed, 7 left")
        rd.seek(15)
        with pytest.raises(GGUFError) as raised:
            rd.take(1)
        assert (raised.value.offset, raised.value.reason) == (15, "unexpected end of file: 1 bytes needed, 0 left")
    with opened(path) as rd:
        assert rd.take(11) == b"\1" + b"\0" * 10  # exactly to the end
    with opened(path, size=100) as rd:  # the file is shorter than its size said (it changed while reading)
        rd.seek(8)
        with pytest.raises(GGUFError) as raised:
            rd.u64()
        assert (raised.value.path, raised.value.offset, raised.value.reason) == (
            path, 8, "short read: 8 bytes needed, 3 read (file changed while reading?)")


def test_reader_long_string_short_read(tmp_path):
    n = _gguf.CHUNK + 10
    path = write(tmp_path / "f", struct.pack("<Q", n) + b"x" * 100)
    with opened(path, size=8 + n) as rd:
        with pytest.raises(GGUFError) as raised:
            rd.raw_string("key 'k'")
        assert (raised.value.offset, raised.value.reason) == (
            8, "short read: %d bytes needed, 100 read (file changed while reading?)" % n)


def test_reader_seek_inside_the_buffer_keeps_it(tmp_path):
    path = write(tmp_path / "f", bytes(range(64)))
    with opened(path) as rd:
        assert rd.take(2) == b"\0\1"
        buf = rd.buf
        for offset in (0, 10, 64):
            rd.seek(offset)
            assert (rd.buf is buf, rd.base, rd.tell()) == (True, 0, offset)
        rd.take(0)
        assert rd.left() == 0
    path = write(tmp_path / "g", bytes(range(64)) * (_gguf.CHUNK // 32))
    with opened(path) as rd:
        rd.u32()
        rd.seek(_gguf.CHUNK + 5)
        assert (rd.buf, rd.base, rd.pos, rd.tell()) == (b"", _gguf.CHUNK + 5, 0, _gguf.CHUNK + 5)
        assert rd.take(3) == bytes([5, 6, 7])


def test_reader_unknown_value_type_is_reported_at_its_type(tmp_path):
    path = write(tmp_path / "f", struct.pack("<I", 13) + b"\0" * 8)
    with opened(path) as rd:
        rd.u32()
        with pytest.raises(GGUFError) as raised:
            rd.value(13, 0, "key 'k'")
        assert (raised.value.offset, raised.value.reason) == (0, "key 'k': unknown value type 13")


def test_next_data_skips_holes_and_stops_at_the_end(tmp_path):
    path = tmp_path / "sparse"
    with open(path, "wb") as f:
        f.write(b"x" * 10)
        f.seek(MIB)
        f.write(b"y")
    os.truncate(path, 3 * MIB)
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            hole_reported = os.lseek(fd, 5000, os.SEEK_DATA) == MIB
            os.lseek(fd, 2 * MIB, os.SEEK_DATA)
            end_reported = False
        except OSError as exc:
            end_reported = exc.errno == errno.ENXIO
    finally:
        os.close(fd)
    if not (hole_reported and end_reported):
        pytest.skip("this file system does not report holes")
    with opened(path) as rd:
        assert rd._next_data(5) == 5
        assert rd._next_data(5000) == MIB
        assert rd._next_data(2 * MIB) == 3 * MIB  # nothing but a hole to the end
        assert rd.tell() == 0


def test_next_data_on_a_descriptor_without_seek_data_is_the_offset(tmp_path):
    fifo = str(tmp_path / "pipe")
    os.mkfifo(fifo)
    with opened(fifo, size=0, flags=os.O_NONBLOCK) as rd:
        assert rd._next_data(5) == 5


def test_zero_run_counts_zeros_up_to_the_limit_without_moving(tmp_path):
    path = write(tmp_path / "f", b"\1" + b"\0" * 10 + b"\2" + b"\0" * 5)
    with opened(path) as rd:
        rd.take(1)
        assert [rd.zero_run(n) for n in (0, 3, 10, 11, 100)] == [0, 3, 10, 10, 10]
        assert rd.tell() == 1
        rd.seek(11)
        assert rd.zero_run(100) == 0
        rd.seek(12)
        assert rd.zero_run(100) == 5  # up to the end of the file
        assert rd.zero_run(5) == 5 and rd.zero_run(4) == 4


def test_zero_run_across_reads_and_holes(tmp_path):
    n = _gguf.CHUNK + 100
    path = write(tmp_path / "f", b"\1" + b"\0" * n + b"\2")  # zeros stored as data, longer than one read
    with opened(path) as rd:
        rd.take(1)
        assert rd.zero_run(10 * n) == n
        assert rd.zero_run(n - 1) == n - 1
    sparse = tmp_path / "sparse"
    with open(sparse, "wb") as f:
        f.write(b"\1")
        f.seek(3 * MIB)
        f.write(b"\0\0\3")
    with opened(sparse) as rd:
        rd.take(1)
        assert rd.zero_run(10 * MIB) == 3 * MIB + 1
        assert rd.zero_run(2 * MIB) == 2 * MIB
    os.truncate(sparse, 5 * MIB)
    with opened(sparse) as rd:
        rd.seek(3 * MIB + 3)
        assert rd.zero_run(10 * MIB) == 2 * MIB - 3


def test_pad_rounds_up_to_the_alignment():
    """GGML_PAD(x, n) = ((x + n - 1) / n) * n."""
    assert [_gguf._pad(x, 32) for x in (0, 1, 31, 32, 33, 64)] == [0, 32, 32, 32, 64, 64]
    assert [_gguf._pad(x, 1) for x in (0, 7)] == [0, 7]


# --------------------------------------------------------------------------- split models

def shard(path, no, count, tensors, *, total=None, endian="little", arch="llama", keys=None):
    """One shard as gguf-split writes it: split.no and split.count (uint16), split.tensors.count (int32, first
    shard only), the model's keys in the first shard only."""
    g = Gguf(endian)
    kvs = [] if keys is None else list(keys)
    if keys is None:
        if no == 0 and arch is not None:
            kvs.append(("general.architecture", STRING, g.s(arch)))
        kvs += [("split.no", U16, g.pack("H", no)), ("split.count", U16, g.pack("H", count))]
        if no == 0:
            kvs.append(("split.tensors.count", I32, g.pack("i", total)))
    return model_file(path, kvs, [(name, (8,)) for name in tensors], endian=endian)[0]


def split_model(tmp_path, layout, endian="little", width=5):
    count = len(layout)
    total = sum(len(t) for t in layout)
    return [shard(tmp_path / ("m-%0*d-of-%0*d.gguf" % (width, i + 1, width, count)), i, count, tensors,
                  total=total, endian=endian) for i, tensors in enumerate(layout)]


def test_a_split_model_reads_every_shard_in_order(tmp_path, endian):
    files = split_model(tmp_path, [["a", "b"], ["c"], ["d"]], endian)
    for f in files:
        assert find_split_files(f) == files
        assert find_split_files(Path(f)) == files
    model = read_model(files[2])
    assert model.files == files
    assert [s.shard for s in model.shards] == [0, 1, 2]
    assert [(t.name, t.shard, t.file) for t in model.tensors] == [
        ("a", 0, files[0]), ("b", 0, files[0]), ("c", 1, files[1]), ("d", 2, files[2])]
    assert model.metadata == model.shards[0].metadata
    assert (model.architecture, model.warnings) == ("llama", [])
    assert model.file_bytes == sum(os.path.getsize(f) for f in files)


def test_shard_numbers_keep_their_width(tmp_path):
    files = split_model(tmp_path, [["a"], ["b"]], width=6)
    assert [os.path.basename(f) for f in files] == ["m-000001-of-000002.gguf", "m-000002-of-000002.gguf"]
    assert find_split_files(files[1]) == files


@pytest.mark.parametrize("name", ["m-0001-of-0002.gguf", "m-00001-of-00002.gguf.part", "-00001-of-00002.gguf",
                                  "m-00001-of-00002.GGUF", "m.gguf", "m-00001-00002.gguf"])
def test_names_that_are_not_shard_names(tmp_path, name):
    assert find_split_files(tmp_path / name) == [str(tmp_path / name)]


@pytest.mark.parametrize("no,count", [(0, 3), (4, 3), (1, 0)])
def test_shard_number_outside_1_to_count(tmp_path, no, count):
    path = str(tmp_path / ("m-%05d-of-%05d.gguf" % (no, count)))
    expect_error(path, 0, "the file name says shard %d of %d" % (no, count), reader=find_split_files)


def test_the_last_shard_number_is_the_count(tmp_path):
    files = split_model(tmp_path, [["a"], ["b"], ["c"]])
    assert find_split_files(files[2]) == files


def test_a_missing_shard_is_named(tmp_path):
    files = split_model(tmp_path, [["a"], ["b"], ["c"]])
    os.remove(files[2])
    os.mkdir(files[2])  # a directory is not a shard
    expect_error(files[0], 0, "shard 3 of 3 is missing: %s" % files[2], reader=find_split_files)


def test_split_keys_must_match_the_file_name(tmp_path):
    g = Gguf()
    base = tmp_path / "m-00001-of-00002.gguf"
    second = shard(tmp_path / "m-00002-of-00002.gguf", 1, 2, ["b"])
    first = shard(base, 0, 2, ["a"], keys=[("split.no", U16, g.pack("H", 0))])
    expect_error(first, 0, "split.count is missing; the file name says shard 1 of 2", reader=read_model)
    split_count = ("split.count", STRING, g.s("2"))
    first = shard(base, 0, 2, ["a"], keys=[split_count])
    expect_error(first, 24, "split.count must be an integer, not string", reader=read_model)
    first = shard(base, 0, 2, ["a"], keys=[("split.count", BOOL, b"\1")])
    expect_error(first, 24, "split.count must be an integer, not bool", reader=read_model)
    first = shard(base, 0, 2, ["a"], keys=[("split.count", U32, g.pack("I", 3))])
    expect_error(first, 24, "split.count is 3 but the file name says shard 1 of 2", reader=read_model)
    count_kv = g.kv("split.count", U8, b"\2")
    first = shard(base, 0, 2, ["a"], keys=[("split.count", U8, b"\2"), ("split.no", I64, g.pack("q", 1))])
    expect_error(first, 24 + len(count_kv), "split.no is 1 but the file name says shard 1 of 2 (split.no is 0-based)",
                 reader=read_model)
    first = shard(base, 0, 2, ["a"], keys=[("split.count", U8, b"\2"), ("split.no", I64, g.pack("q", 0))])
    model = read_model(first)
    assert (model.files, model.warnings) == ([first, second], ["%s: no string general.architecture" % first])


@pytest.mark.parametrize("vtype,code", [(U8, "B"), (I8, "b"), (U16, "H"), (I16, "h"), (U32, "I"), (I32, "i"),
                                        (U64, "Q"), (I64, "q")])
def test_split_keys_may_be_of_any_integer_type(tmp_path, vtype, code):
    g = Gguf()
    first = shard(tmp_path / "m-00001-of-00002.gguf", 0, 2, ["a"],
                  keys=[("split.count", vtype, g.pack(code, 2)), ("split.no", vtype, g.pack(code, 0))])
    second = shard(tmp_path / "m-00002-of-00002.gguf", 1, 2, ["b"],
                   keys=[("split.count", vtype, g.pack(code, 2)), ("split.no", vtype, g.pack(code, 1))])
    assert [t.name for t in read_model(first).tensors] == ["a", "b"]
    assert read_model(second).files == [first, second]


@pytest.mark.parametrize("vtype,payload,name", [(F32V, struct.pack("<f", 2.0), "float32"),
                                                (F64, struct.pack("<d", 2.0), "float64"),
                                                (ARRAY, struct.pack("<IQB", U8, 1, 2), "array")])
def test_split_keys_that_are_not_integers_are_refused(tmp_path, vtype, payload, name):
    path = shard(tmp_path / "m-00001-of-00001.gguf", 0, 1, ["a"], keys=[("split.count", vtype, payload)])
    expect_error(path, 24, "split.count must be an integer, not %s" % name, reader=read_model)


def test_a_single_shard_name_checks_split_keys_only_when_present(tmp_path):
    g = Gguf()
    path = shard(tmp_path / "m-00001-of-00001.gguf", 0, 1, ["a"], keys=[])
    assert [t.name for t in read_model(path).tensors] == ["a"]
    shard(path, 0, 1, ["a"], keys=[("split.count", U16, g.pack("H", 1)), ("split.no", U16, g.pack("H", 0))])
    assert read_model(path).metadata == {"split.count": 1, "split.no": 0}
    no_kv = ("split.no", U16, g.pack("H", 1))
    shard(path, 0, 1, ["a"], keys=[("split.count", U16, g.pack("H", 1)), no_kv])
    expect_error(path, 24 + len(g.kv("split.count", U16, g.pack("H", 1))),
                 "split.no is 1 but the file name says shard 1 of 1 (split.no is 0-based)", reader=read_model)


@pytest.mark.parametrize("claimed,ok", [(None, True), (0, True), (1, True), (2, False)])
def test_a_plain_name_with_split_count(tmp_path, claimed, ok):
    g = Gguf()
    keys = [("general.architecture", STRING, g.s("llama"))]
    if claimed is not None:
        keys.append(("split.count", U16, g.pack("H", claimed)))
    path = shard(tmp_path / "m.gguf", 0, 1, ["a"], keys=keys)
    if ok:
        assert read_model(path).files == [path]
    else:
        expect_error(path, 24 + len(g.kv(*keys[0])), "split.count is 2 but the file name has no -NNNNN-of-MMMMM "
                     "part, so the other shards cannot be found", reader=read_model)


def test_a_tensor_in_two_shards_is_refused(tmp_path):
    files = split_model(tmp_path, [["a", "b"], ["b"]])
    second = read_gguf(files[1], 1)
    expect_error(files[0], second.tensors[0].info_offset, "tensor 'b' is also in %s" % files[0], reader=read_model,
                 in_file=files[1])


def test_split_tensors_count_is_checked_for_several_shards(tmp_path):
    g = Gguf()
    files = split_model(tmp_path, [["a", "b"], ["c"]])
    keys = [("split.no", U16, g.pack("H", 0)), ("split.count", U16, g.pack("H", 2)),
            ("split.tensors.count", I32, g.pack("i", 4))]
    shard(files[0], 0, 2, ["a", "b"], keys=keys)
    expect_error(files[0], 24 + len(g.kv(*keys[0])) + len(g.kv(*keys[1])),
                 "split.tensors.count is 4 but the 2 shards hold 3 tensors", reader=read_model)
    # one file: the count is not checked
    single = shard(tmp_path / "one.gguf", 0, 1, ["a"], keys=[("split.tensors.count", I32, g.pack("i", 4))])
    assert [t.name for t in read_model(single).tensors] == ["a"]


def test_architecture_must_be_a_string(tmp_path):
    g = Gguf()
    path = shard(tmp_path / "m.gguf", 0, 1, ["a"], keys=[("general.architecture", U32, g.pack("I", 5))])
    model = read_model(path)
    assert (model.architecture, model.warnings) == (None, ["%s: no string general.architecture" % path])
    shard(path, 0, 1, ["a"], keys=[])
    assert read_model(path).warnings == ["%s: no string general.architecture" % path]


def test_model_warnings_gather_every_shard_then_the_architecture(tmp_path):
    g = Gguf()
    first = model_file(tmp_path / "m-00001-of-00002.gguf",
                       [("split.no", U16, g.pack("H", 0)), ("split.count", U16, g.pack("H", 2)),
                        ("s", STRING, g.s(b"\xff"))], [("a", (8,))])[0]
    second = model_file(tmp_path / "m-00002-of-00002.gguf",
                        [("split.no", U16, g.pack("H", 1)), ("split.count", U16, g.pack("H", 2)),
                         ("t", STRING, g.s(b"\xfe"))], [("b", (8,))])[0]
    assert read_model(second).warnings == [
        "key 's': a string value is not valid UTF-8 (decoded with replacement characters)",
        "key 't': a string value is not valid UTF-8 (decoded with replacement characters)",
        "%s: no string general.architecture" % first,
    ]


def test_an_empty_key_is_refused(tmp_path, endian):
    """ggml/src/gguf.cpp gguf_init_from_file_impl: "key %d is empty"."""
    g = Gguf(endian)
    first = g.kv("k", U8, b"\x01")
    path = write(tmp_path / "m.gguf", g.header(0, 2) + first + g.kv("", U8, b"\x02"))
    expect_error(path, 24 + len(first), "key 1 is empty")


def test_a_tensor_name_of_64_bytes_is_refused_63_is_read(tmp_path):
    """ggml/src/gguf.cpp gguf_init_from_file_impl: name.length() >= GGML_MAX_NAME (64) is "too long"."""
    g = Gguf()
    ok = "t" * 63
    path = write(tmp_path / "m.gguf", (g.header(1, 0) + g.info(ok, (8,), F32, 0)).ljust(256, b"\0"))
    assert read_gguf(path).tensors[0].name == ok
    path = write(tmp_path / "m.gguf", (g.header(1, 0) + g.info("t" * 64, (8,), F32, 0)).ljust(256, b"\0"))
    expect_error(path, 24, "tensor info 0: the name %r is 64 bytes long, llama.cpp loads names of fewer than 64"
                 % ("t" * 64))
    name = "\u00e9" * 32  # 64 bytes in UTF-8: bytes count, not characters
    path = write(tmp_path / "m.gguf", (g.header(1, 0) + g.info(name, (8,), F32, 0)).ljust(256, b"\0"))
    expect_error(path, 24, "tensor info 0: the name %r is 64 bytes long, llama.cpp loads names of fewer than 64"
                 % name)
