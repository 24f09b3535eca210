"""What a plan is made from (``_plan_inputs``): a GGUF path or ``gguf_info`` result, the GPUs of ``gpu_info`` and the
host memory of ``host_info``."""
from __future__ import annotations

import os

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _plan_inputs as pin
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_inspection import describe
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_inputs import PlanError, load_facts
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.model import read_model
from tools import gguf_models
from tests.helpers.plans import gpu

NUMBER = "gpus[0].%s must be a number of MiB >= 0, got %s"
NO_FREE = "gpus[0] (%s) reports no free memory (nvidia-smi printed [N/A]?): give memory_free_mib in a gpus list"


@pytest.mark.parametrize("given, message", [
    (42, "gguf must be a path or the result of gguf_info, got 42"),
    ("", "gguf must be a path or the result of gguf_info, got ''"),
    ({"files": [], "size": 1},
     "gguf is a dict without files or model: pass a path or the registered result of gguf_info"),
])
def test_gguf_must_be_a_path_or_a_gguf_info_result(given, message):
    with pytest.raises(PlanError) as info:
        load_facts(given)
    assert str(info.value) == message


def test_normalize_gpus_counts_the_running_servers_memory_as_free():
    gpus = pin.normalize_gpus({"gpus": [
        {"name": "A", "memory_total_mib": 24564, "memory_used_mib": 416, "memory_held_by_pid_mib": 100, "uuid": "U"},
        {"memory_free_mib": 8000, "index": 7}]})
    assert gpus == [pin.Gpu("A", 0, "U", 24564, 24148 + 100, 100), pin.Gpu("GPU 1", 7, None, None, 8000, 0)]
    assert pin.normalize_gpus([]) == []
    assert pin.normalize_gpus([gpu(1000, 0), gpu(2000, 1)], [1]) == [pin.Gpu("GPU1", 1, "GPU-1", 2000, 2000, 0)]


@pytest.mark.parametrize("gpus, devices, message", [
    ({"topology": "cpu"}, None, "gpus is a dict without a gpus list: pass the registered result of gpu_info or a list"),
    ("GPU0", None, "gpus must be the registered result of gpu_info or a list of {name, memory_total_mib, "
                   "memory_free_mib}, got 'GPU0'"),
    (["x"], None, "gpus[0] must be a dict with name, memory_total_mib and memory_free_mib"),
    ([{"memory_free_mib": -1}], None, NUMBER % ("memory_free_mib", "-1")),
    ([{"memory_free_mib": True}], None, NUMBER % ("memory_free_mib", "True")),
    ([{"memory_free_mib": float("inf")}], None, NUMBER % ("memory_free_mib", "inf")),
    ([{"memory_free_mib": "lots"}], None, NUMBER % ("memory_free_mib", "'lots'")),
    ([{"memory_total_mib": 100, "memory_used_mib": "a"}], None, NUMBER % ("memory_used_mib", "'a'")),
    ([{"memory_total_mib": 100, "memory_used_mib": 101}], None,
     "gpus[0]: memory_used_mib 101 is more than memory_total_mib 100"),
    ([{"name": "GB10", "memory_total_mib": 100}], None, NO_FREE % "GB10"),
    ([{"memory_total_mib": 100}], None, NO_FREE % "unnamed"),
    ([{"memory_free_mib": 100, "mig_devices": [{}]}], None,
     "gpus[0] (None) is in MIG mode: plan for one MIG device by passing a gpus list with its memory"),
    # MIG mode on with no instance (gpu_info's mig_mode "Enabled", no mig_devices): refused with what to do, even where
    # gpu_devices leaves it out, since CUDA numbers the GPUs after it one lower than nvidia-smi does.
    ([gpu(1000, 0), dict(gpu(40960, 1), name="NVIDIA A100-SXM4-40GB", mig_mode="Enabled", mig_devices=[])], [0],
     "gpus[1]: GPU 1 (NVIDIA A100-SXM4-40GB) has MIG mode enabled but no MIG instances: CUDA sees no device on it. "
     "Create GPU and compute instances (nvidia-smi mig -i 1 -cgi <profiles> -C; nvidia-smi mig -i 1 -lgip lists the "
     "profiles), or turn MIG mode off (nvidia-smi -i 1 -mig 0, then reset the GPU or reboot)"),
    ([{"memory_free_mib": 1, "vram": 2}], None,
     "gpus[0] has unknown field(s) vram (known: %s)" % ", ".join(pin.GPU_INPUT_KEYS)),
    ([gpu(1000, 0), gpu(1000, 1)], [1, 4, 5], "gpu_devices 4, 5 are not among the GPUs (0, 1)"),
    ([], [0], "gpu_devices 0 are not among the GPUs (none)"),
])
def test_normalize_gpus_errors(gpus, devices, message):
    with pytest.raises(pin.PlanError) as info:
        pin.normalize_gpus(gpus, devices)
    assert str(info.value) == message


