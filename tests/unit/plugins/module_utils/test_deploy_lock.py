"""The project directory's lock (plugins/module_utils/_deploy_lock.py): taken once, queued, given back only by its
owner, taken over when the lease ran out or the owner is proved dead; real processes for "dead"."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_lock import (
    acquire,
    boot_id,
    describe,
    owner_is_dead,
    process_start,
    release,
)


def owner(pid=None):
    pid = os.getpid() if pid is None else pid
    return {"controller": socket.gethostname(), "boot_id": boot_id(), "pid": pid, "pid_start": process_start(pid)}


def test_one_owner_at_a_time_and_only_the_owner_gives_it_back(tmp_path):
    path = str(tmp_path / "project" / ".llm_server.lock")
    first = acquire(path, owner(), 3600)
    assert first["acquired"] and first["created_dir"]
    second = acquire(path, owner(), 3600)
    assert not second["acquired"] and second["holder"]["token"] == first["token"]
    assert "pid %d" % os.getpid() in describe(second["holder"])
    assert release(path, "not-the-token") is False
    assert release(path, first["token"]) is True
    assert acquire(path, owner(), 3600)["acquired"]


def test_an_expired_lease_is_taken_over(tmp_path):
    path = str(tmp_path / ".llm_server.lock")
    old = acquire(path, owner(), 60, now=1000.0)
    late = acquire(path, owner(), 60, now=1061.0)
    assert late["acquired"] and late["token"] != old["token"]
    assert late["took_over"]["reason"] == "its lease ran out"
    assert release(path, old["token"]) is False  # the old owner cannot remove the new lock


def test_a_dead_owner_is_taken_over_only_with_its_token(tmp_path):
    path = str(tmp_path / ".llm_server.lock")
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    dead = owner(proc.pid)
    proc.wait()
    held = acquire(path, dead, 3600)
    assert held["acquired"] and owner_is_dead(dead, socket.gethostname(), boot_id())
    assert not acquire(path, owner(), 3600, takeover="some-other-token")["acquired"]
    taken = acquire(path, owner(), 3600, takeover=held["token"])
    assert taken["acquired"] and taken["took_over"]["reason"] == "its owner is gone"


def test_who_is_dead():
    me = owner()
    assert not owner_is_dead(me, me["controller"], me["boot_id"])
    assert owner_is_dead(dict(me, pid_start=me["pid_start"] + 1), me["controller"], me["boot_id"])  # pid reused
    assert not owner_is_dead(dict(me, pid=999999999), "another-controller", me["boot_id"])  # cannot prove it
    assert not owner_is_dead(dict(me, pid=999999999), me["controller"], "another-boot")


def test_two_takers_at_once_get_one_lock(tmp_path):
    path = str(tmp_path / ".llm_server.lock")
    results = []
    barrier = threading.Barrier(8)

    def take():
        barrier.wait()
        results.append(acquire(path, owner(), 3600))
    threads = [threading.Thread(target=take) for _n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r["acquired"] for r in results) == 1


def test_process_start_reads_proc():
    assert process_start(os.getpid()) > 0
    assert process_start(999999999) is None
