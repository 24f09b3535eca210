# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The inspection of a model, what ``gguf_info`` reports: the reader, the tensor classes and the proved offload
pattern together.

``report`` is the module's result for a path (``describe`` for a model already read), data for the planner and
the playbooks; ``_inspection_text.summary_lines`` is the text that the inspect playbook prints of it.

Runs on target hosts: standard library only, Python >= 3.9.
"""
from __future__ import annotations

import os

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import block_index
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_json import summarize
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_pattern import expert_pattern
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._pattern_check import check_pattern
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._pattern_syntax import PatternError, matcher
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._tensor_classes import classify_model
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.error import GGUFError
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.model import read_model

GIB = 1024.0 ** 3


class ReportError(Exception):
    """A model that cannot be reported: ``str()`` names the file and the reason; ``fields`` are the keys the
    failed result carries besides ``msg`` (``path``, ``offset`` and ``reason`` of a malformed file)."""

    def __init__(self, message, fields=None):
        super().__init__(message)
        self.fields = dict(fields or {})


def report(path, tensors="experts", pattern=None):
    """``describe`` of the GGUF file ``path`` (any shard of a split model), read once; raises ``ReportError``."""
    if not os.path.exists(path):
        raise ReportError("%s: %s" % (path, "a broken symbolic link or a symlink loop" if os.path.lexists(path)
                                      else "no such file"))
    if os.path.isdir(path):
        raise ReportError("%s: is a directory, not a .gguf file" % path)
    try:
        model = read_model(path)
    except GGUFError as exc:
        raise ReportError(str(exc), {"path": exc.path, "offset": exc.offset, "reason": exc.reason}) from None
    try:
        return describe(model, tensors, pattern)
    except PatternError as exc:
        raise ReportError("%s: %s" % (path, exc)) from None


def describe(model, tensors="experts", pattern=None):
    """The module's result (without ``changed``) and the warnings, for a ``GGUFModel``."""
    layout = classify_model(model.architecture, model.metadata, model.tensors)
    names = [t.name for t in model.tensors]
    offload = expert_pattern(names, layout.expert_tensors)
    found = matcher(offload) if offload else None
    matches = sorted(n for n in names if found(n)) if found else []
    moe_blocks = len(layout.expert_tensors_by_block)
    if layout.expert_tensors:
        msg = "%s: %d routed-expert tensors (%.2f GiB) in %d MoE blocks; offload pattern %s" % (
            model.architecture, len(layout.expert_tensors), layout.bytes_by_class["routed_experts"] / GIB,
            moe_blocks, offload)
    else:
        msg = "%s: no routed-expert tensors, nothing to offload (a dense model: use -ngl alone)" % (
            model.architecture,)
    result = dict(
        msg=msg, architecture=model.architecture, files=list(model.files), file_bytes=model.file_bytes,
        tensor_count=len(names), tensor_bytes=layout.total_bytes, block_count=layout.block_count,
        layer_kinds=layout.layer_kinds, expert_count=layout.expert_count,
        expert_used_count=layout.expert_used_count, expert_shared_count=layout.expert_shared_count,
        bytes=layout.bytes_by_class, expert_tensors=layout.expert_tensors, offload_pattern=offload,
        offload_pattern_matches=matches,
        model=summarize(model),  # what moe_offload_plan reads instead of the file
    )
    if tensors != "none":
        result["tensors"] = [
            dict(name=t.name, type=t.type_name.lower(), shape=list(t.shape), bytes=t.nbytes,
                 block=block_index(t.name), file=t.file, **{"class": layout.tensor_class[t.name]})
            for t in model.tensors if tensors == "all" or layout.tensor_class[t.name] == "routed_experts"]
    if pattern is not None:
        result["pattern_check"] = check_pattern(pattern, names, layout.expert_tensors, layout.tensor_class)
    return result, list(model.warnings) + list(layout.warnings)
