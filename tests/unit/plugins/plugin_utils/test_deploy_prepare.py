"""What the llm_server role decides before it changes anything (plugins/plugin_utils/_deploy_prepare.py), on real
module results: gguf_info's report of a model written with gguf-py, the GPUs of the nvidia-smi fixtures, the
planner's answer; the refusals carry the failed step's own words."""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_inspection import describe
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.model import read_model
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_prepare import (
    Refused, calibration_of, check_requirement, fetch_args, fetch_line, fetch_summary, make_plan, plan_args, prepare,
    service_args, stored_cuda_context)
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_decision import unchanged
from tests.helpers.deploy_hosts import desired, holding, proved
from tests.helpers.deploy_settings import EXPERTS, demo_model, settings

CPU = {"topology": "cpu", "gpus": [], "processes": []}
ONE_GPU = {"topology": "single", "gpus": [{"index": 0, "name": "NVIDIA RTX A5500", "memory_total_mib": 24564,
                                           "memory_free_mib": 24000, "memory_used_mib": 564}], "processes": []}

demo = pytest.fixture(demo_model, scope="module", name="demo")


def service(model, gpus=None):
    """llm_server_service_info's result for a host that runs nothing yet (without GPU unless ``gpus``)."""
    return {"engine": "podman", "compose_command": ["podman-compose"], "health": None,
            "auth": {"checked": False, "enforced": False},
            "container": {"exists": False, "running": False, "status": "missing", "config_hash": None},
            "disk": {"lock_file": False, "snapshot_hash": None, "verification": None},
            "gpu_info": gpus or CPU, "host_info": None,
            "model_info": describe(read_model(model), tensors="none")[0]}


def refused(step, *args, **kwargs):
    """The ``Refused`` that ``step(*args, **kwargs)`` raises."""
    with pytest.raises(Refused) as caught:
        step(*args, **kwargs)
    return caught.value


def test_the_host_is_read_with_the_gpus_the_memory_and_the_model_for_a_deploy_only(demo):
    s = settings(demo)
    args = service_args(s, "k3y")
    assert args["api_key"] == "k3y" and args["gpus"] and args["host_memory"] and args["model_path"] == demo
    assert args["lock_path"] == s["paths"]["lock"] and args["model_dir"] == s["model_dir"]
    assert service_args(s, "", "rollback") == {
        "project_dir": s["project_dir"], "compose_file": s["compose_file"], "compose_command": s["compose_command"],
        "container_name": s["container_name"], "rollback_dir": s["rollback_dir"], "base_url": s["base_url"]}


def test_the_planner_gets_the_chosen_gpus_the_mode_the_goal_the_layers_and_the_inventory_pattern(demo):
    found = service(demo, ONE_GPU)
    args = plan_args(settings(demo), found)
    assert args["gguf"] is found["model_info"] and args["gpus"] is ONE_GPU
    assert (args["mode"], args["goal"], args["ctx_size"]) == ("auto", "fit", 512)
    assert plan_args(settings(demo, llm_server_moe_offload_goal="speed"), found)["goal"] == "speed"
    assert "gpu_devices" not in args and "cpu_expert_layers" not in args and "pattern" not in args
    layers = plan_args(settings(demo, llm_server_moe_offload_mode="layers", llm_server_cpu_expert_layers=[1],
                                llm_server_gpu_devices=[0]), found)
    assert (layers["mode"], layers["cpu_expert_layers"], layers["gpu_devices"]) == ("layers", [1], [0])
    pattern = plan_args(settings(demo, llm_server_moe_offload_mode="none",
                                 llm_server_moe_offload_pattern=r"blk\.1\.ffn_(up|down)_exps"), found)
    assert (pattern["mode"], pattern["pattern"]) == ("auto", r"blk\.1\.ffn_(up|down)_exps")
    # a count of GPU layers is sized as given (99, the default, is every layer of the demo); auto and all are not counts
    assert args["n_gpu_layers"] == 99
    assert plan_args(settings(demo, llm_server_n_gpu_layers="3"), found)["n_gpu_layers"] == 3
    for word in ("all", "auto"):
        assert "n_gpu_layers" not in plan_args(settings(demo, llm_server_n_gpu_layers=word), found)


