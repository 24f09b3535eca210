"""The memory of each host in the rollout report (plugins/plugin_utils/_rollout_memory.py): llama-server's buffers
in each shape they come in, and per GPU the planned and measured stacks and the host RAM, with errors that name the
host and the field."""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._rollout_memory import device_buffers, memory_views
from tests.helpers import rollout_samples as samples
from tests.helpers.rollout_samples import error_of


SAME_DEVICES = {"CUDA0": {"model": 10.0, "kv": 2.0, "rs": 1.0, "compute": 3.0}, "CPU_Mapped": {"model": 5.0},
                "CUDA_Host": {"compute": 0.5}}


@pytest.mark.parametrize("buffers, devices", [
    (None, {}), ({}, {}), ([], {}),
    # kind first (llama_server_log's shape), device first, or a list of devices: the same devices
    ({"model": {"CUDA0": 10.0, "CPU_Mapped": 5.0}, "kv": {"CUDA0": 2.0}, "rs": {"CUDA0": 1.0},
      "compute": {"CUDA0": 3.0, "CUDA_Host": 0.5}}, SAME_DEVICES),
    (SAME_DEVICES, SAME_DEVICES),
    ([{"device": "CUDA0", "model": 10.0, "kv": 2.0, "recurrent": 1.0, "compute": 3.0},
      {"device": "CPU_Mapped", "model": 5.0}, {"device": "CUDA_Host", "compute": 0.5}], SAME_DEVICES),
    # kind first reads recurrent as rs and devices as text
    ({"recurrent": {"CUDA0": 2}, "model": {0: "10.5", "CPU": None}},
     {"CUDA0": {"rs": 2.0}, "0": {"model": 10.5}, "CPU": {"model": None}}),
    # device first keeps only the known kinds; a mix of kinds and devices is read device first
    ({"CUDA0": {"model": 1, "weights": 9, "recurrent": 3}, "CPU": {"other": 1}}, {"CUDA0": {"model": 1.0, "rs": 3.0}}),
    ({"model": {"CUDA0": 1.0}, "CUDA1": {"kv": 2.0}}, {"CUDA1": {"kv": 2.0}}),
    # list items are named by device, then buffer, then position
    ([{"device": "CUDA0", "model": 1}, {"buffer": "CPU", "model": "2.5"}, {"device": "", "buffer": "", "kv": 3}],
     {"CUDA0": {"model": 1.0}, "CPU": {"model": 2.5}, "2": {"kv": 3.0}}),
])
def test_device_buffers(buffers, devices):
    assert device_buffers(buffers) == devices


def test_errors_name_the_host_the_field_and_where_the_bad_value_is():
    where = "h: llm_server_result.buffers"
    assert error_of(device_buffers, "x", where) == where + " is str, not a dict"
    for buffers, message in [
            ("x", "buffers is str, not a dict"), ([{"model": 1}, 7], "buffers[1] is int, not a dict"),
            ({"model": [1]}, "buffers.model is list, not a dict"), ({"CUDA0": 5}, "buffers.CUDA0 is int, not a dict"),
            ({"kv": {"CUDA0": True}}, "buffers.kv.CUDA0 is True, not a number of MiB"),
            ({"CUDA0": {"kv": "x"}}, "buffers.CUDA0.kv is 'x', not a number of MiB"),
            ([{"device": "CUDA1", "rs": [2]}], "buffers.CUDA1.rs is [2], not a number of MiB")]:
        assert error_of(device_buffers, buffers) == message
    assert error_of(memory_views, []) == "host: llm_server_result is list, not a dict"
    for res, message in [
            ([], " is list, not a dict"), ({"plan": "x"}, ".plan is str, not a dict"),
            ({"plan": {"gpus": {"a": 1}}}, ".plan.gpus is dict, not a list"),
            ({"plan": {"gpus": ["x"]}}, ".plan.gpus[0] is str, not a dict"),
            ({"plan": {"gpus": [{"total_mib": "x"}]}}, ".plan.gpus[0].total_mib is 'x', not a number of MiB"),
            ({"plan": {"gpus": [{}, {"free_mib": [1]}]}}, ".plan.gpus[1].free_mib is [1], not a number of MiB"),
            ({"plan": {"gpus": [{"margin_mib": True}]}}, ".plan.gpus[0].margin_mib is True, not a number of MiB"),
            ({"plan": {"gpus": [{}]}, "vram": [{"used_mib": "x"}]}, ".vram[0].used_mib is 'x', not a number of MiB"),
            ({"buffers": 3}, ".buffers is int, not a dict"),
            ({"buffers": {"CUDA0": {"kv": "x"}}}, ".buffers.CUDA0.kv is 'x', not a number of MiB"),
            ({"plan": {"host": []}}, ".plan.host is list, not a dict"),
            ({"plan": {"host": {"experts_mib": "many"}}}, ".plan.host.experts_mib is 'many', not a number of MiB"),
            ({"plan": {"host": {"available_mib": False}}}, ".plan.host.available_mib is False, not a number of MiB")]:
        assert error_of(memory_views, res, "h") == "h: llm_server_result" + message


