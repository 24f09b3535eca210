"""Host memory from /proc and /sys/fs/cgroup: this machine's own files, a real process tree, and copies of the
files as other kernels write them (cgroup v1 and v2, a kernel without MemAvailable)."""
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


def test_meminfo_of_this_machine():
    values = hm.meminfo()
    with open("/proc/meminfo") as handle:
        total_kib = int([line for line in handle if line.startswith("MemTotal:")][0].split()[1])
    assert values["memory_total_mib"] == round(total_kib / 1024.0, 2)
    assert 0 < values["memory_available_mib"] <= values["memory_total_mib"]


def test_meminfo_of_a_copy(tmp_path):
    write(tmp_path, "proc/meminfo", MEMINFO)
    assert hm.meminfo(str(tmp_path)) == {"memory_total_mib": 64214.16, "memory_available_mib": 60211.21,
                                         "swap_total_mib": 8192.0, "swap_free_mib": 8192.0}


def test_meminfo_without_mem_available_is_a_clear_error(tmp_path):
    write(tmp_path, "proc/meminfo", "MemTotal:       65755304 kB\nMemFree:         1012344 kB\n")
    with pytest.raises(hm.HostMemoryError, match="no MemTotal/MemAvailable"):
        hm.meminfo(str(tmp_path))
    with pytest.raises(hm.HostMemoryError, match="cannot read"):
        hm.meminfo(str(tmp_path / "nothing"))


def test_cgroup_v2_limit(tmp_path):
    write(tmp_path, "proc/self/cgroup", "0::/user.slice/user-1000.slice/session-3.scope\n")
    write(tmp_path, "sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope/memory.max", "34359738368\n")
    write(tmp_path, "sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope/memory.current", "1269301248\n")
    assert hm.cgroup_memory(str(tmp_path)) == {"version": 2, "path": "/user.slice/user-1000.slice/session-3.scope",
                                               "limit_mib": 32768.0, "usage_mib": 1210.5}
    write(tmp_path, "sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope/memory.max", "max\n")
    assert hm.cgroup_memory(str(tmp_path)) is None


def test_cgroup_v1_limit_and_this_machine(tmp_path):
    write(tmp_path, "proc/self/cgroup", "9:name=systemd:/\n4:memory:/docker/abc\n0::/\n")
    write(tmp_path, "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "17179869184\n")
    write(tmp_path, "sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes", "104857600\n")
    assert hm.cgroup_memory(str(tmp_path)) == {"version": 1, "path": "/docker/abc", "limit_mib": 16384.0,
                                               "usage_mib": 100.0}
    write(tmp_path, "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "9223372036854771712\n")
    assert hm.cgroup_memory(str(tmp_path)) is None  # v1's "no limit"
    mine = hm.cgroup_memory()
    assert mine is None or mine["limit_mib"] > 0


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


def test_a_gone_process_is_its_own_tree():
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert hm.process_tree(gone.pid) == [gone.pid]
    assert hm.process_memory([gone.pid]) == {"rss_anon_mib": 0.0, "rss_file_mib": 0.0, "rss_shmem_mib": 0.0}


def test_gather_takes_a_tree_already_walked():
    """llm_server_service_info walks the container's tree once and hands it to the host memory read: the memory of
    exactly those processes counts (here this test's process alone, not its child)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        walked = hm.gather(pid=os.getpid())
        given = hm.gather(pid=os.getpid(), pids=[os.getpid()])
        assert child.pid in walked["process_tree"]["pids"]
        assert given["process_tree"]["pids"] == [os.getpid()]
    finally:
        child.kill()
        child.wait()
