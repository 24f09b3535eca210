"""The rules of the nvidia-smi parsers one by one: the exact queries, what counts as a missing value, the lines
that are skipped or refused, and how the memory of a process tree adds up per GPU."""
from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _nvidia_smi as smi

DATA = Path(__file__).resolve().parents[3] / "data" / "nvidia_smi"
A5500 = "GPU-8d4f3c2a-61b7-4e0a-9f35-2c7e1d9a4b60"
A4000 = "GPU-c05e7d29-4a18-3b6f-90d2-18e4a7f65c0b"


def gpus_of(name):
    return smi.parse_gpus((DATA / (name + ".txt")).read_text())[0]


def test_the_process_query_asks_for_bare_csv():
    """``nvidia-smi --help-query-compute-apps``: the fields by name; ``--format=csv,noheader,nounits`` prints the
    bare values (no header line, ``20988`` instead of ``20988 MiB``), which is what parse_apps reads."""
    assert smi.query_apps_args() == ["--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
                                     "--format=csv,noheader,nounits"]
    assert smi.query_gpu_args(("index", "name")) == ["--query-gpu=index,name", "--format=csv,noheader,nounits"]
    assert smi.list_args() == ["-L"]


def test_an_empty_field_is_missing_like_na():
    """A field nvidia-smi leaves empty (``, ,``) is no value, as ``[N/A]`` is: None and a warning naming it."""
    line = "0, NVIDIA RTX A5500, %s, 00000000:01:00.0, 24564, 416, 24148, , 8.6\n" % A5500
    gpus, warnings = smi.parse_gpus(line)
    assert gpus[0]["driver_version"] is None
    assert gpus[0]["memory_total_mib"] == 24564
    assert len(warnings) == 1 and "driver_version" in warnings[0]
    gpus, warnings = smi.parse_gpus(line.replace(", , 8.6", ", 550.54.15, 8.6"))
    assert gpus[0]["driver_version"] == "550.54.15" and warnings == []


def test_a_process_line_of_one_field_is_refused_unless_it_says_no_running():
    with pytest.raises(smi.NvidiaSmiError) as raised:
        smi.parse_apps("something else\n")
    assert str(raised.value) == "nvidia-smi printed an unexpected process line: 'something else'"
    with pytest.raises(smi.NvidiaSmiError, match=r"unexpected process line: '%s, 52017'$" % A5500):
        smi.parse_apps("%s, 52017\n" % A5500)


def test_the_no_running_note_is_skipped_not_the_end():
    """Old drivers print a note instead of rows; a row after it is still read."""
    apps = smi.parse_apps("No running processes found\n%s, 52017, /usr/local/bin/llama-server, 20988\n" % A5500,
                          gpus_of("dual_a5500_a4000"))
    assert [(a["pid"], a["gpu_index"], a["used_memory_mib"]) for a in apps] == [(52017, 0, 20988)]


def test_a_number_nvidia_smi_cannot_give_is_none():
    apps = smi.parse_apps("%s, 52017, llama-server, [N/A]\n%s, 77, llama-server, 12 MiB\n" % (A5500, A4000))
    assert [a["used_memory_mib"] for a in apps] == [None, None]
    assert [a["pid"] for a in apps] == [52017, 77]
    assert [a["gpu_index"] for a in apps] == [None, None]  # no GPU list given: no index


def test_list_lines_before_any_gpu_and_other_lines_are_ignored():
    text = ("  MIG 1g.5gb      Device  0: (UUID: MIG-00000000-0000-0000-0000-000000000000)\n"
            + (DATA / "mig_a100.list.txt").read_text()
            + "No MIG devices found\n")
    mig = smi.parse_list(text)
    assert mig == {"GPU-e3a91c57-2b0f-8d46-a5c1-7f9b03d2e864": [
        {"index": 0, "profile": "3g.20gb", "uuid": "MIG-4a7f2c90-d1e8-5b36-a0c4-9e2f71b8d653"},
        {"index": 1, "profile": "2g.10gb", "uuid": "MIG-b82e0d15-6c9a-5f47-83d1-0a6e4c2f9b78"},
        {"index": 2, "profile": "1g.5gb", "uuid": "MIG-0d9c63a4-f7b2-51e8-9c40-b3a8e5d17f26"}]}
    assert smi.parse_list((DATA / "dual_a5500_a4000.list.txt").read_text()) == {A5500: [], A4000: []}
    assert smi.parse_list(None) == {} and smi.parse_list("") == {}


