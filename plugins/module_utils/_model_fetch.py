# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A model fetched onto the host over HTTP(S), a piece at a time: what is there and what is missing, the free disk,
the download itself (resumable, in pieces of a few seconds), the checks before a file is renamed into place, and the
record of what the role fetched.

Standard library only, Python >= 3.9; runs on the target hosts (the module ``llm_server_model``).

- Sources: which URLs, which host paths and which sha256 are ``_model_sources``'s; ``sources`` pairs them.
- Bytes go to ``<file>.part`` and are appended with a ``Range`` request from what is there, so a cut download
  (a killed run, a dropped connection, the end of a piece) goes on where it stopped. A complete part is checked
  (the sha256, a GGUF header, the shard's ``split.no`` and ``split.count``) and only then renamed; a part that
  fails is removed, so the host holds what it held before.
- The record (``RECORD_NAME`` in the project directory, ``_model_record``) holds every file with its size, mtime and
  sha256: a file whose size and mtime are still those recorded is neither fetched nor hashed again. The clean-up
  (``_model_cleanup``) reads it.
"""

from __future__ import annotations

import fcntl
import hashlib
import http.client
import os
import time
import urllib.error
import urllib.parse
import urllib.request

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import MIB
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_record import read_record, record_lock, recorded, write_record
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_sources import (
    FetchError,
    display_url,
    expected_sums,
    sources,
    sums_url_of,
    url_problem,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.error import GGUFError
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.header import read_gguf
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.keys import Split

RECORD_NAME = ".llm_server_models.json"
PART_SUFFIX = ".part"
MAX_REDIRECTS = 10
CHUNK = MIB
# A GGUF file starts with these bytes in either byte order (ggml.h GGUF_MAGIC "GGUF").
MAGICS = (b"GGUF",)


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


def download(row, headers, deadline, timeout):
    """Append to ``row``'s part until it is complete or ``deadline`` (a ``time.monotonic()``) passes; the bytes
    written. A part that does not start as a GGUF file is removed (``FetchError``): an error page is not a model.
    Concurrent runs take turns on the part (``flock``), each appending from its current end."""
    part = row["path"] + PART_SUFFIX
    os.makedirs(os.path.dirname(part) or ".", mode=0o755, exist_ok=True)
    written = 0
    with open(part, "ab") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
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
        with record_lock(record_path):
            record = read_record(record_path)
            for row in rows:  # another run may have finished it meanwhile
                if row["state"] != "present" and recorded(record, row["path"], row["sha256"]) is not None:
                    row["state"] = "present"
            finish(rows, record, record_path, args["path"], sums_url_of(args.get("sha256")))
        result.update(done=True, changed=True, fetched=any(r["state"] == "fetch" for r in rows))
    return _shown(result)


def known_of(result):
    """What a piece's ``result`` found, as the next piece's ``known`` option: ``sizes`` and ``sha256`` per file."""
    files = result.get("files") or []
    return {"sizes": [f["size"] for f in files], "sha256": [f["sha256"] for f in files]}


def _sums(sha256, files, record, model_path, headers, timeout):
    """``expected_sums``, without fetching the ``SHA256SUMS`` file again when every file is recorded as checked
    against that same URL."""
    url = sums_url_of(sha256)
    model = next((m for m in record["models"] if m.get("path") == model_path), {})
    if url and model.get("sums_url") == display_url(url) and all(recorded(record, p) for _u, p in files):
        return [None] * len(files)
    return expected_sums(sha256, files, lambda u: get_text(u, headers, timeout))


def _shown(result):
    """The result without the URLs' queries (signed URLs carry credentials there)."""
    result["files"] = [dict(r, url=display_url(r["url"])) for r in result["files"]]
    return result