def test_a_gpu_with_its_mig_mode_off_or_unknown_is_planned_whole():
    for mode in ("Disabled", None):
        normal = pin.normalize_gpus([dict(gpu(81559, 0, "NVIDIA H100 80GB HBM3"), mig_mode=mode, mig_devices=[])])
        assert [(g.name, g.index, g.memory_free_mib) for g in normal] == [("NVIDIA H100 80GB HBM3", 0, 81559)]


@pytest.mark.parametrize("host, normal", [
    (None, None),
    ({"memory_available_mib": 1000.004, "memory_total_mib": 2000}, pin.Host(1000.0, 2000, 0, "MemAvailable")),
    ({"memory_available_mib": 1000, "memory_held_by_pid_mib": 500}, pin.Host(1500, None, 500, "MemAvailable")),
    ({"memory_available_mib": 60000, "memory_held_by_pid_mib": 500, "cgroup": {"limit_mib": 20000, "usage_mib": 1000}},
     pin.Host(19500, None, 500, "the cgroup limit of 20000 MiB")),
    ({"memory_available_mib": 1000, "cgroup": {"limit_mib": 20000, "usage_mib": 1000}},
     pin.Host(1000, None, 0, "MemAvailable")),
    ({"memory_available_mib": 19000, "cgroup": {"limit_mib": 20000, "usage_mib": 1000}},
     pin.Host(19000, None, 0, "MemAvailable")),
    ({"memory_available_mib": 10, "cgroup": {"limit_mib": None}}, pin.Host(10, None, 0, "MemAvailable")),
])
def test_normalize_host_takes_the_smaller_of_memavailable_and_the_cgroup_room(host, normal):
    assert pin.normalize_host(host) == normal


@pytest.mark.parametrize("host, message", [
    ([], "host must be the registered result of host_info or a dict with memory_available_mib, got []"),
    ({}, "host has no memory_available_mib: pass the registered result of host_info"),
    ({"memory_available_mib": -5}, "host.memory_available_mib must be a number of MiB >= 0, got -5"),
    ({"memory_available_mib": 5, "cgroup": {"limit_mib": "x"}},
     "host.cgroup.limit_mib must be a number of MiB >= 0, got 'x'"),
    ({"memory_available_mib": 5, "cgroup": {"limit_mib": 10, "usage_mib": "x"}},
     "host.cgroup.usage_mib must be a number of MiB >= 0, got 'x'"),
    ({"memory_available_mib": 5, "memory_total_mib": -1}, "host.memory_total_mib must be a number of MiB >= 0, got -1"),
])
def test_normalize_host_errors(host, message):
    with pytest.raises(pin.PlanError) as info:
        pin.normalize_host(host)
    assert str(info.value) == message


def test_a_gguf_info_result_is_not_read_again(tmp_path):
    """gguf_info's result, or its model summary, gives every fact the file gives (its path, tensors, caches and
    warnings), also once the file is gone; without the summary its ``files`` (the first) or ``path`` name the file."""
    path = gguf_models.write_tiny_nemotron_h_moe(str(tmp_path / "tiny.gguf"))
    from_file = load_facts(path)
    assert from_file.path == path and from_file.recurrent_blocks and from_file.kv_blocks
    for given in ({"files": [path, str(tmp_path / "unread.gguf")]}, {"path": path}, {"files": [], "path": path}):
        assert load_facts(given) == from_file
    info, _warnings = describe(read_model(path), "none")
    os.unlink(path)
    for given in (info, info["model"]):
        assert load_facts(given) == from_file
    assert load_facts(dict(info["model"], files=[])).path == "gguf.model"
    with pytest.raises(PlanError, match=r"gguf.model.tensors\[0\] must be"):
        load_facts(dict(info["model"], tensors=[["x", 0, [-1], 4]]))
    with pytest.raises(PlanError, match="gguf.model.version"):
        load_facts(dict(info["model"], version=7))
    with pytest.raises(PlanError) as error:
        load_facts({"path": path})
    assert str(error.value) == "%s: at byte 0: cannot open: %s" % (path, os.strerror(2))


def test_gpus_with_pci_bus_ids_are_in_pci_bus_order():
    """nvidia-smi numbers the GPUs in PCI bus order; a list given in another order is put back in it, the bus id
    normalized (CUDA's cudaDeviceGetPCIBusId form, 0000:01:00.0)."""
    a5500 = {"index": 0, "name": "A5500", "memory_free_mib": 24148, "pci_bus_id": "00000000:01:00.0"}
    a4000 = {"index": 1, "name": "A4000", "memory_free_mib": 15746, "pci_bus_id": "00000000:0A:00.0"}
    gpus = pin.normalize_gpus([a4000, a5500])
    assert [(g.name, g.pci_bus_id) for g in gpus] == [("A5500", "0000:01:00.0"), ("A4000", "0000:0a:00.0")]
    assert [g.name for g in pin.normalize_gpus([a4000, dict(a5500, pci_bus_id=None)])] == ["A4000", "A5500"]
    with pytest.raises(pin.PlanError, match=r"gpus\[0\]\.pci_bus_id must be a PCI bus id .* got '01:00'"):
        pin.normalize_gpus([dict(a5500, pci_bus_id="01:00")])
