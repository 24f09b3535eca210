"""gather() on a copy of /proc and /sys/fs/cgroup as a cgroup v2 host writes them: every figure comes from the
copy given as ``root`` (never from this machine's own files), and the memory a process tree gives back when it
stops is its anonymous plus its shared resident memory (the kernel's RssAnon and RssShmem of
/proc/<pid>/status; RssFile is page cache of mapped files, such as the model)."""
from __future__ import annotations

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _host_memory as hm

# Above any pid this machine gives out (/proc/sys/kernel/pid_max is at most 4194304): a tree of the real /proc
# would be the pid alone.
PARENT, CHILD = 4194301, 4194302


def write(root, path, text):
    full = root / path
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_text(text)


def status(anon_kib, file_kib, shmem_kib):
    return ("Name:\tllama-server\nVmRSS:\t%d kB\nRssAnon:\t%d kB\nRssFile:\t%d kB\nRssShmem:\t%d kB\n"
            % (anon_kib + file_kib + shmem_kib, anon_kib, file_kib, shmem_kib))


def host(root):
    write(root, "proc/meminfo", "MemTotal:       65755304 kB\nMemAvailable:   61656276 kB\n"
                                "SwapTotal:       0 kB\nSwapFree:        0 kB\n")
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


def test_gather_without_pid_has_no_tree(tmp_path):
    host(tmp_path)
    result = hm.gather(str(tmp_path))
    assert "process_tree" not in result and "memory_held_by_pid_mib" not in result
    assert result["cgroup"]["limit_mib"] == 32768.0


def test_meminfo_errors_name_the_file(tmp_path):
    missing = tmp_path / "nothing"
    try:
        hm.meminfo(str(missing))
    except hm.HostMemoryError as exc:
        assert str(exc) == "cannot read %s/proc/meminfo: No such file or directory" % missing
    else:
        raise AssertionError("no error for a missing /proc/meminfo")
    write(tmp_path, "proc/meminfo", "MemTotal:       65755304 kB\n")
    try:
        hm.meminfo(str(tmp_path))
    except hm.HostMemoryError as exc:
        assert str(exc) == ("%s/proc/meminfo has no MemTotal/MemAvailable line (a kernel older than 3.14?)"
                            % tmp_path)
    else:
        raise AssertionError("no error without MemAvailable")


def test_a_line_without_a_number_is_no_value(tmp_path):
    """A key line whose value is empty or not a number gives no value (the key is then missing), not a crash."""
    write(tmp_path, "proc/meminfo", "MemTotal:       65755304 kB\nMemAvailable:\nSwapTotal:  n/a kB\n")
    try:
        hm.meminfo(str(tmp_path))
    except hm.HostMemoryError as exc:
        assert "no MemTotal/MemAvailable line" in str(exc)
    else:
        raise AssertionError("no error for an empty MemAvailable")
    write(tmp_path, "proc/meminfo", "MemTotal:       65755304 kB\nMemAvailable:  1024 kB\nSwapTotal:  n/a kB\n")
    assert hm.meminfo(str(tmp_path)) == {"memory_total_mib": 64214.16, "memory_available_mib": 1.0}
