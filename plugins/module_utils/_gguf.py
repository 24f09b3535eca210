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
of the file can hold, so a header that claims 2**60 entries fails at once, with bounded memory.
Every malformed input raises ``GGUFError(path, offset, reason)``, never another exception type.

Choices (documented for the users of this reader):

* duplicate metadata keys and duplicate tensor names are errors (llama.cpp refuses them too);
* metadata keys and tensor names must be valid UTF-8 (an error otherwise); string *values* that are not
  valid UTF-8 are decoded with replacement characters and reported in ``warnings``;
* a single string longer than ``MAX_STRING`` bytes and more than ``MAX_KEPT_BYTES`` of kept metadata
  strings in one file are errors (real files hold tens of KB: chat templates);
* ``n_dims`` may be 0..4; an unknown ggml type id gives ``type_name`` ``"unknown(N)"``, ``nbytes``
  ``None`` and a "size unknown" warning; ``ne0`` that is not a multiple of the type's block size is an error;
* tensor offsets must be multiples of the alignment, lie (with their bytes) inside the file and not overlap
  (gaps are allowed).
"""

from __future__ import absolute_import, division, print_function

import os
import re
import stat
import struct

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import GGML_TYPES, tensor_nbytes, type_name

__all__ = [
    "GGUFError", "TensorInfo", "SkippedArray", "GGUFFile", "read_gguf",
    "find_split_files", "GGUFModel", "read_model",
]

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_DEPTH = 8                  # nesting depth of arrays (arrays of arrays of ...)
KEEP_NUMBERS = 4096            # numeric/bool arrays up to this many elements are kept as lists
KEEP_LISTS = 64                # string arrays and arrays of arrays up to this many elements are kept
MAX_STRING = 16 << 20          # longest single string accepted (key, value or tensor name)
MAX_KEPT_BYTES = 64 << 20      # total bytes of strings kept per file
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

_SPLIT_RE = re.compile(r"^(?P<base>.+)-(?P<no>[0-9]{5,})-of-(?P<count>[0-9]{5,})\.gguf$")


class GGUFError(Exception):
    """A GGUF file that cannot be read: ``str()`` is ``"<path>: at byte <offset>: <reason>"``."""

    def __init__(self, path, offset, reason):
        self.path = str(path)
        self.offset = int(offset)
        self.reason = str(reason)
        super(GGUFError, self).__init__(self.path, self.offset, self.reason)

    def __str__(self):
        return "%s: at byte %d: %s" % (self.path, self.offset, self.reason)


class SkippedArray(object):
    """Stands in for a large metadata array that was skipped without being built."""

    __slots__ = ("item_type", "count")

    def __init__(self, item_type, count):
        self.item_type = item_type
        self.count = count

    @property
    def item_type_name(self):
        return VALUE_TYPE_NAMES.get(self.item_type, str(self.item_type))

    def __len__(self):
        return self.count

    def __eq__(self, other):
        return (isinstance(other, SkippedArray) and self.item_type == other.item_type
                and self.count == other.count)

    def __ne__(self, other):
        return not self == other

    __hash__ = None

    def __repr__(self):
        return "SkippedArray(item_type=%d, count=%d)" % (self.item_type, self.count)


class TensorInfo(object):
    """One tensor info of a GGUF header (its data is never read)."""

    __slots__ = ("name", "shape", "type_id", "type_name", "offset", "nbytes", "file", "shard", "info_offset")

    def __init__(self, name, shape, type_id, offset, nbytes, file=None, shard=0, info_offset=0):
        self.name = name
        self.shape = tuple(shape)
        self.type_id = type_id
        self.type_name = type_name(type_id)
        self.offset = offset
        self.nbytes = nbytes
        self.file = file
        self.shard = shard
        self.info_offset = info_offset  # byte of the tensor info in its file (for messages)

    @property
    def n_elements(self):
        count = 1
        for n in self.shape:
            count *= n
        return count

    def _key(self):
        return (self.name, self.shape, self.type_id, self.offset, self.nbytes, self.file, self.shard)

    def __eq__(self, other):
        return isinstance(other, TensorInfo) and self._key() == other._key()

    def __ne__(self, other):
        return not self == other

    __hash__ = None

    def __repr__(self):
        return ("TensorInfo(name=%r, shape=%r, type_name=%r, offset=%d, nbytes=%r, shard=%d)"
                % (self.name, self.shape, self.type_name, self.offset, self.nbytes, self.shard))


class GGUFFile(object):
    """The header of one GGUF file."""

    def __init__(self, path, version, byte_order, metadata, value_types, key_offsets, tensors,
                 alignment, data_offset, file_size, warnings):
        self.path = path
        self.version = version
        self.byte_order = byte_order
        self.metadata = metadata          # key -> value (SkippedArray for large arrays)
        self.value_types = value_types    # key -> GGUF value type id
        self.key_offsets = key_offsets    # key -> byte of its key/value pair
        self.tensors = tensors
        self.alignment = alignment
        self.data_offset = data_offset
        self.file_size = file_size
        self.warnings = warnings

    def __repr__(self):
        return ("GGUFFile(path=%r, version=%d, byte_order=%r, %d keys, %d tensors)"
                % (self.path, self.version, self.byte_order, len(self.metadata), len(self.tensors)))


class GGUFModel(object):
    """A model: one GGUF file or all the shards of a split model."""

    def __init__(self, files, shards, metadata, tensors, architecture, file_bytes, warnings):
        self.files = files
        self.shards = shards
        self.metadata = metadata
        self.tensors = tensors
        self.architecture = architecture
        self.file_bytes = file_bytes
        self.warnings = warnings

    def __repr__(self):
        return ("GGUFModel(architecture=%r, %d files, %d tensors, %d bytes)"
                % (self.architecture, len(self.files), len(self.tensors), self.file_bytes))


class _Reader(object):
    """Buffered, bounds-checked reading of one file: ``buf[pos]`` is byte ``base + pos`` of the file."""

    def __init__(self, path, fobj, size):
        self.path = path
        self.f = fobj
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
        self.scalar_from = dict((t, (struct.Struct(prefix + code).unpack_from, size))
                                for t, (code, size) in _SCALARS.items())

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
            self.fail("unexpected end of file: %d bytes needed, %d left" % (n, max(self.size - start, 0)))
        self.f.seek(start)
        data = self.f.read(max(n, CHUNK))
        if len(data) < n:
            self.fail("short read: %d bytes needed, %d read (file changed while reading?)" % (n, len(data)))
        self.buf = data
        self.base = start
        self.pos = 0

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

    def skip(self, n):
        if n > self.left():
            self.fail("%d bytes to skip, only %d left in the file" % (n, self.left()))
        self.pos += n

    def raw_string(self, what):
        at = self.tell()
        n = self.u64()
        if n > self.left():
            self.fail("%s: string length %d runs past the end of the file (%d bytes left)"
                      % (what, n, self.left()), at)
        if n > MAX_STRING:
            self.fail("%s: string of %d bytes is longer than the %d this reader accepts" % (what, n, MAX_STRING), at)
        self.kept += n
        if self.kept > MAX_KEPT_BYTES:
            self.fail("%s: more than %d bytes of metadata strings" % (what, MAX_KEPT_BYTES), at)
        return self.take(n)

    def name_string(self, what):
        """A key or tensor name: strict UTF-8."""
        at = self.tell()
        raw = self.raw_string(what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.fail("%s is not valid UTF-8 (%s)" % (what, exc.reason), at)

    def value_string(self, what):
        raw = self.raw_string(what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.warnings.append("%s: a string value is not valid UTF-8 (decoded with replacement characters)"
                                 % what)
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
        return self.fail("%s: unknown value type %d" % (what, vtype), self.tell() - 4)

    def array_header(self, depth, what):
        """Read an array's element type and count; check the count against the rest of the file."""
        at = self.tell()
        if depth > MAX_DEPTH:
            self.fail("%s: arrays nested deeper than %d" % (what, MAX_DEPTH), at)
        itype = self.u32()
        count = self.u64()
        if itype in _SCALARS:
            min_size = _SCALARS[itype][1]
        elif itype == GGUF_TYPE_STRING:
            min_size = 8
        elif itype == GGUF_TYPE_ARRAY:
            min_size = 12
        else:
            return self.fail("%s: unknown array element type %d" % (what, itype), at)
        if count * min_size > self.left():
            self.fail("%s: array of %d %s elements needs at least %d bytes, only %d left in the file"
                      % (what, count, VALUE_TYPE_NAMES[itype], count * min_size, self.left()), at)
        return itype, count

    def array(self, depth, what):
        itype, count = self.array_header(depth, what)
        entry = _SCALARS.get(itype)
        if entry is not None:
            nbytes = count * entry[1]
            if count > KEEP_NUMBERS:
                self.pos += nbytes  # checked against the file by array_header
                return SkippedArray(itype, count)
            data = self.take(nbytes)
            return list(struct.unpack_from("%s%d%s" % (self.prefix, count, entry[0]), data))
        if itype == GGUF_TYPE_STRING:
            if count > KEEP_LISTS:
                self.skip_strings(count, what)
                return SkippedArray(itype, count)
            return [self.value_string(what) for _i in range(count)]
        if count > KEEP_LISTS:
            for _i in range(count):
                self.skip_array(depth + 1, what)
            return SkippedArray(itype, count)
        return [self.array(depth + 1, what) for _i in range(count)]

    def skip_array(self, depth, what):
        itype, count = self.array_header(depth, what)
        entry = _SCALARS.get(itype)
        if entry is not None:
            self.pos += count * entry[1]
        elif itype == GGUF_TYPE_STRING:
            self.skip_strings(count, what)
        else:
            for _i in range(count):
                self.skip_array(depth + 1, what)

    def skip_strings(self, count, what):
        """Walk ``count`` strings (u64 length + bytes) without building them: the hot loop."""
        start = self.tell()
        unpack = self.u64_from
        buf = self.buf
        blen = len(buf)
        pos = self.pos
        left = count
        while left:
            if pos + 8 > blen:
                if self.base + pos + 8 > self.size:
                    self.pos = pos
                    self.check_strings(start, count, what)
                self.pos = pos
                self.fill(8)
                buf = self.buf
                blen = len(buf)
                pos = 0
            limit = blen - 8
            done = 0
            for done in range(1, left + 1):
                pos += 8 + unpack(buf, pos)[0]
                if pos > limit:
                    break
            left -= done
        self.pos = pos
        if self.base + pos > self.size:
            self.check_strings(start, count, what)

    def check_strings(self, start, count, what):
        """Slow path after an overrun: walk the string array again, checking every length, and fail."""
        self.buf = b""
        self.base = start
        self.pos = 0
        for i in range(count):
            at = self.tell()
            n = self.u64()
            if n > self.left():
                self.fail("%s: element %d of %d: string length %d runs past the end of the file (%d bytes left)"
                          % (what, i, count, n, self.left()), at)
            self.pos += n
        self.fail("%s: string array runs past the end of the file" % what, start)


