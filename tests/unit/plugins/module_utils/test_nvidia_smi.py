"""Parsing nvidia-smi output as real cards print it (fixtures in tests/data/nvidia_smi)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _nvidia_smi as smi

DATA = Path(__file__).resolve().parents[3] / "data" / "nvidia_smi"


def fixture(name):
    return (DATA / name).read_text()


def answers(by_args):
    """A ``run(args)`` for gather that answers each query (the key: the first argument's start, the longest that
    matches) with its ``(rc, stdout, stderr)``, and records the calls."""
    calls = []

    def run(args):
        calls.append(list(args))
        starts = [start for start in by_args if args[0].startswith(start)]
        if starts:
            return by_args[max(starts, key=len)]
        raise AssertionError("unexpected query %r" % (args,))
    return run, calls


def error_of(call, *args, **kw):
    """The message of the ``NvidiaSmiError`` that ``call`` raises."""
    with pytest.raises(smi.NvidiaSmiError) as raised:
        call(*args, **kw)
    return str(raised.value)


def fake_run(name):
    """A ``run(args)`` that answers every query from the fixtures of ``name`` (none: no output)."""
    files = {"--query-compute-apps=": ".apps.txt", "-L": ".list.txt", "--query-gpu=": ".txt", MIG_QUERY: ".mig.txt"}
    return answers(dict((start, (0, fixture(name + suffix) if (DATA / (name + suffix)).exists() else "", ""))
                        for start, suffix in files.items()))


MIG_QUERY = "--query-gpu=uuid,mig.mode.current"
NO_MIG = {MIG_QUERY: (0, "", "")}  # a MIG mode query that prints nothing: the mode unknown
A5500 = "GPU-8d4f3c2a-61b7-4e0a-9f35-2c7e1d9a4b60"
A4000 = "GPU-c05e7d29-4a18-3b6f-90d2-18e4a7f65c0b"
MISMATCH = ("nvidia-smi failed (rc=18): Failed to initialize NVML: Driver/library version mismatch / NVML library "
            "version: 550.127. This means the NVIDIA kernel driver and the user-space NVML library differ (typically "
            "after a driver upgrade without a reboot): reboot or reload the nvidia kernel modules.")
DUAL = smi.parse_gpus(fixture("dual_a5500_a4000.txt"))[0]
NO_DRIVER_WORDS = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
                   "latest NVIDIA driver is installed and running.")


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
    (gpu,) = gpus
    assert warnings == [] and smi.topology(gpus) == "single"
    assert (gpu["index"], gpu["name"], gpu["compute_capability"]) == (0, gpu_name, cc)
    assert gpu["uuid"].startswith("GPU-") and len(gpu["uuid"]) == 40
    assert gpu["memory_total_mib"] == total and gpu["memory_free_mib"] == free
    assert isinstance(gpu["memory_used_mib"], int)


def test_the_topologies_and_the_a5500_fields_in_order():
    assert smi.topology([]) == "cpu"
    assert [g["index"] for g in DUAL] == [0, 1] and [g["memory_total_mib"] for g in DUAL] == [24564, 16376]
    assert smi.topology(DUAL) == "dual"
    quad = smi.parse_gpus(fixture("quad_h100.txt"))[0]
    assert smi.topology(quad) == "multi" and len(quad) == 4
    gpus = smi.parse_gpus(fixture("rtx_a5500.txt"))[0]
    assert gpus[0] == {"index": 0, "name": "NVIDIA RTX A5500", "uuid": "GPU-8d4f3c2a-61b7-4e0a-9f35-2c7e1d9a4b60",
                       "pci_bus_id": "00000000:01:00.0", "memory_total_mib": 24564, "memory_used_mib": 1,
                       "memory_free_mib": 24148, "driver_version": "550.127.05", "compute_capability": "8.6"}


@pytest.mark.parametrize("text, missing, warning", [
    (fixture("gb10_na.txt"), ["memory_total_mib", "memory_used_mib", "memory_free_mib"],
     "GPU 0 (NVIDIA GB10): nvidia-smi gives no value for memory_total_mib, memory_used_mib, memory_free_mib ([N/A])"),
    (fixture("gtx1650_not_supported.txt"), ["memory_used_mib", "memory_free_mib"],
     "GPU 0 (NVIDIA GeForce GTX 1650): nvidia-smi gives no value for memory_used_mib, memory_free_mib "
     "([Not Supported])"),
    ("0, NVIDIA RTX A5500, %s, 00000000:01:00.0, 24564, 416, 24148, , 8.6\n" % A5500, ["driver_version"],
     "GPU 0 (NVIDIA RTX A5500): nvidia-smi gives no value for driver_version ()"),
    ("0, NVIDIA GB10, GPU-7a0e4d3b-95c2-1f86-e4b7-3c8d20a9f5e1, 0000000F:01:00.0, [N/A], [N/A], , 580.95.05, 12.1",
     ["memory_total_mib", "memory_used_mib", "memory_free_mib"],
     "GPU 0 (NVIDIA GB10): nvidia-smi gives no value for memory_total_mib, memory_used_mib, memory_free_mib (, [N/A])"),
])
def test_a_value_nvidia_smi_cannot_give_is_none_with_a_warning_naming_it(text, missing, warning):
    """``[N/A]``, ``[Not Supported]`` and a field left empty (``, ,``) are no value."""
    gpus, warnings = smi.parse_gpus(text)
    assert [k for k, v in gpus[0].items() if v is None] == missing and warnings == [warning]


def test_processes_the_memory_a_tree_holds_on_each_gpu_and_a_host_without_gpus():
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
    run, calls = answers({"--query-gpu=": (0, "", "")})
    result = smi.gather(run, processes=True, pids=[1])
    assert result == {"gpus": [], "topology": "cpu", "warnings": [], "processes": []}
    assert len(calls) == 1
    # A llama-server split over two cards (pid 52017, the child of a container's main process 52001) beside other
    # processes: only the tree's memory counts, per GPU index.
    run, calls = fake_run("dual_a5500_a4000_busy")
    result = smi.gather(run, pids=[52001, 52017])
    assert [g["memory_held_by_pid_mib"] for g in result["gpus"]] == [20988, 13314]
    assert "processes" not in result and calls[-1][0].startswith("--query-compute-apps=")
    assert smi.held_by(smi.parse_apps(fixture("dual_a5500_a4000_busy.apps.txt"), result["gpus"]), [1771, 2290]) == {
        0: 512, 1: 310}
    idle = smi.gather(fake_run("dual_a5500_a4000")[0], pids=[52001])
    assert [g["memory_held_by_pid_mib"] for g in idle["gpus"]] == [0, 0]
    # two processes of the tree on the same card add up; one whose memory nvidia-smi cannot give adds nothing
    apps = smi.parse_apps("%s, 10, llama-server, 1000\n%s, 11, llama-server, 234\n%s, 12, llama-server, [N/A]\n"
                          "%s, 13, llama-server, [N/A]\n%s, 99, other, 5000\n" % (A5500, A5500, A5500, A4000, A5500),
                          DUAL)
    assert smi.held_by(apps, [10, 11, 12, 13]) == {0: 1234, 1: 0}
    assert smi.held_by(apps, [12]) == {0: 0}
    assert smi.held_by(apps, []) == {}


def test_read_finds_nvidia_smi_runs_it_with_its_path_and_counts_a_pid_s_tree():
    """gpu_info's result: nvidia-smi found on PATH and run by its full path; none on a host without NVIDIA GPU."""
    run, calls = fake_run("rtx_a5500")
    found = []
    result = smi.read(lambda name: found.append(name) or "/usr/bin/nvidia-smi",
                      lambda argv: run(argv[1:]) if argv[0] == "/usr/bin/nvidia-smi" else (127, "", ""))
    assert found == ["nvidia-smi"] and calls and result["nvidia_smi"] == "/usr/bin/nvidia-smi"
    assert result["topology"] == "single" and result["gpus"][0]["name"] == "NVIDIA RTX A5500"
    assert "process_tree" not in result and "processes" not in result and result["warnings"] == []
    cpu = smi.read(lambda name: None, lambda argv: (127, "", ""))
    assert cpu == {"gpus": [], "topology": "cpu", "warnings": [], "nvidia_smi": None}
    failing = answers({"--query-gpu=": (18, fixture("driver_mismatch.txt"), "")})[0]
    with pytest.raises(smi.NvidiaSmiError) as failed:  # a failure names the program it ran
        smi.read(lambda name: "/opt/nv/nvidia-smi", lambda argv: failing(argv[1:]))
    assert failed.value.binary == "/opt/nv/nvidia-smi" and str(failed.value) == MISMATCH
    assert smi.NvidiaSmiError("x").binary is None
    run = fake_run("rtx_a5500_busy")[0]
    result = smi.read(lambda name: "/x/nvidia-smi", lambda argv: run(argv[1:]), pid=os.getpid(), processes=True)
    assert result["process_tree"]["pid"] == os.getpid() and result["process_tree"]["pids"][0] == os.getpid()
    assert [p["pid"] for p in result["processes"]] == [48213, 1771]
    assert result["gpus"][0]["memory_held_by_pid_mib"] == 0  # this test's process holds nothing on the card
    cpu = smi.read(lambda name: None, lambda argv: (127, "", ""), pid=os.getpid())
    assert cpu["process_tree"]["pid"] == os.getpid() and cpu["gpus"] == []
    # llm_server_service_info walks the container's tree once and hands it to the GPU read
    run = fake_run("dual_a5500_a4000_busy")[0]
    given = smi.read(lambda name: "/x/nvidia-smi", lambda argv: run(argv[1:]), pid=52001, pids=[52001, 52017])
    assert given["process_tree"] == {"pid": 52001, "pids": [52001, 52017]}
    assert [g["memory_held_by_pid_mib"] for g in given["gpus"]] == [20988, 13314]


