"""The CUDA context of llama-server per GPU (plugins/module_utils/_cuda_context.py): measured from nvidia-smi's
per-process memory and the buffers of the server's log, and the figure a plan counts for a card without one."""
from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _cuda_context as cctx
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_log import parse_log
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._nvidia_smi import gather
from tests.helpers import llama_logs as ll

UUID = "GPU-3b9e1f07-c2d4-58a6-7e10-94f2ab6c8d31"
CUDA0 = {"device": "CUDA0", "index": 0, "uuid": UUID, "name": "NVIDIA GeForce RTX 4090"}
# The real log of llama-server b7500 serving Nemotron-3-Nano on an RTX 4090: its CUDA0 buffers are model 1369.43,
# KV 768.00, RS 47.62 and compute 1078.13 MiB, 3263.18 MiB in all.
LOG = "b7500_nemotron_cuda_default_verbosity.log"
SMI = Path(__file__).resolve().parents[3] / "data" / "nvidia_smi"


def answers(name):
    """A ``run(args)`` of nvidia-smi that prints the fixture ``name``: the GPU query ``name.txt``, the per-process
    query ``name.apps.txt``, nothing for the MIG queries (a card without MIG)."""
    def run(args):
        if args[0].startswith("--query-compute-apps="):
            return 0, (SMI / (name + ".apps.txt")).read_text(), ""
        if args[0].startswith("--query-gpu=index"):
            return 0, (SMI / (name + ".txt")).read_text(), ""
        return 0, "", ""
    return run


def serving(pid=52817):
    """gpu_info's GPUs of the RTX 4090 that serves it (fixture rtx_4090_serving), with the memory of ``pid``."""
    return gather(answers("rtx_4090_serving"), pids=[pid])["gpus"]


def test_the_context_is_what_the_process_holds_beyond_its_buffers():
    # nvidia-smi shows 3731 MiB for the server's pid (the other process's 512 MiB are not its own):
    # 3731 - 3263.18 = 467.82, to the MiB nvidia-smi counts in
    (row,) = cctx.measure([CUDA0], serving(), parse_log(ll.read(LOG)))
    assert row == {"index": 0, "uuid": UUID, "name": "NVIDIA GeForce RTX 4090", "device": "CUDA0", "held_mib": 3731,
                   "buffers_mib": 3263.18, "context_mib": 468}


def test_no_measurement_where_the_process_holds_nothing_or_less_than_its_buffers():
    # another pid: nvidia-smi shows nothing of it on the card (a driver that hides a container's pids reads the same)
    assert cctx.measure([CUDA0], serving(pid=4242), parse_log(ll.read(LOG))) == []
    # a log whose buffers are more than the process holds is not this process's log
    bigger = parse_log("\n".join([ll.model_buf("CUDA0", 4000.0)]))
    assert cctx.measure([CUDA0], serving(), bigger) == []


def test_each_device_counts_only_the_buffers_named_for_it():
    gpus = [{"index": 0, "uuid": "GPU-a", "name": "A", "memory_held_by_pid_mib": 1500},
            {"index": 1, "uuid": "GPU-b", "name": "B", "memory_held_by_pid_mib": 900}]
    log = parse_log("\n".join([ll.model_buf("CUDA0", 800.0), ll.model_buf("CUDA1", 500.0), ll.model_buf("CUDA_Host", 70.0),
                               ll.kv_buf("CUDA0", 100.0), ll.kv_buf("CUDA1", 64.0), ll.rs_buf("CUDA1", 1.5),
                               ll.compute_buf("CUDA0", 150.25), ll.compute_buf("CUDA1", 20.0),
                               ll.compute_buf("CUDA_Host", 9.0)]))
    devices = [{"device": "CUDA0", "index": 0, "uuid": "GPU-a", "name": "A"},
               {"device": "CUDA1", "index": 1, "uuid": "GPU-b", "name": "B"}]
    rows = cctx.measure(devices, gpus, log)
    # CUDA0: 1500 - (800 + 100 + 150.25) = 449.75; CUDA1: 900 - (500 + 64 + 1.5 + 20) = 314.5 (rounds to even: 314)
    assert [(r["device"], r["buffers_mib"], r["context_mib"]) for r in rows] == [
        ("CUDA0", 1050.25, 450), ("CUDA1", 585.5, 314)]


def test_a_measurement_of_the_same_card_wins_then_the_table_then_the_assumption():
    measured = [{"index": 0, "uuid": UUID, "name": "NVIDIA GeForce RTX 4090", "context_mib": 468}]
    assert cctx.context_of("NVIDIA GeForce RTX 4090", UUID, 0, measured) == (468, "measured")
    # another card in the same slot (another uuid, or another name) does not inherit it
    assert cctx.context_of("NVIDIA GeForce RTX 4090", "GPU-other", 0, measured) == (cctx.ASSUMED_CONTEXT_MIB, "assumed")
    assert cctx.context_of("NVIDIA GeForce RTX 3090", UUID, 0, measured) == (256, "table")
    # without uuids the index tells the card
    assert cctx.context_of("NVIDIA GeForce RTX 4090", None, 0, [dict(measured[0], uuid=None)]) == (468, "measured")
    assert cctx.context_of("NVIDIA GeForce RTX 4090", None, 1, [dict(measured[0], uuid=None)])[1] == "assumed"


def test_the_table_gives_the_figures_of_its_sources_and_the_assumption_is_the_largest():
    # PR #23604: 555 MiB on the RTX PRO 6000 Blackwell, 107 MiB on the RTX 4060 Ti; InvokeAI #9413: 256 MiB, RTX 3090
    assert cctx.context_of("NVIDIA RTX PRO 6000 Blackwell Workstation Edition") == (555, "table")
    assert cctx.context_of("NVIDIA GeForce RTX 4060 Ti") == (107, "table")
    assert cctx.context_of("NVIDIA GeForce RTX 4060") == (555, "assumed")  # a name is matched whole
    assert cctx.ASSUMED_CONTEXT_MIB == max(cctx.CONTEXT_MIB.values())


@pytest.mark.parametrize("given, message", [
    ({"name": "x"}, "cuda_context must be a list"),
    (["x"], "cuda_context[0] must be a dict with the card's name"),
    ([{"context_mib": 1}], "cuda_context[0] must be a dict with the card's name"),
    ([{"name": "A", "context_mib": -1}], "cuda_context[0].context_mib must be a number of MiB >= 0, got -1"),
    ([{"name": "A", "context_mib": True}], "cuda_context[0].context_mib must be a number of MiB >= 0, got True"),
    ([{"name": "A", "context_mib": "300"}], "cuda_context[0].context_mib must be a number of MiB >= 0, got '300'"),
])
def test_a_stored_measurement_that_is_wrong_is_refused_by_item_and_field(given, message):
    with pytest.raises(ValueError) as info:
        cctx.checked_measurements(given)
    assert message in str(info.value)
    assert cctx.checked_measurements(None) == []
    assert cctx.checked_measurements([{"name": "A", "context_mib": 0}]) == [{"name": "A", "context_mib": 0}]
