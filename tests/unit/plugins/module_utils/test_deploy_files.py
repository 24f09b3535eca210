"""Writes that are complete or absent (plugins/module_utils/_deploy_files.py): single files and snapshots, after
failures and after runs killed between any two steps."""
from __future__ import annotations

import calendar
import errno
import hashlib
import json
import os
import re
import time

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _deploy_files as files
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_files import (
    SnapshotError,
    atomic_write,
    prepare,
    read_snapshot,
    remove_leftovers,
    save_snapshot,
    snapshot_hash,
)

COMPOSE = "docker-compose.prod.yml"


def config(n):
    return {".env": b"LLM_CTX_SIZE='%d'\n" % n, COMPOSE: b"services: {}\n# %d\n" % n}


def leftovers(directory):
    return sorted(p for p in (os.path.join(r, n) for r, ds, fs in os.walk(directory) for n in ds + fs)
                  if files.TMP_MARK in p)


def test_snapshots_rotate_last_to_previous_and_report_the_links_and_a_broken_last_is_passed_over(tmp_path):
    rollback = str(tmp_path / ".rollback")
    changed, details = save_snapshot(rollback, config(1), "h1")
    first = os.readlink(os.path.join(rollback, "last"))
    assert (changed, details) == (True, {"last": first, "previous": None})
    assert save_snapshot(rollback, config(1), "h1") == (False, {"last": first, "previous": None})  # nothing written
    changed, details = save_snapshot(rollback, config(2), "h2")
    second = os.readlink(os.path.join(rollback, "last"))
    assert second != first
    assert (changed, details) == (True, {"last": second, "previous": first})
    assert save_snapshot(rollback, config(2), "h2") == (False, {"last": second, "previous": first})
    assert (snapshot_hash(rollback, "last"), snapshot_hash(rollback, "previous")) == ("h2", "h1")
    assert read_snapshot(rollback, "previous")[0] == config(1)
    save_snapshot(rollback, config(3), "h3")
    assert len(os.listdir(os.path.join(rollback, "snapshots"))) == 2  # h1 is gone: nothing points to it
    assert save_snapshot(rollback, config(3), "h3b")[0] is True  # the same files with another hash: a new snapshot
    assert (snapshot_hash(rollback), snapshot_hash(rollback, "previous")) == ("h3b", "h3")
    # a broken last snapshot does not become previous
    previous = os.readlink(os.path.join(rollback, "previous"))
    with open(os.path.join(rollback, "last", ".env"), "ab") as f:
        f.write(b"EDITED=1\n")
    changed, details = save_snapshot(rollback, config(4), "h4")
    assert (changed, details["previous"]) == (True, previous)
    assert (snapshot_hash(rollback), snapshot_hash(rollback, "previous")) == ("h4", "h3")
    assert sorted(os.listdir(os.path.join(rollback, "snapshots"))) == sorted(
        os.path.basename(os.readlink(os.path.join(rollback, n))) for n in ("last", "previous"))


@pytest.mark.parametrize("kill_at", range(4))
def test_a_run_killed_at_any_step_leaves_complete_snapshots(tmp_path, monkeypatch, kill_at):
    """The snapshot save stopped before each of its three renames in turn (as a SIGKILL would; 3: not stopped): the
    links always point to complete snapshots, and the next save clears what was left."""
    rollback = str(tmp_path / ".rollback")
    save_snapshot(rollback, config(1), "h1")
    save_snapshot(rollback, config(2), "h2")
    steps = {"n": 0}
    real_rename = os.rename

    class Killed(BaseException):
        pass

    def rename(src, dst):
        if steps["n"] == kill_at:
            raise Killed()
        steps["n"] += 1
        real_rename(src, dst)
    monkeypatch.setattr(files.os, "rename", rename)
    try:
        save_snapshot(rollback, config(3), "h3")
    except Killed:
        pass
    monkeypatch.setattr(files.os, "rename", real_rename)
    # Whatever the moment: every link there is points to a complete snapshot.
    for which in ("last", "previous"):
        if os.path.lexists(os.path.join(rollback, which)):
            snap, manifest, _path = read_snapshot(rollback, which)
            assert snap == config(int(manifest["config_hash"][1:]))
    assert snapshot_hash(rollback, "last") in ("h2", "h3")
    prepare(rollback)
    assert leftovers(rollback) == []
    save_snapshot(rollback, config(4), "h4")
    assert snapshot_hash(rollback, "last") == "h4"
    assert len(os.listdir(os.path.join(rollback, "snapshots"))) == 2


def test_a_full_disk_leaves_the_snapshots_as_they_were(tmp_path, monkeypatch):
    rollback = str(tmp_path / ".rollback")
    save_snapshot(rollback, config(1), "h1")
    real_open = open

    def full_open(path, mode="r", *args, **kwargs):
        handle = real_open(path, mode, *args, **kwargs)
        if "w" in mode and files.TMP_MARK in str(path) and str(path).endswith(COMPOSE):
            handle.close()
            raise OSError(errno.ENOSPC, "No space left on device")
        return handle
    monkeypatch.setattr("builtins.open", full_open)
    with pytest.raises(OSError, match="No space left"):
        save_snapshot(rollback, config(2), "h2")
    monkeypatch.undo()
    assert snapshot_hash(rollback, "last") == "h1" and read_snapshot(rollback, "last")[0] == config(1)
    assert leftovers(rollback) == []


