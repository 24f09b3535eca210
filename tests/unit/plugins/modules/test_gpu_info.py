"""gpu_info through real Ansible, with the nvidia-smi test double (tests/doubles) on PATH."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

DOUBLES = Path(__file__).resolve().parents[3] / "doubles"


def env_with_double(fixture, **extra):
    env = {"PATH": "%s:%s" % (DOUBLES, os.environ["PATH"]), "NVIDIA_SMI_FIXTURE": fixture}
    env.update(extra)
    return env


@pytest.mark.parametrize("fixture, gpu_name, total, free", [
    ("rtx_a5500", "NVIDIA RTX A5500", 24564, 24148),
    # [N/A] fields: the warning goes to the callback's [WARNING] lines (test_nvidia_smi checks its text)
    ("gb10_na", "NVIDIA GB10", None, None),
])
def test_a_single_gpu(ansible_module, fixture, gpu_name, total, free):
    result = ansible_module("gpu_info", {"processes": False}, extra_env=env_with_double(fixture))
    assert result["failed"] is False and result["changed"] is False
    assert result["topology"] == "single"
    assert result["nvidia_smi"] == str(DOUBLES / "nvidia-smi")
    gpu = result["gpus"][0]
    assert (gpu["name"], gpu["memory_total_mib"], gpu["memory_free_mib"]) == (gpu_name, total, free)
    assert gpu["mig_devices"] == []
    assert "processes" not in result


def test_dual_with_processes_in_check_mode_and_the_memory_a_process_tree_holds(ansible_module, tmp_path):
    log = tmp_path / "calls"
    result = ansible_module("gpu_info", {"processes": True}, check=True,
                            extra_env=env_with_double("dual_a5500_a4000", NVIDIA_SMI_ARGS_LOG=str(log)))
    assert result["failed"] is False and result["changed"] is False
    assert result["topology"] == "dual"
    assert [g["name"] for g in result["gpus"]] == ["NVIDIA RTX A5500", "NVIDIA RTX A4000"]
    assert result["processes"] == []
    assert log.read_text().splitlines() == [
        "--query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.used,memory.free,driver_version,compute_cap "
        "--format=csv,noheader,nounits", "-L", "--query-gpu=uuid,mig.mode.current --format=csv,noheader,nounits",
        "--query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader,nounits"]
    # pid 48213 is the llama-server of the busy A5500 fixture: its 18342 MiB count for the tree; pid 1771 is another
    # process. The pid does not exist here, so its tree is itself.
    result = ansible_module("gpu_info", {"pid": 48213}, extra_env=env_with_double("rtx_a5500_busy"))
    assert result["failed"] is False
    assert result["process_tree"] == {"pid": 48213, "pids": [48213]}
    assert result["gpus"][0]["memory_held_by_pid_mib"] == 18342 and "processes" not in result
    other = ansible_module("gpu_info", {"pid": 1771, "processes": True}, extra_env=env_with_double("rtx_a5500_busy"))
    assert other["gpus"][0]["memory_held_by_pid_mib"] == 512
    none = ansible_module("gpu_info", {"pid": os.getpid()}, extra_env=env_with_double("dual_a5500_a4000"))
    assert [g["memory_held_by_pid_mib"] for g in none["gpus"]] == [0, 0]
    assert none["process_tree"]["pids"][0] == os.getpid()


@pytest.mark.parametrize("args, fixture, words", [
    ({"processes": False}, "driver_mismatch", "Failed to initialize NVML: Driver/library version mismatch"),
    ({"processes": False}, "no_driver", "couldn't communicate with the NVIDIA driver"),
    ({"gpu": 0}, "h100", "module: gpu. Supported parameters include: pid, processes."),
    ({"pid": 0}, "rtx_a5500", "pid must be a process id >= 1"),
])
def test_a_broken_nvidia_smi_or_a_bad_option_fails_with_its_words(ansible_module, args, fixture, words):
    result = ansible_module("gpu_info", args, extra_env=env_with_double(fixture))
    assert result["failed"] is True
    assert words in result["msg"]
    assert "Traceback" not in result.get("module_stderr", "")


def test_no_nvidia_smi_is_a_cpu_host(ansible_module, tmp_path):
    # A PATH with everything the shell needs but no nvidia-smi: links to the tools of /usr/bin and /bin.
    for directory in ("/usr/bin", "/bin"):
        for tool in os.listdir(directory):
            link = tmp_path / tool
            if tool != "nvidia-smi" and not link.exists():
                link.symlink_to(os.path.join(directory, tool))
    if shutil.which("nvidia-smi", path="/sbin:/usr/sbin:/usr/local/sbin"):
        pytest.skip("an nvidia-smi in an sbin folder is always found by get_bin_path")
    result = ansible_module("gpu_info", {"processes": True}, extra_env={"PATH": str(tmp_path)})
    assert result["failed"] is False
    assert result["gpus"] == [] and result["topology"] == "cpu" and result["nvidia_smi"] is None


def test_a_gpu_in_mig_mode_without_instances_is_reported_with_a_warning(ansible_module):
    result = ansible_module("gpu_info", {}, extra_env=env_with_double("mig_a100_no_instances"))
    assert result["failed"] is False
    gpu = result["gpus"][0]
    assert (gpu["name"], gpu["mig_mode"], gpu["mig_devices"]) == ("NVIDIA A100-SXM4-40GB", "Enabled", [])
    words = [w["event"]["msg"] if isinstance(w, dict) else w for w in result["warnings"]]  # 2.19 wraps each warning
    assert any("GPU 0 (NVIDIA A100-SXM4-40GB) has MIG mode enabled but no MIG instances" in w
               and "nvidia-smi -i 0 -mig 0" in w for w in words)
    plain = ansible_module("gpu_info", {}, extra_env=env_with_double("h100"))
    assert plain["gpus"][0]["mig_mode"] == "Disabled" and not plain.get("warnings")
