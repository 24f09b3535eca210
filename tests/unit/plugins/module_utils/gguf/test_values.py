"""The GGUF value reader (plugins/module_utils/gguf/values.py): scalars, strings and (nested) arrays, which are
kept and which skipped, the bounds that come before any count, length or depth from the file is trusted, and the
buffered reading beneath them.

An array's count is checked against the rest of the file at the least size of one element (llama.cpp's
ggml/src/gguf.cpp ``gguf_reader`` reads ``n`` values of ``sizeof(T)`` bytes; a string is at least its u64 length,
an array its u32 type and u64 count), whatever the element type. The reader's own limits (``MAX_DEPTH``,
``KEEP_NUMBERS``, ``KEEP_LISTS``, ``MAX_STRING``, ``MAX_KEPT_BYTES``) are those of its module docstring. Value type
ids 0..12 are ggml/include/gguf.h ``enum gguf_type`` (gguf-py ``GGUFValueType``).
"""
from __future__ import annotations

import errno
import os

import gguf
import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf import values
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.error import GGUFError
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.header import read_gguf
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.values import SkippedArray
from tests.helpers.gguf_files import (
    ARRAY, BOOL, F32, F32V, F64, I8, I16, I32, I64, MIB, SCALARS, STRING, U8, U16, U32, U64, Gguf, expect_error,
    memory_below, model_file, opened, sparse, write)

G = Gguf()


# --------------------------------------------------------------------------- the result types


def test_skipped_array_names_its_item_type_and_has_its_count_as_length():
    assert values.VALUE_TYPE_NAMES == {int(v): v.name.lower() for v in gguf.GGUFValueType}
    assert [SkippedArray(t, 3).item_type_name for t in range(13)] == [v.name.lower() for v in gguf.GGUFValueType]
    assert SkippedArray(13, 3).item_type_name == "13"
    assert len(SkippedArray(8, 123456)) == 123456
    assert SkippedArray(8, 5) == SkippedArray(8, 5) != SkippedArray(9, 5)


# --------------------------------------------------------------------------- strings


def _tokens(count, elements):
    """One key, ``tokens``: an array of ``count`` strings, then ``elements``."""
    return G.header(0, 1) + G.kv("tokens", ARRAY, G.pack("IQ", STRING, count)) + elements


TOKENS = [G.s("tok%d" % i) for i in range(100)]
AT = len(_tokens(0, b""))  # where the elements of ``tokens`` start


@pytest.mark.parametrize("data, at, reason", [
    # keys and tensor names must be UTF-8 (values are decoded with a warning: the test below)
    (G.header(0, 2) + G.kv("ok", U8, b"\0") + G.kv(b"\xff", U8, b"\0"), 24 + 8 + 2 + 4 + 1,
     "key 1 is not valid UTF-8 (invalid start byte)"),
    (G.header(1, 0) + G.info(b"a\xff", (), F32, 0), 24, "tensor info 0: name is not valid UTF-8 (invalid start byte)"),
    # a string may take exactly the rest of the file: 13 bytes are left after the header, so the pair count passes;
    # a key takes them all, then its value type is missing; one byte more is refused
    (G.header(0, 1) + G.s("abcde"), 37, "unexpected end of file: 4 bytes needed, 0 left"),
    (G.header(0, 1) + G.pack("Q", 6) + b"abcde", 24,
     "key 0: string length 6 runs past the end of the file (5 bytes left)"),
    (G.header(0, 1) + G.kv("a", ARRAY, G.arr(13, 1, b"\0" * 16)), 37, "key 'a': unknown array element type 13"),
    (G.header(0, 1) + G.kv("a", ARRAY, G.arr(99, 1, b"\0" * 16)), 37, "key 'a': unknown array element type 99"),
    # a skipped string array that overruns the file names the element: element 7 of strings that are not empty
    # claims 2**40 bytes; one after a run of empty strings; 800 bytes, as many as 100 empty strings need, but the
    # first string holds 3 bytes
    (_tokens(100, b"".join(TOKENS[:7]) + G.pack("Q", 2 ** 40) + b"".join(TOKENS[8:])), AT + len(b"".join(TOKENS[:7])),
     "key 'tokens': element 7 of 100: string length %d runs past the end of the file (%d bytes left)"
     % (2 ** 40, len(b"".join(TOKENS[8:])))),
    (_tokens(71, b"\0" * (8 * 70) + G.pack("Q", 1000) + b"\0" * 20), AT + 8 * 70,
     "key 'tokens': element 70 of 71: string length 1000 runs past the end of the file (20 bytes left)"),
    (_tokens(100, G.s("abc") + b"\0" * (8 * 98 + 5)), AT + 11 + 8 * 98,
     "key 'tokens': element 99 of 100: no room for its length (5 bytes left in the file)"),
])
def test_values_refused(tmp_path, data, at, reason):
    expect_error(write(tmp_path / "m.gguf", data), at, reason)