def mode_of(path):
    return os.stat(path).st_mode & 0o777


def near_now(text, fmt):
    return abs(calendar.timegm(time.strptime(text, fmt)) - time.time()) < 300


def make_snapshot(rollback, which, data, manifest):
    """A snapshot written by hand: ``rollback/snapshots/<which>`` with ``data`` and ``manifest`` (a dict, its text or
    bytes; None: no manifest.json), and the link."""
    directory = rollback / "snapshots" / which
    directory.mkdir(parents=True)
    for name, content in data.items():
        (directory / name).write_bytes(content)
    if isinstance(manifest, dict):
        manifest = json.dumps(manifest)
    if manifest is not None:
        (directory / "manifest.json").write_bytes(manifest if isinstance(manifest, bytes) else manifest.encode("utf-8"))
    os.symlink(os.path.join("snapshots", which), str(rollback / which))
    return str(rollback / which), str(directory)


def test_atomic_write_is_private_by_default_and_a_failed_write_leaves_the_old_file_alone(tmp_path, monkeypatch):
    """Without a mode the file is 0600 (it may hold secrets), whatever the old file's mode."""
    target = tmp_path / ".env"
    target.write_bytes(b"old")
    os.chmod(str(target), 0o644)
    atomic_write(str(target), b"new")
    assert target.read_bytes() == b"new" and mode_of(str(target)) == 0o600
    atomic_write(str(target), b"public", 0o644)
    assert target.read_bytes() == b"public" and mode_of(str(target)) == 0o644

    def full(*_args):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        atomic_write(str(target), b"two", 0o600)
    assert target.read_bytes() == b"public"
    assert os.listdir(str(tmp_path)) == [".env"]


def test_a_write_renames_a_marked_temporary_file_or_directory_next_to_its_target(tmp_path, monkeypatch):
    """In the target's directory (a rename within one file system), with the leftover mark: a killed write leaves
    nothing that ``remove_leftovers`` (a hidden file) or ``prepare`` (a half-written snapshot) does not clear."""
    renames = []
    real_rename = os.rename

    def rename(src, dst):
        renames.append((src, dst))
        real_rename(src, dst)
    monkeypatch.setattr(files.os, "rename", rename)
    target = str(tmp_path / "compose.yml")
    atomic_write(target, b"services: {}\n")
    ((src, dst),) = renames
    assert dst == target
    assert os.path.dirname(src) == str(tmp_path)
    assert os.path.basename(src).startswith(".compose.yml" + files.TMP_MARK)
    rollback = str(tmp_path / ".rollback")
    save_snapshot(rollback, config(1), "h1")
    src, dst = renames[1]
    assert os.path.dirname(src) == rollback and os.path.basename(src).startswith(files.TMP_MARK)
    assert dst == os.path.join(rollback, os.readlink(os.path.join(rollback, "last")))


def test_remove_leftovers_returns_the_paths_it_removed_and_passes_over_what_it_cannot_remove(tmp_path, monkeypatch):
    half_file = tmp_path / (".env" + files.TMP_MARK + "x")
    half_file.write_text("half")
    half_dir = tmp_path / (files.TMP_MARK + "dir")
    (half_dir / "sub").mkdir(parents=True)
    (half_dir / "sub" / "f").write_text("f")
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "data").write_text("d")
    link = tmp_path / (".last" + files.TMP_MARK + "ab12")  # unlinked, not followed
    os.symlink(str(tmp_path / "keep"), str(link))
    assert sorted(remove_leftovers(str(tmp_path))) == sorted([str(half_file), str(half_dir), str(link)])
    assert os.listdir(str(tmp_path)) == ["keep"] and (tmp_path / "keep" / "data").read_text() == "d"
    assert remove_leftovers(str(tmp_path)) == []
    assert remove_leftovers(str(tmp_path / "missing")) == []
    # a leftover directory that cannot be removed does not stop the run
    (tmp_path / (files.TMP_MARK + "dir")).mkdir()

    def refused(*_args, **_kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")
    monkeypatch.setattr(files.os, "rmdir", refused)
    remove_leftovers(str(tmp_path))
    monkeypatch.undo()
    assert sorted(os.listdir(str(tmp_path))) == [files.TMP_MARK + "dir", "keep"]


def test_ensure_dir_creates_parents_with_the_mode_and_reports_it(tmp_path):
    path = str(tmp_path / "a" / "b")
    old = os.umask(0o077)
    try:
        assert files.ensure_dir(path, 0o750) is True
    finally:
        os.umask(old)
    assert os.path.isdir(path) and mode_of(path) == 0o750
    assert files.ensure_dir(path, 0o700) is False
    assert mode_of(path) == 0o750  # an existing directory is left as it is
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError):
        files.ensure_dir(str(tmp_path / "file"), 0o700)


def sha(data):
    return hashlib.sha256(data).hexdigest()