def test_a_missing_gpu_skips_the_plan_and_is_refused_by_the_placement(demo):
    plan, missing, _warnings = make_plan(settings(demo, llm_server_gpu_devices=[3]), service(demo, ONE_GPU))
    assert (plan, missing) == ({"skipped": True, "changed": False}, [3])
    refusal = refused(prepare, settings(demo, llm_server_gpu_devices=[3]), service(demo, ONE_GPU), host="h1")
    msg = ("llm_server: llm_server_gpu_devices [3] names GPUs that h1 does not have (nvidia-smi indices: [0]). "
           "Nothing was changed.")
    assert (refusal.result, str(refusal), refusal.parts["plan"]) == (
        {"failed": True, "msg": msg}, msg, {"skipped": True, "changed": False})


def test_a_plan_that_does_not_fit_is_refused_with_the_plan_unless_forced(demo):
    tiny = {"topology": "single", "gpus": [dict(ONE_GPU["gpus"][0], memory_total_mib=64, memory_free_mib=1)],
            "processes": []}
    refusal = refused(prepare, settings(demo), service(demo, tiny), host="h1")
    assert refusal.result["msg"].startswith("llm_server: the plan does not fit h1's GPUs: ")
    assert refusal.parts["plan"]["fits"] is False and refusal.parts["plan"]["failed"] is True
    forced = prepare(settings(demo, llm_server_moe_offload_force=True), service(demo, tiny))
    assert forced["plan"]["fits"] is False and forced["placement"]["topology"] == "single"


def test_a_planner_failure_other_than_the_fit_is_a_refusal_in_the_planners_words(demo):
    found = dict(service(demo), model_info={"model": {"metadata": {}, "tensors": []}})
    refusal = refused(make_plan, settings(demo), found)
    assert refusal.result["failed"] is True and refusal.result["msg"]
    assert refusal.parts["plan"] is refusal.result
    # options the planner's argument spec refuses, in its own words
    assert refused(make_plan, dict(settings(demo), ctx_size="many"), found).result == {
        "failed": True, "msg": "argument 'ctx_size' is of type str and we were unable to convert to int: "
                               "\"'many'\" cannot be converted to an int"}


def test_a_deployable_host_gets_its_plan_and_placement_and_the_decision_reads_them(demo):
    s = settings(demo, llm_server_moe_offload_mode="all")
    prepared = prepare(s, service(demo))
    assert sorted(prepared) == ["placement", "plan", "warnings"]
    assert prepared["plan"]["failed"] is False and prepared["plan"]["changed"] is False
    assert prepared["placement"]["pattern_source"] == "plan"
    assert sorted(prepared["placement"]["expected_tensors"]) == EXPERTS
    assert prepared["warnings"] == []
    config = desired(s, prepared["placement"], service(demo))
    assert config["first"] is True and config["files"] == ["env", "compose"]
    assert unchanged(service(demo), s, config) == {"unchanged": False,
                                                   "reason": "the files on disk are not those of this configuration"}
    # a host that holds, runs and proved this configuration: nothing to do
    held, digest = holding(s, prepared["placement"])
    again = prepare(s, dict(service(demo), **held))
    assert again["placement"] == prepared["placement"]
    config = desired(s, again["placement"], held)
    assert config == proved(digest)
    assert unchanged(held, s, config) == {"unchanged": True, "converge": {
        "recreate": False, "verify": False, "wait": False, "reason": ""}}


def test_a_model_outside_the_directory_the_container_mounts_is_refused_before_the_plan(demo):
    message = "llm_server_model_path: /srv/models/m.gguf resolves to /elsewhere/m.gguf, outside ..."
    found = dict(service(demo), disk=dict(service(demo)["disk"], model_outside_dir=message))
    caught = refused(prepare, settings(demo), found)
    assert caught.result == {"failed": True, "msg": message} and "plan" not in caught.parts