def test_the_memory_of_a_tree_adds_up_on_one_gpu():
    """Two processes of the tree on the same card: their memory adds up; a process whose memory nvidia-smi cannot
    give (``[N/A]``) adds nothing."""
    apps = smi.parse_apps("%s, 10, llama-server, 1000\n%s, 11, llama-server, 234\n%s, 12, llama-server, [N/A]\n"
                          "%s, 13, llama-server, [N/A]\n%s, 99, other, 5000\n" % (A5500, A5500, A5500, A4000, A5500),
                          gpus_of("dual_a5500_a4000"))
    assert smi.held_by(apps, [10, 11, 12, 13]) == {0: 1234, 1: 0}
    assert smi.held_by(apps, [12]) == {0: 0}
    assert smi.held_by(apps, []) == {}


def test_invalid_field_of_nothing_is_none():
    assert smi.invalid_field(None) is None and smi.invalid_field("") is None
    assert smi.invalid_field('Field "compute_cap" is not a valid field to query.') == "compute_cap"


MISMATCH = ("nvidia-smi failed (rc=18): Failed to initialize NVML: Driver/library version mismatch / NVML library "
            "version: 550.127. This means the NVIDIA kernel driver and the user-space NVML library differ (typically "
            "after a driver upgrade without a reboot): reboot or reload the nvidia kernel modules.")
NO_DRIVER_WORDS = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
                   "latest NVIDIA driver is installed and running.")


def answers(by_args):
    """A ``run(args)`` for gather that answers each query (the key: the first argument's start) with its
    ``(rc, stdout, stderr)``, and records the calls."""
    calls = []

    def run(args):
        calls.append(list(args))
        for start, answer in by_args.items():
            if args[0].startswith(start):
                return answer
        raise AssertionError("unexpected query %r" % (args,))
    return run, calls


def test_failure_messages_word_for_word():
    assert smi.failure_message(18, (DATA / "driver_mismatch.txt").read_text(), "") == MISMATCH
    assert smi.failure_message(1, "", "") == "nvidia-smi failed (rc=1): no output"
    assert smi.failure_message(1, None, None) == "nvidia-smi failed (rc=1): no output"
    assert smi.failure_message(2, "out line\n", "err line\n") == "nvidia-smi failed (rc=2): out line / err line"
    assert smi.failure_message(2, None, "err line") == "nvidia-smi failed (rc=2): err line"
    assert smi.failure_message(2, "out line", None) == "nvidia-smi failed (rc=2): out line"
    assert smi.failure_message(9, "", NO_DRIVER_WORDS) == (
        "nvidia-smi failed (rc=9): %s. This means the NVIDIA kernel driver is not loaded: install it or load the "
        "nvidia kernel module." % NO_DRIVER_WORDS)


def test_nvidia_smis_failure_words_fail_even_with_rc_0():
    """Only nvidia-smi's own failure words count: the explanation we add is not one of them."""
    assert smi.failure_message(0, "No devices were found\n", "") == (
        "nvidia-smi failed (rc=0): No devices were found. This means the driver is loaded but sees no GPU.")
    assert smi.failure_message(0, "the driver is loaded but sees no GPU", "") is None


def test_parse_errors_and_warnings_word_for_word():
    with pytest.raises(smi.NvidiaSmiError) as raised:
        smi.parse_gpus("index, name\n")
    assert str(raised.value) == (
        "nvidia-smi printed an unexpected line 1 (expected 9 comma-separated fields index,name,uuid,pci.bus_id,"
        "memory.total,memory.used,memory.free,driver_version,compute_cap): 'index, name'")
    with pytest.raises(smi.NvidiaSmiError) as raised:
        smi.parse_gpus((DATA / "rtx_a5500.txt").read_text().replace("24564", "lots"))
    assert str(raised.value) == "nvidia-smi printed 'lots' for memory_total_mib on line 1: not a number"
    line = ("0, NVIDIA GB10, GPU-7a0e4d3b-95c2-1f86-e4b7-3c8d20a9f5e1, 0000000F:01:00.0, [N/A], [N/A], , 580.95.05, "
            "12.1")
    assert smi.parse_gpus(line)[1] == [
        "GPU 0 (NVIDIA GB10): nvidia-smi gives no value for memory_total_mib, memory_used_mib, memory_free_mib (, [N/A])"]


