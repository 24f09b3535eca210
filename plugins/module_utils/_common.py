# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Small jobs that host and controller code share, each with one home: hashing, reading a file, integers from
metadata, MiB and cutting text to a width. Standard library only (this file runs on the target hosts)."""
from __future__ import annotations

import hashlib

MIB = 1024 * 1024


def sha256_hex(data):
    """The SHA-256 of ``data`` in hex; ``None`` for ``None`` (no file)."""
    return None if data is None else hashlib.sha256(data).hexdigest()


def read_bytes(path, missing=(FileNotFoundError,)):
    """The bytes of the file ``path``; ``None`` when reading it raises one of ``missing`` (by default: it does not
    exist; ``OSError`` also takes a directory or an unreadable file in its place for none)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except missing:
        return None


def as_int(value, default=None, bool_as_int=False, whole_floats=True):
    """``value`` as an ``int`` when it is one (a float without a fraction too, unless not ``whole_floats``), else
    ``default``.

    A ``bool`` is an ``int`` in Python but rarely meant as one: ``default`` unless ``bool_as_int`` (GGUF metadata
    written as a bool where llama.cpp reads an integer counts as 0 or 1, as llama.cpp's loader reads it)."""
    if isinstance(value, bool):
        return int(value) if bool_as_int else default
    if isinstance(value, int):
        return value
    if whole_floats and isinstance(value, float) and value.is_integer():
        return int(value)
    return default


def mib(nbytes):
    """Bytes to MiB, rounded to 0.01 as llama.cpp prints them."""
    return round(nbytes / float(MIB), 2)


def mib_text(value, decimals=1, unit=""):
    """MiB as a report writes them: thousands separated, ``decimals`` places, then ``unit``; ``"-"`` for ``None``
    (not known)."""
    return "-" if value is None else "{:,.{}f}{}".format(value, decimals, unit)


def shorten(text, limit, marker="..."):
    """``text`` when it has at most ``limit`` characters, else its start and ``marker``, ``limit`` in all."""
    text = "" if text is None else str(text)
    return text if len(text) <= limit else text[:max(0, limit - len(marker))] + marker
