# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a Linux host offers in memory, and which processes belong to a process tree, from ``/proc`` and
``/sys/fs/cgroup``.

Standard library only: this runs on target hosts (Python >= 3.9). Every function takes ``root`` (``/`` by
default) so that it can read a copy of those files.

* ``meminfo(root)``: MemTotal, MemAvailable, SwapTotal and SwapFree of ``/proc/meminfo``, in MiB;
* ``cgroup_memory(root, pid)``: the memory limit and usage of a process's cgroup (v2 ``memory.max`` and
  ``memory.current``, v1 ``memory.limit_in_bytes`` and ``memory.usage_in_bytes``), ``None`` without a limit;
* ``process_tree(pid, root)``: a process and all its descendants (``/proc/<pid>/task/*/children``);
* ``process_memory(pids, root)``: the resident memory of those processes (``RssAnon``, ``RssFile``,
  ``RssShmem`` of ``/proc/<pid>/status``);
* ``copy_bandwidth(seconds, size)``: the memory bandwidth of copies of a buffer larger than the caches, in MB/s;
* ``gather(root, pid)``: everything ``host_info`` returns.
"""

from __future__ import annotations

import os
import time

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import mib

KIB = 1024
UNLIMITED = 1 << 60  # cgroup v1 writes 9223372036854771712 for "no limit"; v2 writes "max"
_MEMINFO_KEYS = {"MemTotal": "memory_total_mib", "MemAvailable": "memory_available_mib",
                 "SwapTotal": "swap_total_mib", "SwapFree": "swap_free_mib"}
_STATUS_KEYS = {"RssAnon": "rss_anon_mib", "RssFile": "rss_file_mib", "RssShmem": "rss_shmem_mib"}
PROBE_BYTES = 256 << 20  # larger than the last-level cache of common CPUs: the copies go to memory
PROBE_SECONDS = 0.5
MB = 10 ** 6  # bandwidth in decimal megabytes per second, as memory is rated


class HostMemoryError(Exception):
    """``/proc`` did not give what is needed; ``str()`` is a message for people."""


def _path(root, *parts):
    return os.path.join(root, *[p.lstrip("/") for p in parts])


def _read(root, *parts):
    with open(_path(root, *parts)) as handle:
        return handle.read()


def _kib_lines(text, keys):
    """``{key: MiB}`` of ``Name:   1234 kB`` lines."""
    values = {}
    for line in text.splitlines():
        name, _sep, rest = line.partition(":")
        if name in keys:
            fields = rest.split()
            if fields and fields[0].isdigit():
                values[keys[name]] = mib(int(fields[0]) * KIB)
    return values


def meminfo(root="/"):
    """MemTotal, MemAvailable, SwapTotal, SwapFree in MiB; raises ``HostMemoryError`` without MemAvailable."""
    try:
        text = _read(root, "proc/meminfo")
    except OSError as exc:
        raise HostMemoryError("cannot read %s: %s" % (_path(root, "proc/meminfo"), exc.strerror or exc)) from None
    values = _kib_lines(text, _MEMINFO_KEYS)
    if "memory_available_mib" not in values or "memory_total_mib" not in values:
        raise HostMemoryError("%s has no MemTotal/MemAvailable line (a kernel older than 3.14?)"
                              % _path(root, "proc/meminfo"))
    return values


def _limit(text):
    text = text.strip()
    if not text or text == "max" or not text.isdigit() or int(text) >= UNLIMITED:
        return None
    return int(text)


def cgroup_memory(root="/", pid="self"):
    """``{version, path, limit_mib, usage_mib}`` of the memory cgroup of ``pid``, ``None`` when it has no limit
    (or when the cgroup files cannot be read)."""
    try:
        lines = _read(root, "proc/%s/cgroup" % pid).splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        hierarchy, controllers, path = fields
        if "memory" in controllers.split(","):
            files, version = (("sys/fs/cgroup/memory", path, "memory.limit_in_bytes"),
                              ("sys/fs/cgroup/memory", path, "memory.usage_in_bytes")), 1
        elif hierarchy == "0" and controllers == "":
            files, version = (("sys/fs/cgroup", path, "memory.max"), ("sys/fs/cgroup", path, "memory.current")), 2
        else:
            continue
        try:
            limit = _limit(_read(root, *files[0]))
            usage = _limit(_read(root, *files[1]))
        except OSError:
            continue
        if limit is None:
            continue
        return {"version": version, "path": path, "limit_mib": mib(limit),
                "usage_mib": mib(usage) if usage is not None else None}
    return None


def process_tree(pid, root="/"):
    """``pid`` and every descendant (depth first, each once), from ``/proc/<pid>/task/<tid>/children``.

    A process that is gone (or not readable) ends its branch; ``pid`` itself is always in the list.
    """
    pid = int(pid)
    seen = []
    todo = [pid]
    while todo:
        current = todo.pop(0)
        if current in seen:
            continue
        seen.append(current)
        try:
            tasks = sorted(os.listdir(_path(root, "proc/%d/task" % current)), key=lambda t: int(t) if t.isdigit() else 0)
        except OSError:
            continue
        children = []
        for task in tasks:
            try:
                children += [int(c) for c in _read(root, "proc/%d/task/%s/children" % (current, task)).split()]
            except (OSError, ValueError):
                continue
        todo = children + todo
    return seen


def process_memory(pids, root="/"):
    """Resident memory of ``pids`` together: ``rss_anon_mib`` (anonymous, what stopping them gives back),
    ``rss_file_mib`` (file pages, such as a mapped model: page cache) and ``rss_shmem_mib``."""
    total = dict((key, 0.0) for key in _STATUS_KEYS.values())
    for pid in pids:
        try:
            values = _kib_lines(_read(root, "proc/%d/status" % pid), _STATUS_KEYS)
        except OSError:
            continue
        for key, value in values.items():
            total[key] += value
    return dict((key, round(value, 2)) for key, value in total.items())


def copy_bandwidth(seconds=PROBE_SECONDS, size=PROBE_BYTES, clock=time.perf_counter):
    """The host's memory bandwidth measured by copying a ``size``-byte buffer into another, for about ``seconds``:
    after one copy that maps the target's pages, copies run until another would end past ``seconds``. A copy reads
    ``size`` bytes and writes ``size``: the rate is ``2 * size * copies / elapsed``. One thread copying (CPython's
    memcpy), so a lower bound of what llama.cpp's threads read. Returns ``{memory_bandwidth_mb_per_s, buffer_mib,
    copies, seconds}``."""
    source = bytearray(b"\x5a") * size  # written through: no page is the kernel's shared zero page
    target = bytearray(size)
    source_view, target_view = memoryview(source), memoryview(target)
    target_view[:] = source_view
    copies = 0
    start = clock()
    while True:
        before = clock()
        target_view[:] = source_view
        copies += 1
        now = clock()
        if now - start + (now - before) > seconds:
            break
    elapsed = now - start
    return {"memory_bandwidth_mb_per_s": round(2.0 * size * copies / elapsed / MB, 1), "buffer_mib": mib(size),
            "copies": copies, "seconds": round(elapsed, 3)}


def gather(root="/", pid=None, pids=None):
    """What ``host_info`` returns: the memory of ``/proc/meminfo``, the cgroup limit of this process and, with
    ``pid``, the process tree of ``pid`` and the memory it holds (``memory_held_by_pid_mib``: anonymous and
    shared resident memory, which the host gets back when that tree stops); ``pids``: that tree when the caller
    walked it already."""
    result = meminfo(root)
    result["cgroup"] = cgroup_memory(root)
    if pid is not None:
        pids = pids if pids is not None else process_tree(pid, root)
        memory = process_memory(pids, root)
        result["process_tree"] = dict(pid=int(pid), pids=pids, **memory)
        result["memory_held_by_pid_mib"] = round(memory["rss_anon_mib"] + memory["rss_shmem_mib"], 2)
    return result
