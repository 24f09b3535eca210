# -*- coding: utf-8 -*-
# Copyright: ai_llm maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read the header of GGUF files (llama.cpp's model format) without reading tensor data.

Standard library only; runs on target hosts (Python >= 3.9).

What it reads: GGUF v2 and v3, little- and big-endian (v3 has no marker: a version whose low 16 bits
are zero means the file is byte-swapped), every metadata value type including nested arrays, the tensor
infos, ``general.alignment`` and split models (``<base>-NNNNN-of-MMMMM.gguf``).

What it does not do: read tensor data, build large arrays. Numeric arrays of up to ``KEEP_NUMBERS``
elements (per-layer arrays such as ``head_count_kv``) and string or nested arrays of up to
``KEEP_LISTS`` elements are returned as lists; longer arrays (``tokenizer.ggml.tokens``, ``merges``,
``scores``, ``token_type``) are walked or seeked over and stand as ``SkippedArray(item_type, count)``.

Trust: no count, length or nesting depth from the file is used before it is checked against what the rest
of the file can hold, so a header that claims 2**60 entries fails at once, with bounded memory. Runs of empty
strings or arrays (zero bytes, such as the unwritten part of a sparse file) are skipped at once and holes are
never read, so the time depends on the bytes the header really holds, not on the file's apparent size.
Every malformed input raises ``GGUFError(path, offset, reason)``, never another exception type.

Choices (documented for the users of this reader):

* duplicate or empty metadata keys, duplicate tensor names and names of GGML_MAX_NAME (64) bytes or more are
  errors (llama.cpp refuses them too);
* metadata keys and tensor names must be valid UTF-8 (an error otherwise); string *values* that are not
  valid UTF-8 are decoded with replacement characters and reported in ``warnings``;
* a single string longer than ``MAX_STRING`` bytes and more than ``MAX_KEPT_BYTES`` of kept metadata
  strings in one file are errors (real files hold tens of KB: chat templates);
* ``n_dims`` may be 0..4; an unknown ggml type id gives ``type_name`` ``"unknown(N)"``, ``nbytes``
  ``None`` and a "size unknown" warning (newer ggml builds add types); an id that ggml removed
  (``_ggml.REMOVED_TYPE_IDS``, such as 4, Q4_2) is an error, as llama.cpp's loader refuses it; ``ne0`` that is
  not a multiple of the type's block size is an error;
* tensor offsets must be multiples of the alignment, lie (with their bytes) inside the file and not overlap
  (gaps are allowed).
