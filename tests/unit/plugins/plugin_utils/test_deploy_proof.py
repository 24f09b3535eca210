"""Whether a recreated ai-llm proves the deploy (plugins/plugin_utils/_deploy_proof.py): the GPU memory rows, the
log buffers expected from the plan and the verification's verdict."""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_proof import (
    log_args,
    log_expectations,
    parity_answer,
    parity_note,
    verification_problem,
    vram_rows,
)


# vram_rows

def row(index, planned, used, ok):
    return {"index": index, "planned_mib": planned, "used_mib": used, "ok": ok}


def reading(*used):
    """gpu_info's GPUs: (index, memory used in MiB) each."""
    return [{"index": i, "memory_used_mib": mib} for i, mib in used]


@pytest.mark.parametrize("devices, baseline, after, plan, tolerance, rows", [
    # what ai-llm took (the reading after less the one before) against the plan without its margin
    (["0", 1, 2], reading((0, 500), (1, None)), reading((0, 2500), (1, 1000), (2, 300)),
     {"gpus": [{"index": 0, "total_mib": 3024.4, "margin_mib": 1024}, {"index": 1, "total_mib": 1000}]}, 100,
     [row(0, 2000, 2000, True), row(1, 1000, 1000, True), row(2, None, 300, True)]),
    # ok within the tolerance included
    *[([0], [], reading((0, used)), {"gpus": [{"index": 0, "total_mib": 2500, "margin_mib": 500}]}, "100",
       [row(0, 2000, used, ok)]) for used, ok in ((2100, True), (2101, False), (1900, True), (1899, False), (2000, True))],
    # without a plan or a reading the rows say what is known; the plan is rounded
    ([0], None, None, None, 0, [row(0, None, 0, True)]), (None, [], [], {}, 0, []),
    ([0], [], reading((0, 2001)), {"gpus": [{"index": 0, "total_mib": 2000.6}]}, 0.5, [row(0, 2001, 2001, True)]),
    ([1], reading((1, 700)), [], {"gpus": [{"index": 1, "total_mib": None}]}, 0, [row(1, 0, -700, False)]),
])
def test_each_gpu_row_compares_what_ai_llm_took_with_the_plan_without_its_margin(devices, baseline, after, plan,
                                                                                 tolerance, rows):
    assert vram_rows(devices, baseline, after, plan, tolerance) == rows


def test_the_planned_figure_includes_the_cuda_context_the_plan_counted_on_that_gpu():
    """The plan keeps its 1024 MiB margin free beyond the context: ai-llm takes its buffers (2000 MiB) and its
    context (555 MiB on GPU 0, 300 on GPU 1), so 2555 and 2300 MiB are planned."""
    plan = {"gpus": [{"index": 0, "total_mib": 3024, "margin_mib": 1024}, {"index": 1, "total_mib": 3024, "margin_mib": 1024}]}
    devices = [{"index": 0, "cuda_context_mib": 555}, {"index": 1, "cuda_context_mib": 300}]
    rows = vram_rows([0, 1], [], reading((0, 2555), (1, 2555)), plan, 100, devices)
    assert rows == [row(0, 2555, 2555, True), row(1, 2300, 2555, False)]
    # without the context the same use is 555 MiB over the plan
    assert vram_rows([0], [], reading((0, 2555)), plan, 100)[0]["ok"] is False


# log_expectations

# moe_offload_plan's result as the role registers it: two GPUs, the second holding the experts of the first's blocks
TWO_GPUS = {
    "devices": [{"device": "CUDA0", "index": 1}, {"device": "CUDA1", "index": 0}],
    "memory": {"gpus": [{"index": 1, "model_mib": 1369.234, "kv_mib": 192.0, "recurrent_mib": 0,
                         "compute_mib": 1170.4},
                        {"index": 0, "model_mib": 800.5, "kv_mib": None, "recurrent_mib": 47.62, "compute_mib": 300.0}],
               "host": {"model_mib": 21772.0, "kv_mib": 0, "recurrent_mib": 0, "compute_mib": 40.0}},
}
# no KV line for a device without attention blocks, no RS line for one without recurrent blocks
ON_GPUS = {"expect_model_buffers": {"CUDA0": 1369.23, "CUDA1": 800.5}, "expect_kv_buffers": {"CUDA0": 192.0},
           "expect_rs_buffers": {"CUDA1": 47.62}, "expect_compute_buffers": {"CUDA0": 1170.4, "CUDA1": 300.0}}
NONE_EXPECTED = {"expect_model_buffers": {}, "expect_kv_buffers": {}, "expect_rs_buffers": {},
                 "expect_compute_buffers": {}}
CPU_ONLY = {"devices": [], "memory": {"gpus": [], "host": {"model_mib": 30.0, "kv_mib": 27.0, "recurrent_mib": 0.5,
                                                           "compute_mib": 22.77}}}


@pytest.mark.parametrize("layers, expected", [("98", False), ("99", True), (" 99 ", True), ("100", True),
                                              (98, False), (99, True), ("all", True), ("-1", False), ("", False),
                                              ("20", False), ("auto", False)])