def _pad(offset, alignment):
    return offset + (-offset % alignment)


def _read_header(rd):
    path = rd.path
    if rd.size < 24:
        rd.fail("file of %d bytes is too short for a GGUF header (24 bytes)" % rd.size, 0)
    magic = rd.take(4)
    if magic != GGUF_MAGIC:
        rd.fail("bad magic %r: not a GGUF file" % bytes(magic), 0)
    version = rd.u32()
    byte_order = "little"
    if version & 0xFFFF == 0:
        byte_order = "big"
        rd.set_order(">")
        version = struct.unpack("<I", struct.pack(">I", version))[0]
    if version == 1:
        rd.fail("GGUF version 1 is obsolete and not supported (only versions 2 and 3)", 4)
    if version not in SUPPORTED_VERSIONS:
        rd.fail("unsupported GGUF version %d (only versions 2 and 3)" % version, 4)
    at = rd.tell()
    tensor_count = rd.u64()
    kv_count = rd.u64()
    if kv_count * 13 > rd.left():  # shortest pair: key length, value type, one byte
        rd.fail("%d key/value pairs claimed, but only %d bytes left in the file" % (kv_count, rd.left()), at + 8)
    if tensor_count * 24 > rd.left():  # shortest info: name length, n_dims, type, offset
        rd.fail("%d tensors claimed, but only %d bytes left in the file" % (tensor_count, rd.left()), at)

    metadata = {}
    value_types = {}
    key_offsets = {}
    for index in range(kv_count):
        at = rd.tell()
        key = rd.name_string("key %d" % index)
        if key in metadata:
            rd.fail("duplicate key %r" % key, at)
        vtype = rd.u32()
        if vtype not in VALUE_TYPE_NAMES:
            rd.fail("key %r: unknown value type %d" % (key, vtype), rd.tell() - 4)
        metadata[key] = rd.value(vtype, 0, "key %r" % key)
        value_types[key] = vtype
        key_offsets[key] = at

    alignment = DEFAULT_ALIGNMENT
    if "general.alignment" in metadata:
        alignment = metadata["general.alignment"]
        if value_types["general.alignment"] != GGUF_TYPE_UINT32:
            rd.fail("general.alignment must be a uint32, not %s"
                    % VALUE_TYPE_NAMES[value_types["general.alignment"]], key_offsets["general.alignment"])
        if alignment == 0 or alignment & (alignment - 1):
            rd.fail("general.alignment %d is not a power of two" % alignment, key_offsets["general.alignment"])

    tensors = []
    names = set()
    for index in range(tensor_count):
        at = rd.tell()
        name = rd.name_string("tensor info %d: name" % index)
        if name in names:
            rd.fail("duplicate tensor name %r" % name, at)
        names.add(name)
        n_dims = rd.u32()
        if n_dims > MAX_DIMS:
            rd.fail("tensor %r: n_dims %d is more than %d" % (name, n_dims, MAX_DIMS), rd.tell() - 4)
        dims_at = rd.tell()
        shape = struct.unpack_from("%s%dq" % (rd.prefix, n_dims), rd.take(8 * n_dims))
        elements = 1
        for n in shape:
            if n < 0:
                rd.fail("tensor %r: negative dimension %d in shape %r" % (name, n, tuple(shape)), dims_at)
            elements *= n
        if elements > INT64_MAX:
            rd.fail("tensor %r: shape %r has more than 2**63-1 elements" % (name, tuple(shape)), dims_at)
        type_id = rd.u32()
        offset = rd.u64()
        tensors.append(TensorInfo(name, shape, type_id, offset, None, path, 0, at))

    data_offset = _pad(rd.tell(), alignment)
    for t in tensors:
        if t.type_id in GGML_TYPES:
            try:
                t.nbytes = tensor_nbytes(t.type_id, t.shape)
            except ValueError as exc:
                rd.fail("tensor %r: %s" % (t.name, exc), t.info_offset)
        else:
            rd.warnings.append("%s: tensor %r has unknown ggml type id %d: size unknown"
                               % (path, t.name, t.type_id))
        if t.offset % alignment:
            rd.fail("tensor %r: offset %d is not a multiple of the alignment %d" % (t.name, t.offset, alignment),
                    t.info_offset)
        end = data_offset + t.offset + (t.nbytes or 0)
        if end > rd.size:
            rd.fail("tensor %r: data at bytes %d..%d lies beyond the end of the file (%d bytes)"
                    % (t.name, data_offset + t.offset, end, rd.size), t.info_offset)
    previous = None
    for t in sorted(tensors, key=lambda x: (x.offset, x.nbytes or 0)):
        if previous is not None and t.offset < previous.offset + (previous.nbytes or 0):
            rd.fail("tensor %r (data offset %d) overlaps tensor %r (data offset %d, %d bytes)"
                    % (t.name, t.offset, previous.name, previous.offset, previous.nbytes or 0), t.info_offset)
        if previous is None or t.offset + (t.nbytes or 0) > previous.offset + (previous.nbytes or 0):
            previous = t
    return GGUFFile(path, version, byte_order, metadata, value_types, key_offsets, tensors, alignment,
                    data_offset, rd.size, rd.warnings)


