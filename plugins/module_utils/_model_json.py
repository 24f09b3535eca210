# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A model as JSON: a compact summary of its GGUF header, so that a model is read once and passed on.

Standard library only: this runs on target hosts (Python >= 3.9).

``summarize(model)`` is what ``gguf_info`` returns as ``model``: the architecture, the files, the metadata the
memory model reads (``general.architecture``, every ``<arch>.*`` key, the vocabulary size) and one row
``[name, type_id, shape, bytes]`` per tensor. ``read_summary(summary)`` turns it back into metadata and tensor
records for ``_tensor_classes.classify_model`` and ``_model_facts.model_facts``, without opening a file.
"""

from __future__ import annotations

from dataclasses import dataclass

from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.keys import General, Tokenizer, arch_prefix

SUMMARY_VERSION = 1
_NUMBER = (int, float)


class SummaryError(ValueError):
    """A summary that is not what ``summarize`` writes: ``str()`` names the field."""


@dataclass(frozen=True)
class SummaryTensor:
    """One tensor of a summary (the fields ``_tensor_classes`` and ``_model_facts`` read)."""

    name: str
    type_id: int | None
    shape: tuple
    nbytes: int | None


@dataclass(frozen=True)
class CountedArray:
    """A long metadata array (the token list) kept as its length only."""

    count: int

    def __len__(self):
        return self.count


def _plain(value):
    """A metadata value as JSON: long skipped arrays (``.count`` without items) become ``{"count": n}``."""
    count = getattr(value, "count", None)
    if isinstance(count, int) and not isinstance(value, (list, tuple, str)):
        return {"count": count}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def summarize(model):
    """The summary of a ``gguf.model.GGUFModel``: a dict of JSON types only."""
    arch = model.architecture or ""
    metadata = dict((key, _plain(value)) for key, value in model.metadata.items()
                    if key == General.ARCHITECTURE or (arch and key.startswith(arch_prefix(arch))))
    tokens = model.metadata.get(Tokenizer.LIST)
    if tokens is not None:
        metadata[Tokenizer.LIST] = {"count": len(tokens)}
    return {
        "version": SUMMARY_VERSION,
        "architecture": arch,
        "files": list(model.files),
        "metadata": metadata,
        "tensors": [[t.name, t.type_id, list(t.shape), t.nbytes] for t in model.tensors],
        "warnings": list(model.warnings),
    }


def _restore(value):
    if isinstance(value, dict) and set(value) == {"count"} and isinstance(value["count"], int):
        return CountedArray(value["count"])
    if isinstance(value, list):
        return [_restore(v) for v in value]
    return value


def read_summary(summary, where="model"):
    """``(architecture, metadata, tensors, files, warnings)`` of a summary; ``SummaryError`` names the bad field."""
    if not isinstance(summary, dict):
        raise SummaryError("%s must be the model summary of gguf_info (a dict), got %s" % (
            where, type(summary).__name__))
    if summary.get("version") != SUMMARY_VERSION:
        raise SummaryError("%s.version is %r: this collection reads model summaries of version %d (run gguf_info "
                           "of this collection again)" % (where, summary.get("version"), SUMMARY_VERSION))
    arch = summary.get("architecture")
    metadata = summary.get("metadata")
    rows = summary.get("tensors")
    files = summary.get("files") or []
    if not isinstance(arch, str):
        raise SummaryError("%s.architecture must be a string" % where)
    if not isinstance(metadata, dict):
        raise SummaryError("%s.metadata must be a dict" % where)
    if not isinstance(rows, list) or not rows:
        raise SummaryError("%s.tensors must be a non-empty list of [name, type_id, shape, bytes]" % where)
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise SummaryError("%s.files must be a list of paths" % where)
    tensors = []
    for position, row in enumerate(rows):
        if not (isinstance(row, (list, tuple)) and len(row) == 4 and isinstance(row[0], str)
                and (row[1] is None or isinstance(row[1], int)) and isinstance(row[2], (list, tuple))
                and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in row[2])
                and (row[3] is None or (isinstance(row[3], int) and row[3] >= 0))):
            raise SummaryError("%s.tensors[%d] must be [name, type_id, shape, bytes], got %r" % (
                where, position, row))
        tensors.append(SummaryTensor(row[0], row[1], tuple(row[2]), row[3]))
    restored = dict((key, _restore(value)) for key, value in metadata.items())
    warnings = [w for w in summary.get("warnings") or [] if isinstance(w, str)]
    return arch, restored, tensors, files, warnings
