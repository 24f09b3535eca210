# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Texts of the llm_server role's result: the cause of a failed task in one line, the parity line, and the line
that says at the default verbosity what a run did on one host.

Standard library only; runs on the controller.
"""

from __future__ import annotations

import json

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import mib, mib_text, shorten


def failure_cause(failed_result, failed_task=None):
    """The cause of a failed task in one line: its message, or for a command the end of what it printed
    (``Argument list too long`` rather than ``non-zero return code``)."""
    result = failed_result or {}
    msg = str(result.get("msg") or "").strip()
    if msg.startswith("llm_server: "):
        msg = msg[len("llm_server: "):]
    if result.get("cause"):
        return str(result["cause"])
    if msg == "failed to validate":  # the validate of the .env template: the compose tool's own words
        printed = str(result.get("stderr") or result.get("stdout") or "")
        lines = [line.strip() for line in printed.splitlines() if line.strip()]
        return "the compose tool refused the new .env with the new compose file (nothing was replaced): %s" % (
            " | ".join(lines[-3:]) or "exit %s" % result.get("exit_status"))
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


def result_line(result):
    """What a run did on one host, in one line, from its ``llm_server_result``: the status, then the message of a
    failure or a rollback, else the pattern and its source, the tensors in host memory, the VRAM that frees (the
    plan's routed-expert MiB on a GPU host), the model's bytes when this run fetched it, the speed when it was
    measured; and the seconds the run took."""
    head = "%s: %s" % (result.get("host") or "?", result.get("status") or "?")
    took = (result.get("timings") or {}).get("total")
    tail = [] if took is None else ["%.1f s" % took]
    if result.get("status") in ("failed", "rolled_back"):
        return ", ".join([head + ": " + shorten(result.get("message") or "", 400)] + tail)
    pattern = result.get("pattern") or ""
    parts = [head, "--override-tensor %s=CPU (%s)" % (pattern, result.get("pattern_source")) if pattern
             else "no offload pattern"]
    moved = len(result.get("tensors_moved") or [])
    plan = result.get("plan") or {}
    experts = (plan.get("host") or {}).get("experts_mib")
    parts.append("%d tensors in host memory" % moved)
    if plan.get("gpus"):
        parts.append("%s of VRAM freed" % mib_text(experts or 0, unit=" MiB"))
    elif plan:
        parts.append("no GPU")
    fetched = result.get("model_fetch") or {}
    if fetched.get("bytes"):
        parts.append("model fetched: %s in %.1f s" % (mib_text(mib(fetched["bytes"]), unit=" MiB"),
                                                      fetched.get("seconds") or 0))
    speed = result.get("speed") or {}
    if speed.get("decode_tokens_per_second") is not None:
        parts.append("decode %.1f, prompt %.1f tokens/s" % (
            speed["decode_tokens_per_second"], speed.get("prompt_tokens_per_second") or 0.0))
    return ", ".join(parts + tail)
