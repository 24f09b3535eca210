"""The project directory's lock (plugins/module_utils/_deploy_lock.py): taken once, queued, given back only by its
owner, taken over when the lease ran out or the owner is proved dead; real processes for "dead"."""
from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading

import pytest

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


def test_one_owner_at_a_time_even_among_takers_at_once_and_only_the_owner_gives_it_back(tmp_path):
    """The lock names the owner (controller, user, pid): 0600 in a 0750 project directory, as the role's files."""
    path = str(tmp_path / "project" / ".llm_server.lock")
    assert release(path, "t") is False  # no directory yet
    first = acquire(path, owner(), 3600)
    assert first["acquired"] is True and first["created_dir"] is True and first["took_over"] is None
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o750
    second = acquire(path, owner(), 3600)
    assert not second["acquired"] and second["holder"]["token"] == first["token"]
    assert release(path, "not-the-token") is False
    assert release(path, first["token"]) is True
    assert release(path, first["token"]) is False  # the lock file is gone
    assert acquire(path, owner(), 3600)["acquired"]
    # eight takers at once get one lock
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


def test_who_is_dead_and_a_dead_owner_is_taken_over_only_with_its_token(tmp_path):
    me = owner()
    assert not owner_is_dead(me, me["controller"], me["boot_id"])
    assert owner_is_dead(dict(me, pid_start=me["pid_start"] + 1), me["controller"], me["boot_id"])  # pid reused
    assert not owner_is_dead(dict(me, pid=999999999), "another-controller", me["boot_id"])  # cannot prove it
    assert not owner_is_dead(dict(me, pid=999999999), me["controller"], "another-boot")
    assert not owner_is_dead(dict(me, pid=str(me["pid"] + 999999)), me["controller"], me["boot_id"])  # not a pid
    path = str(tmp_path / ".llm_server.lock")
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    dead = owner(proc.pid)
    proc.wait()
    held = acquire(path, dead, 3600)
    assert held["acquired"] and owner_is_dead(dead, socket.gethostname(), boot_id())
    assert not acquire(path, owner(), 3600, takeover="some-other-token")["acquired"]
    taken = acquire(path, owner(), 3600, takeover=held["token"])
    assert taken["acquired"] and taken["took_over"]["reason"] == "its owner is gone"


def test_an_expired_lease_is_taken_over_once_the_clock_is_past_it(tmp_path):
    """The lease runs until lease_until: a lease that ends now still holds."""
    path = str(tmp_path / ".llm_server.lock")
    held = acquire(path, owner(), 60, now=1000.0)
    with open(path, encoding="utf-8") as f:
        record = json.load(f)
    assert record == {"token": held["token"], "owner": owner(), "acquired_at": 1000.0, "lease_until": 1060.0}
    refused = acquire(path, owner(), 60, now=1060.0)
    assert refused == {"acquired": False, "token": None, "holder": record, "took_over": None, "created_dir": False,
                       "now": 1060.0}
    late = acquire(path, owner(), 60, now=1060.5)
    assert late["acquired"] is True and late["holder"] is None and late["now"] == 1060.5
    assert late["took_over"] == dict(record, reason="its lease ran out") and late["token"] != held["token"]
    assert release(path, held["token"]) is False  # the old owner cannot remove the new lock


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b"\xff\xfe", b"", b"null"])
def test_an_unreadable_lock_file_is_taken_over(tmp_path, content):
    """A lock file that holds no owner and no lease (a write cut short, something else's file) would otherwise
    block every deploy for ever."""
    path = tmp_path / ".llm_server.lock"
    path.write_bytes(content)
    taken = acquire(str(path), owner(), 60)
    assert taken["acquired"] is True
    assert taken["took_over"] == {"token": None, "broken": True, "reason": "the lock file was unreadable"}


def test_the_owner_in_words():
    assert describe(None) == "nobody"
    assert describe({"token": None, "broken": True}) == "an unreadable lock file"
    assert describe({"owner": {"pid": 4242, "controller": "ctl-1"}, "acquired_at": 86400 + 3661}) == \
        "ansible-playbook (pid 4242) on ctl-1, since 1970-01-02 01:01:01 UTC"
    assert describe({"owner": {}, "acquired_at": "yesterday"}) == "ansible-playbook (pid ?) on ?, since ?"


def test_process_start_counts_from_the_last_parenthesis(tmp_path):
    """/proc/<pid>/stat: the command name (field 2) is in parentheses and may hold ') ', digits and bytes that are
    not ASCII; the start time is field 22 (proc(5)). Two sleeps started one after the other, one named
    'x) 1 2 (d\u00e9j\u00e0', start within a second."""
    odd = tmp_path / "x) 1 2 (d\u00e9j\u00e0"
    odd.symlink_to(shutil.which("sleep"))
    plain = subprocess.Popen(["sleep", "30"])
    weird = subprocess.Popen([str(odd), "30"])
    try:
        with open("/proc/%d/stat" % weird.pid, "rb") as f:
            assert "(x) 1 2 (d\u00e9j\u00e0)".encode("utf-8") in f.read()
        ticks = os.sysconf("SC_CLK_TCK")
        assert 0 <= process_start(weird.pid) - process_start(plain.pid) <= ticks
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        assert abs(process_start(plain.pid) / ticks - uptime) < 5  # started just now, in ticks since boot
        assert process_start(999999999) is None
    finally:
        for proc in (plain, weird):
            proc.kill()
            proc.wait()