def test_the_process_query_asks_for_bare_csv_and_its_rows_are_read_past_the_no_running_note():
    """``nvidia-smi --help-query-compute-apps``: the fields by name; ``--format=csv,noheader,nounits`` prints the
    bare values (no header line, ``20988`` instead of ``20988 MiB``), which is what parse_apps reads."""
    assert smi.query_apps_args() == ["--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
                                     "--format=csv,noheader,nounits"]
    assert smi.query_gpu_args(("index", "name")) == ["--query-gpu=index,name", "--format=csv,noheader,nounits"]
    assert smi.list_args() == ["-L"]
    # Old drivers print a note instead of rows; a row after it is still read.
    text = ("No running processes found\n%s, 52017, /usr/local/bin/llama-server, 20988\n%s, 77, llama-server, [N/A]\n"
            "%s, 78, llama-server, 12 MiB\n" % (A5500, A4000, A5500))
    apps = smi.parse_apps(text, DUAL)
    assert [(a["pid"], a["gpu_index"], a["used_memory_mib"]) for a in apps] == [(52017, 0, 20988), (77, 1, None),
                                                                                (78, 0, None)]
    assert [a["gpu_index"] for a in smi.parse_apps(text)] == [None, None, None]  # no GPU list given: no index


def test_list_lines_and_mig_devices_only_from_a_list_that_succeeded_and_each_gpu_s_keys():
    text = ("  MIG 1g.5gb      Device  0: (UUID: MIG-00000000-0000-0000-0000-000000000000)\n"
            + fixture("mig_a100.list.txt")
            + "No MIG devices found\n")
    mig = smi.parse_list(text)
    assert mig == {"GPU-e3a91c57-2b0f-8d46-a5c1-7f9b03d2e864": [
        {"index": 0, "profile": "3g.20gb", "uuid": "MIG-4a7f2c90-d1e8-5b36-a0c4-9e2f71b8d653"},
        {"index": 1, "profile": "2g.10gb", "uuid": "MIG-b82e0d15-6c9a-5f47-83d1-0a6e4c2f9b78"},
        {"index": 2, "profile": "1g.5gb", "uuid": "MIG-0d9c63a4-f7b2-51e8-9c40-b3a8e5d17f26"}]}
    assert smi.parse_list(fixture("dual_a5500_a4000.list.txt")) == {A5500: [], A4000: []}
    assert smi.parse_list(None) == {} and smi.parse_list("") == {}
    a100 = fixture("mig_a100.txt")
    mig_list = fixture("mig_a100.list.txt")
    run, calls = answers({"--query-gpu=": (0, a100, ""), "-L": (0, mig_list, ""), **NO_MIG})
    result = smi.gather(run)
    assert calls[1] == ["-L"] and result["topology"] == "single" and "processes" not in result
    assert result["gpus"][0]["mig_devices"] == smi.parse_list(mig_list)["GPU-e3a91c57-2b0f-8d46-a5c1-7f9b03d2e864"]
    assert result["warnings"] == ["GPU 0 (NVIDIA A100-SXM4-40GB) is in MIG mode: CUDA sees its 3 MIG devices "
                                  "(3g.20gb, 2g.10gb, 1g.5gb), each with a slice of the memory, not the whole GPU"]
    failed = smi.gather(answers({"--query-gpu=": (0, a100, ""), "-L": (15, mig_list, ""), **NO_MIG})[0])
    assert failed["gpus"][0]["mig_devices"] == [] and failed["warnings"] == []
    plain = smi.gather(answers({"--query-gpu=": (0, fixture("h100.txt"), ""), "-L": (0, "", ""), **NO_MIG})[0])
    assert plain["gpus"][0]["mig_devices"] == []
    run = answers({"--query-gpu=": (0, fixture("dual_a5500_a4000.txt"), ""), "-L": (0, "", ""),
                   "--query-compute-apps=": (0, "", ""), **NO_MIG})[0]
    assert [sorted(g) for g in smi.gather(run)["gpus"]] == [sorted(smi.GPU_KEYS + ("mig_mode", "mig_devices"))] * 2
    assert [sorted(g) for g in smi.gather(run, pids=[1])["gpus"]] == [sorted(smi.GPU_KEYS + smi.GPU_EXTRA_KEYS)] * 2