"""

from __future__ import annotations

import errno
import os
import re
import stat
import struct
from dataclasses import dataclass, field
from typing import Optional

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import (
    GGML_MAX_DIMS,
    GGML_MAX_NAME,
    GGML_TYPES,
    REMOVED_TYPE_IDS,
    REMOVED_TYPE_NAMES,
    tensor_nbytes,
    type_name,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._gguf_keys import General, Split

__all__ = [
    "GGUFError", "TensorInfo", "SkippedArray", "GGUFFile", "read_gguf",
    "find_split_files", "GGUFModel", "read_model",
]

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DEPTH = 8                  # nesting depth of arrays (arrays of arrays of ...)
KEEP_NUMBERS = 4096            # numeric/bool arrays up to this many elements are kept as lists
KEEP_LISTS = 64                # string arrays and arrays of arrays up to this many elements are kept
MAX_STRING = 4 << 20           # longest single string accepted (key, value or tensor name)
MAX_KEPT_BYTES = 16 << 20      # total bytes of strings kept per file (with MAX_STRING, what bounds the memory)
CHUNK = 1 << 20                # buffered read size
INT64_MAX = (1 << 63) - 1

# GGUF metadata value types.
GGUF_TYPE_UINT8 = 0
GGUF_TYPE_INT8 = 1
GGUF_TYPE_UINT16 = 2
GGUF_TYPE_INT16 = 3
GGUF_TYPE_UINT32 = 4
GGUF_TYPE_INT32 = 5
GGUF_TYPE_FLOAT32 = 6
GGUF_TYPE_BOOL = 7
GGUF_TYPE_STRING = 8
GGUF_TYPE_ARRAY = 9
GGUF_TYPE_UINT64 = 10
GGUF_TYPE_INT64 = 11
GGUF_TYPE_FLOAT64 = 12

VALUE_TYPE_NAMES = {
    0: "uint8", 1: "int8", 2: "uint16", 3: "int16", 4: "uint32", 5: "int32", 6: "float32", 7: "bool",
    8: "string", 9: "array", 10: "uint64", 11: "int64", 12: "float64",
}

# Fixed-size value types: type id -> (struct code, size in bytes).
_SCALARS = {
    0: ("B", 1), 1: ("b", 1), 2: ("H", 2), 3: ("h", 2), 4: ("I", 4), 5: ("i", 4), 6: ("f", 4),
    7: ("?", 1), 10: ("Q", 8), 11: ("q", 8), 12: ("d", 8),
}
_INT_TYPES = frozenset((0, 1, 2, 3, 4, 5, 10, 11))
# An empty string is 8 zero bytes (its u64 length); an empty array of uint8 is 12 (u32 type 0, u64 count 0).
_EMPTY_STRING_BYTES = 8
_EMPTY_ARRAY_BYTES = 12
_ZEROS = re.compile(b"\0+")
_SEEK_DATA = getattr(os, "SEEK_DATA", None)

_SPLIT_RE = re.compile(r"^(?P<base>.+)-(?P<no>[0-9]{5,})-of-(?P<count>[0-9]{5,})\.gguf$")


class GGUFError(Exception):
    """A GGUF file that cannot be read: ``str()`` is ``"<path>: at byte <offset>: <reason>"``."""

    def __init__(self, path, offset, reason):
        self.path = str(path)
        self.offset = int(offset)
        self.reason = str(reason)
        super().__init__(self.path, self.offset, self.reason)

    def __str__(self):
        return f"{self.path}: at byte {self.offset}: {self.reason}"


@dataclass(frozen=True)
class SkippedArray:
    """Stands in for a large metadata array that was skipped without being built."""

    item_type: int
    count: int

    @property
    def item_type_name(self):
        return VALUE_TYPE_NAMES.get(self.item_type, str(self.item_type))

    def __len__(self):
        return self.count


@dataclass(frozen=True)
class TensorInfo:
    """One tensor info of a GGUF header (its data is never read).

    ``shape`` is in ggml ``ne`` order; ``offset`` is relative to the data section; ``nbytes`` is ``None`` for
    a type id this reader does not know; ``file`` and ``shard`` say which file of the model holds it;
    ``info_offset`` is the byte of the tensor info in that file (for messages, not compared).
    """

    name: str
    shape: tuple
    type_id: int
    offset: int
    nbytes: Optional[int]
    file: str = ""
    shard: int = 0
    info_offset: int = field(default=0, compare=False)

    @property
    def type_name(self):
        """The ggml type name (``"Q4_K"``), ``"unknown(N)"`` for an id this reader does not know."""
        return type_name(self.type_id)

    @property
    def n_elements(self):
        count = 1
        for n in self.shape:
            count *= n
        return count

    def __repr__(self):
        return (f"TensorInfo(name={self.name!r}, shape={self.shape!r}, type_name={self.type_name!r}, "
                f"offset={self.offset}, nbytes={self.nbytes!r}, shard={self.shard})")


@dataclass(frozen=True)
class GGUFFile:
    """The header of one GGUF file.

    ``metadata``: key -> value (``SkippedArray`` for large arrays); ``value_types``: key -> GGUF value type id;
    ``key_offsets``: key -> byte of its key/value pair; ``shard``: the 0-based number of this file in its model.
    """

    path: str
    version: int
    byte_order: str
    metadata: dict
    value_types: dict
    key_offsets: dict
    tensors: list
    alignment: int
    data_offset: int
    file_size: int
    warnings: list
    shard: int = 0

    def __repr__(self):
        return (f"GGUFFile(path={self.path!r}, version={self.version}, byte_order={self.byte_order!r}, "
                f"{len(self.metadata)} keys, {len(self.tensors)} tensors)")


@dataclass(frozen=True)
class GGUFModel:
    """A model: one GGUF file or all the shards of a split model.

    ``metadata`` is the first shard's (only it holds the model's keys); ``tensors`` are those of every shard
    in order; ``architecture`` is ``general.architecture`` (``None`` when absent); ``file_bytes`` the size of
    all files together.
    """

    files: list
    shards: list
    metadata: dict
    tensors: list
    architecture: Optional[str]
    file_bytes: int
    warnings: list

    @property
    def tensor_names(self):
        return [t.name for t in self.tensors]

    def __repr__(self):
        return (f"GGUFModel(architecture={self.architecture!r}, {len(self.files)} files, "
                f"{len(self.tensors)} tensors, {self.file_bytes} bytes)")


def _pread(fd, n, offset):
    if hasattr(os, "pread"):
        return os.pread(fd, n, offset)
    os.lseek(fd, offset, os.SEEK_SET)  # (no pread on this platform: one reader per descriptor, so no race)
    return os.read(fd, n)


class _Reader:
    """Buffered, bounds-checked reading of one file: ``buf[pos]`` is byte ``base + pos`` of the file.

    Reads with ``pread`` at absolute offsets, so the descriptor has no position to keep in step.
    """

    def __init__(self, path, fd, size):
        self.path = path
        self.fd = fd
        self.size = size
        self.buf = b""
        self.base = 0
        self.pos = 0
        self.kept = 0
        self.warnings = []
        self.set_order("<")

    def set_order(self, prefix):
        self.prefix = prefix
        self.u32_from = struct.Struct(prefix + "I").unpack_from
        self.u64_from = struct.Struct(prefix + "Q").unpack_from
        self.scalar_from = {t: (struct.Struct(prefix + code).unpack_from, size) for t, (code, size) in _SCALARS.items()}

    def tell(self):
        return self.base + self.pos

    def left(self):
        return self.size - self.base - self.pos

    def fail(self, reason, offset=None):
        raise GGUFError(self.path, self.tell() if offset is None else offset, reason)

    def fill(self, n):
        """Make ``n`` bytes readable at ``buf[pos]``, or fail because the file ends."""
        start = self.base + self.pos
        if start + n > self.size:
            self.fail(f"unexpected end of file: {n} bytes needed, {max(self.size - start, 0)} left")
        data = _pread(self.fd, max(n, CHUNK), start)
        if len(data) < n:
            self.fail(f"short read: {n} bytes needed, {len(data)} read (file changed while reading?)")
        self.buf = data
        self.base = start
        self.pos = 0

    def seek(self, offset):
        """Go to byte ``offset`` of the file (already checked against its size)."""
        p = offset - self.base
        if 0 <= p <= len(self.buf):
            self.pos = p
        else:
            self.buf, self.base, self.pos = b"", offset, 0

    def _next_data(self, offset):
        """The first byte at or after ``offset`` that the file stores: the bytes before it are a hole (zeros)."""
        if _SEEK_DATA is None:
            return offset
        try:
            return os.lseek(self.fd, offset, _SEEK_DATA)
        except OSError as exc:
            # ENXIO: nothing but a hole up to the end; anything else (no SEEK_DATA here): read the bytes
            return self.size if exc.errno == errno.ENXIO else offset

    def zero_run(self, limit):
        """How many zero bytes follow the position (at most ``limit``), without moving it.

        A header can claim millions of empty strings or arrays over the unwritten part of a sparse file; the
        zeros are counted at C speed where they are stored, and holes are skipped without being read
        (``SEEK_DATA``), so the time does not grow with the file's apparent size.
        """
        start = self.tell()
        end = min(self.size, start + limit)
        at = start
        buf, base = self.buf, self.base
        while at < end:
            p = at - base
            if 0 <= p < len(buf):
                stop = min(len(buf), p + end - at)
                match = _ZEROS.match(buf, p, stop)
                at += match.end() - p if match else 0
                if at - base < stop or at >= end:
                    break  # a byte that is not zero, or the limit
                continue
            data = self._next_data(at)
            if data > at:
                at = min(data, end)
                continue
            buf, base = _pread(self.fd, CHUNK, at), at
            if not buf:
                break
        return min(at, end) - start

    def u32(self):
        p = self.pos
        if p + 4 > len(self.buf):
            self.fill(4)
            p = 0
        self.pos = p + 4
        return self.u32_from(self.buf, p)[0]

    def u64(self):
        p = self.pos
        if p + 8 > len(self.buf):
            self.fill(8)
            p = 0
        self.pos = p + 8
        return self.u64_from(self.buf, p)[0]

    def take(self, n):
        """The next ``n`` bytes (``n`` already checked against the file)."""
        p = self.pos
        if p + n > len(self.buf):
            self.fill(n)
            p = 0
        self.pos = p + n
        return self.buf[p:p + n]

    def raw_string(self, what):
        at = self.tell()
        n = self.u64()
        if n > self.left():
            self.fail(f"{what}: string length {n} runs past the end of the file ({self.left()} bytes left)", at)
        if n > MAX_STRING:
            self.fail(f"{what}: string of {n} bytes is longer than the {MAX_STRING} this reader accepts", at)
        self.kept += n
        if self.kept > MAX_KEPT_BYTES:
            self.fail(f"{what}: more than {MAX_KEPT_BYTES} bytes of metadata strings", at)
        if n <= CHUNK:
            return self.take(n)
        start = self.tell()  # a long string is read on its own, not kept in the buffer as well
        data = _pread(self.fd, n, start)
        if len(data) < n:
            self.fail(f"short read: {n} bytes needed, {len(data)} read (file changed while reading?)")
        self.seek(start + n)
        return data

    def name_string(self, what):
        """A key or tensor name: strict UTF-8."""
        at = self.tell()
        raw = self.raw_string(what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return self.fail(f"{what} is not valid UTF-8 ({exc.reason})", at)

    def value_string(self, what):
        raw = self.raw_string(what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.warnings.append(f"{what}: a string value is not valid UTF-8 (decoded with replacement characters)")
            return raw.decode("utf-8", "replace")

    def value(self, vtype, depth, what):
        entry = self.scalar_from.get(vtype)
        if entry is not None:
            unpack, size = entry
            p = self.pos
            if p + size > len(self.buf):
                self.fill(size)
                p = 0
            self.pos = p + size
            return unpack(self.buf, p)[0]
        if vtype == GGUF_TYPE_STRING:
            return self.value_string(what)
        if vtype == GGUF_TYPE_ARRAY:
            return self.array(depth + 1, what)
        return self.fail(f"{what}: unknown value type {vtype}", self.tell() - 4)

    def array_header(self, depth, what):
        """Read an array's element type and count; check the count against the rest of the file."""
        at = self.tell()
        if depth > MAX_DEPTH:
            self.fail(f"{what}: arrays nested deeper than {MAX_DEPTH}", at)
        itype = self.u32()
        count = self.u64()
        if itype in _SCALARS:
            min_size = _SCALARS[itype][1]
        elif itype == GGUF_TYPE_STRING:
            min_size = _EMPTY_STRING_BYTES
        elif itype == GGUF_TYPE_ARRAY:
            min_size = _EMPTY_ARRAY_BYTES
        else:
            return self.fail(f"{what}: unknown array element type {itype}", at)
        if count * min_size > self.left():
            self.fail(f"{what}: array of {count} {VALUE_TYPE_NAMES[itype]} elements needs at least "
                      f"{count * min_size} bytes, only {self.left()} left in the file", at)
        return itype, count

    def array(self, depth, what):
        itype, count = self.array_header(depth, what)
        entry = _SCALARS.get(itype)
        if entry is not None:
            nbytes = count * entry[1]
            if count > KEEP_NUMBERS:
                self.seek(self.tell() + nbytes)  # checked against the file by array_header
                return SkippedArray(itype, count)
            data = self.take(nbytes)
            return list(struct.unpack_from(f"{self.prefix}{count}{entry[0]}", data))
        if itype == GGUF_TYPE_STRING:
            if count > KEEP_LISTS:
                self.skip_strings(count, what)
                return SkippedArray(itype, count)
            return [self.value_string(what) for _i in range(count)]
        if count > KEEP_LISTS:
            self.skip_arrays(count, depth, what)
            return SkippedArray(itype, count)
        return [self.array(depth + 1, what) for _i in range(count)]

    def skip_array(self, depth, what):
        itype, count = self.array_header(depth, what)
        entry = _SCALARS.get(itype)
        if entry is not None:
            self.seek(self.tell() + count * entry[1])
        elif itype == GGUF_TYPE_STRING:
            self.skip_strings(count, what)
        else:
            self.skip_arrays(count, depth, what)

    def skip_arrays(self, count, depth, what):
        """Walk ``count`` arrays; a run of empty ones (12 zero bytes each) is skipped at once."""
        left = count
        while left:
            empty = min(self.zero_run(left * _EMPTY_ARRAY_BYTES) // _EMPTY_ARRAY_BYTES, left)
            if empty:
                self.seek(self.tell() + empty * _EMPTY_ARRAY_BYTES)
                left -= empty
                continue
            self.skip_array(depth + 1, what)
            left -= 1

    def skip_strings(self, count, what):
        """Walk ``count`` strings (u64 length + bytes) without building them: the hot loop.

        A run of empty strings (8 zero bytes each, as in the unwritten part of a sparse file) is skipped at once.
        """
        unpack = self.u64_from
        left = count
        while left:
            if self.pos + 8 > len(self.buf):
                if self.tell() + 8 > self.size:
                    self.fail(f"{what}: element {count - left} of {count}: no room for its length "
                              f"({self.left()} bytes left in the file)")
                self.fill(8)
            buf = self.buf
            pos = self.pos
            limit = len(buf) - 8
            done = 0
            n = at = 0
            for _i in range(left):
                n = unpack(buf, pos)[0]
                if not n:
                    break
                at = pos
                pos += 8 + n
                done += 1
                if pos > limit:
                    break
            left -= done
            self.pos = pos
            if self.base + pos > self.size:
                self.fail(f"{what}: element {count - left - 1} of {count}: string length {n} runs past the end of "
                          f"the file ({self.size - self.base - at - 8} bytes left)", self.base + at)
            if left and not n and pos <= limit:
                empty = min(self.zero_run(left * _EMPTY_STRING_BYTES) // _EMPTY_STRING_BYTES, left)
                self.seek(self.tell() + empty * _EMPTY_STRING_BYTES)
                left -= empty


def _pad(offset, alignment):
    return offset + (-offset % alignment)


def _tensor_size(rd, name, type_id, shape, info_offset):
    """The bytes of one tensor, ``None`` for an unknown type id (with a warning); removed ids are errors."""
    if type_id in REMOVED_TYPE_IDS:
        # ggml/src/ggml.c type_traits gives the removed types blck_size 0, and ggml/src/gguf.cpp
        # gguf_init_from_file_impl refuses "blck_size == 0 || ne[0] % blck_size != 0": llama.cpp does not load it.
        rd.fail(f"tensor {name!r}: ggml type {type_id} ({REMOVED_TYPE_NAMES[type_id]}) was removed from ggml; "
                f"llama.cpp refuses files that use it (convert the model again)", info_offset)
    if type_id not in GGML_TYPES:
        rd.warnings.append(f"{rd.path}: tensor {name!r} has unknown ggml type id {type_id}: size unknown")
        return None
    try:
        return tensor_nbytes(type_id, shape)
    except ValueError as exc:
        return rd.fail(f"tensor {name!r}: {exc}", info_offset)


def _read_preamble(rd):
    """The magic, the version (which also gives the byte order), the tensor count and the key/value count."""
    if rd.size < 24:
        rd.fail(f"file of {rd.size} bytes is too short for a GGUF header (24 bytes)")  # at byte 0
    magic = rd.take(4)
    if magic != GGUF_MAGIC:
        rd.fail(f"bad magic {bytes(magic)!r}: not a GGUF file", 0)
    version = rd.u32()
    byte_order = "little"
    if version & 0xFFFF == 0:
        byte_order = "big"
        rd.set_order(">")
        version = struct.unpack("<I", struct.pack(">I", version))[0]
    if version == 1:
        rd.fail("GGUF version 1 is obsolete and not supported (only versions 2 and 3)", 4)
    if version not in SUPPORTED_VERSIONS:
        rd.fail(f"unsupported GGUF version {version} (only versions 2 and 3)", 4)
    at = rd.tell()
    tensor_count = rd.u64()
    kv_count = rd.u64()
    if kv_count * 13 > rd.left():  # shortest pair: key length, value type, one byte
        rd.fail(f"{kv_count} key/value pairs claimed, but only {rd.left()} bytes left in the file", at + 8)
    if tensor_count * 24 > rd.left():  # shortest info: name length, n_dims, type, offset
        rd.fail(f"{tensor_count} tensors claimed, but only {rd.left()} bytes left in the file", at)
    return version, byte_order, tensor_count, kv_count


def _read_metadata(rd, kv_count):
    """The key/value pairs: key -> value, key -> value type id, key -> byte of its pair."""
    metadata = {}
    value_types = {}
    key_offsets = {}
    for index in range(kv_count):
        at = rd.tell()
        key = rd.name_string(f"key {index}")
        if not key:
            rd.fail(f"key {index} is empty", at)  # (gguf_init_from_file_impl: "key %d is empty")
        if key in metadata:
            rd.fail(f"duplicate key {key!r}", at)
        vtype = rd.u32()
        if vtype not in VALUE_TYPE_NAMES:
            rd.fail(f"key {key!r}: unknown value type {vtype}", rd.tell() - 4)
        metadata[key] = rd.value(vtype, 0, f"key {key!r}")
        value_types[key] = vtype
        key_offsets[key] = at
    return metadata, value_types, key_offsets


def _alignment(rd, metadata, value_types, key_offsets):
    """``general.alignment`` (a uint32 power of two), else ``DEFAULT_ALIGNMENT``."""
    if General.ALIGNMENT not in metadata:
        return DEFAULT_ALIGNMENT
    alignment = metadata[General.ALIGNMENT]
    if value_types[General.ALIGNMENT] != GGUF_TYPE_UINT32:
        rd.fail(f"{General.ALIGNMENT} must be a uint32, not {VALUE_TYPE_NAMES[value_types[General.ALIGNMENT]]}",
                key_offsets[General.ALIGNMENT])
    if alignment == 0 or alignment & (alignment - 1):
        rd.fail(f"{General.ALIGNMENT} {alignment} is not a power of two", key_offsets[General.ALIGNMENT])
    return alignment


def _read_tensor_info(rd, index, names, shard):
    """One tensor info: a unique name shorter than GGML_MAX_NAME, at most GGML_MAX_DIMS dimensions, the type and
    the offset."""
    name_at = rd.tell()
    name = rd.name_string(f"tensor info {index}: name")
    if len(name.encode("utf-8")) >= GGML_MAX_NAME:  # (gguf_init_from_file_impl: "tensor name ... is too long")
        rd.fail(f"tensor info {index}: the name {name[:80]!r} is {len(name.encode('utf-8'))} bytes long, "
                f"llama.cpp loads names of fewer than {GGML_MAX_NAME}", name_at)
    if name in names:
        rd.fail(f"duplicate tensor name {name!r}", name_at)
    names.add(name)
    n_dims = rd.u32()
    if n_dims > GGML_MAX_DIMS:
        rd.fail(f"tensor {name!r}: n_dims {n_dims} is more than {GGML_MAX_DIMS}", rd.tell() - 4)
    dims_at = rd.tell()
    shape = struct.unpack_from(f"{rd.prefix}{n_dims}q", rd.take(8 * n_dims))
    elements = 1
    for n in shape:
        if n < 0:
            rd.fail(f"tensor {name!r}: negative dimension {n} in shape {shape!r}", dims_at)
        elements *= n
    if elements > INT64_MAX:
        rd.fail(f"tensor {name!r}: shape {shape!r} has more than 2**63-1 elements", dims_at)
    type_id = rd.u32()
    offset = rd.u64()
    nbytes = _tensor_size(rd, name, type_id, shape, name_at)
    return TensorInfo(name, shape, type_id, offset, nbytes, rd.path, shard, name_at)


def _check_tensor_data(rd, tensors, alignment, data_offset):
    """Each tensor's data is aligned, lies inside the file and overlaps no other (gaps are allowed)."""
    for t in tensors:
        if t.offset % alignment:
            rd.fail(f"tensor {t.name!r}: offset {t.offset} is not a multiple of the alignment {alignment}",
                    t.info_offset)
        end = data_offset + t.offset + (t.nbytes or 0)
        if end > rd.size:
            rd.fail(f"tensor {t.name!r}: data at bytes {data_offset + t.offset}..{end} lies beyond the end of the "
                    f"file ({rd.size} bytes)", t.info_offset)
    previous = None
    for t in sorted(tensors, key=lambda x: (x.offset, x.nbytes or 0)):
        if previous is not None and t.offset < previous.offset + (previous.nbytes or 0):
            rd.fail(f"tensor {t.name!r} (data offset {t.offset}) overlaps tensor {previous.name!r} "
                    f"(data offset {previous.offset}, {previous.nbytes or 0} bytes)", t.info_offset)
        if previous is None or t.offset + (t.nbytes or 0) > previous.offset + (previous.nbytes or 0):
            previous = t


def _read_header(rd, shard):
    version, byte_order, tensor_count, kv_count = _read_preamble(rd)
    metadata, value_types, key_offsets = _read_metadata(rd, kv_count)
    alignment = _alignment(rd, metadata, value_types, key_offsets)
    names = set()
    tensors = [_read_tensor_info(rd, index, names, shard) for index in range(tensor_count)]
    data_offset = _pad(rd.tell(), alignment)
    _check_tensor_data(rd, tensors, alignment, data_offset)
    return GGUFFile(rd.path, version, byte_order, metadata, value_types, key_offsets, tensors, alignment,
                    data_offset, rd.size, rd.warnings, shard)


def _file_kind(mode):
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return f"mode {mode:o}"


def read_gguf(path, shard=0):
    """Read the header of one GGUF file (``shard``: its 0-based number in a split model). Raises ``GGUFError``."""
    path = os.fspath(path)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer (it has no effect on regular files).
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except (OSError, ValueError, TypeError) as exc:
        raise GGUFError(path, 0, f"cannot open: {getattr(exc, 'strerror', None) or exc}") from None
    rd = None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise GGUFError(path, 0, f"cannot open: not a regular file ({_file_kind(info.st_mode)})")
        rd = _Reader(path, fd, info.st_size)
        return _read_header(rd, shard)
    except GGUFError:
        raise
    except (struct.error, UnicodeError, OverflowError, MemoryError, ValueError, TypeError, IndexError,
            KeyError, RecursionError, OSError) as exc:
        offset = rd.tell() if rd is not None else 0
        raise GGUFError(path, offset, f"{type(exc).__name__}: {exc}") from None
    finally:
        os.close(fd)


def find_split_files(path):
    """All shards of the split model that ``path`` belongs to, in order (``[path]`` when not split).

    Shard names are ``<base>-NNNNN-of-MMMMM.gguf`` (1-based). A missing shard raises ``GGUFError``.
    """
    path = os.fspath(path)
    folder, name = os.path.split(path)
    match = _SPLIT_RE.match(name)
    if not match:
        return [path]
    number = int(match.group("no"))
    count = int(match.group("count"))
    if not 1 <= number <= count:
        raise GGUFError(path, 0, f"the file name says shard {number} of {count}")
    base, width, total = match.group("base"), len(match.group("no")), match.group("count")
    files = []
    for i in range(1, count + 1):
        shard = os.path.join(folder, f"{base}-{i:0{width}d}-of-{total}.gguf")
        if not os.path.isfile(shard):
            raise GGUFError(path, 0, f"shard {i} of {count} is missing: {shard}")
        files.append(shard)
    return files


def _split_key(gguf, key, expected, what):
    value = gguf.metadata.get(key)
    if value is None:
        raise GGUFError(gguf.path, 0, f"{key} is missing; the file name says {what}")
    if gguf.value_types.get(key) not in _INT_TYPES:
        raise GGUFError(gguf.path, gguf.key_offsets[key],
                        f"{key} must be an integer, not {VALUE_TYPE_NAMES.get(gguf.value_types.get(key))}")
    if value != expected:
        raise GGUFError(gguf.path, gguf.key_offsets[key], f"{key} is {value} but the file name says {what}")


def read_model(path):
    """Read a model: one GGUF file, or every shard of a split model given any one of them."""
    files = find_split_files(path)
    shards = [read_gguf(f, number) for number, f in enumerate(files)]
    first = shards[0]
    count = len(files)
    named_split = bool(_SPLIT_RE.match(os.path.basename(files[0])))
    for number, gguf in enumerate(shards):
        if named_split and (count > 1 or Split.LLM_KV_SPLIT_COUNT in gguf.metadata):
            what = f"shard {number + 1} of {count}"
            _split_key(gguf, Split.LLM_KV_SPLIT_COUNT, count, what)
            _split_key(gguf, Split.LLM_KV_SPLIT_NO, number, what + f" ({Split.LLM_KV_SPLIT_NO} is 0-based)")
        elif not named_split:
            claimed = gguf.metadata.get(Split.LLM_KV_SPLIT_COUNT)
            if claimed not in (None, 0, 1):
                raise GGUFError(gguf.path, gguf.key_offsets[Split.LLM_KV_SPLIT_COUNT],
                                f"{Split.LLM_KV_SPLIT_COUNT} is {claimed!r} but the file name has no "
                                "-NNNNN-of-MMMMM part, "
                                "so the other shards cannot be found")
    tensors = []
    names = {}
    warnings = []
    for gguf in shards:
        warnings.extend(gguf.warnings)
        for t in gguf.tensors:
            if t.name in names:
                raise GGUFError(gguf.path, t.info_offset, f"tensor {t.name!r} is also in {names[t.name]}")
            names[t.name] = gguf.path
            tensors.append(t)
    total = first.metadata.get(Split.LLM_KV_SPLIT_TENSORS_COUNT)
    if total is not None and count > 1 and total != len(tensors):
        raise GGUFError(first.path, first.key_offsets[Split.LLM_KV_SPLIT_TENSORS_COUNT],
                        f"{Split.LLM_KV_SPLIT_TENSORS_COUNT} is {total!r} but the {count} shards hold {len(tensors)} "
                        "tensors")
    architecture = first.metadata.get(General.ARCHITECTURE)
    if not isinstance(architecture, str):
        warnings.append(f"{first.path}: no string {General.ARCHITECTURE}")
        architecture = None
    return GGUFModel(files, shards, first.metadata, tensors, architecture,
                     sum(g.file_size for g in shards), warnings)