def gpu_view(index=0, name=None, available=None, planned=(), planned_total=0.0, overflow=0.0, measured=None,
             measured_total=None, used=None, vram_ok=None):
    return {"index": index, "name": name, "available": available, "planned": list(planned),
            "planned_total": planned_total, "overflow": overflow, "measured": measured,
            "measured_total": measured_total, "used": used, "vram_ok": vram_ok}


def planned(model=0.0, kv=0.0, recurrent=0.0, compute=0.0, margin=0.0, free=0.0):
    return [("model", model), ("kv", kv), ("recurrent", recurrent), ("compute", compute), ("margin", margin),
            ("free", free)]


NO_VIEWS = {"gpus": [], "host": None}


def gpus_only(*views):
    return {"gpus": list(views), "host": None}


def host_only(available=None, planned=None, measured=None):
    return {"gpus": [], "host": {"available": available, "planned": planned, "measured": measured}}


@pytest.mark.parametrize("result, views", [
    # no result or no plan
    (None, NO_VIEWS), ({}, NO_VIEWS), ({"plan": {"gpus": None, "host": None}, "vram": "not measured"}, NO_VIEWS),
    # the total_mib of the plan wins over the sum of its parts
    ({"plan": {"gpus": [dict(index=0, name="G", model_mib=100, kv_mib="50", free_mib=1000, total_mib=400)]}},
     gpus_only(gpu_view(0, "G", 1000.0, planned(100.0, 50.0, free=600.0), 400.0))),
    ({"plan": {"gpus": [{"index": 0, "model_mib": 100, "kv_mib": 50, "recurrent_mib": 25, "compute_mib": 75,
                         "margin_mib": 250, "free_mib": 1000}]}},
     gpus_only(gpu_view(0, None, 1000.0, planned(100.0, 50.0, 25.0, 75.0, 250.0, 500.0), 500.0))),
    # the overflow is what the plan needs beyond the free memory
    *[({"plan": {"gpus": [{"index": 0, "model_mib": 400, "free_mib": free}]}},
       gpus_only(gpu_view(0, None, free, planned(400.0, free=left), 400.0, overflow)))
      for free, left, overflow in ((401, 1.0, 0.0), (400, 0.0, 0.0), (300, 0.0, 100.0), (None, 0.0, 0.0))],
    # measured from the buffers and the vram the container took, or the buffers alone
    ({"plan": {"gpus": [{"index": 0, "model_mib": 100, "free_mib": 1000}]},
      "buffers": {"CUDA0": {"model": 90, "kv": 10, "rs": 5, "compute": 20}},
      "vram": [{"index": 0, "used_mib": 300, "ok": False}]},
     gpus_only(gpu_view(0, None, 1000.0, planned(100.0, free=900.0), 100.0, measured=[
         ("model", 90.0), ("kv", 10.0), ("recurrent", 5.0), ("compute", 20.0), ("other", 175.0), ("free", 700.0)],
         measured_total=300.0, used=300.0, vram_ok=False))),
    ({"plan": {"gpus": [{"index": 0}]}, "buffers": {"CUDA0": {"model": 10, "compute": 2}}},
     gpus_only(gpu_view(0, None, None, planned(), 0.0, measured=[
         ("model", 10.0), ("kv", 0.0), ("recurrent", 0.0), ("compute", 2.0)], measured_total=12.0))),
    # host RAM from the plan and the host-side model buffers
    ({"plan": {"host": {"experts_mib": 10}}}, host_only(planned=10.0)),
    ({"plan": {"host": {"available_mib": "2048"}}}, host_only(available=2048.0)),
    ({"buffers": {"model": {"CPU": 100, "CPU_REPACK": 50.5, "CUDA0": 9}, "compute": {"CUDA_Host": 3}}},
     host_only(measured=150.5)),
    ({"buffers": {"compute": {"CUDA_Host": 3}, "model": {"CUDA0": 9}}}, NO_VIEWS),
    ({"buffers": {"CPU": {"model": 0}}}, host_only(measured=0.0)),
])
def test_memory_views(result, views):
    assert memory_views(result) == views


ZEROS = [("kv", 0.0), ("recurrent", 0.0), ("compute", 0.0)]