@pytest.mark.parametrize("rc, out, err, message", [
    (18, fixture("driver_mismatch.txt"), "", MISMATCH),
    (1, "", "", "nvidia-smi failed (rc=1): no output"),
    (1, None, None, "nvidia-smi failed (rc=1): no output"),
    (2, "out line\n", "err line\n", "nvidia-smi failed (rc=2): out line / err line"),
    (2, None, "err line", "nvidia-smi failed (rc=2): err line"),
    (2, "out line", None, "nvidia-smi failed (rc=2): out line"),
    (9, "", NO_DRIVER_WORDS, "nvidia-smi failed (rc=9): %s. This means the NVIDIA kernel driver is not loaded: install "
                             "it or load the nvidia kernel module." % NO_DRIVER_WORDS),
    # with rc 0 only nvidia-smi's own failure words fail: the explanation added to them is not one of them
    (0, "No devices were found\n", "",
     "nvidia-smi failed (rc=0): No devices were found. This means the driver is loaded but sees no GPU."),
    (0, "the driver is loaded but sees no GPU", "", None),
    (0, fixture("h100.txt"), "", None),
])
def test_failure_messages_word_for_word(rc, out, err, message):
    assert smi.failure_message(rc, out, err) == message


def test_parse_errors_and_a_failure_not_asked_again_keep_their_words():
    assert error_of(smi.parse_gpus, "index, name\n") == (
        "nvidia-smi printed an unexpected line 1 (expected 9 comma-separated fields index,name,uuid,pci.bus_id,"
        "memory.total,memory.used,memory.free,driver_version,compute_cap): 'index, name'")
    assert error_of(smi.parse_gpus, fixture("rtx_a5500.txt").replace("24564", "lots")) == (
        "nvidia-smi printed 'lots' for memory_total_mib on line 1: not a number")
    for line in ("something else", "%s, 52017" % A5500):  # a process line of too few fields, not the note
        assert error_of(smi.parse_apps, line + "\n") == "nvidia-smi printed an unexpected process line: %r" % line
    run, calls = answers({"--query-gpu=": (18, fixture("driver_mismatch.txt"), "")})
    assert error_of(smi.gather, run) == MISMATCH and len(calls) == 1
    assert smi.invalid_field(None) is None and smi.invalid_field("") is None  # no output names no field
    run = answers({"--query-gpu=": (0, fixture("h100.txt"), ""), "-L": (0, "", ""), **NO_MIG,
                   "--query-compute-apps=": (2, "Unable to determine the device handle for GPU0000:01:00.0", "x")})[0]
    assert error_of(smi.gather, run, processes=True) == (
        "nvidia-smi failed (rc=2): Unable to determine the device handle for GPU0000:01:00.0 / x. This means a GPU "
        "is in a bad state (fallen off the bus?): see dmesg.")


