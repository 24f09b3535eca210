"""Host memory from /proc and /sys/fs/cgroup: this machine's own files, a real process tree, and copies of the
files as other kernels write them (cgroup v1 and v2, a kernel without MemAvailable).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _host_memory as hm

MEMINFO = """MemTotal:       65755304 kB
MemFree:         1012344 kB
MemAvailable:   61656276 kB
Buffers:          212340 kB
SwapTotal:       8388604 kB
SwapFree:        8388604 kB
"""


def write(root, path, text):
    full = root / path
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_text(text)


def test_meminfo_of_this_machine_its_errors_naming_the_file_and_this_process_s_cgroup(monkeypatch, tmp_path):
    values = hm.meminfo()
    with open("/proc/meminfo") as handle:
        total_kib = int([line for line in handle if line.startswith("MemTotal:")][0].split()[1])
    assert values["memory_total_mib"] == round(total_kib / 1024.0, 2)
    assert 0 < values["memory_available_mib"] <= values["memory_total_mib"]
    missing = tmp_path / "nothing"
    with pytest.raises(hm.HostMemoryError) as raised:
        hm.meminfo(str(missing))
    assert str(raised.value) == "cannot read %s/proc/meminfo: No such file or directory" % missing
    for text in ("MemTotal:       65755304 kB\n", "MemTotal:       65755304 kB\nMemAvailable:\nSwapTotal:  n/a kB\n"):
        write(tmp_path, "proc/meminfo", text)  # MemAvailable missing, or without a number: no value
        with pytest.raises(hm.HostMemoryError) as raised:
            hm.meminfo(str(tmp_path))
        assert str(raised.value) == ("%s/proc/meminfo has no MemTotal/MemAvailable line (a kernel older than 3.14?)"
                                     % tmp_path)
    read = []
    monkeypatch.setattr(hm, "_read", lambda root, *parts: read.append((root,) + parts) or "0::/\n")
    assert hm.cgroup_memory() is None
    assert read[0] == ("/", "proc/self/cgroup")


@pytest.mark.parametrize("text, values", [
    (MEMINFO, {"memory_total_mib": 64214.16, "memory_available_mib": 60211.21, "swap_total_mib": 8192.0,
               "swap_free_mib": 8192.0}),
    # a key line whose value is empty or not a number gives no value (the key is then missing), not a crash
    ("MemTotal:       65755304 kB\nMemAvailable:  1024 kB\nSwapTotal:  n/a kB\n",
     {"memory_total_mib": 64214.16, "memory_available_mib": 1.0}),
])
def test_meminfo_of_a_copy(tmp_path, text, values):
    write(tmp_path, "proc/meminfo", text)
    assert hm.meminfo(str(tmp_path)) == values


@pytest.fixture
def tree():
    """A real process tree: a Python parent with two children, one of which has a child."""
    code = ("import subprocess, sys, time\n"
            "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']),\n"
            "        subprocess.Popen(['sh', '-c', 'sleep 60 & wait'])]\n"
            "print(' '.join(str(k.pid) for k in kids), flush=True)\n"
            "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    kids = [int(p) for p in parent.stdout.readline().split()]
    deadline = time.time() + 10
    while time.time() < deadline and not open("/proc/%d/task/%d/children" % (kids[1], kids[1])).read().split():
        time.sleep(0.05)
    yield parent.pid, kids
    for pid in reversed(hm.process_tree(parent.pid)):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    parent.wait()


def test_process_tree_and_memory_of_real_processes(tree):
    parent, kids = tree
    pids = hm.process_tree(parent)
    grandchild = int(open("/proc/%d/task/%d/children" % (kids[1], kids[1])).read().split()[0])
    assert pids[0] == parent and set(pids) == {parent, kids[0], kids[1], grandchild} and len(pids) == 4
    memory = hm.process_memory(pids)
    assert memory["rss_anon_mib"] > 0 and memory["rss_file_mib"] > 0
    alone = hm.process_memory([kids[0]])
    assert alone["rss_anon_mib"] < memory["rss_anon_mib"]
    result = hm.gather(pid=parent)
    assert result["process_tree"]["pids"] == pids
    assert result["memory_held_by_pid_mib"] == round(result["process_tree"]["rss_anon_mib"]
                                                     + result["process_tree"]["rss_shmem_mib"], 2)


# Above any pid this machine gives out (/proc/sys/kernel/pid_max is at most 4194304): a tree of the real /proc
# would be the pid alone.
PARENT, CHILD = 4194301, 4194302


def status(anon_kib, file_kib, shmem_kib):
    return ("Name:\tllama-server\nVmRSS:\t%d kB\nRssAnon:\t%d kB\nRssFile:\t%d kB\nRssShmem:\t%d kB\n"
            % (anon_kib + file_kib + shmem_kib, anon_kib, file_kib, shmem_kib))


def host(root):
    write(root, "proc/meminfo", MEMINFO)
    write(root, "proc/self/cgroup", "0::/system.slice/ai-llm.scope\n")
    write(root, "sys/fs/cgroup/system.slice/ai-llm.scope/memory.max", "34359738368\n")
    write(root, "sys/fs/cgroup/system.slice/ai-llm.scope/memory.current", "1073741824\n")
    write(root, "proc/%d/task/%d/children" % (PARENT, PARENT), "%d\n" % CHILD)
    write(root, "proc/%d/task/%d/children" % (CHILD, CHILD), "")
    write(root, "proc/%d/status" % PARENT, status(2048, 1024, 512))
    write(root, "proc/%d/status" % CHILD, status(4096, 8192, 1536))


def test_gather_reads_everything_from_the_root_it_is_given(tmp_path):
    host(tmp_path)
    result = hm.gather(str(tmp_path), pid=str(PARENT))
    assert result["memory_total_mib"] == 64214.16
    assert result["cgroup"] == {"version": 2, "path": "/system.slice/ai-llm.scope", "limit_mib": 32768.0,
                                "usage_mib": 1024.0}
    assert result["process_tree"] == {"pid": PARENT, "pids": [PARENT, CHILD], "rss_anon_mib": 6.0,
                                      "rss_file_mib": 9.0, "rss_shmem_mib": 2.0}
    # anonymous + shared: 6 + 2 MiB; the 9 MiB of file pages stay in the page cache
    assert result["memory_held_by_pid_mib"] == 8.0
    # llm_server_service_info walks the container's tree once and hands it over: exactly those processes count
    given = hm.gather(str(tmp_path), pid=str(PARENT), pids=[PARENT])
    assert given["process_tree"] == {"pid": PARENT, "pids": [PARENT], "rss_anon_mib": 2.0, "rss_file_mib": 1.0,
                                     "rss_shmem_mib": 0.5}
    assert given["memory_held_by_pid_mib"] == 2.5
    alone = hm.gather(str(tmp_path))
    assert "process_tree" not in alone and "memory_held_by_pid_mib" not in alone
    assert alone["cgroup"]["limit_mib"] == 32768.0


def limits(root, cgroup_lines, files):
    write(root, "proc/self/cgroup", "".join(line + "\n" for line in cgroup_lines))
    for path, text in files.items():
        write(root, "sys/fs/cgroup/" + path, text + "\n")
    return hm.cgroup_memory(str(root))


@pytest.mark.parametrize("limit, usage, mib", [
    (str((1536 << 20) + 12345), str((10240 << 20) + 12345), (1536.01, 10240.01)),  # MiB to two decimals
    (str(1 << 30), "", (1024.0, None)),
    (str((1 << 60) - (1 << 20)), "0", ((1 << 40) - 1, 0.0)),
    ("max", "0", None), ("", "0", None), ("not a number", "0", None), (str(1 << 60), "0", None),
])
def test_the_limit_and_usage_of_a_cgroup_and_what_is_no_limit(tmp_path, limit, usage, mib):
    """v2 writes ``max``, v1 a page-aligned 2**63 - 4096 for no limit; from 2**60 bytes (1 EiB) up, or a value
    that is not a byte count, is no limit either: no cgroup figures."""
    found = limits(tmp_path, ["0::/ai.slice"], {"ai.slice/memory.max": limit, "ai.slice/memory.current": usage})
    assert found == (mib and {"version": 2, "path": "/ai.slice", "limit_mib": mib[0], "usage_mib": mib[1]})


def test_the_cgroup_lines_as_the_kernel_writes_them(tmp_path):
    """man 7 cgroups, /proc/<pid>/cgroup: ``hierarchy-ID:controller-list:cgroup-path``, one line per hierarchy; a
    path may hold colons; a v1 hierarchy may bind several controllers (``cpu,memory``); ``0::path`` is the v2
    one. The first line whose limit can be read counts."""
    assert limits(tmp_path, ["0::/ai.slice/a:b.scope"], {"ai.slice/a:b.scope/memory.max": "1048576",
                                                         "ai.slice/a:b.scope/memory.current": "0"})["path"] \
        == "/ai.slice/a:b.scope"
    assert limits(tmp_path / "v1", ["5:cpu,memory:/docker/x"], {
        "memory/docker/x/memory.limit_in_bytes": "2097152", "memory/docker/x/memory.usage_in_bytes": "0"}) == {
        "version": 1, "path": "/docker/x", "limit_mib": 2.0, "usage_mib": 0.0}
    # hybrid hosts: a v1 memory line whose files are missing, or without a limit, then the v2 line with one
    for v1_files in ({}, {"memory/docker/x/memory.limit_in_bytes": "9223372036854771712",
                          "memory/docker/x/memory.usage_in_bytes": "0"}):
        root = tmp_path / ("hybrid%d" % len(v1_files))
        found = limits(root, ["not a cgroup line", "4:memory:/docker/x", "0::/X11.slice"],
                       dict(v1_files, **{"X11.slice/memory.max": "3145728", "X11.slice/memory.current": "0"}))
        assert found == {"version": 2, "path": "/X11.slice", "limit_mib": 3.0, "usage_mib": 0.0}


def test_the_tree_walks_every_thread_and_child_once(tmp_path):
    """/proc/<pid>/task/<tid>/children lists the children each thread started: the tree takes those of every
    thread (in thread id order), each process once; a thread or process that is gone ends only its own branch."""
    parent, thread, gone, child_a, child_b, grandchild = 4194301, 999999, 4194290, 4194302, 4194303, 4194304
    write(tmp_path, "proc/%d/task/%d/children" % (parent, parent), "%d %d\n" % (child_b, child_a))
    write(tmp_path, "proc/%d/task/%d/children" % (parent, thread), "%d %d\n" % (gone, child_b))
    (tmp_path / ("proc/%d/task/1234567" % parent)).mkdir()  # a thread that ended: no children file
    write(tmp_path, "proc/%d/task/%d/children" % (child_a, child_a), "")
    write(tmp_path, "proc/%d/task/%d/children" % (child_b, child_b), "%d\n" % grandchild)
    write(tmp_path, "proc/%d/task/%d/children" % (grandchild, grandchild), "")
    # thread 999999 first: the gone process, then child_b (listed by both threads) and its child, then child_a
    assert hm.process_tree(parent, str(tmp_path)) == [parent, gone, child_b, grandchild, child_a]
    for pid, kib in ((parent, 1234), (child_b, 2345), (grandchild, 100)):
        write(tmp_path, "proc/%d/status" % pid, status(kib, kib // 2, 7))
    memory = hm.process_memory([gone, parent, child_b, grandchild], str(tmp_path))
    # each figure of /proc/<pid>/status in MiB to two decimals, then summed
    assert memory == {"rss_anon_mib": round(1.21 + 2.29 + 0.1, 2), "rss_file_mib": round(0.6 + 1.14 + 0.05, 2),
                      "rss_shmem_mib": round(0.01 + 0.01 + 0.01, 2)}


def test_copy_bandwidth_counts_a_read_and_a_write_per_copy_and_stops_before_a_copy_would_end_late():
    """A clock that moves 0.1 s a reading: copies end at 0.2, 0.4 and 0.6 s; after the third another would end past
    0.5 s. 3 copies of 1 MiB, each read and written: 2 x 1048576 x 3 bytes in 0.6 s = 10.48576 MB/s."""
    ticks = iter(range(100))
    probe = hm.copy_bandwidth(0.5, 1 << 20, clock=lambda: next(ticks) / 10.0)
    assert probe == {"memory_bandwidth_mb_per_s": round(2 * 1048576 * 3 / 0.6 / 1e6, 1), "buffer_mib": 1.0,
                     "copies": 3, "seconds": 0.6}
    started = time.perf_counter()
    real = hm.copy_bandwidth(0.05, 1 << 20)
    assert real["copies"] >= 1 and real["memory_bandwidth_mb_per_s"] > 0
    assert time.perf_counter() - started < 1.0
