# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lock of a project directory, so that two deploys of one host queue instead of racing.

Standard library only (runs on target hosts).

The lock is a JSON file in the project directory that names its owner: the controller host, its boot id,
the pid of the ``ansible-playbook`` process and that process's start time, and a lease (an absolute time).
Every change of it happens under ``flock`` of the project directory, so that two deploys that both find a
dead owner cannot both take the lock over.

A lock is taken over when its lease has run out (the target's clock decides), or when the caller proves its
owner dead and names the owner's token (``takeover``): only a process on the same controller can prove that,
the controller side (the action plugin ``llm_server_lock``) does it.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import uuid

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_files import atomic_write, ensure_dir


def _read(path):
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read().decode("utf-8"))
        # JSON that is not an object (a truncated or foreign file) holds no owner and no lease: unreadable too
        return data if isinstance(data, dict) else {"token": None, "broken": True}
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError):
        return {"token": None, "broken": True}


class _DirLock:
    """flock of a directory for the few milliseconds a lock file is read and replaced."""

    def __init__(self, directory):
        self.fd = os.open(directory, os.O_RDONLY)

    def __enter__(self):
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def describe(holder):
    """One line naming the owner of a lock, for people."""
    if not holder:
        return "nobody"
    if holder.get("broken"):
        return "an unreadable lock file"
    owner = holder.get("owner") or {}
    since = holder.get("acquired_at")
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since)) if isinstance(since, (int, float)) else "?"
    return "ansible-playbook (pid %s) on %s, since %s" % (owner.get("pid", "?"), owner.get("controller", "?"), when)


def acquire(path, owner, lease, takeover=None, now=None):
    """Try once to take the lock file ``path`` for ``owner`` (a dict) for ``lease`` seconds.

    Returns ``{"acquired", "token", "holder", "took_over", "created_dir"}``: ``holder`` is the lock file of
    the other owner when it was not acquired; ``took_over`` the lock file replaced (expired, or the owner the
    caller proved dead by naming its ``takeover`` token).
    """
    now = time.time() if now is None else now
    directory = os.path.dirname(path)
    created = ensure_dir(directory, 0o750)
    with _DirLock(directory):
        holder = _read(path)
        took_over = None
        if holder is not None:
            expired = isinstance(holder.get("lease_until"), (int, float)) and holder["lease_until"] < now
            proved_dead = takeover is not None and holder.get("token") == takeover
            if not (expired or proved_dead or holder.get("broken")):
                return {"acquired": False, "token": None, "holder": holder, "took_over": None,
                        "created_dir": created, "now": now}
            took_over = dict(holder, reason="its lease ran out" if expired else
                             "its owner is gone" if proved_dead else "the lock file was unreadable")
        token = uuid.uuid4().hex
        record = {"token": token, "owner": owner, "acquired_at": now, "lease_until": now + lease}
        atomic_write(path, (json.dumps(record, sort_keys=True) + "\n").encode("utf-8"), 0o600)
    return {"acquired": True, "token": token, "holder": None, "took_over": took_over, "created_dir": created,
            "now": now}


def release(path, token):
    """Remove the lock file when it still holds ``token``; True when it did."""
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        return False
    with _DirLock(directory):
        holder = _read(path)
        if holder is None or holder.get("token") != token:
            return False
        os.unlink(path)
    return True


def process_start(pid):
    """The start time of ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22), None if gone."""
    try:
        with open("/proc/%d/stat" % int(pid), "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except (OSError, ValueError):
        return None
    # The command name (field 2) is in parentheses and may hold spaces: count from the last ')'.
    fields = stat[stat.rfind(")") + 2:].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def owner_is_dead(owner, controller, this_boot_id):
    """Whether the owner of a lock is provably gone, seen from a process on ``controller``: the same host
    and boot, and its pid is no longer running, or runs a process that started at another time."""
    if not owner or owner.get("controller") != controller or not owner.get("boot_id") or \
            owner.get("boot_id") != this_boot_id:
        return False
    pid = owner.get("pid")
    if not isinstance(pid, int):
        return False
    start = process_start(pid)
    return start is None or start != owner.get("pid_start")