@pytest.mark.parametrize("rc", [1, 2])
def test_a_rejected_field_is_asked_again_without_it(rc):
    """Whatever the failing exit code, and wherever nvidia-smi prints the rejection."""
    legacy = fixture("legacy_470.txt")
    rejection = fixture("legacy_470.invalid_field.txt")
    for first in ((rc, "", rejection), (rc, rejection, None)):
        run, calls = answers({"--query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.used,memory.free,"
                              "driver_version,compute_cap": first, "--query-gpu=": (0, legacy, ""),
                              "-L": (0, "", ""), **NO_MIG})
        result = smi.gather(run)
        assert result["warnings"] == ["this driver does not know the field compute_cap (drivers before 510 lack "
                                      "compute_cap): compute_capability is left empty"]
        fields = "index,name,uuid,pci.bus_id,memory.total,memory.used,memory.free,driver_version"
        assert calls == [["--query-gpu=%s,compute_cap" % fields, "--format=csv,noheader,nounits"],
                         ["--query-gpu=%s" % fields, "--format=csv,noheader,nounits"], ["-L"],
                         [MIG_QUERY, "--format=csv,noheader,nounits"]]
        gpu = result["gpus"][0]
        assert (gpu["name"], gpu["compute_capability"], gpu["memory_free_mib"]) == (
            "NVIDIA GeForce RTX 3090", None, 24263)