@pytest.mark.parametrize("free, buffers, used, measured, total", [
    # other: only what the vram used exceeds the buffers
    (1000, {"model": {"CUDA0": 100}}, 101, [("model", 100.0)] + ZEROS + [("other", 1.0), ("free", 899.0)], 101.0),
    (1000, {"model": {"CUDA0": 100}}, 100, [("model", 100.0)] + ZEROS + [("free", 900.0)], 100.0),
    (1000, {"model": {"CUDA0": 100}}, 80, [("model", 100.0)] + ZEROS + [("free", 920.0)], 80.0),
    # the measured free memory is never negative
    (1000, None, 1500, [("model", 0.0)] + ZEROS + [("other", 1500.0), ("free", 0.0)], 1500.0),
    (1000, None, 1000, [("model", 0.0)] + ZEROS + [("other", 1000.0), ("free", 0.0)], 1000.0),
    # without free memory, no free part
    (None, None, 7, [("model", 0.0)] + ZEROS + [("other", 7.0)], 7.0),
])
def test_memory_views_measured_other_and_free(free, buffers, used, measured, total):
    res = {"plan": {"gpus": [{"index": 0, "free_mib": free}]}, "buffers": buffers,
           "vram": [{"index": 0, "used_mib": used}]}
    gpu = memory_views(res)["gpus"][0]
    assert (gpu["measured"], gpu["measured_total"]) == (measured, total)


def test_memory_views_the_ith_gpu_of_the_plan_gets_the_buffers_of_device_i_and_its_vram_row():
    res = {"plan": {"gpus": [{"index": 0}, {"index": 1}, {"index": 2}, {"index": 3}]},
           "buffers": {"CUDA1": {"model": 1}, "Vulkan0": {"model": 2}, "ROCm2": {"kv": 3},
                       "RPC[10.0.0.1:50052]3": {"compute": 4}, "CUDA_Host": {"compute": 5}}}
    assert [dict(g["measured"]) for g in memory_views(res)["gpus"]] == [
        {"model": 2.0, "kv": 0.0, "recurrent": 0.0, "compute": 0.0},
        {"model": 1.0, "kv": 0.0, "recurrent": 0.0, "compute": 0.0},
        {"model": 0.0, "kv": 3.0, "recurrent": 0.0, "compute": 0.0},
        {"model": 0.0, "kv": 0.0, "recurrent": 0.0, "compute": 4.0}]
    res = {"plan": {"gpus": [{"index": 1}, {"index": 0}]},
           "vram": [{"index": 0, "used_mib": 100, "ok": True}, {"index": 1, "used_mib": 200, "ok": False}]}
    gpus = memory_views(res)["gpus"]
    assert [(g["index"], g["used"], g["vram_ok"]) for g in gpus] == [(1, 200.0, False), (0, 100.0, True)]
    res = {"plan": {"gpus": [{"index": 5}, {"index": 6}, {"index": 7}]},
           "vram": [{"index": 0, "used_mib": 40}, "not a row"]}
    assert [memory_views(res)["gpus"][i]["used"] for i in range(3)] == [40.0, None, None]
    res = {"plan": {"gpus": [{"name": "A"}, {"name": "B"}]}, "vram": [{"used_mib": 1}, {"index": 7, "used_mib": 2}]}
    assert [(g["index"], g["name"], g["used"]) for g in memory_views(res)["gpus"]] == [(0, "A", 1.0), (1, "B", 2.0)]


def test_memory_views_planned_and_measured_per_gpu():
    views = memory_views(samples.changed_single())
    (gpu,) = views["gpus"]
    planned = dict(gpu["planned"])
    assert list(planned) == ["model", "kv", "recurrent", "compute", "margin", "free"]
    assert planned["model"] == 21009.47 and planned["margin"] == 1024.0
    # free: the card's free memory before the deploy less everything planned
    assert planned["free"] == pytest.approx(24148 - (21009.47 + 192.0 + 47.62 + 1178.5 + 1024.0))
    measured = dict(gpu["measured"])
    assert measured["model"] == 21003.12 and measured["kv"] == 192.0 and measured["recurrent"] == 47.62
    # what the container took beyond llama-server's buffers (CUDA context, cuBLAS workspace)
    assert measured["other"] == pytest.approx(22843.0 - (21003.12 + 192.0 + 47.62 + 1178.5))
    assert measured["free"] == pytest.approx(24148 - 22843.0)
    assert gpu["measured_total"] == 22843.0 and gpu["overflow"] == 0.0 and gpu["vram_ok"] is True
    # host RAM: the experts planned; measured: the host-side model buffers llama-server logged
    assert views["host"] == {"available": 61440.0, "planned": 2362.5, "measured": 2375.2}
