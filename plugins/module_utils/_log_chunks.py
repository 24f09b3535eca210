# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read a log in chunks of whole lines, whatever it comes as: text, bytes, a file object or an iterable of lines.

Standard library only (runs on target hosts, Python >= 3.9).

The log is read ``CHUNK`` characters at a time, a line longer than ``MAX_LINE`` characters in pieces, and bytes
that are not UTF-8 are replaced (lone surrogates too: Ansible refuses a result that holds one), so that a parser fed
these chunks reads a log of any size in bounded memory. ``_llama_log`` parses llama-server's logs with it.
"""
from __future__ import annotations

import io
import re

MAX_LINE = 1 << 20      # characters of one line parsed at a time (a longer line is read in pieces)
CHUNK = 1 << 20         # characters read at a time

_SURROGATE = re.compile("[\ud800-\udfff]")


def _clean(text):
    """``text`` with lone surrogates replaced: Ansible decodes undecodable bytes of a command's output as surrogates
    (surrogateescape), and refuses a module result that holds one ("Refusing to deserialize an invalid UTF8
    string")."""
    if not _SURROGATE.search(text):
        return text
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raw = text.encode("utf-8", "surrogatepass")
    return raw.decode("utf-8", "replace")


def _pieces(source):
    """Pieces of the text of ``source`` (universal newlines, bytes that are not UTF-8 replaced)."""
    if isinstance(source, str):
        stream = io.StringIO(source, newline=None)
    elif isinstance(source, (bytes, bytearray)):
        stream = io.TextIOWrapper(io.BytesIO(source), encoding="utf-8", errors="replace", newline=None)
    elif hasattr(source, "read"):
        if isinstance(source, io.TextIOBase):
            stream = source
        else:
            stream = io.TextIOWrapper(source, encoding="utf-8", errors="replace", newline=None)
    else:  # an iterable of lines
        for item in source:
            if isinstance(item, (bytes, bytearray)):
                item = item.decode("utf-8", "replace")
            item = _clean(item.replace("\r\n", "\n").replace("\r", "\n"))
            yield item if item.endswith("\n") else item + "\n"
        return
    while True:
        piece = stream.read(CHUNK)
        if not piece:
            return
        yield _clean(piece)


def iter_chunks(source):
    """The text of ``source`` in chunks of whole lines, each line ended by ``\\n``; a line longer than
    ``MAX_LINE`` characters comes in pieces. ``source``: a ``str``, ``bytes``, a text or binary file object, or an
    iterable of lines (``str`` or ``bytes``)."""
    if source is None:
        return
    carry = ""
    size = 0
    pending = []
    for piece in _pieces(source):
        pending.append(piece)
        size += len(piece)
        if size < CHUNK:
            continue
        text = carry + "".join(pending)
        pending, size = [], 0
        cut = text.rfind("\n") + 1
        chunk, carry = text[:cut], text[cut:]
        while len(carry) > MAX_LINE:
            chunk += carry[:MAX_LINE] + "\n"
            carry = carry[MAX_LINE:]
        if chunk:
            yield chunk
    text = carry + "".join(pending)
    while len(text) > MAX_LINE:
        cut = text.rfind("\n", 0, MAX_LINE) + 1 or MAX_LINE
        yield text[:cut] if text[cut - 1] == "\n" else text[:cut] + "\n"
        text = text[cut:]
    if text:
        yield text if text.endswith("\n") else text + "\n"
