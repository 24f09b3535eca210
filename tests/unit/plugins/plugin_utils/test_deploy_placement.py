"""Where the llm_server role puts the weights (plugins/plugin_utils/_deploy_placement.py), on real module results:
gguf_info's report of models written with gguf-py and moe_offload_plan's plans for GPUs of the nvidia-smi fixtures."""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_inspection import describe
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_plan import plan
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_inputs import PlanError, load_facts
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import Options
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.model import read_model
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_placement import (
    PlacementRefused, missing_gpus, place)
from tests.helpers.deploy_settings import EXPERTS, demo_model, settings
from tools.gguf_models import write_nemotron_nano_30b

A5500_BUSY = {"topology": "single", "gpus": [{"index": 0, "name": "NVIDIA RTX A5500", "memory_total_mib": 24564,
                                              "memory_free_mib": 5276, "memory_used_mib": 18854}],
              "processes": [{"gpu_index": 0, "pid": 48213, "used_memory_mib": 18342},
                            {"gpu_index": 0, "pid": 777, "used_memory_mib": 512}]}
ALL = r"\.ffn_.*_exps\.weight"
CPU = {"topology": "cpu"}

demo = pytest.fixture(demo_model, scope="module", name="demo")


@pytest.fixture(scope="module")
def nano(tmp_path_factory):
    return write_nemotron_nano_30b(str(tmp_path_factory.mktemp("nano")), shards=1, vocab_size=1024, n_merges=1000)[0]


def report(model, pattern=None):
    return describe(read_model(model), tensors="none", pattern=pattern)[0]


def gpu_plan(model, gpus, **kwargs):
    """moe_offload_plan's answer (its result, or on failure the details it reports) for the model's gguf_info."""
    try:
        return plan(load_facts(report(model)), gpus, None, Options(**kwargs))
    except PlanError as exc:
        return dict(exc.details, failed=True, fits=exc.details.get("fits", False), msg=str(exc))


def refusal(*args, **kwargs):
    """What ``place(*args, **kwargs)`` refuses, as the user reads it."""
    with pytest.raises(PlacementRefused) as refused:
        place(*args, **kwargs)
    return str(refused.value)


@pytest.mark.parametrize("mode, layers, planned, pattern, source, expected", [
    # a CPU host: the plan's pattern; without a plan, mode all moves every expert gguf_info proved in the model
    ("all", [], True, ALL, "plan", EXPERTS), ("none", [], True, "", "none", []),
    ("layers", [4], True, r"blk\.4\.ffn_.*_exps\.weight", "plan", EXPERTS[2:]),
    ("all", [], False, ALL, "model", EXPERTS), ("none", [], False, "", "none", []),
])
def test_cpu_host_modes_with_and_without_a_plan(demo, mode, layers, planned, pattern, source, expected):
    answer = gpu_plan(demo, [], ctx_size=512, mode=mode, **({"cpu_expert_layers": layers} if layers else {}))
    chosen = settings(demo, llm_server_moe_offload_mode=mode, llm_server_cpu_expert_layers=layers)
    p = place(chosen, report(demo), answer if planned else None, CPU)
    assert (p["pattern"], p["pattern_source"], p["expected_tensors"]) == (pattern, source, expected)
    assert (p["gpu_devices"], p["topology"]) == ([], "cpu")


def test_an_inventory_pattern_wins_and_is_checked_against_every_tensor(demo):
    pattern = r"blk\.4\.ffn_(up|down)_exps"
    p = place(settings(demo, llm_server_moe_offload_pattern=pattern), report(demo, pattern), None, {})
    assert (p["pattern"], p["pattern_source"], p["expected_tensors"]) == (pattern, "inventory", EXPERTS[2:])
    # the planner's check of the same pattern (it sizes the plan with it)
    answer = gpu_plan(demo, [], ctx_size=512, pattern=pattern)
    p = place(settings(demo, llm_server_moe_offload_pattern=pattern), report(demo), answer, CPU)
    assert (p["pattern"], p["pattern_source"], p["expected_tensors"]) == (pattern, "inventory", EXPERTS[2:])
    # a forced pattern that moves non-experts expects all it moves
    forced = place(settings(demo, llm_server_moe_offload_pattern=r"blk\.1\.", llm_server_moe_offload_force=True),
                   report(demo, r"blk\.1\."), None, {})
    assert set(EXPERTS[:2]) < set(forced["expected_tensors"])
    assert all(t.startswith("blk.1.") for t in forced["expected_tensors"])


