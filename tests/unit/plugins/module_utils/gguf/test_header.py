"""The header of one GGUF file (plugins/module_utils/gguf/header.py), on files assembled byte by byte and on
files written by gguf-py (cross-checked against gguf-py's ``GGUFReader``).

What a valid header is and what is refused follows llama.cpp's ggml/src/gguf.cpp ``gguf_init_from_file_impl``:

* the header is the magic ``GGUF``, a u32 version, an i64 tensor count and an i64 key/value count (24 bytes);
  a version whose low 16 bits are zero (``(ctx->version & 0x0000FFFF) == 0``; gguf-py's GGUFReader:
  ``temp_version[0] & 65535 == 0``) is of the other byte order, version 1 is refused, and so is one above 3;
* a key is refused when it repeats (``duplicate key``) or is empty (``key %d is empty``), a value type > 12 too;
* ``general.alignment`` must be a u32 (``must be of type uint32``) and a power of two (``alignment == 0 ||
  (alignment & (alignment - 1)) != 0`` is refused); the default is ``GGUF_DEFAULT_ALIGNMENT`` 32;
* a tensor info is a name (shorter than ``GGML_MAX_NAME`` 64 bytes), ``n_dims`` (refused above ``GGML_MAX_DIMS``
  4), ``n_dims`` i64 dimensions (a negative one is refused, a shape of more than INT64_MAX elements is refused, a
  zero-element shape is fine), a u32 ggml type and a u64 offset; ``ne[0]`` must be a multiple of the type's block
  size, and removed types (``blck_size == 0``) are refused;
* the data section starts at the end of the tensor infos padded to the alignment (``GGML_PAD``).
"""
from __future__ import annotations

import errno
import os
import socket
import stat
import threading
from pathlib import Path
from unittest import mock

import gguf
import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf import header, values
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.error import GGUFError
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.header import GGUFFile, TensorInfo, read_gguf
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.model import read_model
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.types import REMOVED_TYPE_NAMES
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.values import SkippedArray
from tests.helpers.gguf_files import (
    ALL_SCALARS, BIG_ARRAYS, F32, I32, Q8_0, SMALL_ARRAYS, SOME_TENSORS, STRING, U8, U16, U32, U64, VT, Gguf,
    cross_check, expect_error, field_offsets, memory_below, model_file, pad, patch, sparse, write, write_gguf)

G = Gguf()


@pytest.fixture
def small_file(tmp_path, endian):
    return write_gguf(tmp_path / "small.gguf", ALL_SCALARS + SMALL_ARRAYS[:3] + BIG_ARRAYS[:1], SOME_TENSORS,
                      endian=endian)[0]


# --------------------------------------------------------------------------- the result types


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


def test_every_value_type_reads_back(tmp_path, endian):
    full_file = write_gguf(tmp_path / "full.gguf", ALL_SCALARS + SMALL_ARRAYS + BIG_ARRAYS, SOME_TENSORS,
                           endian=endian)[0]
    gf = read_gguf(full_file)
    assert (gf.version, gf.byte_order, gf.path) == (3, endian, full_file)
    for key, value, vtype in ALL_SCALARS:  # a bool stays a bool (0.5 is exact in float32)
        assert (gf.metadata[key], type(gf.metadata[key]), gf.value_types[key]) == (value, type(value), vtype), key
    for kv in SMALL_ARRAYS:
        kept = SkippedArray(int(VT.INT32), len(kv[1])) if len(kv[1]) > values.KEEP_NUMBERS else kv[1]
        assert (gf.metadata[kv[0]], gf.value_types[kv[0]]) == (kept, VT.ARRAY), kv[0]
    for kv in BIG_ARRAYS:  # longer than the reader keeps: skipped, not built
        assert gf.metadata[kv[0]] == SkippedArray(int(kv[3]) if len(kv) > 3 else int(VT.ARRAY), len(kv[1]))
    assert gf.metadata["general.architecture"] == "testarch"
    cross_check(full_file, gf)