def test_string_values_that_are_not_utf8_are_decoded_with_a_warning(tmp_path):
    path = write(tmp_path / "m.gguf", G.header(0, 2) + G.kv("s", STRING, G.s(b"x\xffy"))
                 + G.kv("a", ARRAY, G.arr(STRING, 2, G.s("ok") + G.s(b"\xff"))))
    gf = read_gguf(path)
    assert gf.metadata == {"s": "x\ufffdy", "a": ["ok", "\ufffd"]}
    assert gf.warnings == ["key '%s': a string value is not valid UTF-8 (decoded with replacement characters)" % k
                           for k in "sa"]


def test_one_string_is_bounded_by_max_string(tmp_path):
    """A string of MAX_STRING bytes is read (zeros in a sparse file); one byte more is refused."""
    n = values.MAX_STRING
    head = G.header(0, 1) + G.s("k") + G.pack("IQ", STRING, n)
    path = sparse(tmp_path / "m.gguf", [(0, head)], len(head) + n + 1)
    assert read_gguf(path).metadata == {"k": "\0" * n}
    sparse(path, [(0, head[:-8] + G.pack("Q", n + 1))], len(head) + n + 1)
    expect_error(path, len(head) - 8, "key 'k': string of %d bytes is longer than the %d this reader accepts"
                 % (n + 1, n))


def test_kept_strings_are_bounded_by_max_kept_bytes_keys_included(tmp_path):
    """Keys and values count: four 1-byte keys and values of 16 MiB - 4 bytes in all (zeros in a sparse file) are
    kept; one byte more (a fifth key) is refused at that key, and the memory stays near the cap, not a multiple."""
    n = values.MAX_STRING
    sizes = [n, n, n, n - 4]
    assert sum(sizes) + 4 == values.MAX_KEPT_BYTES
    path = tmp_path / "m.gguf"

    def build(n_kv, tail):
        with open(path, "wb") as f:
            f.write(G.header(0, n_kv))
            for key, size in zip("abcd", sizes):
                f.write(G.s(key) + G.pack("IQ", STRING, size))
                f.seek(size, os.SEEK_CUR)
            f.write(tail)
            f.truncate()
        return str(path)

    gf = read_gguf(build(4, b""))
    assert {k: len(v) for k, v in gf.metadata.items()} == dict(zip("abcd", sizes))
    over = build(5, G.kv("e", U8, b"\0"))
    with memory_below(values.MAX_KEPT_BYTES + 3 * values.MAX_STRING):
        expect_error(over, os.path.getsize(over) - 14, "key 4: more than %d bytes of metadata strings"
                     % values.MAX_KEPT_BYTES)


# --------------------------------------------------------------------------- arrays


@pytest.mark.parametrize("itype, keep, item, encode", [
    (U8, values.KEEP_NUMBERS, lambda i: i % 100, lambda g, v: g.pack("B", v)),
    (U16, values.KEEP_NUMBERS, lambda i: i % 100, lambda g, v: g.pack("H", v)),
    (F32V, values.KEEP_NUMBERS, lambda i: i % 100, lambda g, v: g.pack("f", v)),
    (U64, values.KEEP_NUMBERS, lambda i: i % 100, lambda g, v: g.pack("Q", v)),
    (STRING, values.KEEP_LISTS, lambda i: "w%d" % i, lambda g, v: g.s(v)),
    (ARRAY, values.KEEP_LISTS, lambda i: [i, i + 1], lambda g, v: g.arr(I16, 2, g.pack("2h", *v))),
])
def test_arrays_are_kept_up_to_their_limit(tmp_path, endian, itype, keep, item, encode):
    """KEEP_NUMBERS numbers, or KEEP_LISTS strings or arrays, are returned as a list; one element more is skipped (and
    the key after it reads right)."""
    g = Gguf(endian)
    items = [item(i) for i in range(keep + 1)]
    kvs = [g.kv(key, ARRAY, g.arr(itype, n, b"".join(encode(g, v) for v in items[:n])))
           for key, n in (("kept", keep), ("skipped", keep + 1))]
    gf = read_gguf(write(tmp_path / "m.gguf", g.header(0, 3) + b"".join(kvs) + g.kv("after", U32, g.pack("I", 7))))
    assert gf.metadata == {"kept": items[:keep], "skipped": SkippedArray(itype, keep + 1), "after": 7}