def test_gpu_plan_pattern_and_devices(nano):
    held = {"gpus": [dict(A5500_BUSY["gpus"][0], memory_held_by_pid_mib=18342)]}
    answer = gpu_plan(nano, held, ctx_size=32768, parallel=2)
    p = place(settings(nano, llm_server_ctx_size=32768, llm_server_parallel=2), report(nano), answer, A5500_BUSY)
    assert p["pattern_source"] == ("plan" if answer["pattern"] else "none")
    assert p["gpu_devices"] == [0] and p["topology"] == "single"
    busy = gpu_plan(nano, A5500_BUSY["gpus"], ctx_size=32768, parallel=2)
    p = place(settings(nano), report(nano), busy, A5500_BUSY)
    assert p["pattern"] == busy["pattern"] and p["pattern_source"] == "plan"
    blocks = set(busy["cpu_expert_layers"])
    assert p["expected_tensors"] == sorted(t for t in report(nano)["expert_tensors"] if int(t.split(".")[1]) in blocks)


def test_the_plan_s_count_of_gpu_layers_replaces_the_inventory_s(nano):
    """The inventory's -ngl (99: every layer) goes to .env unless the plan keeps fewer layers on the GPUs."""
    every = gpu_plan(nano, A5500_BUSY["gpus"], ctx_size=32768, parallel=2)
    assert every["n_gpu_layers"] is None
    assert place(settings(nano), report(nano), every, A5500_BUSY)["n_gpu_layers"] == "99"
    fewer = dict(every, n_gpu_layers=40, pattern="", cpu_expert_layers=[])
    assert place(settings(nano), report(nano), fewer, A5500_BUSY)["n_gpu_layers"] == "40"
    assert place(settings(nano), report(nano), dict(fewer, failed=True), A5500_BUSY)["n_gpu_layers"] == "99"


def test_a_plan_that_does_not_fit_is_refused_unless_forced(nano):
    answer = gpu_plan(nano, A5500_BUSY["gpus"], ctx_size=1048576)
    assert answer["fits"] is False
    told = refusal(settings(nano, llm_server_ctx_size=1048576), report(nano), answer, A5500_BUSY, host="h1")
    assert "the plan does not fit h1's GPUs: " in told and "MiB are missing" in told
    assert "llm_server_moe_offload_force=true" in told and "Nothing was changed" in told
    forced = {"llm_server_ctx_size": 1048576, "llm_server_moe_offload_force": True}
    p = place(settings(nano, **forced), report(nano), answer, A5500_BUSY)
    assert p["pattern"] == ALL and p["pattern_source"] == "model"
    layers = settings(nano, llm_server_moe_offload_mode="layers", llm_server_cpu_expert_layers=[1, 3], **forced)
    assert "with llm_server_moe_offload_pattern" in refusal(layers, report(nano), answer, A5500_BUSY)


@pytest.mark.parametrize("pattern", ["blk\\.1\n\\.ffn", "blk${X}", "x" * 20000])
def test_a_pattern_derived_from_crafted_tensor_names_gets_the_same_checks(demo, pattern):
    model = dict(report(demo), offload_pattern=pattern, offload_pattern_matches=EXPERTS)
    told = refusal(settings(demo, llm_server_moe_offload_mode="all"), model, None, CPU)
    assert "the pattern gguf_info built from the model's tensor names" in told


DUAL = {"topology": "dual", "gpus": [
    {"index": 0, "name": "NVIDIA RTX A5500", "memory_total_mib": 24564, "memory_free_mib": 24148},
    {"index": 1, "name": "NVIDIA RTX A4000", "memory_total_mib": 16376, "memory_free_mib": 16000}]}