# --------------------------------------------------------------------------- the 24-byte header


# the shortest pair, a key length (8), a value type (4) and a one-byte value, without its value: 13 bytes
PAIR = G.s("k") + G.pack("I", U8)
# the shortest tensor info, a name length (8), n_dims (4), a type (4) and an offset (8), with a 1-byte name and
# its offset a byte short: 24 bytes
INFO = G.info("t", (), F32, 0)[:24]


@pytest.mark.parametrize("data, at, reason", [
    (G.header(0, 0)[:23], 0, "file of 23 bytes is too short for a GGUF header (24 bytes)"),
    (b"", 0, "file of 0 bytes is too short for a GGUF header (24 bytes)"),
    (b"GGML" + G.pack("IQQ", 3, 0, 0), 0, "bad magic b'GGML': not a GGUF file"),
    # a count is bounded at the least size of one entry: a count that fits passes, and the entry then lacks bytes
    (G.header(0, 1) + PAIR, 37, "unexpected end of file: 1 bytes needed, 0 left"),
    (G.header(0, 1) + PAIR[:12], 16, "1 key/value pairs claimed, but only 12 bytes left in the file"),
    (G.header(0, 2) + PAIR + b"\x07", 16, "2 key/value pairs claimed, but only 14 bytes left in the file"),
    (G.header(1, 0) + INFO, 41, "unexpected end of file: 8 bytes needed, 7 left"),
    (G.header(1, 0) + INFO[:23], 8, "1 tensors claimed, but only 23 bytes left in the file"),
    (G.header(3, 0) + INFO + b"\0" * 47, 8, "3 tensors claimed, but only 71 bytes left in the file"),
    # the pair count is checked before the tensor count
    (G.header(5, 5) + b"\0" * 10, 16, "5 key/value pairs claimed, but only 10 bytes left in the file"),
])
def test_headers_refused(tmp_path, data, at, reason):
    expect_error(write(tmp_path / "m.gguf", data), at, reason)


@pytest.mark.parametrize("version", [2, 3])
def test_24_bytes_is_the_shortest_header_of_either_version_and_byte_order(tmp_path, endian, version):
    path = write(tmp_path / "ok.gguf", Gguf(endian).header(0, 0, version))
    gf = read_gguf(path)
    assert (gf.version, gf.byte_order, gf.metadata, gf.tensors, gf.file_size, gf.alignment) == (
        version, endian, {}, [], 24, 32)
    assert gf.data_offset == gguf.GGUFReader(path).data_offset == 32


# 256, 0x0300 and 0xFF00: the low 8 bits zero but not the low 16, not the mark of the other byte order
@pytest.mark.parametrize("version,reason", [
    (1, "GGUF version 1 is obsolete and not supported (only versions 2 and 3)")] + [
    (v, "unsupported GGUF version %d (only versions 2 and 3)" % v) for v in (4, 0xFFFF, 0, 256, 0x0300, 0xFF00)])
def test_versions_refused(tmp_path, endian, version, reason):
    path = write(tmp_path / "m.gguf", Gguf(endian).header(0, 0, version))
    expect_error(path, 4, reason)


@pytest.mark.parametrize("offset, what", [(8, "tensors"), (16, "key/value pairs")])
def test_huge_counts_fail_at_once(small_file, endian, offset, what):
    patch(small_file, offset, "Q", 2 ** 60, endian)
    with memory_below(4 << 20):
        expect_error(small_file, offset, "%d %s claimed, but only %d bytes left in the file"
                     % (2 ** 60, what, os.path.getsize(small_file) - 24))


def test_every_truncation_fails_cleanly(small_file):
    data = Path(small_file).read_bytes()
    header_end = read_gguf(small_file).data_offset
    for length in list(range(0, 200)) + list(range(200, header_end, 97)) + [header_end - 1]:
        Path(small_file).write_bytes(data[:length])
        with pytest.raises(GGUFError) as raised:
            read_gguf(small_file)
        assert raised.value.path == small_file and 0 <= raised.value.offset <= length + 8


