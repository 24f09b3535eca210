"""host_info through real Ansible: this machine's /proc/meminfo and a real process tree."""
from __future__ import annotations

import subprocess
import sys


def test_host_memory_of_this_machine(ansible_module):
    result = ansible_module("host_info", {}, check=True)
    assert result["failed"] is False and result["changed"] is False
    assert 0 < result["memory_available_mib"] <= result["memory_total_mib"]
    assert "swap_total_mib" in result and "process_tree" not in result
    assert result["cgroup"] is None or result["cgroup"]["limit_mib"] > 0


def test_memory_a_process_tree_holds_and_a_bad_pid_is_refused(ansible_module):
    # the child says when its 64 MiB are allocated (and zeroed, so resident): read before that, it holds less
    child = subprocess.Popen([sys.executable, "-c", "import time\nx = bytearray(64 << 20)\nprint('ready', flush=True)\n"
                              "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        result = ansible_module("host_info", {"pid": child.pid})
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    assert result["failed"] is False
    assert result["process_tree"]["pid"] == child.pid and result["process_tree"]["pids"] == [child.pid]
    assert result["memory_held_by_pid_mib"] >= 64  # the 64 MiB bytearray is anonymous memory
    result = ansible_module("host_info", {"pid": -3})
    assert result["failed"] is True and "pid must be a process id >= 1" in result["msg"]


def test_the_bandwidth_probe_is_asked_for_and_gives_mb_per_second(ansible_module):
    result = ansible_module("host_info", {"bandwidth_probe": True}, check=True)
    probe = result["memory_bandwidth_probe"]
    assert result["failed"] is False and probe["buffer_mib"] == 256.0 and probe["copies"] >= 1
    assert probe["seconds"] <= 1.0 and result["memory_bandwidth_mb_per_s"] > 0