def test_each_refusal_in_full(demo, nano):
    """What the user reads, whole: the variable to change, the host, and that nothing was changed."""
    assert refusal(settings(nano, llm_server_gpu_devices=[0, 3]), report(nano), None, DUAL, [3], "h2") == (
        "llm_server: llm_server_gpu_devices [0, 3] names GPUs that h2 does not have (nvidia-smi indices: [0, 1]). "
        "Nothing was changed.")
    answer = {"fits": False, "reason": "The host cannot hold its part: 10 MiB are missing.", "msg": "other"}
    assert refusal(settings(demo), report(demo), answer, CPU, host="h3") == (
        "llm_server: the plan does not fit h3's memory: The host cannot hold its part: 10 MiB are missing. Nothing "
        "was changed; lower llm_server_ctx_size / llm_server_parallel, change llm_server_moe_offload_mode, or set "
        "llm_server_moe_offload_force=true.")
    assert "does not fit h3's memory: other Nothing" in refusal(settings(demo), report(demo), dict(answer, reason=""),
                                                                CPU, host="h3")
    layers = settings(demo, llm_server_moe_offload_mode="layers", llm_server_cpu_expert_layers=[1])
    assert refusal(layers, report(demo), {"skipped": True}, CPU, host="h4") == (
        "llm_server: llm_server_moe_offload_mode=layers needs the plan, which did not run on h4. Give "
        "llm_server_moe_offload_pattern instead.")
    pattern = settings(demo, llm_server_moe_offload_pattern=r"blk\.1\.")
    verdict = report(demo, r"blk\.1\.")["pattern_check"]["verdict"]
    assert refusal(pattern, report(demo, r"blk\.1\."), None, {}) == (
        'llm_server: refused inventory pattern "blk\\\\.1\\\\." for %s: %s. Nothing was changed; set '
        "llm_server_moe_offload_force=true to deploy it anyway." % (demo, verdict))
    assert ": it was not checked. The pattern matched no tensors. Nothing" in refusal(pattern, report(demo), None, {})


def test_a_split_plan_gives_its_devices_and_split(nano):
    answer = gpu_plan(nano, DUAL["gpus"], ctx_size=65536, parallel=4)
    assert answer["placement"] == "split" and answer["gpu_devices"] == [0, 1]
    p = place(settings(nano, llm_server_ctx_size=65536, llm_server_parallel=4), report(nano), answer, DUAL)
    assert (p["gpu_devices"], p["tensor_split"], p["topology"]) == ([0, 1], answer["tensor_split"], "dual")
    # llama.cpp's --tensor-split shares of the free memory less the CUDA context the plan assumes on each card (555
    # MiB, neither card in _cuda_context's table): 24148 - 555 : 16000 - 555 = 23593 : 15445
    assert p["tensor_split"] == "0.604,0.396"
    one = gpu_plan(nano, DUAL["gpus"], ctx_size=65536, parallel=4, gpu_devices=[1])
    p = place(settings(nano, llm_server_ctx_size=65536, llm_server_parallel=4, llm_server_gpu_devices=[1]),
              report(nano), one, DUAL)
    assert p["gpu_devices"] == [1] and p["tensor_split"] == ""
    # without a plan: the chosen GPUs, else every GPU the host has; none on a CPU host
    p = place(settings(nano, llm_server_gpu_devices=[1]), report(nano), None, DUAL)
    assert (p["gpu_devices"], p["tensor_split"]) == ([1], "")
    assert place(settings(nano), report(nano), None, DUAL)["gpu_devices"] == [0, 1]
    assert place(settings(nano, llm_server_gpu_devices=[1]), report(nano), None, CPU)["gpu_devices"] == []
    failed = dict(answer, failed=True)
    assert place(settings(nano), report(nano), failed, DUAL)["tensor_split"] == ""


def test_device_overrides_as_the_plan_gives_them(demo):
    answer = gpu_plan(demo, [], ctx_size=512, mode="all")
    overrides = [{"pattern": r"blk\.4\.ffn_(up|down)_exps\.weight$", "device": "CUDA1"},
                 {"pattern": r"blk\.1\.ffn_(up|down)_exps\.weight$", "buffer_type": "CUDA0"},
                 r"blk\.9\.ffn_(up|down)_exps\.weight$=CUDA1"]
    p = place(settings(demo), report(demo), dict(answer, device_overrides=overrides), CPU)
    assert p["device_overrides"] == [r"blk\.4\.ffn_(up|down)_exps\.weight$=CUDA1",
                                     r"blk\.1\.ffn_(up|down)_exps\.weight$=CUDA0",
                                     r"blk\.9\.ffn_(up|down)_exps\.weight$=CUDA1"]
    assert place(settings(demo), report(demo), dict(answer, device_overrides=None), {})["device_overrides"] == []
    failed = dict(answer, device_overrides=overrides, failed=True)
    assert place(settings(demo), report(demo), failed, CPU)["device_overrides"] == []