# What _speed_check measured on the host: medians of the server's timings, a prompt of 64 tokens, 4 generated.
MEASURED = {"decode_tokens_per_second": 50.0, "prompt_tokens_per_second": 400.0, "runs": 3, "prompt_tokens": 64,
            "predicted_tokens": 4}


def verified(found, status="changed", **speed):
    """``found`` with a last verification of ``status`` that recorded ``speed``."""
    return dict(found, disk=dict(found["disk"], verification={"status": status, "config_hash": "c" * 64,
                                                              "speed": dict(MEASURED, **speed)}))


def test_a_measured_speed_gives_the_calibration_that_the_next_plan_of_the_host_reads_back(demo):
    """On a host without GPU a decoded token is one read of B bytes from host memory (one backend: no graph
    split), so the calibrated bandwidth is B x the measured rate: half the rate, half the bandwidth."""
    s, found = settings(demo), service(demo)
    first = prepare(s, found)
    assert "calibration" not in plan_args(s, found) and first["plan"]["speed"]["calibrated"] is False
    solved, problem = calibration_of(s, found, first["plan"], MEASURED)
    # the measured prompt speed gives the host's compute rate too, the bandwidth solved from decode first
    assert problem == "" and set(solved) == {"host_bytes_per_second", "host_flops_per_second", "measured"}
    halved, _problem = calibration_of(s, found, first["plan"], dict(MEASURED, decode_tokens_per_second=25.0))
    assert halved["host_bytes_per_second"] == pytest.approx(solved["host_bytes_per_second"] / 2, abs=1)
    assert (solved["measured"]["decode_tokens_per_second"], solved["measured"]["prompt_tokens"],
            solved["measured"]["placement"]) == (50.0, 64, "cpu")
    again = verified(found, calibration=solved)
    assert plan_args(s, again)["calibration"] == solved
    planned = prepare(s, again)["plan"]["speed"]
    assert planned["calibrated"] is True and planned["prompt_calibrated"] is True and "(calibrated)" in planned["from"]
    # the plan predicts a full slot of 512 tokens, which reads more of the cache than the 66 measured at
    assert planned["decode_tokens_per_second"] <= MEASURED["decode_tokens_per_second"]


def test_no_calibration_is_read_from_a_failed_verification_nor_solved_without_a_plan_or_a_full_measurement(demo):
    s, found = settings(demo), service(demo)
    solved, _problem = calibration_of(s, found, prepare(s, found)["plan"], MEASURED)
    assert "calibration" not in plan_args(s, verified(found, "failed", calibration=solved))
    assert "calibration" not in plan_args(s, verified(found, calibration=None))
    assert calibration_of(s, found, {"skipped": True, "changed": False}, MEASURED) == (None, "no plan to calibrate")
    lacking = {"decode_tokens_per_second": 50.0}
    solved, problem = calibration_of(s, found, prepare(s, found)["plan"], lacking)
    assert solved is None and problem.startswith("cannot calibrate on {'decode_tokens_per_second': 50.0}")


def piece(got, have, total=10 * 2 ** 20, **more):
    """One piece of llm_server_model as the module returns it (two files): ``got`` bytes fetched, ``have`` there."""
    return dict({"bytes_fetched": got, "bytes_have": have, "bytes_total": total, "done": have >= total,
                 "files": [{"path": "/m/a-00001-of-00002.gguf"}, {"path": "/m/a-00002-of-00002.gguf"}]}, **more)