# The MIG mode fixtures (*.mig.txt) print what ``nvidia-smi --query-gpu=uuid,mig.mode.current
# --format=csv,noheader,nounits`` prints: the GPU's UUID, then "Enabled", "Disabled" or "[N/A]" (nvidia-smi(1) of
# driver 550, "MIG Mode": https://manpages.ubuntu.com/manpages/plucky/man1/nvidia-smi.1.html; the query in
# https://github.com/NVIDIA/gpu-operator/issues/132). mig_a100_no_instances.list.txt is what ``nvidia-smi -L`` prints
# for a GPU in MIG mode with no instance: its GPU line alone (https://github.com/NVIDIA/gpu-operator/issues/442).
NO_INSTANCES = ("GPU 0 (NVIDIA A100-SXM4-40GB) has MIG mode enabled but no MIG instances: CUDA sees no device on it. "
                "Create GPU and compute instances (nvidia-smi mig -i 0 -cgi <profiles> -C; nvidia-smi mig -i 0 -lgip "
                "lists the profiles), or turn MIG mode off (nvidia-smi -i 0 -mig 0, then reset the GPU or reboot)")


@pytest.mark.parametrize("name, mode, devices, refused", [
    ("mig_a100_no_instances", "Enabled", 0, True),  # MIG on, no instance: CUDA sees nothing on it
    ("mig_a100", "Enabled", 3, False),  # MIG on with instances: CUDA sees them (the planner refuses it apart)
    ("h100", "Disabled", 0, False),  # MIG-capable, off: the whole GPU
    ("rtx_4090", None, 0, False),  # no MIG: [N/A]
    ("rtx_a5500", None, 0, False),  # the query printed nothing: unknown
])
def test_the_mig_mode_of_each_gpu_and_mig_on_without_instances_named(name, mode, devices, refused):
    run, calls = fake_run(name)
    result = smi.gather(run)
    gpu = result["gpus"][0]
    assert (gpu["mig_mode"], len(gpu["mig_devices"])) == (mode, devices)
    assert calls[2] == [MIG_QUERY, "--format=csv,noheader,nounits"] == [smi.query_mig_args()[0], calls[2][1]]
    assert smi.mig_without_instances(gpu) == (NO_INSTANCES if refused else None)
    assert (NO_INSTANCES in result["warnings"]) is refused


