"""Where the llm_server role puts the weights (plugins/plugin_utils/_deploy_placement.py), on real module results:
gguf_info's report of models written with gguf-py and moe_offload_plan's plans for GPUs of the nvidia-smi fixtures."""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_placement import (
    PlacementRefused,
    missing_gpus,
    place,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_values import check_settings
from tests.helpers.role_vars import role_values
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._gguf import read_model
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_report import describe
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_plan import plan
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_inputs import PlanError, load_facts
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import Options
from tools.gguf_models import write_demo_model, write_nemotron_nano_30b

A5500_BUSY = {"topology": "single", "gpus": [{"index": 0, "name": "NVIDIA RTX A5500", "memory_total_mib": 24564,
                                              "memory_free_mib": 5276, "memory_used_mib": 18854}],
              "processes": [{"gpu_index": 0, "pid": 48213, "used_memory_mib": 18342},
                            {"gpu_index": 0, "pid": 777, "used_memory_mib": 512}]}
EXPERTS = ["blk.1.ffn_down_exps.weight", "blk.1.ffn_up_exps.weight", "blk.4.ffn_down_exps.weight",
           "blk.4.ffn_up_exps.weight"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return write_demo_model(str(tmp_path_factory.mktemp("m") / "demo.gguf"))


@pytest.fixture(scope="module")
def nano(tmp_path_factory):
    return write_nemotron_nano_30b(str(tmp_path_factory.mktemp("nano")), shards=1, vocab_size=1024, n_merges=1000)[0]


def settings(model, **values):
    return check_settings(role_values({"llm_server_model_path": model, "llm_server_compose_project": "x",
                                       "llm_server_ctx_size": 512}, **values)).as_dict()


def report(model, pattern=None):
    return describe(read_model(model), tensors="none", pattern=pattern)[0]


def gpu_plan(model, gpus, **kwargs):
    """moe_offload_plan's answer (its result, or on failure the details it reports) for the model's gguf_info."""
    try:
        return plan(load_facts(report(model)), gpus, None, Options(**kwargs))
    except PlanError as exc:
        return dict(exc.details, failed=True, fits=exc.details.get("fits", False), msg=str(exc))


def test_cpu_host_plans_every_mode(demo):
    for mode, pattern in (("all", r"\.ffn_.*_exps\.weight"), ("none", "")):
        answer = gpu_plan(demo, [], ctx_size=512, mode=mode)
        p = place(settings(demo, llm_server_moe_offload_mode=mode), report(demo), answer, {"topology": "cpu", "gpus": []})
        assert (p["pattern"], p["pattern_source"]) == (pattern, "plan" if pattern else "none")
        assert p["expected_tensors"] == (EXPERTS if pattern else []) and p["gpu_devices"] == []
    answer = gpu_plan(demo, [], ctx_size=512, mode="layers", cpu_expert_layers=[4])
    p = place(settings(demo, llm_server_moe_offload_mode="layers", llm_server_cpu_expert_layers=[4]), report(demo),
              answer, {"topology": "cpu", "gpus": []})
    assert p["expected_tensors"] == EXPERTS[2:]


def test_cpu_host_mode_all_moves_every_expert_proved_by_the_model(demo):
    p = place(settings(demo, llm_server_moe_offload_mode="all"), report(demo), None, {"topology": "cpu", "gpus": []})
    assert p["pattern_source"] == "model" and p["pattern"] == r"\.ffn_.*_exps\.weight"
    assert p["expected_tensors"] == EXPERTS and p["gpu_devices"] == [] and p["topology"] == "cpu"
    none = place(settings(demo, llm_server_moe_offload_mode="none"), report(demo), None, {"topology": "cpu"})
    assert (none["pattern"], none["pattern_source"], none["expected_tensors"]) == ("", "none", [])


def test_an_inventory_pattern_wins_and_is_checked_against_every_tensor(demo):
    pattern = r"blk\.4\.ffn_(up|down)_exps"
    p = place(settings(demo, llm_server_moe_offload_pattern=pattern), report(demo, pattern), None, {})
    assert (p["pattern"], p["pattern_source"], p["expected_tensors"]) == (pattern, "inventory", EXPERTS[2:])
    # the planner's check of the same pattern (it sizes the plan with it)
    answer = gpu_plan(demo, [], ctx_size=512, pattern=pattern)
    p = place(settings(demo, llm_server_moe_offload_pattern=pattern), report(demo), answer, {"topology": "cpu"})
    assert (p["pattern"], p["pattern_source"], p["expected_tensors"]) == (pattern, "inventory", EXPERTS[2:])


def test_a_forced_pattern_that_moves_non_experts_expects_all_it_moves(demo):
    pattern = r"blk\.1\."
    p = place(settings(demo, llm_server_moe_offload_pattern=pattern, llm_server_moe_offload_force=True),
              report(demo, pattern), None, {})
    assert set(EXPERTS[:2]) < set(p["expected_tensors"])
    assert all(t.startswith("blk.1.") for t in p["expected_tensors"])


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


def test_a_plan_that_does_not_fit_is_refused_unless_forced(nano):
    answer = gpu_plan(nano, A5500_BUSY["gpus"], ctx_size=1048576)
    assert answer["fits"] is False
    with pytest.raises(PlacementRefused) as exc:
        place(settings(nano, llm_server_ctx_size=1048576), report(nano), answer, A5500_BUSY, host="h1")
    assert "the plan does not fit h1's GPUs: " in str(exc.value)
    assert "MiB are missing" in str(exc.value)
    assert "llm_server_moe_offload_force=true" in str(exc.value) and "Nothing was changed" in str(exc.value)
    forced = place(settings(nano, llm_server_ctx_size=1048576, llm_server_moe_offload_force=True), report(nano),
                   answer, A5500_BUSY)
    assert forced["pattern"] == r"\.ffn_.*_exps\.weight" and forced["pattern_source"] == "model"
    with pytest.raises(PlacementRefused, match="with llm_server_moe_offload_pattern"):
        place(settings(nano, llm_server_ctx_size=1048576, llm_server_moe_offload_force=True,
                       llm_server_moe_offload_mode="layers", llm_server_cpu_expert_layers=[1, 3]),
              report(nano), answer, A5500_BUSY)


@pytest.mark.parametrize("pattern", ["blk\\.1\n\\.ffn", "blk${X}", "x" * 20000])
def test_a_pattern_derived_from_crafted_tensor_names_gets_the_same_checks(demo, pattern):
    model = dict(report(demo), offload_pattern=pattern, offload_pattern_matches=EXPERTS)
    with pytest.raises(PlacementRefused, match="the pattern gguf_info built from the model's tensor names"):
        place(settings(demo, llm_server_moe_offload_mode="all"), model, None, {"topology": "cpu"})


DUAL = {"topology": "dual", "gpus": [
    {"index": 0, "name": "NVIDIA RTX A5500", "memory_total_mib": 24564, "memory_free_mib": 24148},
    {"index": 1, "name": "NVIDIA RTX A4000", "memory_total_mib": 16376, "memory_free_mib": 16000}]}


def test_each_refusal_in_full(demo, nano):
    """What the user reads, whole: the variable to change, the host, and that nothing was changed."""
    with pytest.raises(PlacementRefused) as exc:
        place(settings(nano, llm_server_gpu_devices=[0, 3]), report(nano), None, DUAL, [3], "h2")
    assert str(exc.value) == ("llm_server: llm_server_gpu_devices [0, 3] names GPUs that h2 does not have "
                              "(nvidia-smi indices: [0, 1]). Nothing was changed.")
    answer = {"fits": False, "reason": "The host cannot hold its part: 10 MiB are missing.", "msg": "other"}
    with pytest.raises(PlacementRefused) as exc:
        place(settings(demo), report(demo), answer, {"topology": "cpu"}, host="h3")
    assert str(exc.value) == ("llm_server: the plan does not fit h3's memory: The host cannot hold its part: 10 MiB "
                              "are missing. Nothing was changed; lower llm_server_ctx_size / llm_server_parallel, "
                              "change llm_server_moe_offload_mode, or set llm_server_moe_offload_force=true.")
    with pytest.raises(PlacementRefused, match="does not fit h3's memory: other Nothing"):
        place(settings(demo), report(demo), dict(answer, reason=""), {"topology": "cpu"}, host="h3")
    with pytest.raises(PlacementRefused) as exc:
        place(settings(demo, llm_server_moe_offload_mode="layers", llm_server_cpu_expert_layers=[1]), report(demo),
              {"skipped": True}, {"topology": "cpu"}, host="h4")
    assert str(exc.value) == ("llm_server: llm_server_moe_offload_mode=layers needs the plan, which did not run on "
                              "h4. Give llm_server_moe_offload_pattern instead.")
    pattern = r"blk\.1\."
    with pytest.raises(PlacementRefused) as exc:
        place(settings(demo, llm_server_moe_offload_pattern=pattern), report(demo, pattern), None, {})
    verdict = report(demo, pattern)["pattern_check"]["verdict"]
    assert str(exc.value) == ('llm_server: refused inventory pattern "blk\\\\.1\\\\." for %s: %s. Nothing was '
                              "changed; set llm_server_moe_offload_force=true to deploy it anyway." % (demo, verdict))
    with pytest.raises(PlacementRefused, match=r": it was not checked\. The pattern matched no tensors\. Nothing"):
        place(settings(demo, llm_server_moe_offload_pattern=pattern), report(demo), None, {})


def test_a_split_plan_gives_its_devices_and_split(nano):
    answer = gpu_plan(nano, DUAL["gpus"], ctx_size=65536, parallel=4)
    assert answer["placement"] == "split" and answer["gpu_devices"] == [0, 1]
    p = place(settings(nano, llm_server_ctx_size=65536, llm_server_parallel=4), report(nano), answer, DUAL)
    assert (p["gpu_devices"], p["tensor_split"], p["topology"]) == ([0, 1], answer["tensor_split"], "dual")
    assert p["tensor_split"] == "0.601,0.399"  # free memory 24148 : 16000 (llama.cpp's --tensor-split shares)
    one = gpu_plan(nano, DUAL["gpus"], ctx_size=65536, parallel=4, gpu_devices=[1])
    p = place(settings(nano, llm_server_ctx_size=65536, llm_server_parallel=4, llm_server_gpu_devices=[1]),
              report(nano), one, DUAL)
    assert p["gpu_devices"] == [1] and p["tensor_split"] == ""
    # without a plan: the chosen GPUs, else every GPU the host has; none on a CPU host
    p = place(settings(nano, llm_server_gpu_devices=[1]), report(nano), None, DUAL)
    assert (p["gpu_devices"], p["tensor_split"]) == ([1], "")
    assert place(settings(nano), report(nano), None, DUAL)["gpu_devices"] == [0, 1]
    assert place(settings(nano, llm_server_gpu_devices=[1]), report(nano), None, {"topology": "cpu"})["gpu_devices"] == []
    failed = dict(answer, failed=True)
    assert place(settings(nano), report(nano), failed, DUAL)["tensor_split"] == ""


def test_device_overrides_as_the_plan_gives_them(demo):
    answer = gpu_plan(demo, [], ctx_size=512, mode="all")
    overrides = [{"pattern": r"blk\.4\.ffn_(up|down)_exps\.weight$", "device": "CUDA1"},
                 {"pattern": r"blk\.1\.ffn_(up|down)_exps\.weight$", "buffer_type": "CUDA0"},
                 r"blk\.9\.ffn_(up|down)_exps\.weight$=CUDA1"]
    p = place(settings(demo), report(demo), dict(answer, device_overrides=overrides), {"topology": "cpu"})
    assert p["device_overrides"] == [r"blk\.4\.ffn_(up|down)_exps\.weight$=CUDA1",
                                     r"blk\.1\.ffn_(up|down)_exps\.weight$=CUDA0",
                                     r"blk\.9\.ffn_(up|down)_exps\.weight$=CUDA1"]
    assert place(settings(demo), report(demo), dict(answer, device_overrides=None), {})["device_overrides"] == []
    assert place(settings(demo), report(demo), dict(answer, device_overrides=overrides, failed=True),
                 {"topology": "cpu"})["device_overrides"] == []


def test_the_expected_tensors_of_a_plan_pattern_without_its_check(demo):
    answer = gpu_plan(demo, [], ctx_size=512, mode="layers", cpu_expert_layers=[1])
    bare = dict(answer, pattern_check={})
    p = place(settings(demo, llm_server_moe_offload_mode="layers", llm_server_cpu_expert_layers=[1]), report(demo),
              bare, {"topology": "cpu"})
    assert p["expected_tensors"] == EXPERTS[:2]  # the pattern searched in the model's expert names
    empty = place(settings(demo), report(demo), dict(answer, pattern=""), {"topology": "cpu"})
    assert (empty["pattern"], empty["pattern_source"], empty["expected_tensors"]) == ("", "none", [])


def test_a_context_beyond_the_training_context_of_the_report_its_metadata_or_the_plan_is_refused(demo):
    model = report(demo)  # gguf_info's model summary: nemotron_h_moe.context_length 4096
    with pytest.raises(PlacementRefused, match="llm_server_ctx_size: 8192 is more than the model's training context "
                                               "4096"):
        place(settings(demo, llm_server_ctx_size=8192), model, None, {"topology": "cpu"})
    assert place(settings(demo, llm_server_ctx_size=4096), model, None, {"topology": "cpu"})["pattern"]
    with pytest.raises(PlacementRefused, match="more than the model's training context 1000"):
        place(settings(demo, llm_server_ctx_size=2048), dict(model, context_length=1000), None, {"topology": "cpu"})
    for value in (0, "4096", None, -1):
        meta = dict(model["model"]["metadata"], **{"nemotron_h_moe.context_length": value})
        bare = dict(model, model=dict(model["model"], metadata=meta))
        assert place(settings(demo, llm_server_ctx_size=8192), bare, None, {"topology": "cpu"})["pattern"]
        with pytest.raises(PlacementRefused, match="training context 2048"):
            place(settings(demo, llm_server_ctx_size=8192), bare, {"n_ctx_train": 2048, "skipped": True},
                  {"topology": "cpu"})


def test_missing_gpus_are_the_chosen_indices_the_host_lacks_as_numbers():
    assert missing_gpus(A5500_BUSY, [0, 2]) == [2] and missing_gpus({"topology": "cpu", "gpus": []}, [0]) == []
    assert missing_gpus(DUAL, ["1", 2]) == [2]
    assert missing_gpus({"gpus": DUAL["gpus"]}, [5]) == []  # no topology: a CPU host
    assert missing_gpus(None, [0]) == [] and missing_gpus(DUAL, None) == []