@pytest.mark.parametrize("key, vtype, code, value, at, reason", [
    ("k", U8, "B", 2, 0, "duplicate key 'k'"),
    ("", U8, "B", 2, 0, "key 1 is empty"),  # (gguf_init_from_file_impl: "key %d is empty")
    ("j", 13, "Q", 0, 9, "key 'j': unknown value type 13"),  # at the type, after the 9-byte key
] + [("general.alignment", U32, "I", a, 0, "general.alignment %d is not a power of two" % a)
     for a in (0, 3, 6, 48, 2 ** 31 + 1)] + [
    ("general.alignment", vtype, code, 32, 0, "general.alignment must be a uint32, not " + name)
    for vtype, code, name in ((I32, "i", "int32"), (U64, "Q", "uint64"), (U16, "H", "uint16"))])
def test_keys_refused(tmp_path, endian, key, vtype, code, value, at, reason):
    """The second of two keys: refused where it starts, or at its value type."""
    g = Gguf(endian)
    first = g.kv("k", U8, b"\x01")
    path = write(tmp_path / "m.gguf", g.header(0, 2) + first + g.kv(key, vtype, g.pack(code, value)))
    expect_error(path, 24 + len(first) + at, reason)


# --------------------------------------------------------------------------- alignment


@pytest.mark.parametrize("alignment", [1, 2, 64, 2 ** 31])
def test_alignment_powers_of_two_are_taken(tmp_path, alignment):
    kv = G.kv("general.alignment", U32, G.pack("I", alignment))
    head = G.header(1, 1) + kv + G.info("t", (8,), F32, 0)
    data_offset = pad(len(head), alignment)
    # zeros up to the end of the tensor (a hole for the large alignment)
    gf = read_gguf(sparse(tmp_path / "m.gguf", [(0, head)], data_offset + 32))
    assert (gf.alignment, gf.data_offset, gf.tensors[0].nbytes) == (alignment, data_offset, 32)


def test_pad_rounds_up_to_the_alignment():
    """GGML_PAD(x, n) = ((x + n - 1) / n) * n."""
    assert [header._pad(x, 32) for x in (0, 1, 31, 32, 33, 64)] == [0, 32, 32, 32, 64, 64]
    assert [header._pad(x, 1) for x in (0, 7)] == [0, 7]


# --------------------------------------------------------------------------- tensor infos


def _tensor_file(path, infos, size, endian):
    """A header of ``infos`` ((name, shape, ggml type id, data offset)) and no keys, zeros up to ``size`` bytes;
    returns the path and the byte where each tensor info starts."""
    g = Gguf(endian)
    raw = [g.info(*info) for info in infos]
    head = g.header(len(raw), 0) + b"".join(raw)
    return write(path, head.ljust(size, b"\0")), [24 + sum(len(r) for r in raw[:i]) for i in range(len(raw))]


