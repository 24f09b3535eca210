# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The text the inspect playbook prints of a ``gguf_info`` result (``_model_inspection.describe``'s first value):
the lines of the ``gguf_summary_lines`` filter.

Runs on target hosts: standard library only, Python >= 3.9.
"""
from __future__ import annotations

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._tensor_classes import BLOCK_KINDS

SHOW = ("summary", "none", "experts", "all")
_GIB_INT, _MIB_INT = 1024 ** 3, 1024 ** 2  # integer divisors, as the playbook's text divided


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
