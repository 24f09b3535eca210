# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read the header of one GGUF file (llama.cpp's model format) without reading tensor data.

Standard library only; runs on target hosts (Python >= 3.9).

What it reads: GGUF v2 and v3, little- and big-endian (v3 has no marker: a version whose low 16 bits
are zero means the file is byte-swapped), the metadata (its values through ``values``), the tensor
infos and ``general.alignment``. Every malformed input raises ``GGUFError(path, offset, reason)``, never another
exception type.

Choices (documented for the users of this reader), as llama.cpp's ggml/src/gguf.cpp ``gguf_init_from_file_impl``:

* duplicate or empty metadata keys, duplicate tensor names and names of GGML_MAX_NAME (64) bytes or more are
  errors (llama.cpp refuses them too);
* ``n_dims`` may be 0..4; an unknown ggml type id gives ``type_name`` ``"unknown(N)"``, ``nbytes``
  ``None`` and a "size unknown" warning (newer ggml builds add types); an id that ggml removed
  (``types.REMOVED_TYPE_IDS``, such as 4, Q4_2) is an error, as llama.cpp's loader refuses it; ``ne0`` that is
  not a multiple of the type's block size is an error;
* tensor offsets must be multiples of the alignment, lie (with their bytes) inside the file and not overlap
  (gaps are allowed).
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass, field
from typing import Optional

from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.types import (
    GGML_MAX_DIMS,
    GGML_MAX_NAME,
    GGML_TYPES,
    REMOVED_TYPE_IDS,
    REMOVED_TYPE_NAMES,
    tensor_nbytes,
    type_name,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.error import GGUFError
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.keys import General
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.values import (
    GGUF_TYPE_UINT32,
    VALUE_TYPE_NAMES,
    ValueReader,
)

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
INT64_MAX = (1 << 63) - 1


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
        rd = ValueReader(path, fd, info.st_size)
        return _read_header(rd, shard)
    except GGUFError:
        raise
    except (struct.error, UnicodeError, OverflowError, MemoryError, ValueError, TypeError, IndexError,
            KeyError, RecursionError, OSError) as exc:
        offset = rd.tell() if rd is not None else 0
        raise GGUFError(path, offset, f"{type(exc).__name__}: {exc}") from None
    finally:
        os.close(fd)