@pytest.mark.parametrize("infos, size, read", [
    # up to GGML_MAX_DIMS (4) dimensions
    ([("t", (32, 1, 1, 2), F32, 0)], 352, [("t", (32, 1, 1, 2), 0, 256)]),
    # a dimension may be zero (no elements, no bytes), whatever the others; no dimension is one element
    ([("t", (0, 2 ** 62, 2 ** 62, 2 ** 62), F32, 0)], 96, [("t", (0, 2 ** 62, 2 ** 62, 2 ** 62), 0, 0)]),
    ([("s", (), F32, 0), ("z", (0,), F32, 32)], 128, [("s", (), 0, 4), ("z", (0,), 32, 0)]),
    # 57 bytes of header: the data starts at 64 (the default alignment 32) and may end at the end of the file
    ([("t", (8,), F32, 0)], 96, [("t", (8,), 0, 32)]),
    ([("t", (8,), F32, 32)], 128, [("t", (8,), 32, 32)]),
    # a name of 63 bytes: fewer than GGML_MAX_NAME (64)
    ([("t" * 63, (8,), F32, 0)], 256, [("t" * 63, (8,), 0, 32)]),
    # tensors may touch
    ([("a", (16,), F32, 0), ("b", (8,), F32, 64), ("c", (8,), F32, 96)], 256,
     [("a", (16,), 0, 64), ("b", (8,), 64, 32), ("c", (8,), 96, 32)]),
    # gguf_init_from_file_impl lays a tensor of zero elements at the offset of the next one (padded size 0): a
    # tensor of zero bytes overlaps nothing, before or after the other tensor at its offset
    ([("z", (0,), F32, 0), ("a", (8,), F32, 0)], 128, [("z", (0,), 0, 0), ("a", (8,), 0, 32)]),
    ([("a", (8,), F32, 0), ("z", (0,), F32, 0)], 128, [("a", (8,), 0, 32), ("z", (0,), 0, 0)]),
    # a tensor of unknown size counts no bytes for the overlap and end-of-file checks
    ([("u", (8,), 99, 32), ("a", (8,), F32, 32)], 160, [("u", (8,), 32, None), ("a", (8,), 32, 32)]),
])
def test_tensor_infos_read(tmp_path, endian, infos, size, read):
    """A tensor of an unknown type id is read, its size unknown, with a warning."""
    path, _starts = _tensor_file(tmp_path / "m.gguf", infos, size, endian)
    gf = read_gguf(path)
    assert [(t.name, t.shape, t.offset, t.nbytes) for t in gf.tensors] == read
    assert gf.warnings == ["%s: tensor '%s' has unknown ggml type id 99: size unknown" % (path, info[0])
                           for info in infos if info[2] == 99]


NAME_64 = "tensor info 0: the name %r is 64 bytes long, llama.cpp loads names of fewer than 64"


@pytest.mark.parametrize("infos, size, at, reason", [
    # at (the tensor info, bytes into it): its name (8 + 1 bytes), n_dims (4), the dimensions
    ([("t", (32, 1, 1, 2, 1), F32, 0)], 352, (0, 9), "tensor 't': n_dims 5 is more than 4"),
    ([("t", (32, -1), F32, 0)], 128, (0, 13), "tensor 't': negative dimension -1 in shape (32, -1)"),
    # gguf_init_from_file_impl refuses a shape when INT64_MAX / ne[i] < the elements so far: (2**63-1,) is
    # representable (the data then lies beyond the file), (2**32, 2**31) is 2**63 elements
    ([("t", (2 ** 63 - 1,), F32, 0)], 96, (0, 0),
     "tensor 't': data at bytes 64..%d lies beyond the end of the file (96 bytes)" % (64 + 4 * (2 ** 63 - 1))),
    ([("t", (2 ** 32, 2 ** 31), F32, 0)], 96, (0, 13),
     "tensor 't': shape (4294967296, 2147483648) has more than 2**63-1 elements"),
    ([("t", (8,), F32, 0)], 95, (0, 0), "tensor 't': data at bytes 64..96 lies beyond the end of the file (95 bytes)"),
    ([("t", (8,), F32, 16)], 128, (0, 0), "tensor 't': offset 16 is not a multiple of the alignment 32"),
    ([("q", (48, 2), Q8_0, 0)], 256, (0, 0), "tensor 'q': ne0 = 48 is not a multiple of the Q8_0 block size 32"),
    ([("t", (8,), F32, 0), ("t", (8,), F32, 32)], 256, (1, 0), "duplicate tensor name 't'"),
    # gguf_init_from_file_impl: name.length() >= GGML_MAX_NAME (64) is "too long"; bytes count, not characters
    ([("t" * 64, (8,), F32, 0)], 256, (0, 0), NAME_64 % ("t" * 64)),
    ([("\u00e9" * 32, (8,), F32, 0)], 256, (0, 0), NAME_64 % ("\u00e9" * 32)),
    # a tensor of 32 bytes at 32 lies inside a (0..64), whatever order the infos come in
    ([("b", (8,), F32, 32), ("a", (16,), F32, 0)], 256, (0, 0),
     "tensor 'b' (data offset 32) overlaps tensor 'a' (data offset 0, 64 bytes)"),
    ([("a", (64,), F32, 0), ("b", (8,), F32, 32), ("c", (8,), F32, 128)], 512, (1, 0),
     "tensor 'b' (data offset 32) overlaps tensor 'a' (data offset 0, 256 bytes)"),
    # at one offset: a tensor of unknown size (0 bytes for the checks), one I8 element (1 byte, ggml type 24), one
    # F32 element (4 bytes): the F32 one overlaps the I8 one, which ends last among those before it
    ([("u", (8,), 99, 0), ("t", (1,), 24, 0), ("a", (1,), F32, 0)], 160, (2, 0),
     "tensor 'a' (data offset 0) overlaps tensor 't' (data offset 0, 1 bytes)"),
])
def test_tensor_infos_refused(tmp_path, endian, infos, size, at, reason):
    path, starts = _tensor_file(tmp_path / "m.gguf", infos, size, endian)
    expect_error(path, starts[at[0]] + at[1], reason)