# the least bytes one element takes: sizeof(T) for a number, the length of a string, type + count of an array
ELEMENT_BYTES = [(U8, 1, "uint8"), (I8, 1, "int8"), (U16, 2, "uint16"), (I16, 2, "int16"), (U32, 4, "uint32"),
                 (I32, 4, "int32"), (F32V, 4, "float32"), (BOOL, 1, "bool"), (STRING, 8, "string"),
                 (ARRAY, 12, "array"), (U64, 8, "uint64"), (I64, 8, "int64"), (F64, 8, "float64")]


@pytest.mark.parametrize("itype,size,name", ELEMENT_BYTES)
def test_an_array_may_need_exactly_the_rest_of_the_file(tmp_path, endian, itype, size, name):
    """The count is checked at the least size of an element; a count that fits exactly passes that check. An
    empty array (which GGUFWriter does not write) is an empty list."""
    g = Gguf(endian)
    path = write(tmp_path / "m.gguf", g.header(0, 1) + g.kv("a", ARRAY, g.pack("IQ", itype, 0)))
    assert read_gguf(path).metadata == {"a": []}
    head = g.header(0, 1) + g.kv("a", ARRAY, g.pack("IQ", itype, 3))
    write(path, head + b"\0" * (3 * size))
    assert read_gguf(path).metadata == {"a": [{STRING: "", ARRAY: [], BOOL: False}.get(itype, 0)] * 3}
    write(path, head + b"\0" * (3 * size - 1))
    expect_error(path, 24 + 9 + 4, "key 'a': array of 3 %s elements needs at least %d bytes, only %d left in the file"
                 % (name, 3 * size, 3 * size - 1))


@pytest.mark.parametrize("itype,size,name", [(STRING, 8, "string"), (U8, 1, "uint8")])
@pytest.mark.parametrize("count", [2 ** 60, 2 ** 64 - 1, 10 ** 6])
def test_huge_array_counts_fail_at_once(tmp_path, endian, count, itype, size, name):
    g = Gguf(endian)
    path = write(tmp_path / "m.gguf", g.header(0, 1) + g.kv("a", ARRAY, g.pack("IQ", itype, count)) + b"\0" * 100)
    with memory_below(4 << 20):
        expect_error(path, 37, "key 'a': array of %d %s elements needs at least %d bytes, only 100 left in the file"
                     % (count, name, count * size))


def _nested(g, levels, leaf):
    """``levels`` arrays one inside the other, the innermost holding ``leaf`` (one uint8)."""
    value = g.arr(U8, 1, leaf)
    for _i in range(levels - 1):
        value = g.arr(ARRAY, 1, value)
    return value


@pytest.mark.parametrize("count", [1, values.KEEP_LISTS + 1])
def test_arrays_nest_up_to_max_depth_kept_or_skipped(tmp_path, endian, count):
    """The value's own array is level 1; MAX_DEPTH levels read, one more is refused where its header is, in a
    kept array and in one skipped for its length alike."""
    g = Gguf(endian)
    depth = values.MAX_DEPTH
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
    count = values.KEEP_LISTS + 1
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
    count = values.KEEP_LISTS + 3
    # a string of length 256 starts with a zero byte in little-endian, 7 zero bytes in big-endian
    strings = g.s("") * (count - 2) + g.s("x" * 256) + g.s("")
    # a uint8 array of one zero: its type (0) is 4 zero bytes, its count starts with zeros in big-endian
    arrays = g.arr(U8, 0, b"") * (count - 2) + g.arr(U8, 1, b"\0") + g.arr(U8, 0, b"")
    body = g.kv("s", ARRAY, g.arr(STRING, count, strings)) + g.kv("a", ARRAY, g.arr(ARRAY, count, arrays))
    gf = read_gguf(write(tmp_path / "m.gguf", g.header(0, 3) + body + g.kv("after", U8, b"\x09")))
    assert gf.metadata == {"s": SkippedArray(STRING, count), "a": SkippedArray(ARRAY, count), "after": 9}


