"""Parsing nvidia-smi output as real cards print it (fixtures in tests/data/nvidia_smi)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _nvidia_smi as smi

DATA = Path(__file__).resolve().parents[3] / "data" / "nvidia_smi"


def fixture(name):
    return (DATA / name).read_text()


def fake_run(name, rc_by_mode=None):
    """A ``run(args)`` that answers like the nvidia-smi test double does, recording the calls."""
    calls = []

    def run(args):
        calls.append(list(args))
        joined = " ".join(args)
        for failing, rc in (("driver_mismatch", 18), ("no_driver", 9)):
            if name == failing:
                return rc, fixture(name + ".txt"), ""
        if "--query-gpu=" in joined and "compute_cap" in joined and (DATA / (name + ".invalid_field.txt")).exists():
            return 2, fixture(name + ".invalid_field.txt"), ""
        suffix = ".apps.txt" if "--query-compute-apps" in joined else ".list.txt" if args == ["-L"] else ".txt"
        path = DATA / (name + suffix)
        return 0, path.read_text() if path.exists() else "", ""
    return run, calls


@pytest.mark.parametrize("name, gpu_name, total, free, cc", [
    ("rtx_a5500", "NVIDIA RTX A5500", 24564, 24148, "8.6"),
    ("rtx_4090", "NVIDIA GeForce RTX 4090", 24564, 22918, "8.9"),
    ("a100_40gb", "NVIDIA A100-PCIE-40GB", 40960, 40337, "8.0"),
    ("a100_80gb", "NVIDIA A100-SXM4-80GB", 81920, 81037, "8.0"),
    ("h100", "NVIDIA H100 80GB HBM3", 81559, 81007, "9.0"),
    ("h200", "NVIDIA H200", 143771, 143161, "9.0"),
])
def test_single_cards(name, gpu_name, total, free, cc):
    gpus, warnings = smi.parse_gpus(fixture(name + ".txt"))
    assert warnings == []
    assert len(gpus) == 1
    gpu = gpus[0]
    assert gpu["index"] == 0
    assert gpu["name"] == gpu_name
    assert gpu["uuid"].startswith("GPU-") and len(gpu["uuid"]) == 40
    assert gpu["memory_total_mib"] == total and gpu["memory_free_mib"] == free
    assert gpu["compute_capability"] == cc
    assert isinstance(gpu["memory_used_mib"], int)
    assert smi.topology(gpus) == "single"


def test_a5500_fields_in_order():
    gpus = smi.parse_gpus(fixture("rtx_a5500.txt"))[0]
    assert gpus[0] == {"index": 0, "name": "NVIDIA RTX A5500", "uuid": "GPU-8d4f3c2a-61b7-4e0a-9f35-2c7e1d9a4b60",
                       "pci_bus_id": "00000000:01:00.0", "memory_total_mib": 24564, "memory_used_mib": 1,
                       "memory_free_mib": 24148, "driver_version": "550.127.05", "compute_capability": "8.6"}


def test_topologies():
    assert smi.topology([]) == "cpu"
    dual = smi.parse_gpus(fixture("dual_a5500_a4000.txt"))[0]
    assert [g["index"] for g in dual] == [0, 1]
    assert [g["memory_total_mib"] for g in dual] == [24564, 16376]
    assert smi.topology(dual) == "dual"
    quad = smi.parse_gpus(fixture("quad_h100.txt"))[0]
    assert smi.topology(quad) == "multi" and len(quad) == 4


@pytest.mark.parametrize("name, marker", [("gb10_na", "[N/A]"), ("gtx1650_not_supported", "[Not Supported]")])
def test_unavailable_fields_are_none_with_a_warning(name, marker):
    gpus, warnings = smi.parse_gpus(fixture(name + ".txt"))
    assert gpus[0]["memory_free_mib"] is None
    assert gpus[0]["memory_used_mib"] is None
    assert len(warnings) == 1 and marker in warnings[0] and "memory_free_mib" in warnings[0]


def test_unexpected_output_is_an_error_not_a_crash():
    with pytest.raises(smi.NvidiaSmiError, match="unexpected line 1"):
        smi.parse_gpus("index, name\n")
    with pytest.raises(smi.NvidiaSmiError, match="not a number"):
        smi.parse_gpus(fixture("rtx_a5500.txt").replace("24564", "lots"))


@pytest.mark.parametrize("name, rc, words, meaning", [
    ("driver_mismatch", 18, "Failed to initialize NVML: Driver/library version mismatch", "reboot"),
    ("no_driver", 9, "couldn't communicate with the NVIDIA driver", "not loaded"),
])
def test_failures_keep_nvidia_smis_words(name, rc, words, meaning):
    message = smi.failure_message(rc, fixture(name + ".txt"), "")
    assert words in message and meaning in message and "rc=%d" % rc in message
    run = fake_run(name)[0]
    with pytest.raises(smi.NvidiaSmiError, match="rc=%d" % rc):
        smi.gather(run)


def test_success_is_no_failure():
    assert smi.failure_message(0, fixture("h100.txt"), "") is None
    assert "rc=1" in smi.failure_message(1, "", "")


def test_old_driver_without_compute_cap_is_asked_again():
    run, calls = fake_run("legacy_470")
    result = smi.gather(run)
    assert calls[0][0].endswith(",compute_cap") and "compute_cap" not in calls[1][0]
    assert result["gpus"][0]["name"] == "NVIDIA GeForce RTX 3090"
    assert result["gpus"][0]["compute_capability"] is None
    assert result["gpus"][0]["memory_free_mib"] == 24263
    assert any("compute_cap" in w for w in result["warnings"])


def test_gather_exact_query_and_mig():
    run, calls = fake_run("mig_a100")
    result = smi.gather(run)
    assert calls[0] == ["--query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.used,memory.free,"
                        "driver_version,compute_cap", "--format=csv,noheader,nounits"]
    assert calls[1] == ["-L"]
    assert [d["profile"] for d in result["gpus"][0]["mig_devices"]] == ["3g.20gb", "2g.10gb", "1g.5gb"]
    assert result["gpus"][0]["mig_devices"][0]["uuid"] == "MIG-4a7f2c90-d1e8-5b36-a0c4-9e2f71b8d653"
    assert any("MIG mode" in w for w in result["warnings"])
    assert "processes" not in result


def test_processes():
    run, calls = fake_run("rtx_a5500_busy")
    result = smi.gather(run, processes=True)
    assert calls[-1][0] == "--query-compute-apps=gpu_uuid,pid,process_name,used_memory"
    assert result["processes"] == [
        {"gpu_uuid": "GPU-8d4f3c2a-61b7-4e0a-9f35-2c7e1d9a4b60", "gpu_index": 0, "pid": 48213,
         "process_name": "/usr/local/bin/llama-server", "used_memory_mib": 18342},
        {"gpu_uuid": "GPU-8d4f3c2a-61b7-4e0a-9f35-2c7e1d9a4b60", "gpu_index": 0, "pid": 1771,
         "process_name": None, "used_memory_mib": 512}]
    assert smi.parse_apps("No running processes found\n") == []
    run = fake_run("h100")[0]
    assert smi.gather(run, processes=True)["processes"] == []


def test_memory_held_by_a_process_tree_on_each_gpu():
    """A llama-server split over two cards (pid 52017, the child of a container's main process 52001) beside
    other processes: only the tree's memory counts, per GPU index."""
    run, calls = fake_run("dual_a5500_a4000_busy")
    result = smi.gather(run, pids=[52001, 52017])
    assert [g["memory_held_by_pid_mib"] for g in result["gpus"]] == [20988, 13314]
    assert "processes" not in result and calls[-1][0].startswith("--query-compute-apps=")
    assert smi.held_by(smi.parse_apps(fixture("dual_a5500_a4000_busy.apps.txt"), result["gpus"]), [1771, 2290]) == {
        0: 512, 1: 310}
    idle = smi.gather(fake_run("dual_a5500_a4000")[0], pids=[52001])
    assert [g["memory_held_by_pid_mib"] for g in idle["gpus"]] == [0, 0]


def test_read_finds_nvidia_smi_and_runs_it_with_its_path(tmp_path):
    """gpu_info's result: nvidia-smi found on PATH and run by its full path; none on a host without NVIDIA GPU."""
    run, calls = fake_run("rtx_a5500")
    found = []

    def find(name):
        found.append(name)
        return "/usr/bin/nvidia-smi"
    result = smi.read(find, lambda argv: run(argv[1:]) if argv[0] == "/usr/bin/nvidia-smi" else (127, "", ""))
    assert found == ["nvidia-smi"] and calls and result["nvidia_smi"] == "/usr/bin/nvidia-smi"
    assert result["topology"] == "single" and result["gpus"][0]["name"] == "NVIDIA RTX A5500"
    assert "process_tree" not in result and "processes" not in result and result["warnings"] == []
    cpu = smi.read(lambda name: None, lambda argv: (127, "", ""))
    assert cpu == {"gpus": [], "topology": "cpu", "warnings": [], "nvidia_smi": None}


def test_read_with_a_pid_counts_its_tree_and_asks_for_processes():
    run = fake_run("rtx_a5500_busy")[0]
    result = smi.read(lambda name: "/x/nvidia-smi", lambda argv: run(argv[1:]), pid=os.getpid(), processes=True)
    assert result["process_tree"]["pid"] == os.getpid() and result["process_tree"]["pids"][0] == os.getpid()
    assert [p["pid"] for p in result["processes"]] == [48213, 1771]
    assert result["gpus"][0]["memory_held_by_pid_mib"] == 0  # this test's process holds nothing on the card
    cpu = smi.read(lambda name: None, lambda argv: (127, "", ""), pid=os.getpid())
    assert cpu["process_tree"]["pid"] == os.getpid() and cpu["gpus"] == []


def test_read_fails_with_the_program_it_ran():
    run = fake_run("driver_mismatch")[0]
    with pytest.raises(smi.NvidiaSmiError) as failed:
        smi.read(lambda name: "/opt/nv/nvidia-smi", lambda argv: run(argv[1:]))
    assert failed.value.binary == "/opt/nv/nvidia-smi" and "Failed to initialize NVML" in str(failed.value)
    assert smi.NvidiaSmiError("x").binary is None


def test_read_takes_a_tree_already_walked():
    """llm_server_service_info walks the container's tree once and hands it to the GPU read."""
    run = fake_run("dual_a5500_a4000_busy")[0]
    result = smi.read(lambda name: "/x/nvidia-smi", lambda argv: run(argv[1:]), pid=52001, pids=[52001, 52017])
    assert result["process_tree"] == {"pid": 52001, "pids": [52001, 52017]}
    assert [g["memory_held_by_pid_mib"] for g in result["gpus"]] == [20988, 13314]