@pytest.mark.parametrize("type_id,name", sorted(REMOVED_TYPE_NAMES.items()))
def test_removed_type_id_is_refused_like_llama_cpp(small_file, endian, type_id, name):
    """ggml gives the removed types blck_size 0 (ggml/src/ggml.c type_traits) and gguf_init_from_file_impl
    (ggml/src/gguf.cpp) refuses a tensor whose blck_size is 0: the file does not load, so it is an error here."""
    _kv, tensors = field_offsets(small_file)
    info = tensors["output.weight"]
    patch(small_file, info["type"], "I", type_id, endian)
    reason = ("tensor 'output.weight': ggml type %d (%s) was removed from ggml; llama.cpp refuses files that use it "
              "(convert the model again)" % (type_id, name))
    expect_error(small_file, info["info"], reason)
    expect_error(small_file, info["info"], reason, reader=read_model)


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
    if os.path.exists("/dev/null"):
        expect_error("/dev/null", 0, "cannot open: not a regular file (a character device)")


def test_an_io_error_is_a_gguf_error_at_the_byte_reached(tmp_path, monkeypatch):
    """A disk's I/O error (EIO, which no test machine's disk gives on demand: injected into fstat and pread) is
    a GGUFError with the exception's type and text, at byte 0 before the reading starts, else where it was."""
    path, _offset, _offsets = model_file(tmp_path / "m.gguf", [("general.architecture", STRING, G.s("llama"))],
                                         [("a", (8,))])
    eio = OSError(errno.EIO, os.strerror(errno.EIO))
    reason = "OSError: [Errno %d] %s" % (errno.EIO, os.strerror(errno.EIO))
    with mock.patch.object(os, "fstat", side_effect=eio):
        expect_error(path, 0, reason)
    reads = []

    def second_read_fails(fd, n, offset):
        reads.append(offset)
        if len(reads) > 1:
            raise eio
        return os.pread(fd, n, offset)

    monkeypatch.setattr(values, "CHUNK", 16)
    monkeypatch.setattr(values, "_pread", second_read_fails)
    expect_error(path, 16, reason)
    assert reads == [0, 16]


def test_file_kinds_by_mode():
    modes = [stat.S_IFBLK | 0o660, stat.S_IFCHR | 0o666, stat.S_IFSOCK | 0o755, stat.S_IFREG | 0o644]
    assert [header._file_kind(m) for m in modes] == ["a block device", "a character device", "a socket", "mode 100644"]


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
