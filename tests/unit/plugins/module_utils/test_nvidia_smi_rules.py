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
