"""What ``gguf_info`` reports of a model: the reader, the tensor classes and the proved pattern together.

``report`` is the module's result for a path (``describe`` for a model already read); ``summary_lines`` the text
that the inspect playbook prints of it.

Runs on target hosts: standard library only, Python >= 3.9.
"""
from __future__ import annotations

import os

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import block_index
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_summary import summarize
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_pattern import expert_pattern
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._pattern_check import check_pattern
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._pattern_syntax import PatternError, matcher
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._tensor_classes import BLOCK_KINDS, classify_model
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.error import GGUFError
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.model import read_model

GIB = 1024.0 ** 3
SHOW = ("summary", "none", "experts", "all")
_GIB_INT, _MIB_INT = 1024 ** 3, 1024 ** 2  # integer divisors, as the playbook's text divided


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


def summary_lines(report, show="summary"):
    """The lines the inspect playbook prints of ``report``, a ``gguf_info`` result (``describe``'s first value).

    ``show``: ``summary`` the model, its layer kinds, routed experts and pattern, ending with the
    ``LLM_MOE_OFFLOAD_PATTERN=`` line; ``experts`` or ``all`` one line per tensor of ``report["tensors"]``
    (``name  type  shape  size  class``), or one line saying there is none; ``none`` no line.
    A ``KeyError`` names a key the report lacks. Like the playbook's text, the lines are joined, stripped of
    surrounding white space and split at line ends again (a value holding a line end makes two lines).
    """
    if show not in SHOW:
        raise ValueError("show is %r, not one of %s" % (show, ", ".join(SHOW)))
    if show == "none":
        return []
    lines = _summary(report) if show == "summary" else _tensor_lines(report, show)
    return "\n".join(lines).strip().split("\n")


def _text(value):
    """A value as Ansible's templating prints it (``None`` as nothing)."""
    return "" if value is None else str(value)


def _summary(report):
    files = report["files"]
    kinds = report["layer_kinds"]
    lines = [
        "model (%d file%s, %.2f GiB): %s" % (len(files), "s" if len(files) > 1 else "",
                                             report["file_bytes"] / _GIB_INT, _text(files[0])),
        "architecture: %s, %s blocks, %s tensors (%.2f GiB)" % (
            _text(report["architecture"]), _text(report["block_count"]), _text(report["tensor_count"]),
            report["tensor_bytes"] / _GIB_INT),
    ]
    for kind in BLOCK_KINDS:
        blocks = kinds[kind]
        lines.append("%s layers (%d): %s" % (kind, len(blocks), ",".join(map(_text, blocks)) if blocks else "-"))
    if report["expert_tensors"]:
        by_class = report["bytes"]
        lines += [
            "routed experts: %d tensors, %.2f GiB (%s experts, %s used per token, %s shared)" % (
                len(report["expert_tensors"]), by_class["routed_experts"] / _GIB_INT, _text(report["expert_count"]),
                _text(report["expert_used_count"]), _text(report["expert_shared_count"])),
            "GPU weights with experts offloaded: %.2f GiB (all but experts and token_embd)" % (
                (report["tensor_bytes"] - by_class["routed_experts"] - by_class["token_embd"]) / _GIB_INT),
            "pattern %s matches %d tensors: exactly the routed experts" % (
                _text(report["offload_pattern"]), len(report["offload_pattern_matches"])),
        ]
    else:
        lines.append("routed experts: none, nothing to offload (dense model: use -ngl alone)")
    if "pattern_check" in report:
        check = report["pattern_check"]
        lines.append("your pattern %s: %s" % (_text(check["pattern"]), _text(check["verdict"])))
    lines.append("LLM_MOE_OFFLOAD_PATTERN=" + _text(report["offload_pattern"]))
    return lines


def _tensor_lines(report, show):
    lines = [
        "  ".join((_text(t["name"]), _text(t["type"]), "x".join(map(_text, t["shape"])),
                   "size unknown" if t["bytes"] is None else "%.1f MiB" % (t["bytes"] / _MIB_INT), _text(t["class"])))
        for t in report.get("tensors") or []]
    return lines or ["no routed-expert tensors" if show == "experts" else "no tensors"]
