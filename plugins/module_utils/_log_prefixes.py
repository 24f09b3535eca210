# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The prefixes a llama-server log line picks up (llama.cpp's own timestamp, level and component; a container
runtime's, journald's, compose's, a collector's), removed before ``_llama_log`` reads the message.

Standard library only (runs on target hosts, Python >= 3.9).
"""
from __future__ import annotations

import re

__all__ = ["MAX_WRAPPERS", "strip_prefixes"]

MAX_WRAPPERS = 8       # nested prefixes removed from one line (a timestamp inside a compose prefix...)

# ANSI colour sequences (--log-colors on, or colourised chat-template diagnostics).
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_SPACES = re.compile(r"\s*")
# Prefixes that the log picks up on its way to the reader, removed (each optional, in any order):
# - a container runtime's timestamp (`docker logs -t`, `podman logs -t`): "2025-08-20T11:41:20.014123456Z ";
# - a timestamp with a space and a bar, as some log collectors export: "2026-05-16 22:21:42.654 | ";
# - journald (`journalctl -u ...`): "Apr 17 23:09:42 athena ollama[2840147]: ", or without the hostname
#   (`journalctl --no-hostname`, or an export that drops it): "Sep 26 10:33:42 ollama[6664]: ";
# - "ai-llm-1  | " / "ai-llm | " / "[ai-llm] | ": the service prefix of `docker compose logs` / `podman-compose logs`;
# - "[47161] ": the llama-server router (--models-preset/--models-dir) prefixes every child line with its port;
# - the loader's progress dots ("....") are printed without a newline, so the next line can be glued to them.
# (Used with .match(line, pos): each is anchored where the previous one ended.)
_WRAPPERS = (
    re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)? "),
    re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)? +\| ?"),
    # (without the hostname, the ident must carry its "[pid]": "Sep 26 10:33:42 llama_context: ..." is no prefix)
    re.compile(r"[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d (?:[^\s\[\]:]+ [\w.@/-]+(?:\[\d+\])?|[\w.@/-]+\[\d+\]): "),
    re.compile(r"\[?[A-Za-z0-9][\w.-]*\]?\s*\| ?"),
    re.compile(r"\[\d+\] "),
    re.compile(r"\.+"),
)
# Optional "0.00.011.842 D " (timestamp + level letter), or just the level letter, then an optional
# component tag of the newer common logger ("srv  ", "cmn  ", "slot ", "que  ", "spec ").
_PREFIX = re.compile(
    r"(?:(?P<ts>\d+(?:\.\d+){3}) )?(?:(?P<lvl>[IWEDT]) )?"
    r"(?:(?:srv|cmn|slot|que|spec|main|ctx|res) +(?=\S+:))?"
)


def strip_prefixes(line):
    """Return (level letter or None, the message without timestamp/level/component/wrapper prefixes).

    Linear in the line: the prefixes are matched in place (no copies), at most ``MAX_WRAPPERS`` rounds.
    """
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    pos = _SPACES.match(line).end()
    for _round in range(MAX_WRAPPERS):
        start = pos
        for rx in _WRAPPERS:
            m = rx.match(line, pos)
            if m and m.end() > pos:
                pos = _SPACES.match(line, m.end()).end()
        if pos == start:
            break
    m = _PREFIX.match(line, pos)
    return m.group("lvl"), line[m.end():].rstrip()
