# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A model fetched onto the host over HTTP(S): its files (one, or every shard of a split model), their sizes and
checksums, the free disk, the download itself (resumable, in pieces of a few seconds) and the record of what the
role fetched, which the clean-up reads.

Standard library only, Python >= 3.9; runs on the target hosts (the module ``llm_server_model``).

- Sources: ``llm_server_model_url`` is one URL, or one per shard in order. One URL named as llama.cpp's gguf-split
  names shards (``<base>-00001-of-00006.gguf``) stands for all six; the host names follow the same rule from
  ``llm_server_model_path``, which llama.cpp needs to find the other shards.
- Bytes go to ``<file>.part`` and are appended with a ``Range`` request from what is there, so a cut download
  (a killed run, a dropped connection, the end of a piece) goes on where it stopped. A complete part is checked
  (the sha256, a GGUF header, the shard's ``split.no`` and ``split.count``) and only then renamed; a part that
  fails is removed, so the host holds what it held before.
- The record (``RECORD_NAME`` in the project directory) holds every file with its size, mtime and sha256: a file
  whose size and mtime are still those recorded is neither fetched nor hashed again.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import http.client
import json
import os
import posixpath
import re
import time
import urllib.error
import urllib.parse
import urllib.request

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import MIB, read_bytes
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_files import (
    LINKS,
    SnapshotError,
    atomic_write,
    read_snapshot,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_render import parse_env
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.error import GGUFError
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.header import read_gguf
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.keys import Split
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.model import shard_name, split_name

RECORD_NAME = ".llm_server_models.json"
PART_SUFFIX = ".part"
SCHEMES = ("http", "https")
MAX_REDIRECTS = 10
CHUNK = MIB
# A GGUF file starts with these bytes in either byte order (ggml.h GGUF_MAGIC "GGUF").
MAGICS = (b"GGUF",)
_HEX_RE = re.compile(r"^[0-9a-fA-F]{64}$")
_SUMS_LINE_RE = re.compile(r"^([0-9a-fA-F]{64}) [ *]?(.+)$")


class FetchError(Exception):
    """A model that cannot be fetched; the message names the URL or the file and what is wrong."""


# --- where the files come from and go ---------------------------------------------------------------------------


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
    url = _sums_url(sha256)
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


# --- HTTP -------------------------------------------------------------------------------------------------------


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are followed by ``open_url``, which drops the headers on another host and names a loop."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def _origin(url):
    parts = urllib.parse.urlsplit(url)
    return parts.scheme, parts.netloc


def open_url(url, headers=None, method="GET", start=0, timeout=30.0, byte_range=None):
    """``(response, final url)`` of a request that answered 2xx, redirects followed (at most ``MAX_REDIRECTS``;
    ``headers``, the token among them, only go to the first URL's scheme and host: never to another host, nor in
    clear text after a redirect from https to http). ``start`` asks for the bytes from there, ``byte_range`` for
    ``bytes=<byte_range>`` (``Range``, sent to every host). ``FetchError`` naming the URL for any other answer or
    when nothing answers."""
    first = _origin(url)
    seen = [url]
    while True:
        sent = dict(headers or {}) if _origin(url) == first else {}
        if start or byte_range:
            sent["Range"] = "bytes=%s" % (byte_range or "%d-" % start)
        sent.setdefault("User-Agent", "ai_llm.moe_offload")
        request = urllib.request.Request(url, headers=sent, method=method)
        try:
            return _OPENER.open(request, timeout=timeout), url
        except urllib.error.HTTPError as exc:
            location = exc.headers.get("Location") if exc.code in (301, 302, 303, 307, 308) else None
            exc.close()
            if not location:
                raise FetchError("%s answered HTTP %d %s" % (display_url(url), exc.code, exc.reason)) from None
            url = urllib.parse.urljoin(url, location)
            if url in seen:
                raise FetchError("%s redirects in a loop (%s)" % (
                    display_url(seen[0]), " -> ".join(display_url(u) for u in seen + [url]))) from None
            seen.append(url)
            if len(seen) > MAX_REDIRECTS + 1:
                raise FetchError("%s redirects more than %d times" % (display_url(seen[0]), MAX_REDIRECTS)) from None
            if url_problem(url):
                raise FetchError("%s redirects to %s" % (display_url(seen[0]), url_problem(url))) from None
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            raise FetchError("%s cannot be reached: %s" % (display_url(url), reason)) from None


def remote_size(url, headers=None, timeout=30.0):
    """The size of the file at ``url``, from a HEAD request (or a one-byte GET where HEAD is not allowed)."""
    try:
        response, _final = open_url(url, headers, method="HEAD", timeout=timeout)
    except FetchError as exc:
        if " answered HTTP 405 " not in str(exc) and " answered HTTP 501 " not in str(exc):
            raise
        response, _final = open_url(url, headers, timeout=timeout, byte_range="0-0")
    with response:
        total = (response.headers.get("Content-Range") or "").rpartition("/")[2]
        length = total if total.isdigit() else response.headers.get("Content-Length")
    if not (length or "").strip().isdigit():
        raise FetchError("%s does not say its size (no Content-Length)" % display_url(url))
    return int(length)


def get_text(url, headers=None, timeout=30.0, limit=MIB):
    """The text at ``url`` (a ``SHA256SUMS`` file), at most ``limit`` bytes."""
    response, _final = open_url(url, headers, timeout=timeout)
    with response:
        return response.read(limit).decode("utf-8", "replace")


# --- the record of what is on the host --------------------------------------------------------------------------


def read_record(path):
    """The record (``{"files": {path: {...}}, "models": [...]}``); empty when there is none or it is unreadable."""
    try:
        data = json.loads((read_bytes(path, missing=(OSError,)) or b"null").decode("utf-8"))
    except ValueError:
        data = None
    files = data.get("files") if isinstance(data, dict) else None
    models = data.get("models") if isinstance(data, dict) else None
    return {"files": files if isinstance(files, dict) else {},
            "models": [m for m in models if isinstance(m, dict)] if isinstance(models, list) else []}


def write_record(path, record):
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o750, exist_ok=True)
    atomic_write(path, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode("utf-8"), 0o640)


def recorded(record, path, expected=None):
    """The record of ``path`` when the file still has the size and mtime recorded (and the sha256 ``expected``,
    when given), else None."""
    entry = record["files"].get(path)
    try:
        info = os.stat(path)
    except OSError:
        return None
    if not isinstance(entry, dict) or entry.get("size") != info.st_size or entry.get("mtime_ns") != info.st_mtime_ns:
        return None
    if expected and entry.get("sha256") != expected:
        return None
    return entry


def file_sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def free_bytes(folder):
    """The bytes an unprivileged write can still use in ``folder`` (its nearest existing parent)."""
    while not os.path.isdir(folder) and folder not in ("", "/"):
        folder = os.path.dirname(folder)
    info = os.statvfs(folder or "/")
    return info.f_bavail * info.f_frsize


# --- the fetch ----------------------------------------------------------------------------------------------------


def _part_size(path):
    try:
        return os.stat(path + PART_SUFFIX).st_size
    except OSError:
        return 0


def plan_files(files, sums, record, headers, timeout, sizes=None):
    """One row per file: ``url``, ``path``, ``sha256`` (expected), ``state`` (``present``: recorded or checked
    before, nothing to fetch; ``check``: a file the record does not know, checked and recorded, never overwritten;
    ``fetch``), ``size`` and ``have`` (the bytes of its part). A file recorded from another URL is refused unless
    its sha256 is given and matches. ``sizes`` are the files' sizes when known (else a HEAD request asks)."""
    rows = []
    for index, ((url, path), sha) in enumerate(zip(files, sums)):
        entry = recorded(record, path, sha)
        if entry is not None:
            if entry.get("url") not in (None, display_url(url)) and not sha:
                raise FetchError("%s holds the model fetched from %s, not %s: give the new model its own "
                                 "llm_server_model_path (the old one stays for a rollback)"
                                 % (path, entry.get("url"), display_url(url)))
            rows.append({"url": url, "path": path, "sha256": entry.get("sha256"), "state": "present",
                         "size": entry["size"], "have": entry["size"]})
            continue
        if os.path.lexists(path):
            size = os.path.getsize(path)
            rows.append({"url": url, "path": path, "sha256": sha, "state": "check", "size": size, "have": size})
            continue
        size = sizes[index] if sizes else remote_size(url, headers, timeout)
        have = _part_size(path)
        rows.append({"url": url, "path": path, "sha256": sha, "state": "fetch", "size": size,
                     "have": have if have <= size else 0})
    return rows


def disk_problem(rows):
    """The shortfall of free disk for the bytes still to fetch, per folder (a model's files share one), or
    ``""``."""
    need = {}
    for row in rows:
        if row["state"] == "fetch":
            folder = os.path.dirname(row["path"])
            need.setdefault(folder, 0)
            need[folder] += row["size"] - row["have"]
    for folder, nbytes in sorted(need.items()):
        free = free_bytes(folder)
        if nbytes > free:
            return ("%s has %.1f MiB free, and the model needs %.1f MiB more there: %.1f MiB missing. Nothing was "
                    "written" % (folder, free / MIB, nbytes / MIB, (nbytes - free) / MIB))
    return ""


def _lock(f):
    fcntl.flock(f.fileno(), fcntl.LOCK_EX)


def download(row, headers, deadline, timeout):
    """Append to ``row``'s part until it is complete or ``deadline`` (a ``time.monotonic()``) passes; the bytes
    written. A part that does not start as a GGUF file is removed (``FetchError``): an error page is not a model.
    Concurrent runs take turns on the part (``flock``), each appending from its current end."""
    part = row["path"] + PART_SUFFIX
    os.makedirs(os.path.dirname(part) or ".", mode=0o755, exist_ok=True)
    written = 0
    with open(part, "ab") as f:
        _lock(f)
        have = os.fstat(f.fileno()).st_size
        if have > row["size"]:
            f.truncate(0)
            have = 0
        if have == row["size"]:
            row["have"] = have
            return 0
        response, _final = open_url(row["url"], headers, start=have, timeout=timeout)
        with response:
            if have and response.status != 206:
                f.truncate(0)  # the server sends the whole file: start over
                have = 0
            elif have:
                answered = response.headers.get("Content-Range") or ""
                start = answered.partition(" ")[2].partition("-")[0]
                total = answered.rpartition("/")[2]
                if start != str(have) or total not in (str(row["size"]), "*"):
                    raise FetchError("%s answered a Range request from byte %d of %d with %r: the file changed "
                                     "on the server, or the server mixes it up; run again to start over" % (
                                         display_url(row["url"]), have, row["size"], answered))
            while have < row["size"]:
                try:
                    block = response.read(min(CHUNK, row["size"] - have))
                except http.client.IncompleteRead as exc:
                    block = exc.partial
                    row["cut"] = "the connection ended at byte %d of %d" % (have + len(block), row["size"])
                except (OSError, http.client.HTTPException) as exc:
                    block = b""
                    row["cut"] = "the connection failed at byte %d of %d: %s" % (have, row["size"], exc)
                if not block:
                    row.setdefault("cut", "the connection ended at byte %d of %d" % (have, row["size"]))
                    break
                if have == 0 and not any(m.startswith(block[:len(m)]) for m in MAGICS):
                    f.close()
                    os.unlink(part)
                    raise FetchError("%s is not a GGUF file (it starts with %r)" % (
                        display_url(row["url"]), block[:16]))
                f.write(block)
                have += len(block)
                written += len(block)
                if "cut" in row or time.monotonic() >= deadline:
                    break
        f.flush()
        os.fsync(f.fileno())
    row["have"] = have
    return written


def _remove(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def check_part(row, number, count):
    """Check a complete part (its sha256 and its GGUF header, a shard's split keys) and return its sha256; a part
    that fails is removed and ``FetchError`` says why."""
    part = row["path"] + PART_SUFFIX
    try:
        digest = file_sha256(part)
        if row["sha256"] and digest != row["sha256"]:
            raise FetchError("%s: the sha256 of the %d bytes fetched is %s, not %s (llm_server_model_sha256)" % (
                display_url(row["url"]), row["size"], digest, row["sha256"]))
        check_header(part, row["url"], number, count)
    except FetchError:
        _remove(part)
        raise
    return digest


def check_header(path, url, number, count):
    """A GGUF header, and a shard's ``split.no`` and ``split.count`` as its place says."""
    try:
        gguf = read_gguf(path, number)
    except GGUFError as exc:
        raise FetchError("%s is not a GGUF model: %s" % (display_url(url), exc.args[-1] if exc.args else exc))
    if count > 1:
        for key, want in ((Split.LLM_KV_SPLIT_COUNT, count), (Split.LLM_KV_SPLIT_NO, number)):
            if gguf.metadata.get(key) != want:
                raise FetchError("%s: %s is %r, but it is shard %d of %d" % (
                    display_url(url), key, gguf.metadata.get(key), number + 1, count))
    elif gguf.metadata.get(Split.LLM_KV_SPLIT_COUNT) not in (None, 0, 1):
        raise FetchError("%s: %s is %r: it is one shard of a split model; give the URL of its first shard, named "
                         "<name>-00001-of-<count>.gguf, or one URL per shard" % (
                             display_url(url), Split.LLM_KV_SPLIT_COUNT, gguf.metadata.get(Split.LLM_KV_SPLIT_COUNT)))


def finish(rows, record, record_path, model_path, sums_url=""):
    """Rename the checked parts into place and record every file and the model (``fetched``: the role fetched
    it, so the clean-up may remove it one day; ``sums_url``: the ``SHA256SUMS`` its files were checked against)."""
    count = len(rows)
    digests = {}
    for number, row in enumerate(rows):
        if row["state"] == "fetch":
            try:
                digests[number] = check_part(row, number, count)
            except FetchError:
                for other in rows:  # the model is all of its files: none of this fetch stays
                    if other["state"] == "fetch":
                        _remove(other["path"] + PART_SUFFIX)
                raise
        elif row["state"] == "check":
            digest = file_sha256(row["path"])
            if row["sha256"] and digest != row["sha256"]:
                raise FetchError("%s is already there with sha256 %s, not %s (llm_server_model_sha256): remove it or "
                                 "give the new model its own llm_server_model_path"
                                 % (row["path"], digest, row["sha256"]))
            check_header(row["path"], row["url"], number, count)
            digests[number] = digest
    for number, row in enumerate(rows):
        if row["state"] == "fetch":
            os.replace(row["path"] + PART_SUFFIX, row["path"])
    now = time.time()
    for number, row in enumerate(rows):
        if number not in digests:
            continue
        info = os.stat(row["path"])
        record["files"][row["path"]] = {"size": info.st_size, "mtime_ns": info.st_mtime_ns,
                                        "sha256": digests[number], "url": display_url(row["url"]),
                                        "fetched": row["state"] == "fetch"}
    models = [m for m in record["models"] if m.get("path") != model_path]
    old = next((m for m in record["models"] if m.get("path") == model_path), {})
    fetched_now = any(r["state"] == "fetch" for r in rows)
    models.append({"path": model_path, "files": [r["path"] for r in rows],
                   "fetched": bool(old.get("fetched")) or fetched_now,
                   "fetched_at": now if fetched_now else old.get("fetched_at"),
                   "used_at": old.get("used_at"), "sums_url": display_url(sums_url) if sums_url else None})
    record["models"] = models
    write_record(record_path, record)


def fetch(args, check_mode=False):
    """One piece of the fetch of a model (the module ``llm_server_model``, state ``present``): what is there,
    what is missing, the disk check, then at most ``piece_seconds`` of download; once every file is complete, the
    checks and the renames. Returns the module's result: ``done``, ``files``, ``bytes_total``, ``bytes_have``,
    ``bytes_fetched`` (this piece), ``changed``. ``known`` holds what the last piece found (``sizes`` and
    ``sha256`` per file): the next piece asks for neither again."""
    headers = args.get("headers") or {}
    timeout = float(args.get("timeout") or 30)
    files = sources(args["url"], args["path"])
    record_path = args["record"]
    known = args.get("known") or {}
    known_sums, sizes = known.get("sha256") or [], known.get("sizes") or []
    # (read without the record's lock: it is only ever replaced whole, by atomic_write)
    record = read_record(record_path)
    sums = known_sums if len(known_sums) == len(files) else \
        _sums(args.get("sha256"), files, record, args["path"], headers, timeout)
    rows = plan_files(files, sums, record, headers, timeout, sizes if len(sizes) == len(files) else None)
    result = {"changed": False, "done": False, "bytes_total": sum(r["size"] for r in rows),
              "bytes_fetched": 0, "files": rows}
    if all(r["state"] == "present" for r in rows):
        result.update(done=True, bytes_have=result["bytes_total"], fetched=False)
        return _shown(result)
    problem = disk_problem(rows)
    if problem:
        raise FetchError(problem)
    if check_mode:
        result.update(changed=any(r["state"] == "fetch" for r in rows), bytes_have=sum(r["have"] for r in rows),
                      would_fetch=sum(r["size"] - r["have"] for r in rows if r["state"] == "fetch"))
        return _shown(result)
    deadline = time.monotonic() + float(args.get("piece_seconds") or 10)
    for row in rows:
        if row["state"] == "fetch" and row["have"] < row["size"] and time.monotonic() < deadline:
            result["bytes_fetched"] += download(row, headers, deadline, timeout)
    result["bytes_have"] = sum(r["have"] for r in rows)
    result["changed"] = result["bytes_fetched"] > 0
    if all(r["have"] >= r["size"] for r in rows):
        with _record_lock(record_path):
            record = read_record(record_path)
            for row in rows:  # another run may have finished it meanwhile
                if row["state"] != "present" and recorded(record, row["path"], row["sha256"]) is not None:
                    row["state"] = "present"
            finish(rows, record, record_path, args["path"], _sums_url(args.get("sha256")))
        result.update(done=True, changed=True, fetched=any(r["state"] == "fetch" for r in rows))
    return _shown(result)


def known_of(result):
    """What a piece's ``result`` found, as the next piece's ``known`` option: ``sizes`` and ``sha256`` per file."""
    files = result.get("files") or []
    return {"sizes": [f["size"] for f in files], "sha256": [f["sha256"] for f in files]}


def _sums_url(sha256):
    """The ``SHA256SUMS`` URL ``llm_server_model_sha256`` gives, or ``""`` (hex digits, or nothing)."""
    values = [str(v).strip() for v in sha256 or [] if str(v).strip()]
    return values[0] if len(values) == 1 and not _HEX_RE.match(values[0]) else ""


def _sums(sha256, files, record, model_path, headers, timeout):
    """``expected_sums``, without fetching the ``SHA256SUMS`` file again when every file is recorded as checked
    against that same URL."""
    url = _sums_url(sha256)
    model = next((m for m in record["models"] if m.get("path") == model_path), {})
    if url and model.get("sums_url") == display_url(url) and all(recorded(record, p) for _u, p in files):
        return [None] * len(files)
    return expected_sums(sha256, files, lambda u: get_text(u, headers, timeout))


def _shown(result):
    """The result without the URLs' queries (signed URLs carry credentials there)."""
    result["files"] = [dict(r, url=display_url(r["url"])) for r in result["files"]]
    return result


class _record_lock:
    """The record's lock (``<record>.lock``, its directory made when missing): one run at a time reads, changes
    and writes the record. A file of its own, not the project directory's flock (``_deploy_lock``): a run holds it
    while it hashes a whole model, which must not hold up another deploy's lock of the project."""

    def __init__(self, record_path):
        self.path = record_path + ".lock"
        self.f = None

    def __enter__(self):
        os.makedirs(os.path.dirname(self.path), mode=0o750, exist_ok=True)
        self.f = open(self.path, "a")
        _lock(self.f)
        return self

    def __exit__(self, *exc):
        self.f.close()
        return False


# --- the clean-up -------------------------------------------------------------------------------------------------


# The model directory's bind mount as render_compose writes it (its first volume; the values are JSON strings).
_MOUNT_RE = re.compile(r'^\s*source: ("(?:[^"\\]|\\.)*")\s*\n\s*target: ("(?:[^"\\]|\\.)*")', re.MULTILINE)


def snapshot_models(rollback_dir):
    """The host paths of the models the kept snapshots run: their ``.env``'s ``LLM_MODEL_PATH`` (a path in the
    container) through the model directory's bind mount of their compose file; a snapshot that cannot be read
    names none."""
    paths = []
    for which in LINKS:
        try:
            files, _manifest, _path = read_snapshot(rollback_dir, which)
        except SnapshotError:
            continue
        inside = parse_env(files.get(".env", b"").decode("utf-8", "replace")).get("LLM_MODEL_PATH") or ""
        if not inside.startswith("/"):
            continue
        for name, data in files.items():
            match = _MOUNT_RE.search(data.decode("utf-8", "replace")) if name.endswith((".yml", ".yaml")) else None
            if not match or not inside:
                continue
            try:
                source, target = json.loads(match.group(1)), json.loads(match.group(2))
            except ValueError:
                continue
            if posixpath.commonpath([target, inside]) == target:
                paths.append(posixpath.normpath(posixpath.join(source, posixpath.relpath(inside, target))))
    return paths


def prune(record_path, current, keep, protected=()):
    """After a verified deploy of ``current`` (a model path): mark it used, then remove the files of the models the
    role fetched beyond the ``keep`` most recently used, never ``current`` nor the ``protected`` paths (the models
    of the snapshots) nor a file changed since it was recorded (only the record of it goes). Returns the paths
    removed."""
    removed = []
    with _record_lock(record_path):
        record = read_record(record_path)
        now = time.time()
        for model in record["models"]:
            if model.get("path") == current:
                model["used_at"] = now
        order = sorted((m for m in record["models"] if m.get("fetched")),
                       key=lambda m: (m.get("used_at") or m.get("fetched_at") or 0), reverse=True)
        kept = {m.get("path") for m in order[:max(keep, 1)]} | {current} | set(protected)
        models = []
        for model in record["models"]:
            if model.get("path") in kept or not model.get("fetched"):
                models.append(model)
                continue
            for path in model.get("files") or []:
                entry = record["files"].pop(path, None)
                if entry and entry.get("fetched") and recorded({"files": {path: entry}}, path) is not None:
                    try:
                        os.unlink(path)
                        removed.append(path)
                    except OSError as exc:
                        if exc.errno != errno.ENOENT:
                            raise
        record["models"] = models
        write_record(record_path, record)
    return removed
