# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Writes of the llm_server role that are complete or absent: single files (a temporary file in the same
directory, fsync, rename) and snapshots (a temporary directory, then a rename).

Standard library only (runs on target hosts).

Snapshots live under the rollback directory::

    snapshots/<id>/      .env, the compose file, manifest.json (sha256 of each file, the config hash)
    last -> snapshots/<id>        the last verified configuration
    previous -> snapshots/<id>    the verified configuration before it

``last`` and ``previous`` are symbolic links replaced by a rename, so a reader always finds complete
snapshots, whatever moment a run was killed at; a full disk leaves the snapshots as they were. Leftovers of a
killed or failed run (temporary files and directories, snapshots no link points to) are removed by the next
write.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import read_bytes, sha256_hex

TMP_MARK = ".llm_server-tmp-"
MANIFEST = "manifest.json"
LINKS = ("last", "previous")


class SnapshotError(Exception):
    """A snapshot is missing, incomplete or does not match its manifest."""


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path, data, mode=0o600):
    """Write ``data`` (bytes) to ``path``: a temporary file next to it, fsync, rename. Nothing is left
    behind when it fails (a full disk), and the old file stays until the rename."""
    directory, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix="." + name + TMP_MARK, dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(directory)


def remove_leftovers(directory):
    """Remove the temporary files and directories a killed or failed write left in ``directory``."""
    removed = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return removed
    for name in names:
        if TMP_MARK in name:
            path = os.path.join(directory, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
            removed.append(path)
    return removed


def ensure_dir(path, mode):
    """Create ``path`` (and its parents) when missing; True when it was created."""
    if os.path.isdir(path):
        return False
    os.makedirs(path, mode=mode, exist_ok=True)
    os.chmod(path, mode)
    return True


# --- snapshots ------------------------------------------------------------------------------------------------


def _manifest(files, config_hash, source):
    return {
        "config_hash": config_hash,
        "files": {name: sha256_hex(data) for name, data in sorted(files.items())},
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "source": source,
    }


def read_snapshot(rollback_dir, which):
    """``(files, manifest, path)`` of snapshot ``which`` (``last`` or ``previous``); ``SnapshotError`` when it
    is missing or does not match its manifest (a file changed, cut or gone since it was kept)."""
    link = os.path.join(rollback_dir, which)
    if not os.path.lexists(link):
        raise SnapshotError("there is no %s snapshot in %s" % (which, rollback_dir))
    path = os.path.realpath(link)
    raw = read_bytes(os.path.join(path, MANIFEST))
    if raw is None:
        raise SnapshotError("%s (%s) has no %s" % (link, path, MANIFEST))
    try:
        manifest = json.loads(raw.decode("utf-8"))
        expected = dict(manifest["files"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise SnapshotError("%s: %s cannot be read: %s" % (link, MANIFEST, exc))
    files = {}
    for name, digest in expected.items():
        if "/" in name or name in ("", ".", ".."):
            raise SnapshotError("%s: the manifest names %r, not a file of the snapshot" % (link, name))
        data = read_bytes(os.path.join(path, name))
        if data is None:
            raise SnapshotError("%s: %s is missing" % (link, name))
        if sha256_hex(data) != digest:
            raise SnapshotError("%s: %s does not match the sha256 recorded with the snapshot (changed or cut since "
                                "it was kept)" % (link, name))
        files[name] = data
    return files, manifest, path


def snapshot_hash(rollback_dir, which="last"):
    """The config hash recorded with a snapshot, ``None`` when there is none (not verified against its files)."""
    raw = read_bytes(os.path.join(rollback_dir, which, MANIFEST))
    if raw is None:
        return None
    try:
        return json.loads(raw.decode("utf-8")).get("config_hash")
    except (ValueError, UnicodeDecodeError, AttributeError):
        return None


def _replace_link(rollback_dir, name, target):
    tmp = os.path.join(rollback_dir, "." + name + TMP_MARK + os.urandom(4).hex())
    os.symlink(target, tmp)
    try:
        os.rename(tmp, os.path.join(rollback_dir, name))
    except BaseException:
        os.unlink(tmp)
        raise


def _link_target(rollback_dir, name):
    link = os.path.join(rollback_dir, name)
    if os.path.islink(link):
        return os.readlink(link)
    return None


def _write_snapshot_dir(rollback_dir, files, config_hash, source):
    """A complete snapshot directory under ``snapshots/`` (written in a temporary directory, then renamed);
    returns its path relative to ``rollback_dir``."""
    snapshots = os.path.join(rollback_dir, "snapshots")
    ensure_dir(snapshots, 0o700)
    tmp = tempfile.mkdtemp(prefix=TMP_MARK, dir=rollback_dir)
    try:
        for name, data in files.items():
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(os.path.join(tmp, name), 0o600)
        manifest = json.dumps(_manifest(files, config_hash, source), indent=1, sort_keys=True).encode("utf-8")
        with open(os.path.join(tmp, MANIFEST), "wb") as f:
            f.write(manifest + b"\n")
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        name = "%s-%s" % (time.strftime("%Y%m%dT%H%M%S", time.gmtime()), os.urandom(4).hex())
        os.rename(tmp, os.path.join(snapshots, name))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(snapshots)
    return os.path.join("snapshots", name)


def _prune(rollback_dir):
    """Remove snapshot directories no link points to (left by a killed run)."""
    keep = {os.path.normpath(t) for t in (_link_target(rollback_dir, n) for n in LINKS) if t}
    snapshots = os.path.join(rollback_dir, "snapshots")
    removed = []
    for name in os.listdir(snapshots) if os.path.isdir(snapshots) else []:
        if os.path.join("snapshots", name) not in keep:
            shutil.rmtree(os.path.join(snapshots, name), ignore_errors=True)
            removed.append(name)
    return removed


def prepare(rollback_dir):
    """Create the rollback directory and clear leftovers of killed runs. Returns the leftovers removed."""
    ensure_dir(rollback_dir, 0o700)
    return remove_leftovers(rollback_dir) + _prune(rollback_dir)


def save_snapshot(rollback_dir, files, config_hash, source="verified"):
    """Keep ``files`` ({name: bytes}) as the ``last`` snapshot; the ``last`` one before becomes ``previous``.

    Returns ``(changed, details)``. Nothing changes when ``last`` already holds these files. A failure (a full
    disk) raises and leaves the snapshots as they were, without temporary files.
    """
    prepare(rollback_dir)
    try:
        current, manifest, _path = read_snapshot(rollback_dir, "last")
    except SnapshotError:
        current, manifest = None, None
    if current == files and manifest and manifest.get("config_hash") == config_hash:
        return False, {"last": _link_target(rollback_dir, "last"), "previous": _link_target(rollback_dir, "previous")}
    target = _write_snapshot_dir(rollback_dir, files, config_hash, source)
    old_last = _link_target(rollback_dir, "last")
    if old_last and current is not None:
        _replace_link(rollback_dir, "previous", old_last)
    _replace_link(rollback_dir, "last", target)
    _fsync_dir(rollback_dir)
    _prune(rollback_dir)
    return True, {"last": target, "previous": _link_target(rollback_dir, "previous")}