def _file_kind(mode):
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "mode %o" % mode


def read_gguf(path):
    """Read the header of one GGUF file. Raises ``GGUFError`` on anything malformed."""
    path = os.fspath(path) if hasattr(os, "fspath") else path
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer (it has no effect on regular files).
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except (OSError, IOError, ValueError, TypeError) as exc:
        raise GGUFError(path, 0, "cannot open: %s" % (getattr(exc, "strerror", None) or exc))
    try:
        info = os.fstat(fd)
    except (OSError, IOError) as exc:
        os.close(fd)
        raise GGUFError(path, 0, "cannot stat: %s" % exc)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise GGUFError(path, 0, "cannot open: not a regular file (%s)" % _file_kind(info.st_mode))
    fobj = os.fdopen(fd, "rb")
    rd = None
    try:
        with fobj:
            size = info.st_size
            rd = _Reader(path, fobj, size)
            return _read_header(rd)
    except GGUFError:
        raise
    except (struct.error, UnicodeError, OverflowError, MemoryError, ValueError, TypeError, IndexError,
            KeyError, RecursionError, OSError, IOError) as exc:
        offset = rd.tell() if rd is not None else 0
        raise GGUFError(path, offset, "%s: %s" % (type(exc).__name__, exc))


def find_split_files(path):
    """All shards of the split model that ``path`` belongs to, in order (``[path]`` when not split).

    Shard names are ``<base>-NNNNN-of-MMMMM.gguf`` (1-based). A missing shard raises ``GGUFError``.
    """
    path = os.fspath(path) if hasattr(os, "fspath") else path
    folder, name = os.path.split(path)
    match = _SPLIT_RE.match(name)
    if not match:
        return [path]
    number = int(match.group("no"))
    count = int(match.group("count"))
    if not 1 <= number <= count:
        raise GGUFError(path, 0, "the file name says shard %d of %d" % (number, count))
    name_format = "%s-%%0%dd-of-%s.gguf" % (match.group("base").replace("%", "%%"), len(match.group("no")),
                                            match.group("count"))
    files = []
    for i in range(1, count + 1):
        shard = os.path.join(folder, name_format % i)
        if not os.path.isfile(shard):
            raise GGUFError(path, 0, "shard %d of %d is missing: %s" % (i, count, shard))
        files.append(shard)
    return files


