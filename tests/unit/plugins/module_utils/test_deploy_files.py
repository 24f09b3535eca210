"""Writes that are complete or absent (plugins/module_utils/_deploy_files.py): single files and snapshots, after
failures and after runs killed between any two steps."""
from __future__ import annotations

import errno
import json
import os

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


def test_atomic_write_replaces_and_leaves_nothing_when_it_fails(tmp_path, monkeypatch):
    target = tmp_path / ".env"
    atomic_write(str(target), b"one", 0o600)
    assert target.read_bytes() == b"one" and oct(target.stat().st_mode & 0o777) == "0o600"

    def full(*_args):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(OSError):
        atomic_write(str(target), b"two", 0o600)
    assert target.read_bytes() == b"one"
    assert leftovers(tmp_path) == []


def test_snapshots_rotate_last_to_previous(tmp_path):
    rollback = str(tmp_path / ".rollback")
    assert save_snapshot(rollback, config(1), "h1", COMPOSE)[0] is True
    assert save_snapshot(rollback, config(1), "h1", COMPOSE)[0] is False  # the same: nothing written
    assert save_snapshot(rollback, config(2), "h2", COMPOSE)[0] is True
    assert (snapshot_hash(rollback, "last"), snapshot_hash(rollback, "previous")) == ("h2", "h1")
    assert read_snapshot(rollback, "previous")[0] == config(1)
    assert (tmp_path / ".rollback" / "previous" / ".env").read_bytes() == config(1)[".env"]
    save_snapshot(rollback, config(3), "h3", COMPOSE)
    assert len(os.listdir(os.path.join(rollback, "snapshots"))) == 2  # h1 is gone: nothing points to it


def test_a_changed_or_cut_snapshot_is_refused(tmp_path):
    rollback = str(tmp_path / ".rollback")
    save_snapshot(rollback, config(1), "h1", COMPOSE)
    path = read_snapshot(rollback, "last")[2]
    with open(os.path.join(path, COMPOSE), "ab") as f:
        f.write(b"image: [edited by hand\n")
    with pytest.raises(SnapshotError, match="does not match the sha256"):
        read_snapshot(rollback, "last")
    os.unlink(os.path.join(path, ".env"))
    with pytest.raises(SnapshotError, match=".env is missing"):
        read_snapshot(rollback, "last")
    with pytest.raises(SnapshotError, match="there is no previous snapshot"):
        read_snapshot(rollback, "previous")


@pytest.mark.parametrize("kill_at", range(6))
def test_a_run_killed_at_any_step_leaves_complete_snapshots(tmp_path, monkeypatch, kill_at):
    """The snapshot save stopped at each of its file operations in turn (as a SIGKILL would): the links always
    point to complete snapshots, and the next save clears what was left."""
    rollback = str(tmp_path / ".rollback")
    save_snapshot(rollback, config(1), "h1", COMPOSE)
    save_snapshot(rollback, config(2), "h2", COMPOSE)
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
        save_snapshot(rollback, config(3), "h3", COMPOSE)
    except Killed:
        pass
    monkeypatch.setattr(files.os, "rename", real_rename)
    # Whatever the moment: every link there is points to a complete snapshot.
    for which in ("last", "previous"):
        if os.path.lexists(os.path.join(rollback, which)):
            snap, manifest, _path = read_snapshot(rollback, which)
            assert snap == config(int(manifest["config_hash"][1:]))
    assert snapshot_hash(rollback, "last") in ("h2", "h3")
    prepare(rollback, COMPOSE)
    assert leftovers(rollback) == []
    save_snapshot(rollback, config(4), "h4", COMPOSE)
    assert snapshot_hash(rollback, "last") == "h4"
    assert len(os.listdir(os.path.join(rollback, "snapshots"))) == 2


def test_a_full_disk_leaves_the_snapshots_as_they_were(tmp_path, monkeypatch):
    rollback = str(tmp_path / ".rollback")
    save_snapshot(rollback, config(1), "h1", COMPOSE)
    real_open = open

    def full_open(path, mode="r", *args, **kwargs):
        handle = real_open(path, mode, *args, **kwargs)
        if "w" in mode and files.TMP_MARK in str(path) and str(path).endswith(COMPOSE):
            handle.close()
            raise OSError(errno.ENOSPC, "No space left on device")
        return handle
    monkeypatch.setattr("builtins.open", full_open)
    with pytest.raises(OSError, match="No space left"):
        save_snapshot(rollback, config(2), "h2", COMPOSE)
    monkeypatch.undo()
    assert snapshot_hash(rollback, "last") == "h1" and read_snapshot(rollback, "last")[0] == config(1)
    assert leftovers(rollback) == []


def test_the_layout_of_earlier_versions_becomes_snapshots(tmp_path):
    rollback = tmp_path / ".rollback"
    (rollback / "previous").mkdir(parents=True)
    for directory, n in ((rollback, 2), (rollback / "previous", 1)):
        for name, data in config(n).items():
            (directory / name).write_bytes(data)
    prepare(str(rollback), COMPOSE)
    assert read_snapshot(str(rollback), "last")[0] == config(2)
    assert read_snapshot(str(rollback), "previous")[0] == config(1)
    assert not (rollback / ".env").exists() and (rollback / "previous").is_symlink()
    assert json.loads((rollback / "last" / "manifest.json").read_text())["source"] == "legacy"


def test_remove_leftovers(tmp_path):
    (tmp_path / (".env" + files.TMP_MARK + "x")).write_text("half")
    (tmp_path / (files.TMP_MARK + "dir")).mkdir()
    (tmp_path / "keep").write_text("k")
    assert len(remove_leftovers(str(tmp_path))) == 2
    assert os.listdir(tmp_path) == ["keep"]
