"""llama.cpp's ``using device`` lines (``_llama_devices``) and the check of the devices against the plan.

The line is src/llama.cpp ``llama_prepare_model_devices`` (b10435): ``"%s: using device %s (%s) (%s) - %zu MiB
free\\n"``; the forms below are copied from real logs (sources beside each)."""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_devices import (
    device_problem, normalize_pci_bus_id, parse_using_device,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_log import parse_log
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._placement_proof import verify_placement

# the real b10435 server with a ggml-rpc-server device (tests/data/llama_logs/b10435_rpc_server_killed_lv4.log)
RPC = "0.00.177.484 I llama_prepare_model_devices: using device RPC0 (127.0.0.1:18850) (unknown id) - 24105 MiB free"
# https://github.com/lmstudio-ai/lmstudio-bug-tracker/issues/1360 (with a PCI id)
WITH_ID = ("llama_model_load_from_file_impl: using device CUDA0 (NVIDIA GeForce RTX 5060 Ti) (0000:01:00.0) - "
           "15055 MiB free")
# build 6096, no id: https://github.com/ggml-org/llama.cpp/issues/15125
NO_ID = ("llama_model_load_from_file_impl: using device CUDA0 (NVIDIA GeForce RTX 3090) - 22532 MiB free",
         "llama_model_load_from_file_impl: using device CUDA1 (NVIDIA GeForce RTX 3060) - 11687 MiB free")
A5500 = {"device": "CUDA0", "pci_bus_id": "00000000:01:00.0", "name": "NVIDIA RTX A5500"}
A4000 = {"device": "CUDA1", "pci_bus_id": "00000000:02:00.0", "name": "NVIDIA RTX A4000"}


def cuda(n, name, bus):
    """A line of the form of WITH_ID for another card."""
    return f"llama_prepare_model_devices: using device CUDA{n} ({name}) ({bus}) - 24000 MiB free"


@pytest.mark.parametrize("line, device", [
    (RPC, {"device": "RPC0", "description": "127.0.0.1:18850", "id": "unknown id", "pci_bus_id": None,
           "free_mib": 24105}),
    (WITH_ID, {"device": "CUDA0", "description": "NVIDIA GeForce RTX 5060 Ti", "id": "0000:01:00.0",
               "pci_bus_id": "0000:01:00.0", "free_mib": 15055}),
    (NO_ID[1], {"device": "CUDA1", "description": "NVIDIA GeForce RTX 3060", "id": None, "pci_bus_id": None,
                "free_mib": 11687}),
    # a description with parentheses of its own keeps them
    ("x: using device Vulkan0 (Intel(R) Arc(TM) A770) (0000:03:00.0) - 1 MiB free",
     {"device": "Vulkan0", "description": "Intel(R) Arc(TM) A770", "id": "0000:03:00.0",
      "pci_bus_id": "0000:03:00.0", "free_mib": 1}),
])
def test_every_form_of_the_line_is_read_from_a_log(line, device):
    assert parse_log(line + "\n")["devices"] == [device]


@pytest.mark.parametrize("line", [
    "using device CUDA0 (NVIDIA) (0000:01:00.0) - 15055 MiB",        # no "free"
    "using device CUDA0 NVIDIA - 1 MiB free",                        # no parentheses
    "main: skipping device CUDA1 (NVIDIA) - already using device CUDA0 (NVIDIA) with the same id",
])
def test_other_lines_are_no_device(line):
    assert parse_using_device(line) is None


def test_pci_ids_of_nvidia_smi_and_cuda_are_one_form():
    assert normalize_pci_bus_id("00000000:01:00.0") == normalize_pci_bus_id("0000:01:00.0") == "0000:01:00.0"
    assert normalize_pci_bus_id("00000000:C1:00.0") == "0000:c1:00.0"
    assert normalize_pci_bus_id("00010000:01:00.0") == "10000:01:00.0"
    for wrong in ("unknown id", "01:00.0", "0000:01:00.8", None, 1):
        assert normalize_pci_bus_id(wrong) is None


def test_a_run_keeps_its_last_line_per_device():
    """-fit on loads twice (a dry run, then for real): the devices are printed twice and counted once."""
    log = parse_log("\n".join([WITH_ID, cuda(1, "B", "0000:02:00.0"), WITH_ID, cuda(1, "B", "0000:02:00.0")]))
    assert [d["device"] for d in log["devices"]] == ["CUDA0", "CUDA1"]


def test_the_planned_cards_in_pci_order_pass():
    log = parse_log("\n".join([cuda(0, "NVIDIA RTX A5500", "0000:01:00.0"), cuda(1, "NVIDIA RTX A4000", "0000:02:00.0")]))
    assert device_problem(log, [A5500, A4000]) == ""


def test_cards_numbered_fastest_first_fail_with_their_cause():
    log = parse_log("\n".join([cuda(0, "NVIDIA RTX A4000", "0000:02:00.0"), cuda(1, "NVIDIA RTX A5500", "0000:01:00.0")]))
    assert device_problem(log, [A5500, A4000]) == (
        "CUDA0 is 0000:02:00.0 (NVIDIA RTX A4000), the plan put the NVIDIA RTX A5500 at 0000:01:00.0 there: is "
        "CUDA_DEVICE_ORDER=PCI_BUS_ID set?; CUDA1 is 0000:01:00.0 (NVIDIA RTX A5500), the plan put the NVIDIA RTX "
        "A4000 at 0000:02:00.0 there: is CUDA_DEVICE_ORDER=PCI_BUS_ID set?")


def test_exactly_the_planned_devices():
    two = parse_log("\n".join([cuda(0, "A", "0000:01:00.0"), cuda(1, "B", "0000:02:00.0")]))
    assert device_problem(two, [A5500]) == "llama-server also uses CUDA1, which the plan does not"
    one = parse_log(cuda(0, "A", "0000:01:00.0"))
    assert device_problem(one, [A5500, A4000]) == "CUDA1 is not among the devices llama-server uses (CUDA0)"


def test_missing_lines_have_their_own_causes():
    on_cpu = parse_log("load_tensors:   CPU_Mapped model buffer size =   300.00 MiB")
    assert "the container sees no GPU" in device_problem(on_cpu, [A5500])
    assert "verbosity is too low" in device_problem(parse_log("main: server is listening"), [A5500])
    old = parse_log("\n".join(NO_ID))
    assert device_problem(old, [A5500, A4000]) == "; ".join(
        f"CUDA{n} is logged without a PCI id: this llama.cpp build is too old to print one (the collection models "
        "build 10435)" for n in (0, 1))


def test_rpc_devices_and_cpu_plans():
    """An RPC device prints (unknown id): it is checked by name, even when the plan's GPU list had bus ids."""
    rpc = parse_log(RPC)
    assert device_problem(rpc, [{"device": "RPC0", "pci_bus_id": "00000000:01:00.0"}]) == ""
    assert device_problem(rpc, []) == ""
    assert device_problem(parse_log(WITH_ID), []) == "the plan uses no GPU but llama-server uses CUDA0"
    assert device_problem(parse_log(""), []) == ""


def test_the_proof_fails_on_the_wrong_card_and_passes_on_the_right_one():
    buffers = "load_tensors:        CUDA0 model buffer size =  1000.00 MiB\nllama_server: model loaded"
    right = parse_log(cuda(0, "NVIDIA RTX A5500", "0000:01:00.0") + "\n" + buffers)
    wrong = parse_log(cuda(0, "NVIDIA RTX A4000", "0000:02:00.0") + "\n" + buffers)
    model = {"CUDA0": 1000.0}
    assert verify_placement(right, expect_model_buffers=model, expect_devices=[A5500])["verified"]
    res = verify_placement(wrong, expect_model_buffers=model, expect_devices=[A5500])
    assert not res["verified"] and res["msg"].startswith("CUDA0 is 0000:02:00.0 (NVIDIA RTX A4000)")
    alone = verify_placement(right, expect_devices=[A5500])
    assert alone["verified"] and alone["msg"] == "llama-server uses exactly the planned devices: CUDA0 (0000:01:00.0)"
    assert not verify_placement(wrong, expect_devices=[A5500])["verified"]