def _split_key(gguf, key, expected, what):
    value = gguf.metadata.get(key)
    if value is None:
        raise GGUFError(gguf.path, 0, "%s is missing; the file name says %s" % (key, what))
    if gguf.value_types.get(key) not in _INT_TYPES:
        raise GGUFError(gguf.path, gguf.key_offsets[key], "%s must be an integer, not %s"
                        % (key, VALUE_TYPE_NAMES.get(gguf.value_types.get(key))))
    if value != expected:
        raise GGUFError(gguf.path, gguf.key_offsets[key], "%s is %d but the file name says %s"
                        % (key, value, what))


def read_model(path):
    """Read a model: one GGUF file, or every shard of a split model given any one of them."""
    files = find_split_files(path)
    shards = [read_gguf(f) for f in files]
    first = shards[0]
    count = len(files)
    named_split = bool(_SPLIT_RE.match(os.path.basename(files[0])))
    for number, gguf in enumerate(shards):
        if named_split and (count > 1 or "split.count" in gguf.metadata):
            what = "shard %d of %d" % (number + 1, count)
            _split_key(gguf, "split.count", count, what)
            _split_key(gguf, "split.no", number, what + " (split.no is 0-based)")
        elif not named_split:
            claimed = gguf.metadata.get("split.count")
            if claimed not in (None, 0, 1):
                raise GGUFError(gguf.path, gguf.key_offsets["split.count"],
                                "split.count is %r but the file name has no -NNNNN-of-MMMMM part, "
                                "so the other shards cannot be found" % (claimed,))
    tensors = []
    names = {}
    warnings = []
    for number, gguf in enumerate(shards):
        warnings.extend(gguf.warnings)
        for t in gguf.tensors:
            if t.name in names:
                raise GGUFError(gguf.path, t.info_offset, "tensor %r is also in %s" % (t.name, names[t.name]))
            names[t.name] = gguf.path
            t.file = gguf.path
            t.shard = number
            tensors.append(t)
    total = first.metadata.get("split.tensors.count")
    if total is not None and count > 1 and total != len(tensors):
        raise GGUFError(first.path, first.key_offsets["split.tensors.count"],
                        "split.tensors.count is %r but the %d shards hold %d tensors" % (total, count, len(tensors)))
    architecture = first.metadata.get("general.architecture")
    if not isinstance(architecture, str):
        warnings.append("%s: no string general.architecture" % first.path)
        architecture = None
    return GGUFModel(files, shards, first.metadata, tensors, architecture,
                     sum(g.file_size for g in shards), warnings)
