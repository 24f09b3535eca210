# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where the files of a model fetched onto the host come from: its URLs, each paired with its path on the host, the
URLs as logs may show them, and the sha256 each file must have.

Standard library only, Python >= 3.9; runs on the target hosts (``_model_fetch``, and the checks of the deploy's
values).

``llm_server_model_url`` is one URL, or one per shard in order. One URL named as llama.cpp's gguf-split names shards
(``<base>-00001-of-00006.gguf``) stands for all six; the host names follow the same rule from
``llm_server_model_path``, which llama.cpp needs to find the other shards. ``llm_server_model_sha256`` is one sha256
per file, or the URL of a ``SHA256SUMS`` file.
"""

from __future__ import annotations

import posixpath
import re
import urllib.parse

from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.model import shard_name, split_name

SCHEMES = ("http", "https")
_HEX_RE = re.compile(r"^[0-9a-fA-F]{64}$")
_SUMS_LINE_RE = re.compile(r"^([0-9a-fA-F]{64}) [ *]?(.+)$")


class FetchError(Exception):
    """A model that cannot be fetched; the message names the URL or the file and what is wrong."""


def url_problem(url):
    """Why ``url`` cannot be a model's URL (not http or https, no host, credentials in it), or ``""``."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as exc:
        return "%s is not a URL: %s" % (url, exc)
    if parts.scheme not in SCHEMES:
        return "%s is not an http or https URL" % url
    if not parts.hostname:
        return "%s has no host" % url
    try:
        if parts.port == 0:
            raise ValueError("Port 0 cannot be connected to")
    except ValueError as exc:  # not a number, or out of range: display_url and urllib would raise it later
        return "%s://%s has a bad port: %s" % (parts.scheme, parts.hostname, exc)
    if parts.username or parts.password:
        return "%s holds credentials, which would show in logs: give them in llm_server_model_headers" % (
            display_url(url))
    return ""


def display_url(url):
    """``url`` without credentials and without its query (a signed URL's query is a credential)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = "[%s]" % host
    if parts.port:
        host += ":%d" % parts.port
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def _url_name(url):
    return urllib.parse.unquote(posixpath.basename(urllib.parse.urlsplit(url).path))


def _with_name(url, name):
    parts = urllib.parse.urlsplit(url)
    path = posixpath.join(posixpath.dirname(parts.path), urllib.parse.quote(name))
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def sources(urls, model_path):
    """``[(url, host path)]`` of every file of the model: ``urls`` is one URL (a first shard named as gguf-split
    names shards stands for all of them) or one per shard in order; the host names come from ``model_path`` by
    the same rule. ``FetchError`` when they cannot be paired."""
    urls = [str(u) for u in urls]
    if not urls:
        raise FetchError("llm_server_model_url is empty")
    for url in urls:
        problem = url_problem(url)
        if problem:
            raise FetchError("llm_server_model_url: " + problem)
    if len(urls) == 1:
        name = _url_name(urls[0])
        named = split_name(name)
        if named and named[2] > 1:
            number, count = named[1], named[2]
            if number != 1:
                raise FetchError("llm_server_model_url: %s names shard %d of %d: give the first shard's URL"
                                 % (display_url(urls[0]), number, count))
            urls = [_with_name(urls[0], shard_name(name, i)) for i in range(1, count + 1)]
    if len(urls) == 1:
        return [(urls[0], model_path)]
    folder, name = posixpath.split(model_path)
    named = split_name(name)
    if not named or named[1] != 1 or named[2] != len(urls):
        raise FetchError("llm_server_model_path: %s must be named as the first of %d shards "
                         "(<name>-%05d-of-%05d.gguf), the names llama.cpp looks for the other shards under"
                         % (model_path, len(urls), 1, len(urls)))
    return [(url, posixpath.join(folder, shard_name(name, i))) for i, url in enumerate(urls, 1)]


def expected_sums(sha256, files, get_text):
    """The sha256 each of ``files`` (``[(url, path)]``) must have: ``sha256`` is one hex per file, or the URL of a
    ``SHA256SUMS`` file (``<hex>  <name>`` lines, as sha256sum writes them) that ``get_text`` fetches; empty
    checks nothing (``[None, ...]``)."""
    sha256 = [str(s).strip() for s in sha256 or [] if str(s).strip()]
    if not sha256:
        return [None] * len(files)
    url = sums_url_of(sha256)
    if url:
        problem = url_problem(url)
        if problem and "://" in url:
            raise FetchError("llm_server_model_sha256: " + problem)
        if problem:
            raise FetchError("llm_server_model_sha256: %s is neither a sha256 (64 hex digits) nor a SHA256SUMS URL"
                             % url)
        sums = {}
        for line in get_text(url).splitlines():
            match = _SUMS_LINE_RE.match(line.strip())
            if match:
                sums[posixpath.basename(match.group(2).strip())] = match.group(1).lower()
        found = []
        for url, _path in files:
            name = _url_name(url)
            if name not in sums:
                raise FetchError("llm_server_model_sha256: %s lists no sha256 for %s" % (display_url(url), name))
            found.append(sums[name])
        return found
    bad = [s for s in sha256 if not _HEX_RE.match(s)]
    if bad:
        raise FetchError("llm_server_model_sha256: %r is not a sha256 (64 hex digits)" % bad[0])
    if len(sha256) != len(files):
        raise FetchError("llm_server_model_sha256 holds %d sha256 for the model's %d file(s)"
                         % (len(sha256), len(files)))
    return [s.lower() for s in sha256]


def sums_url_of(sha256):
    """The ``SHA256SUMS`` URL ``llm_server_model_sha256`` gives, or ``""`` (hex digits, or nothing)."""
    values = [str(v).strip() for v in sha256 or [] if str(v).strip()]
    return values[0] if len(values) == 1 and not _HEX_RE.match(values[0]) else ""
