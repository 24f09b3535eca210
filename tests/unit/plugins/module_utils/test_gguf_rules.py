"""Two guards of the GGUF reader stated as llama.cpp states them, on files written by gguf-py's GGUFWriter:

* the byte order: ggml/src/gguf.cpp gguf_init_from_file_impl takes a version whose low 16 bits are zero
  (``(ctx->version & 0x0000FFFF) == 0x00000000``) as a file of the other byte order, as gguf-py's GGUFReader
  does (``temp_version[0] & 65535 == 0``); a version such as 256 (0x00000100) is of this byte order, and
  unsupported;
* the array bound: an array of ``n`` elements of type T takes at least ``n * sizeof(T)`` bytes (gguf.cpp
  gguf_reader reads ``n`` values of ``sizeof(T)`` bytes each; a string at least its 8-byte length, an array its
  4-byte type and 8-byte count), so a count that the rest of the file cannot hold at that size is refused at the
  array, whatever the element type.
"""
from __future__ import annotations

import os

import gguf
import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._gguf import GGUFError, read_gguf
from test_gguf_reader import ALL_SCALARS, SMALL_ARRAYS, SOME_TENSORS, field_offsets, patch, write_gguf

VT = gguf.GGUFValueType


@pytest.fixture(params=["little", "big"])
def endian(request):
    return request.param


@pytest.fixture
def small_file(tmp_path, endian):
    return write_gguf(tmp_path / "small.gguf", ALL_SCALARS + SMALL_ARRAYS, SOME_TENSORS, endian=endian)[0]


@pytest.mark.parametrize("version", [256, 0x0300, 0xFF00])
def test_a_version_with_low_16_bits_set_is_this_byte_order(small_file, endian, version):
    """The low 8 bits zero but not the low 16: not the mark of the other byte order."""
    patch(small_file, 4, "I", version, endian)
    with pytest.raises(GGUFError) as raised:
        read_gguf(small_file)
    assert (raised.value.offset, raised.value.reason) == (4, "unsupported GGUF version %d (only versions 2 and 3)"
                                                          % version)


@pytest.mark.parametrize("version", [2, 3])
def test_a_version_with_low_16_bits_zero_is_the_other_byte_order(small_file, endian, version):
    patch(small_file, 4, "I", version, endian)
    gf = read_gguf(small_file)
    assert (gf.version, gf.byte_order) == (version, endian)


# key -> the least bytes one element takes (sizeof(T) for a number, the length of a string, type + count of an array)
ELEMENT_BYTES = {"a.u8": 1, "a.u16": 2, "a.i32": 4, "a.f32": 4, "a.u64": 8, "a.f64": 8, "a.i64": 8, "a.str": 8,
                 "a.nested": 12}


@pytest.mark.parametrize("key", sorted(ELEMENT_BYTES))
def test_an_array_count_is_bounded_by_its_element_size(small_file, endian, key):
    kv, _t = field_offsets(small_file, endian)
    at = kv[key] + 8 + len(key) + 4            # the array's element type, then its 8-byte count
    left = os.path.getsize(small_file) - (at + 12)
    size = ELEMENT_BYTES[key]
    count = left // size + 1                   # one element more than the rest of the file holds at that size
    assert count <= left or size == 1          # (so that a bound of one byte per element would let it through)
    patch(small_file, at + 4, "Q", count, endian)
    with pytest.raises(GGUFError) as raised:
        read_gguf(small_file)
    assert raised.value.offset == at
    assert raised.value.reason.endswith("array of %d %s elements needs at least %d bytes, only %d left in the file"
                                        % (count, _type_name(key), count * size, left))


def _type_name(key):
    return {"a.u8": "uint8", "a.u16": "uint16", "a.i32": "int32", "a.f32": "float32", "a.u64": "uint64",
            "a.f64": "float64", "a.i64": "int64", "a.str": "string", "a.nested": "array"}[key]