def test_a_fetch_is_asked_with_the_settings_and_summed_over_its_pieces_and_the_earlier_step(demo):
    s = dict(settings(demo, llm_server_model_url=["https://m.example/x.gguf"]), model_sha256=["ab" * 32])
    assert fetch_args(s, {"Authorization": "Bearer t"}, 10.0) == {
        "url": ["https://m.example/x.gguf"], "path": s["model_path"], "sha256": ["ab" * 32],
        "headers": {"Authorization": "Bearer t"}, "record": s["project_dir"] + "/.llm_server_models.json",
        "piece_seconds": 10.0}
    mib = 2 ** 20
    pieces = [piece(4 * mib, 4 * mib), piece(6 * mib, 10 * mib, fetched=True)]
    summary = fetch_summary(pieces, 12.5, {"bytes": mib, "seconds": 1.25, "fetched": False})
    assert summary == {"bytes": 11 * mib, "seconds": 13.75, "bytes_total": 10 * mib, "fetched": True,
                       "files": ["/m/a-00001-of-00002.gguf", "/m/a-00002-of-00002.gguf"], "would_fetch": 0}
    failed = fetch_summary([piece(0, 0, failed=True, msg="llm_server: the model cannot be fetched: 404")], 0.4)
    assert (failed["failed"], failed["msg"]) == (True, "llm_server: the model cannot be fetched: 404")
    checked = fetch_summary([piece(0, 0, would_fetch=10 * mib)], 0.3)
    assert checked["msg"] == "check mode: the model would be fetched first (10.0 MiB), and the plan made from its header"


@pytest.mark.parametrize("one, seconds, line", [
    (piece(0, 3 * 2 ** 20 + 2 ** 19), 10.4, "h1: fetching the model, 3.5 of 10.0 MiB (35 %), 10 s"),
    (piece(0, 5 * 2 ** 20, files=[{"path": "/m/a", "cut": "the connection ended at byte 5242880 of 10485760"}]), 21.0,
     "h1: fetching the model, 5.0 of 10.0 MiB (50 %), 21 s; the connection ended at byte 5242880 of 10485760, "
     "resuming"),
    (piece(0, 0, total=0), 1.0, "h1: fetching the model, 0.0 of 0.0 MiB (0 %), 1 s"),
])
def test_the_line_of_progress_says_the_bytes_there_of_the_total_and_a_cut(one, seconds, line):
    assert fetch_line("h1", one, seconds) == line


def test_a_gpu_the_image_s_requirement_does_not_allow_is_refused_before_anything_changes():
    require = "cuda>=12.8 brand=unknown,driver>=550,driver<551 brand=tesla,driver>=560,driver<561"
    geforce = {"index": 0, "name": "NVIDIA GeForce RTX 4090", "driver": "560.35.03", "cuda": "12.6", "brand": "GeForce"}
    found = {"image": "localhost/ai-llm:cuda", "found": True, "require": require, "gpus": [geforce]}
    caught = refused(check_requirement, found, [0], host="h1")
    assert caught.result["msg"].startswith("llm_server: GPU 0 (NVIDIA GeForce RTX 4090) (driver 560.35.03, CUDA 12.6, "
                                           "brand GeForce) does not meet the image's NVIDIA_REQUIRE_CUDA")
    assert caught.result["msg"].endswith("on h1. Nothing was changed.")
    a5500 = dict(geforce, name="NVIDIA RTX A5500", driver="550.127.05", cuda="12.4", brand="Unknown")
    assert check_requirement(dict(found, gpus=[a5500]), [0]) == []
    assert check_requirement(found, []) == [] and check_requirement(found, [1]) == []   # CPU deploy; another GPU
    absent = check_requirement({"image": "x:1", "found": False, "require": None, "error": "no such image"}, [0])
    assert len(absent) == 1 and "x:1 is not on" in absent[0]


def test_the_cuda_context_a_verified_run_measured_reaches_the_next_plan(demo):
    s, found = settings(demo), service(demo)
    measured = [{"index": 0, "uuid": "GPU-1", "name": "NVIDIA RTX A5500", "context_mib": 468}]
    recorded = dict(found, disk=dict(found["disk"], verification={"status": "changed", "cuda_context": measured}))
    assert stored_cuda_context(recorded) == measured and plan_args(s, recorded)["cuda_context"] == measured
    # a failed verification, none recorded or an empty list: nothing
    failed = dict(found, disk=dict(found["disk"], verification={"status": "failed", "cuda_context": measured}))
    empty = dict(found, disk=dict(found["disk"], verification={"status": "changed", "cuda_context": []}))
    for service_read in (failed, empty, found):
        assert stored_cuda_context(service_read) is None and "cuda_context" not in plan_args(s, service_read)