def test_buffers_are_expected_from_99_layers_or_all(layers, expected):
    expect = log_expectations(TWO_GPUS, "multi", {"n_gpu_layers": layers}, ("t",))
    assert expect == dict(ON_GPUS if expected else NONE_EXPECTED, expect_tensors=["t"])


@pytest.mark.parametrize("layers, expected", [("30", True), (30, True), ("99", False), ("31", False), ("all", False)])
def test_a_plan_with_fewer_gpu_layers_is_proved_at_its_own_count_with_the_host_s_caches(layers, expected):
    """A plan sized for -ngl 30 holds only at -ngl 30; then the caches of the blocks left on the host are in the
    CPU KV and RS buffers (llama-kv-cache.cpp, llama-memory-recurrent.cpp: the buffer of the layer's device)."""
    plan = dict(TWO_GPUS, n_gpu_layers=30, memory=dict(TWO_GPUS["memory"], host=dict(
        TWO_GPUS["memory"]["host"], kv_mib=48.0, recurrent_mib=11.9)))
    expect = log_expectations(plan, "multi", {"n_gpu_layers": layers}, ("t",))
    host = {"expect_kv_buffers": dict(ON_GPUS["expect_kv_buffers"], CPU=48.0),
            "expect_rs_buffers": dict(ON_GPUS["expect_rs_buffers"], CPU=11.9)}
    assert expect == dict(dict(ON_GPUS, **host) if expected else NONE_EXPECTED, expect_tensors=["t"])
    args = log_args(plan, {"topology": "multi", "n_gpu_layers": "30"}, {"n_gpu_layers": "99", "extra_args": []})
    assert args["expect_kv_buffers"] == host["expect_kv_buffers"]  # the placement's -ngl, not the inventory's


@pytest.mark.parametrize("plan, settings", [
    (TWO_GPUS, {"extra_args": ["-ub", "1024"]}), ({"skipped": True}, {}), (dict(TWO_GPUS, failed=True), {}),
    (dict(TWO_GPUS, memory=[]), {}), (None, {}), ({}, {}),
])
def test_nothing_is_expected_when_the_server_does_not_run_as_planned(plan, settings):
    assert log_expectations(plan, "multi", settings, ["t"]) == dict(NONE_EXPECTED, expect_tensors=["t"])


@pytest.mark.parametrize("plan, topology, host", [
    (CPU_ONLY, "cpu", {"expect_kv_buffers": {"CPU": 27.0}, "expect_rs_buffers": {"CPU": 0.5},
                       "expect_compute_buffers": {"CPU": 22.77}}),
    # the host figures, also when the plan lists devices, or on GPUs when it lists none
    (TWO_GPUS, "cpu", {"expect_compute_buffers": {"CPU": 40.0}}),
    (dict(TWO_GPUS, devices=[]), "single", {"expect_compute_buffers": {"CPU": 40.0}}),
])
def test_a_host_without_gpu_is_proved_by_its_cpu_kv_recurrent_and_compute_buffers(plan, topology, host):
    """The weights are the mapped file: no model buffer line is expected on the CPU, whatever the plan says."""
    expect = log_expectations(plan, topology, {}, ["t"])
    assert expect == dict(NONE_EXPECTED, **host, expect_tensors=None if topology == "cpu" else ["t"])


@pytest.mark.parametrize("topology, verbosity, shown", [
    ("cpu", None, False), ("cpu", "", False), ("cpu", 4, False), ("cpu", "4", False), ("cpu", 5, True),
    ("cpu", "5", True), ("cpu", "6", True), ("single", None, True), ("single", 4, True), ("multi", 5, True)])
def test_the_tensors_are_expected_where_the_log_can_show_them(topology, verbosity, shown):
    """On GPUs always (the device buffers stand in for hidden per-tensor lines); on a host without GPU only from
    -lv 5, where llama.cpp prints the per-tensor DEBUG lines (src/llama-model-loader.cpp, create_tensor)."""
    expect = log_expectations(TWO_GPUS, topology, {"log_verbosity": verbosity}, ("t",))
    assert expect["expect_tensors"] == (["t"] if shown else None)


# verification_problem

OK_LOG = {"verified": True, "per_tensor_lines_visible": True, "overridden": [{"tensor": "t"}]}
NOT_VERIFIED = "llama_server_log did not verify the placement"
NOTHING = dict(OK_LOG, overridden=[])
FAR = [row(0, 2000, 2000, True), row(1, 1000, 4000, False), row(2, 500, 10, False)]
FAR_TEXT = ("GPU memory taken by ai-llm is far from the plan (tolerance %s MiB): GPU 1: 4000 MiB used, 1000 MiB "
            "planned; GPU 2: 10 MiB used, 500 MiB planned")
SAME = {"tokens": [1, 2], "content": "ab"}
DIFFERENT = {"before": SAME, "after": {"tokens": [1, 3], "content": "ac"}}
PARITY_FAILED = "output parity failed: the same prompt (greedy, seed %s) gave [1, 2] before and [1, 3] after"