def test_the_expected_tensors_of_a_plan_pattern_without_its_check(demo):
    answer = gpu_plan(demo, [], ctx_size=512, mode="layers", cpu_expert_layers=[1])
    bare = dict(answer, pattern_check={})
    p = place(settings(demo, llm_server_moe_offload_mode="layers", llm_server_cpu_expert_layers=[1]), report(demo),
              bare, CPU)
    assert p["expected_tensors"] == EXPERTS[:2]  # the pattern searched in the model's expert names
    empty = place(settings(demo), report(demo), dict(answer, pattern=""), CPU)
    assert (empty["pattern"], empty["pattern_source"], empty["expected_tensors"]) == ("", "none", [])


def test_a_context_beyond_the_training_context_of_the_report_its_metadata_or_the_plan_is_refused(demo):
    model = report(demo)  # gguf_info's model summary: nemotron_h_moe.context_length 4096
    assert refusal(settings(demo, llm_server_ctx_size=8192), model, None, CPU).startswith(
        "llm_server: llm_server_ctx_size: 8192 is more than the model's training context 4096")
    assert place(settings(demo, llm_server_ctx_size=4096), model, None, CPU)["pattern"]
    assert "more than the model's training context 1000" in refusal(
        settings(demo, llm_server_ctx_size=2048), dict(model, context_length=1000), None, CPU)
    for value in (0, "4096", None, -1):
        meta = dict(model["model"]["metadata"], **{"nemotron_h_moe.context_length": value})
        bare = dict(model, model=dict(model["model"], metadata=meta))
        assert place(settings(demo, llm_server_ctx_size=8192), bare, None, CPU)["pattern"]
        plan = {"n_ctx_train": 2048, "skipped": True}
        assert "training context 2048" in refusal(settings(demo, llm_server_ctx_size=8192), bare, plan, CPU)


def test_missing_gpus_are_the_chosen_indices_the_host_lacks_as_numbers():
    assert missing_gpus(A5500_BUSY, [0, 2]) == [2] and missing_gpus({"topology": "cpu", "gpus": []}, [0]) == []
    assert missing_gpus(DUAL, ["1", 2]) == [2]
    assert missing_gpus({"gpus": DUAL["gpus"]}, [5]) == []  # no topology: a CPU host
    assert missing_gpus(None, [0]) == [] and missing_gpus(DUAL, None) == []


def test_the_placed_gpus_by_uuid_in_the_order_of_their_indices(nano):
    """The compose file names GPUs by UUID: each placed index's UUID from nvidia-smi, none on a CPU host, and none
    when a placed GPU has no UUID (the indices are used then)."""
    uuids = {0: "GPU-8d4f3c2a-61b7-4e0a-9f35-2c7e1d9a4b60", 1: "GPU-c05e7d29-4a18-3b6f-90d2-18e4a7f65c0b"}
    dual = dict(DUAL, gpus=[dict(g, uuid=uuids[g["index"]]) for g in DUAL["gpus"]])
    p = place(settings(nano, llm_server_gpu_devices=[1, 0]), report(nano), None, dual)
    assert p["gpu_uuids"] == [uuids[1], uuids[0]]
    p = place(settings(nano, llm_server_gpu_devices=[1]), report(nano), None, dual)
    assert p["gpu_uuids"] == [uuids[1]]
    assert place(settings(nano, llm_server_gpu_devices=[1]), report(nano), None, CPU)["gpu_uuids"] == []
    no_uuid = dict(dual, gpus=[dict(g, uuid=None) if g["index"] == 1 else g for g in dual["gpus"]])
    assert place(settings(nano), report(nano), None, no_uuid)["gpu_uuids"] == []