def _read_bytes():
    """Bytes this process has read through read(2)/pread(2) so far (Linux /proc/self/io ``rchar``)."""
    with open("/proc/self/io") as f:
        return int([line for line in f if line.startswith("rchar:")][0].split()[1])


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux /proc/self/io")
@pytest.mark.parametrize("itype, unit", [(STRING, 8), (ARRAY, 12)])
def test_a_sparse_64_gib_header_reads_only_the_bytes_it_holds(tmp_path, itype, unit):
    """A header whose array spans a 64 GiB hole of a sparse file (empty strings, or empty uint8 arrays: zeros),
    followed by one more key: it reads back right, and only a few MiB are read, not 64 GiB."""
    hole = 64 << 30
    count = hole // unit
    head = G.header(0, 3) + G.kv("general.architecture", STRING, G.s("x"))
    head += G.kv("big", ARRAY, G.pack("IQ", itype, count + 1))
    # the first element is written (not empty), then `count` empty ones lie in the hole, then the last key
    first = G.s("tok") if itype == STRING else G.arr(I32, 2, G.pack("2i", 1, 2))
    after = G.kv("after", U32, G.pack("I", 7))
    path = sparse(tmp_path / "sparse.gguf", [(0, head + first), (len(head + first) + count * unit, after)])
    assert os.path.getsize(path) > hole and os.stat(path).st_blocks * 512 < 1 << 20  # really sparse
    before = _read_bytes()
    gf = read_gguf(path)
    read = _read_bytes() - before
    assert gf.metadata["big"] == SkippedArray(itype, count + 1)
    assert gf.metadata["after"] == 7 and gf.data_offset == -(-(os.path.getsize(path)) // 32) * 32
    assert read < 16 << 20, read


# --------------------------------------------------------------------------- the read size


READ_SIZES = [1, 2, 3, 5, 8, 9, 13, 31, 64, 1000]


def _straddling_file(path, endian, cut=None):
    """Every value type, a skipped string array (empty strings among strings of 1 to 10 bytes), a skipped array of
    arrays, kept arrays and two tensor infos: with a small read size, every kind of field straddles a read.
    ``cut``: the file ends that many bytes into the last string of the skipped array (10 bytes long), after the
    scalars. Returns (path, facts)."""
    g = Gguf(endian)
    count = values.KEEP_LISTS + 5
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
    end of a read is read whole from the next one, at any read size; and the last string of a skipped array that
    lacks its last byte (with it the file would end exactly there) is named."""
    path, facts = _straddling_file(tmp_path / "m.gguf", endian)
    whole = read_gguf(path)
    assert whole.metadata["k%d" % U64] == 2 ** 64 - 2 and whole.metadata["k%d" % F64] == 2.25
    assert whole.metadata["tok"] == SkippedArray(STRING, facts["count"])
    assert whole.metadata["nested"] == SkippedArray(ARRAY, facts["count"])
    assert (whole.metadata["nums"], whole.metadata["names"]) == ([7, 8, 9], ["up", ""])
    assert [(t.name, t.offset) for t in whole.tensors] == [("a", 0), ("b", facts["offsets"][1])]
    assert whole.data_offset == facts["data_offset"]
    monkeypatch.setattr(values, "CHUNK", chunk)
    assert read_gguf(path) == whole
    count = facts["count"]
    path, facts = _straddling_file(tmp_path / "cut.gguf", endian, cut=9)
    expect_error(path, facts["at"], "key 'tok': element %d of %d: string length 10 runs past the end of the file "
                                    "(9 bytes left)" % (count - 1, count))
    path, _facts = _straddling_file(tmp_path / "exact.gguf", endian, cut=10)
    assert read_gguf(path).metadata["tok"] == SkippedArray(STRING, count)


# --------------------------------------------------------------------------- the buffered reader


def failure(call):
    """(path, offset, reason) of the GGUFError that ``call()`` raises."""
    with pytest.raises(GGUFError) as raised:
        call()
    return raised.value.path, raised.value.offset, raised.value.reason


def test_pread_and_without_it_seek_then_read(tmp_path, monkeypatch):
    """``pread`` reads at an offset and leaves the position; where ``os.pread`` is missing (not POSIX), ``lseek`` +
    ``read`` give the same bytes and the same header."""
    path, _offset, _offsets = model_file(tmp_path / "m.gguf", [("general.architecture", STRING, G.s("llama"))],
                                         [("a", (8,)), ("b", (16,))])
    with_pread = read_gguf(path)
    fd = os.open(write(tmp_path / "f", bytes(range(32))), os.O_RDONLY)
    try:
        assert values._pread(fd, 4, 10) == bytes([10, 11, 12, 13])
        assert os.lseek(fd, 0, os.SEEK_CUR) == 0
        monkeypatch.delattr(os, "pread")
        assert values._pread(fd, 4, 10) == bytes([10, 11, 12, 13])
        assert values._pread(fd, 3, 0) == bytes([0, 1, 2])
    finally:
        os.close(fd)
    assert read_gguf(path) == with_pread


def test_reader_end_of_file_and_short_reads(tmp_path):
    path = write(tmp_path / "f", b"\1\0\0\0" + b"\0" * 7)
    with opened(path) as rd:
        assert (rd.u32(), rd.tell(), rd.left()) == (1, 4, 7)
        assert failure(rd.u64) == (path, 4, "unexpected end of file: 8 bytes needed, 7 left")
        rd.seek(15)
        assert failure(lambda: rd.take(1)) == (path, 15, "unexpected end of file: 1 bytes needed, 0 left")
    with opened(path) as rd:
        assert rd.take(11) == b"\1" + b"\0" * 10  # exactly to the end
    with opened(path) as rd:  # an unknown value type (the header refuses it first), named where its u32 starts
        rd.u32()
        assert failure(lambda: rd.value(13, 0, "key 'k'")) == (path, 0, "key 'k': unknown value type 13")
    with opened(path, size=100) as rd:  # the file is shorter than its size said (it changed while reading)
        rd.seek(8)
        assert failure(rd.u64) == (path, 8, "short read: 8 bytes needed, 3 read (file changed while reading?)")
    n = values.CHUNK + 10  # a string longer than a read is read on its own
    path = write(tmp_path / "g", G.pack("Q", n) + b"x" * 100)
    with opened(path, size=8 + n) as rd:
        assert failure(lambda: rd.raw_string("key 'k'")) == (
            path, 8, "short read: %d bytes needed, 100 read (file changed while reading?)" % n)


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
    path = write(tmp_path / "g", bytes(range(64)) * (values.CHUNK // 32))
    with opened(path) as rd:
        rd.u32()
        rd.seek(values.CHUNK + 5)
        assert (rd.buf, rd.base, rd.pos, rd.tell()) == (b"", values.CHUNK + 5, 0, values.CHUNK + 5)
        assert rd.take(3) == bytes([5, 6, 7])


def test_next_data_skips_holes_and_stops_at_the_end(tmp_path):
    path = sparse(tmp_path / "sparse", [(0, b"x" * 10), (MIB, b"y")], 3 * MIB)
    with opened(path) as probe:  # whether this file system reports the hole and the end
        try:
            hole_reported = os.lseek(probe.fd, 5000, os.SEEK_DATA) == MIB
            os.lseek(probe.fd, 2 * MIB, os.SEEK_DATA)
            end_reported = False
        except OSError as exc:
            end_reported = exc.errno == errno.ENXIO
    fifo = str(tmp_path / "pipe")  # a descriptor without SEEK_DATA: the offset itself
    os.mkfifo(fifo)
    with opened(fifo, size=0, flags=os.O_NONBLOCK) as rd:
        assert rd._next_data(5) == 5
    if not (hole_reported and end_reported):
        pytest.skip("this file system does not report holes")
    with opened(path) as rd:
        assert rd._next_data(5) == 5
        assert rd._next_data(5000) == MIB
        assert rd._next_data(2 * MIB) == 3 * MIB  # nothing but a hole to the end
        assert rd.tell() == 0


def test_zero_run_counts_zeros_up_to_the_limit_without_moving_across_reads_and_holes(tmp_path):
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
    n = values.CHUNK + 100
    path = write(tmp_path / "g", b"\1" + b"\0" * n + b"\2")  # zeros stored as data, longer than one read
    with opened(path) as rd:
        rd.take(1)
        assert rd.zero_run(10 * n) == n
        assert rd.zero_run(n - 1) == n - 1
    holes = sparse(tmp_path / "sparse", [(0, b"\1"), (3 * MIB, b"\0\0\3")])
    with opened(holes) as rd:
        rd.take(1)
        assert rd.zero_run(10 * MIB) == 3 * MIB + 1
        assert rd.zero_run(2 * MIB) == 2 * MIB
    os.truncate(holes, 5 * MIB)
    with opened(holes) as rd:
        rd.seek(3 * MIB + 3)
        assert rd.zero_run(10 * MIB) == 2 * MIB - 3