def test_mig_mode_lines_a_failed_query_and_the_index_in_the_advice():
    text = fixture("mig_a100.mig.txt") + fixture("h100.mig.txt") + fixture("rtx_4090.mig.txt")
    assert smi.parse_mig_modes(text) == {"GPU-e3a91c57-2b0f-8d46-a5c1-7f9b03d2e864": "Enabled",
                                         "GPU-a47c0e52-1d9b-6f38-2e7a-c9051b8d3f64": "Disabled",
                                         "GPU-3b9e1f07-c2d4-58a6-7e10-94f2ab6c8d31": None}
    assert smi.parse_mig_modes("") == {} and smi.parse_mig_modes(None) == {}
    assert error_of(smi.parse_mig_modes, "Enabled\n") == (
        "nvidia-smi printed an unexpected line 1 (expected 2 comma-separated fields uuid,mig.mode.current): 'Enabled'")
    # A driver that rejects the field (or any failure of this query): the mode is unknown, nothing refused.
    run = answers({"--query-gpu=": (0, fixture("mig_a100.txt"), ""), "-L": (0, fixture("mig_a100_no_instances.list.txt"), ""),
                   MIG_QUERY: (2, 'Field "mig.mode.current" is not a valid field to query.', "")})[0]
    result = smi.gather(run)
    assert result["gpus"][0]["mig_mode"] is None and result["warnings"] == []
    third = {"index": 2, "name": "NVIDIA H100 PCIe", "mig_mode": "Enabled", "mig_devices": []}
    assert smi.mig_without_instances(third) == (
        "GPU 2 (NVIDIA H100 PCIe) has MIG mode enabled but no MIG instances: CUDA sees no device on it. Create GPU "
        "and compute instances (nvidia-smi mig -i 2 -cgi <profiles> -C; nvidia-smi mig -i 2 -lgip lists the "
        "profiles), or turn MIG mode off (nvidia-smi -i 2 -mig 0, then reset the GPU or reboot)")
    assert smi.mig_without_instances(dict(third, mig_mode="Disabled")) is None
    assert smi.mig_without_instances(dict(third, mig_devices=[{"index": 0}])) is None


# nvidia-smi -q: the driver's CUDA version and NVML's brand (captures of tests/data/nvidia_smi/SOURCES.md)
@pytest.mark.parametrize("name, driver, cuda, bus, product, brand", [
    ("rtx_a5500", "550.127.05", "12.4", "00000000:01:00.0", "NVIDIA RTX A5500", "NVIDIA RTX"),
    ("rtx_4090", "560.35.03", "12.6", "00000000:01:00.0", "NVIDIA GeForce RTX 4090", "GeForce"),
])
def test_details_give_the_cuda_version_and_the_brand_per_bus_id(name, driver, cuda, bus, product, brand):
    found = smi.parse_details(fixture(name + ".q.txt"))
    assert sorted(found) == ["cuda_version", "driver_version", "gpus"]   # the capture's other top-level lines: none
    assert found["driver_version"] == driver and found["cuda_version"] == cuda
    assert found["gpus"] == {bus: {"product_name": product, "product_brand": brand}}
    assert smi.details_args() == ["-q"]


def test_details_without_a_cuda_driver_and_nested_names_are_not_taken_for_the_gpu_s():
    text = ("Driver Version                            : 525.147.01\nCUDA Version                              : Not Found\n"
            "GPU 00000000:4f:00.0\n    Product Brand                         : [N/A]\n"
            "    MIG Mode\n        Product Name                      : nested\n")
    found = smi.parse_details(text)
    assert found["cuda_version"] is None and found["driver_version"] == "525.147.01"
    assert found["gpus"] == {"00000000:4F:00.0": {"product_name": None, "product_brand": None}}
    assert smi.parse_details("") == {"driver_version": None, "cuda_version": None, "gpus": {}}
