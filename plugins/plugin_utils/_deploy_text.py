# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Texts of the llm_server role's result: the cause of a failed task in one line, and the parity line.

Standard library only; runs on the controller.
"""

from __future__ import annotations

import json

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import shorten


def failure_cause(failed_result, failed_task=None):
    """The cause of a failed task in one line: its message, or for a command the end of what it printed
    (``Argument list too long`` rather than ``non-zero return code``)."""
    result = failed_result or {}
    msg = str(result.get("msg") or "").strip()
    if msg.startswith("llm_server: "):
        msg = msg[len("llm_server: "):]
    if result.get("cause"):
        return str(result["cause"])
    if not msg or msg.startswith("non-zero return code") or msg == "MODULE FAILURE":
        printed = str(result.get("stderr") or result.get("module_stderr") or result.get("stdout") or "")
        lines = [line.strip() for line in printed.splitlines() if line.strip()]
        cmd = result.get("cmd")
        cmd = " ".join(cmd) if isinstance(cmd, list) else (cmd or (failed_task or {}).get("name") or "a command")
        if lines:
            shown = shorten(cmd, 120)
            return "%s failed (rc=%s): %s" % (shown, result.get("rc"), " | ".join(lines[-3:]))
    return msg or "the task %s failed" % ((failed_task or {}).get("name") or "?")


def parity_text(settings, parity, note=None):
    """The parity line of the result: identical, off, or why there was no baseline."""
    if not settings.get("parity_check"):
        return "off"
    parity = parity or {}
    if parity.get("after"):
        return "identical: %d tokens %s" % (len(parity["after"].get("tokens") or []),
                                            json.dumps(parity["after"].get("content") or ""))
    return note or "no baseline (nothing served before this deploy)"