NOT_A_FILE = "{link}: the manifest names %r, not a file of the snapshot"


@pytest.mark.parametrize("data, manifest, message", [
    (None, None, "there is no last snapshot in {rollback}"),
    ({"a": b"x"}, None, "{link} ({path}) has no manifest.json"),
    # the exception's own words follow the file's name
    ({"a": b"x"}, "not json", "{link}: manifest.json cannot be read: Expecting value: line 1 column 1 (char 0)"),
    ({"a": b"x"}, "[1]", "{link}: manifest.json cannot be read: list indices must be integers or slices, not str"),
    ({"a": b"x"}, "{}", "{link}: manifest.json cannot be read: 'files'"),
    ({"a": b"x"}, '{"files": 3}', "{link}: manifest.json cannot be read: 'int' object is not iterable"),
    ({"a": b"x"}, b"\xff\xfe",
     "{link}: manifest.json cannot be read: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"),
    ({"a": b"x", "b": b"y"}, {"files": {"a": sha(b"x"), "b": sha(b"y\n")}},
     "{link}: b does not match the sha256 recorded with the snapshot (changed or cut since it was kept)"),
    ({"a": b"x"}, {"files": {"a": sha(b"x"), "b": sha(b"y")}}, "{link}: b is missing"),
    *[({"a": b"x"}, {"files": {name: sha(b"x")}}, NOT_A_FILE % name) for name in ("a/b", "../a", "", ".", "..")],
])
def test_a_snapshot_that_cannot_be_read_whole_is_refused_saying_why(tmp_path, data, manifest, message):
    link, path = str(tmp_path / "last"), ""
    if data is not None:
        link, path = make_snapshot(tmp_path, "last", data, manifest)
    with pytest.raises(SnapshotError) as info:
        read_snapshot(str(tmp_path), "last")
    assert str(info.value) == message.format(link=link, path=os.path.realpath(path), rollback=tmp_path)


@pytest.mark.parametrize("manifest", ["not json", "[1]", '"text"', '{"files": {}}', '{"config_hash": null}',
                                      b'{"config_hash": "\xff"}'])
def test_snapshot_hash_is_none_without_a_readable_hash(tmp_path, manifest):
    make_snapshot(tmp_path, "last", {}, manifest)
    assert snapshot_hash(str(tmp_path)) is None
    assert snapshot_hash(str(tmp_path), "previous") is None


@pytest.mark.parametrize("source, recorded", [((), "verified"), (("rollback",), "rollback")])
def test_a_saved_snapshot_holds_the_files_and_a_readable_manifest(tmp_path, source, recorded):
    """``snapshots/<UTC time>-<8 hex>/``: each file 0600, and manifest.json sorted, indented, newline-terminated,
    with the source it is given ("verified" by default)."""
    rollback = str(tmp_path / ".rollback")
    save_snapshot(rollback, config(1), "h1", *source)
    target = os.readlink(os.path.join(rollback, "last"))
    assert os.path.dirname(target) == "snapshots"
    name = os.path.basename(target)
    assert re.fullmatch(r"[0-9]{8}T[0-9]{6}-[0-9a-f]{8}", name)
    assert near_now(name.split("-")[0], "%Y%m%dT%H%M%S")
    directory = os.path.join(rollback, target)
    assert sorted(os.listdir(directory)) == [".env", COMPOSE, "manifest.json"]
    assert all(mode_of(os.path.join(directory, n)) == 0o600 for n in (".env", COMPOSE))
    text = (tmp_path / ".rollback" / "last" / "manifest.json").read_text()
    created = json.loads(text)["created"]
    assert re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z", created)
    assert near_now(created, "%Y-%m-%dT%H:%M:%SZ")
    assert text == (
        '{\n "config_hash": "h1",\n "created": "%s",\n "files": {\n  ".env": "%s",\n  "%s": "%s"\n },\n'
        ' "source": "%s"\n}\n' % (
            created, hashlib.sha256(config(1)[".env"]).hexdigest(), COMPOSE,
            hashlib.sha256(config(1)[COMPOSE]).hexdigest(), recorded))
    assert read_snapshot(rollback, "last") == (config(1), json.loads(text), os.path.realpath(directory))


def test_prepare_makes_a_private_directory_and_clears_the_leftovers_and_the_snapshots_no_link_points_to(tmp_path):
    rollback = tmp_path / "project" / ".rollback"
    old = os.umask(0)
    try:
        assert prepare(str(rollback)) == []
        save_snapshot(str(rollback), config(1), "h1")
    finally:
        os.umask(old)
    assert mode_of(str(rollback)) == 0o700 and mode_of(str(rollback / "snapshots")) == 0o700
    half = rollback / (".last" + files.TMP_MARK + "0000")
    half.write_text("x")
    (rollback / "snapshots" / "20000101T000000-deadbeef").mkdir()
    assert prepare(str(rollback)) == [str(half), "20000101T000000-deadbeef"]
    assert os.listdir(str(rollback / "snapshots")) == [os.path.basename(os.readlink(str(rollback / "last")))]
    assert snapshot_hash(str(rollback)) == "h1"