@pytest.mark.parametrize("rc", [1, 2])
def test_a_rejected_field_is_asked_again_without_it(rc):
    """Whatever the failing exit code, and wherever nvidia-smi prints the rejection."""
    legacy = (DATA / "legacy_470.txt").read_text()
    rejection = (DATA / "legacy_470.invalid_field.txt").read_text()
    for first in ((rc, "", rejection), (rc, rejection, None)):
        run, calls = answers({"--query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.used,memory.free,"
                              "driver_version,compute_cap": first, "--query-gpu=": (0, legacy, ""),
                              "-L": (0, "", "")})
        result = smi.gather(run)
        assert result["warnings"] == ["this driver does not know the field compute_cap (drivers before 510 lack "
                                      "compute_cap): compute_capability is left empty"]
        assert [c[0] for c in calls] == [
            "--query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.used,memory.free,driver_version,compute_cap",
            "--query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.used,memory.free,driver_version", "-L"]


def test_a_failure_is_not_asked_again_and_keeps_its_words():
    run, calls = answers({"--query-gpu=": (18, (DATA / "driver_mismatch.txt").read_text(), "")})
    with pytest.raises(smi.NvidiaSmiError) as raised:
        smi.gather(run)
    assert str(raised.value) == MISMATCH and len(calls) == 1
    run, calls = answers({"--query-gpu=": (9, "", NO_DRIVER_WORDS)})
    with pytest.raises(smi.NvidiaSmiError, match="^nvidia-smi failed \\(rc=9\\): NVIDIA-SMI has failed because"):
        smi.gather(run)


def test_mig_devices_only_from_a_list_that_succeeded():
    a100 = (DATA / "mig_a100.txt").read_text()
    mig_list = (DATA / "mig_a100.list.txt").read_text()
    result = smi.gather(answers({"--query-gpu=": (0, a100, ""), "-L": (0, mig_list, "")})[0])
    assert result["topology"] == "single"
    assert result["warnings"] == ["GPU 0 (NVIDIA A100-SXM4-40GB) is in MIG mode: CUDA sees its 3 MIG devices "
                                  "(3g.20gb, 2g.10gb, 1g.5gb), each with a slice of the memory, not the whole GPU"]
    failed = smi.gather(answers({"--query-gpu=": (0, a100, ""), "-L": (15, mig_list, "")})[0])
    assert failed["gpus"][0]["mig_devices"] == [] and failed["warnings"] == []
    plain = smi.gather(answers({"--query-gpu=": (0, (DATA / "h100.txt").read_text(), ""), "-L": (0, "", "")})[0])
    assert plain["gpus"][0]["mig_devices"] == []


def test_a_host_without_gpus_has_no_processes_and_holds_nothing():
    run, calls = answers({"--query-gpu=": (0, "", "")})
    result = smi.gather(run, processes=True, pids=[1])
    assert result == {"gpus": [], "topology": "cpu", "warnings": [], "processes": []}
    assert len(calls) == 1


def test_a_failing_process_query_is_an_error_with_its_words():
    h100 = (DATA / "h100.txt").read_text()
    run = answers({"--query-gpu=": (0, h100, ""), "-L": (0, "", ""),
                   "--query-compute-apps=": (2, "Unable to determine the device handle for GPU0000:01:00.0", "x")})[0]
    with pytest.raises(smi.NvidiaSmiError) as raised:
        smi.gather(run, processes=True)
    assert str(raised.value) == (
        "nvidia-smi failed (rc=2): Unable to determine the device handle for GPU0000:01:00.0 / x. This means a GPU "
        "is in a bad state (fallen off the bus?): see dmesg.")


def test_each_gpu_has_exactly_the_documented_keys():
    run = answers({"--query-gpu=": (0, (DATA / "dual_a5500_a4000.txt").read_text(), ""), "-L": (0, "", ""),
                   "--query-compute-apps=": (0, "", "")})[0]
    assert [sorted(g) for g in smi.gather(run)["gpus"]] == [sorted(smi.GPU_KEYS + ("mig_devices",))] * 2
    assert [sorted(g) for g in smi.gather(run, pids=[1])["gpus"]] == [sorted(smi.GPU_KEYS + smi.GPU_EXTRA_KEYS)] * 2