@pytest.mark.parametrize("log, pattern, more, problem", [
    # a load error is the first problem
    (dict(OK_LOG, load_error="tensor 'x' has wrong shape", failed=True, msg="other"), "p", {},
     "the model failed to load: tensor 'x' has wrong shape"),
    # no overridden tensor is a problem only for a pattern with the per-tensor lines shown
    (NOTHING, "", {}, ""), (NOTHING, None, {}, ""), (dict(NOTHING, per_tensor_lines_visible=False), "blk", {}, ""),
    (NOTHING, r"blk\.9", {},
     "the pattern matched no tensors: llama-server's log shows no tensor overridden to CPU for \"blk\\\\.9\""),
    # a log that did not verify gives its message
    (dict(OK_LOG, failed=True, msg="no CUDA0 buffer"), "p", {}, "no CUDA0 buffer"), (dict(OK_LOG, failed=True), "p", {}, NOT_VERIFIED),
    ({"verified": False}, "p", {}, NOT_VERIFIED), (None, "", {}, NOT_VERIFIED),
    # each GPU far from the plan is named with the tolerance, judged before the parity
    (OK_LOG, "p", {"vram": FAR, "parity": {"before": {"tokens": [1]}, "after": {"tokens": [2]}}}, FAR_TEXT % 0),
    (OK_LOG, "p", {"vram": FAR, "tolerance_mib": 512}, FAR_TEXT % 512), (OK_LOG, "p", {"vram": FAR[:1]}, ""),
    (OK_LOG, "p", {"vram": [row(0, 2000, 2000, None)]},
     "GPU memory taken by ai-llm is far from the plan (tolerance 0 MiB): GPU 0: 2000 MiB used, 2000 MiB planned"),
    # different answers before and after are a parity failure; the same answer or no baseline is none
    (OK_LOG, "p", {"vram": [], "parity": DIFFERENT, "seed": 42}, PARITY_FAILED % 42),
    (OK_LOG, "p", {"parity": DIFFERENT}, PARITY_FAILED % None),
    (OK_LOG, "p", {"parity": {"before": SAME, "after": dict(SAME)}}, ""), (OK_LOG, "p", {"parity": {}}, ""),
    (OK_LOG, "p", {"parity": {"before": None, "after": SAME}}, ""),
    (OK_LOG, "p", {"parity": {"before": SAME, "after": None}}, ""),
])
def test_verification_problem(log, pattern, more, problem):
    assert verification_problem(log, pattern, **more) == problem


# log_args, parity_answer, parity_note


def test_the_log_is_asked_for_what_the_plan_and_the_placement_expect():
    placement = {"topology": "multi", "expected_tensors": ["t"], "pattern": "p"}
    args = log_args(TWO_GPUS, placement, {"extra_args": []})      # no n_gpu_layers: the role's default, every layer
    devices = [{"device": "CUDA0", "pci_bus_id": None, "name": None}, {"device": "CUDA1", "pci_bus_id": None, "name": None}]
    assert args == dict(ON_GPUS, fail_on_mismatch=False, expect_tensors=["t"], expect_gpu_model_mib=2169.73,
                        expect_devices=devices)
    cpu = log_args(CPU_ONLY, {"topology": "cpu", "expected_tensors": ["t"]}, {})
    assert cpu == {"fail_on_mismatch": False, "expect_kv_buffers": {"CPU": 27.0}, "expect_rs_buffers": {"CPU": 0.5},
                   "expect_compute_buffers": {"CPU": 22.77}, "expect_devices": []}
    assert log_args({"skipped": True}, placement, {}) == {"fail_on_mismatch": False, "expect_tensors": ["t"]}
    assert log_args(None, dict(placement, topology="cpu"), {}) == {"fail_on_mismatch": False, "expect_devices": []}


def test_the_log_must_show_the_plans_cards_by_pci_bus_id():
    plan = dict(TWO_GPUS, devices=[{"device": "CUDA0", "index": 0, "name": "NVIDIA RTX A5500", "pci_bus_id": "0000:01:00.0",
                                    "uuid": "GPU-8d4f"}])
    args = log_args(plan, {"topology": "single"}, {"extra_args": []})
    assert args["expect_devices"] == [{"device": "CUDA0", "pci_bus_id": "0000:01:00.0", "name": "NVIDIA RTX A5500"}]
    assert "expect_devices" not in log_args(dict(plan, failed=True), {"topology": "single"}, {})


def test_a_parity_answer_is_kept_only_when_it_is_200():
    assert parity_answer({"status": 200, "json": SAME}) == SAME
    assert parity_answer({"status": 200, "json": {}}) == {"tokens": [], "content": ""}
    assert parity_answer({"status": 401, "json": SAME}) is None
    assert parity_answer(None) is None
    assert parity_note({"status": 401}) == "no baseline: the old configuration answered /completion with 401"
    assert parity_note({"status": 200}) == ""
    assert parity_note({"skipped": True, "changed": False, "status": 401}) == ""
    assert parity_note(None) == ""
