# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Bounded reading of GGUF values from one file: scalars, strings and (nested) arrays, never tensor data.

Standard library only; runs on target hosts (Python >= 3.9). ``header`` reads a file's header with it.

Numeric arrays of up to ``KEEP_NUMBERS`` elements (per-layer arrays such as ``head_count_kv``) and string or
nested arrays of up to ``KEEP_LISTS`` elements are returned as lists; longer arrays (``tokenizer.ggml.tokens``,
``merges``, ``scores``, ``token_type``) are walked or seeked over and stand as ``SkippedArray(item_type, count)``.

Trust: no count, length or nesting depth from the file is used before it is checked against what the rest
of the file can hold, so a header that claims 2**60 entries fails at once, with bounded memory. Runs of empty
strings or arrays (zero bytes, such as the unwritten part of a sparse file) are skipped at once and holes are
never read, so the time depends on the bytes the header really holds, not on the file's apparent size.
Every malformed value raises ``GGUFError(path, offset, reason)``.

Keys and tensor names must be valid UTF-8; string *values* that are not are decoded with replacement characters
and reported in ``warnings``. A single string longer than ``MAX_STRING`` bytes and more than ``MAX_KEPT_BYTES``
of kept strings in one file are errors (real files hold tens of KB: chat templates).
"""

from __future__ import annotations

import errno
import os
import re
import struct
from dataclasses import dataclass

from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.error import GGUFError

MAX_DEPTH = 8                  # nesting depth of arrays (arrays of arrays of ...)
KEEP_NUMBERS = 4096            # numeric/bool arrays up to this many elements are kept as lists
KEEP_LISTS = 64                # string arrays and arrays of arrays up to this many elements are kept
MAX_STRING = 4 << 20           # longest single string accepted (key, value or tensor name)
MAX_KEPT_BYTES = 16 << 20      # total bytes of strings kept per file (with MAX_STRING, what bounds the memory)
CHUNK = 1 << 20                # buffered read size
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
INT_TYPES = frozenset((0, 1, 2, 3, 4, 5, 10, 11))
# An empty string is 8 zero bytes (its u64 length); an empty array of uint8 is 12 (u32 type 0, u64 count 0).
_EMPTY_STRING_BYTES = 8
_EMPTY_ARRAY_BYTES = 12
_ZEROS = re.compile(b"\0+")
_SEEK_DATA = getattr(os, "SEEK_DATA", None)


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


def _pread(fd, n, offset):
    if hasattr(os, "pread"):
        return os.pread(fd, n, offset)
    os.lseek(fd, offset, os.SEEK_SET)  # (no pread on this platform: one reader per descriptor, so no race)
    return os.read(fd, n)


class ValueReader:
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
