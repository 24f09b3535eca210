# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read a GGUF model (llama.cpp's model format): one file, or every shard of a split model, headers only.

Standard library only; runs on target hosts (Python >= 3.9).

Split models are named ``<base>-NNNNN-of-MMMMM.gguf`` (1-based), as llama.cpp's gguf-split writes them: each
shard is a whole GGUF file with ``split.no`` (0-based) and ``split.count``; the first holds the model's keys and
``split.tensors.count``. Each file's header is read by ``header.read_gguf`` (its values by
``values``); every malformed input raises ``GGUFError(path, offset, reason)``, never another exception type.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Optional

from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.error import GGUFError
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.header import read_gguf
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.keys import General, Split
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.values import INT_TYPES, VALUE_TYPE_NAMES

_SPLIT_RE = re.compile(r"^(?P<base>.+)-(?P<no>[0-9]{5,})-of-(?P<count>[0-9]{5,})\.gguf$")


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


def split_name(name):
    """``(base, number, count, width, count_text)`` of a file name that gguf-split's naming gives a shard
    (``<base>-NNNNN-of-MMMMM.gguf``, 1-based), else ``None``."""
    match = _SPLIT_RE.match(name)
    if not match:
        return None
    return (match.group("base"), int(match.group("no")), int(match.group("count")), len(match.group("no")),
            match.group("count"))


def shard_name(name, number):
    """The name of shard ``number`` (1-based) of the split model whose shard ``name`` is (``split_name``)."""
    base, _no, _count, width, count_text = split_name(name)
    return f"{base}-{number:0{width}d}-of-{count_text}.gguf"


def find_split_files(path):
    """All shards of the split model that ``path`` belongs to, in order (``[path]`` when not split).

    Shard names are ``<base>-NNNNN-of-MMMMM.gguf`` (1-based). A missing shard raises ``GGUFError``.
    """
    path = os.fspath(path)
    folder, name = os.path.split(path)
    named = split_name(name)
    if not named:
        return [path]
    number, count = named[1], named[2]
    if not 1 <= number <= count:
        raise GGUFError(path, 0, f"the file name says shard {number} of {count}")
    files = []
    for i in range(1, count + 1):
        shard = os.path.join(folder, shard_name(name, i))
        if not os.path.isfile(shard):
            raise GGUFError(path, 0, f"shard {i} of {count} is missing: {shard}")
        files.append(shard)
    return files


def _split_key(gguf, key, expected, what):
    value = gguf.metadata.get(key)
    if value is None:
        raise GGUFError(gguf.path, 0, f"{key} is missing; the file name says {what}")
    if gguf.value_types.get(key) not in INT_TYPES:
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
