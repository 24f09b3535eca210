"""The placement proof (``_placement_proof``) on logs parsed by ``_llama_log.parse_log``: those of
tests/data/llama_logs, and lines built with the formats of llama.cpp's source by tests/helpers/llama_logs.py."""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_log import parse_log
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._pattern_syntax import PatternError
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._placement_proof import (
    Expectations, expected_from_overrides, expected_from_pattern, gpu_model_mib, is_device_buffer, prove,
    verify_placement,
)
from tests.helpers.llama_logs import (
    BUF_CUDA0, DEFAULT, DEVICES_LOG, DOWN1, IK_CPU, LV4, NEMOTRON_EXPERTS, PUBLIC_LOGS, QWEN3_EXPERTS, READY, UP1, UP2,
    compute_buf, kv_buf, load_lines, model_buf, offloaded, override, read, rs_buf, text,
)

HIDDEN = "the log's verbosity hides the per-tensor override lines (use -lv 5 or -v); "
NO_BUFFER_LINES = "and the log has no model buffer lines either (verbosity too low?): not verified"
NO_BUFFER_LINES_ALONE = "the log has no model buffer lines (verbosity too low?): not verified"
PLAN = {"CUDA0": 1369.43, "CUDA1": 812.5}
OTHERS = dict(expect_kv_buffers={"CUDA0": 96.0, "CUDA1": 32.0}, expect_rs_buffers={"CUDA0": 47.62},
              expect_compute_buffers={"CUDA0": 310.0, "CUDA_Host": 20.01}, expect_offloaded_layers=5)


def log(*lines, exit_code=None):
    return parse_log(text(*lines), exit_code)


def verdict(**changes):
    """The whole result of verify_placement: the fields a test does not name keep their default."""
    res = {"verified": False, "evidence": "none", "missing": [], "unexpected": [], "checks": [],
           "gpu_model_mib": None, "gpu_model_tolerance_mib": None, "msg": ""}
    res.update(changes)
    return res


def check(name, expected, logged, ok, note):
    return {"check": name, "expected": expected, "logged": logged, "ok": ok, "note": note}


# ---------------------------------------------------------------- the logs of tests/data/llama_logs

IK_SIZED = ["blk.%d.ffn_%s_exps.weight" % (b, k) for b, k in ((20, "gate"), (20, "down"), (21, "up"), (21, "gate"),
                                                              (21, "down"), (22, "down"))]
SHEXP57 = "blk.57.ffn_up_shexp.weight"
UP62 = "blk.62.ffn_up_exps.weight"
TO_RPC = ["blk.59.ffn_%s_exps.weight" % k for k in ("down", "gate", "up")]


@pytest.mark.parametrize("name, exit_code, expected, kwargs, fields, words", [
    (LV4.name, None, NEMOTRON_EXPERTS, {}, {"verified": True, "evidence": "per_tensor", "missing": [],
                                            "unexpected": []}, []),
    # the tensor list alone cannot be proven at the default verbosity: never verified, and the reason is given
    (DEFAULT.name, None, NEMOTRON_EXPERTS, {}, {"verified": False, "evidence": "none"},
     ["verbosity hides the per-tensor"]),
    (DEFAULT.name, None, NEMOTRON_EXPERTS, {"expect_gpu_model_mib": 1369.0, "tolerance_mib": 1.0, "tolerance_pct": 0},
     {"verified": True, "evidence": "buffers", "missing": [], "unexpected": []}, []),
    # all experts on the GPU would be ~23140 MiB: a far prediction fails, with both numbers
    (DEFAULT.name, None, NEMOTRON_EXPERTS, {"expect_gpu_model_mib": 23140.0},
     {"verified": False, "evidence": "buffers"}, ["1369.43", "23140.00"]),
    ("b5200_load_tensors_overriden_nosize_qwen3moe.log", None, QWEN3_EXPERTS, {}, {"verified": True}, []),
    ("ik_llama_llm_load_tensors_Tensor_overriden_qwen3moe.log", None, QWEN3_EXPERTS[:-1], {},
     {"verified": False, "unexpected": QWEN3_EXPERTS[-1:]}, QWEN3_EXPERTS[-1:]),
    ("b10434_sigill_amx_default_verbosity.log", 132, [], {"expect_gpu_model_mib": 0.0}, {"verified": False}, []),
    ("b10435_rpc_server_killed_lv4.log", 134, None, {"expect_model_buffers": {"RPC0": 0.37}}, {"verified": False},
     ["Remote RPC server crashed"]),
    ("public/ik_llama_sized_overriden_cuda_host.log", None, IK_SIZED, {}, {"verified": True, "evidence": "per_tensor"},
     []),
    # the routed experts went to host memory: proven, the CUDA1 pins are neither missing nor unexpected
    ("public/ik_llama_ot_cuda1_and_cpu.log", None, IK_CPU, {}, {"verified": True, "unexpected": []}, ["CUDA1"]),
    # expecting a tensor on the host that the log pins to CUDA1 fails, and says where it went
    ("public/ik_llama_ot_cuda1_and_cpu.log", None, IK_CPU + [SHEXP57], {}, {"verified": False, "missing": [SHEXP57]},
     [SHEXP57 + " (to CUDA1)"]),
    # experts on a remote device are not "on the CPU"; norm, router, bias and shared experts went to the CPU
    ("public/b4xxx_overriden_rpc_and_cpu.log", None, TO_RPC, {}, {"verified": False, "missing": TO_RPC,
                                                                  "unexpected": 6}, ["(to RPC[127.0.0.1:50053])"]),
    ("public/router_b10xxx_port_prefix_recurrent.log", None, [UP62], {}, {"verified": False, "missing": [UP62]}, []),
])
def test_the_verdict_on_a_log_of_the_data(name, exit_code, expected, kwargs, fields, words):
    """A number stands for the length of a list field."""
    v = verify_placement(parse_log(read(name), exit_code), expected, **kwargs)
    counted = {k: len(v[k]) if isinstance(f, int) and not isinstance(f, bool) else v[k] for k, f in fields.items()}
    assert counted == fields
    assert all(w in v["msg"] for w in words), v["msg"]


def test_the_rpc_load_before_the_abort_is_proved_per_device():
    """The per-device proof (RPC0 without its endpoint) holds on the log before the real abort of the RPC server."""
    rpc = read("b10435_rpc_server_killed_lv4.log")
    alive = parse_log(rpc[:rpc.index("/build/llama.cpp/ggml/src/ggml-rpc")])
    assert verify_placement(alive, expect_model_buffers={"RPC0": 0.37}, expect_kv_buffers={"RPC0": 0.06},
                            require_ready=True)["verified"]


def test_device_and_host_buffer_names():
    p = log(model_buf("CUDA0", 700.0), model_buf("CUDA1", 669.43), model_buf("CPU_Mapped", 3900.0))
    assert gpu_model_mib(p) == 1369.43 and gpu_model_mib({}) is None
    assert [is_device_buffer(b) for b in ("CUDA0", "Vulkan0", "ROCm1", "Metal", "RPC[10.0.0.2:50052]")] == [True] * 5
    assert [is_device_buffer(b) for b in ("CPU", "CPU_Mapped", "CPU_REPACK", "CUDA_Host", "AMX")] == [False] * 5


@pytest.mark.parametrize("name, mib", [
    ("public/ollama_b6xxx_cuda0_cuda2_interleaved.log", 70429.66), ("public/b9xxx_sycl_prefixed.log", 12867.08),
    ("public/ollama_journald_2024_cuda0_cuda1.log", 68190.89), ("public/metal_mtp_mtl0_mapped.log", 14803.73),
    ("ik_llama_llm_load_tensors_Tensor_overriden_qwen3moe.log", 1045.73),  # CUDA_Host is host memory
])
def test_the_gpu_model_buffer_of_a_log(name, mib):
    assert gpu_model_mib(parse_log(read(name))) == mib


# ---------------------------------------------------------------- one tensor expected: failures first

UP1_ON_CPU = [override(UP1, "CPU"), BUF_CUDA0]
ONLY_UP1 = "the log shows exactly the 1 expected tensors overridden to host memory"


@pytest.mark.parametrize("parsed, kwargs, result", [
    # a load error comes before a crash and an exit code
    ({"load_error": "unknown model architecture: 'foo'", "crash": "Killed", "crash_cause": "oom", "exit_code": 1,
      "model_buffers": {"CUDA0": 1.5, "CPU_Mapped": 8.0}}, {},
     dict(gpu_model_mib=1.5, msg="the model failed to load: unknown model architecture: 'foo'")),
    # a crash comes before an exit code, and its cause is optional
    ({"crash": "Killed", "exit_code": 137}, {}, dict(msg="llama-server died: Killed")),
    ({"crash": "Killed", "crash_cause": "the OOM killer"}, {}, dict(msg="llama-server died: Killed (the OOM killer)")),
    # an exit before the ready line, whatever the code
    *[(log(*UP1_ON_CPU, exit_code=code), {}, dict(
        gpu_model_mib=1369.43, msg=f"llama-server exited with code {code} before the log shows it ready"))
      for code in (0, 1, 2)],
    # without an exit code only require_ready needs a ready line
    (log(*UP1_ON_CPU), {}, dict(verified=True, evidence="per_tensor", gpu_model_mib=1369.43, msg=ONLY_UP1)),
    (log(*UP1_ON_CPU), {"require_ready": True}, dict(
        gpu_model_mib=1369.43,
        msg="the log does not show the server ready (no 'model loaded', 'listening on http' or 'all slots are idle' "
            "line): not verified")),
    (log(*UP1_ON_CPU, READY, exit_code=0), {"require_ready": True},
     dict(verified=True, evidence="per_tensor", gpu_model_mib=1369.43, msg=ONLY_UP1)),
    # at -lv 5 a pattern that matched nothing prints no override line: a DEBUG line (here the loader's) proves that
    # the override lines would have been printed
    (log(*load_lines([], 5.0)), {}, dict(
        evidence="per_tensor", missing=[UP1], gpu_model_mib=5.0,
        msg=f"the log shows no overridden tensor (the pattern matched nothing?); 1 expected tensors not overridden "
            f"to host memory: {UP1}")),
    (log(*load_lines([], 5.0, debug=False)), {}, dict(
        gpu_model_mib=5.0, msg=HIDDEN + "no expected GPU model buffer given to fall back on: not verified")),
    # too many override lines prove nothing
    ({"overridden": [{"tensor": UP1, "mib": 1, "type": "f32", "buffer": "CPU"}], "overridden_dropped": 3,
      "per_tensor_lines_visible": True}, {}, dict(
        evidence="per_tensor", msg="the log holds more than 65536 override lines (3 not kept): not verified")),
    # no model buffer line proves nothing
    (log(kv_buf("CUDA0", 96.0), READY), {"expect_gpu_model_mib": 1369.43}, dict(msg=HIDDEN + NO_BUFFER_LINES)),
    (log(kv_buf("CUDA0", 96.0), READY), {"expect_model_buffers": {"CUDA0": 1369.43}}, dict(
        checks=[check("model buffer CUDA0", 1369.43, None, False, "not in the log")],
        msg=HIDDEN + NO_BUFFER_LINES + "; model buffer CUDA0: not in the log, expected 1369.43 MiB")),
])
def test_the_verdict_when_one_tensor_is_expected(parsed, kwargs, result):
    assert verify_placement(parsed, [UP1], **kwargs) == verdict(**result)


def test_without_any_expectation_nothing_is_verified_and_the_log_is_summed_up():
    assert verify_placement({})["msg"].startswith("no expectation given, nothing verified: 0 tensors overridden, ")


@pytest.mark.parametrize("kwargs", [
    {"expected": []}, {"expect_overrides": {}}, {"expect_gpu_model_mib": 0.0}, {"expect_model_buffers": {}},
    {"expect_kv_buffers": {}}, {"expect_rs_buffers": {}}, {"expect_compute_buffers": {}},
    {"expect_offloaded_layers": 0},
])
def test_an_empty_or_zero_expectation_is_still_an_expectation(kwargs):
    assert not verify_placement(log(BUF_CUDA0, READY), **kwargs)["msg"].startswith("no expectation given")


@pytest.mark.parametrize("lines", [[], ["srv  llama_server: model loaded"], load_lines([], 5.0, debug=False)])
@pytest.mark.parametrize("kwargs", [{"expected": ["blk.0.a"]}, {"expected": []}, {}])
def test_no_evidence_never_verifies(lines, kwargs):
    p = parse_log("\n".join(lines))
    assert p["per_tensor_lines_visible"] is False
    v = verify_placement(p, **kwargs)
    assert v["verified"] is False and v["evidence"] == "none"


def test_prove_takes_the_expectations_as_one_value():
    p = log(*DEVICES_LOG)
    assert prove(p, Expectations(model_buffers=PLAN, offloaded_layers=5)) == verify_placement(
        p, expect_model_buffers=PLAN, expect_offloaded_layers=5)


# ---------------------------------------------------------------- buffer and layer checks

def test_every_check_states_what_was_expected_and_logged():
    v = verify_placement(log(*DEVICES_LOG), expect_model_buffers={"CUDA1": 812.5, "CUDA0": 1369.434},
                         expect_kv_buffers={"CUDA0": 96}, expect_rs_buffers={"CUDA0": 47.62},
                         expect_compute_buffers={"CUDA0": 310}, expect_offloaded_layers=5)
    assert v == verdict(
        verified=True, evidence="device_buffers", gpu_model_mib=2181.93,
        checks=[check("model buffer CUDA0", 1369.43, 1369.43, True, "1369.43 +/- 0.01"),
                check("model buffer CUDA1", 812.5, 812.5, True, "812.50 +/- 0.01"),
                check("KV buffer CUDA0", 96.0, 96.0, True, "96.00 +/- 0.01"),
                check("RS buffer CUDA0", 47.62, 47.62, True, "47.62 +/- 0.01"),
                check("compute buffer CUDA0", 310.0, 300.5, True, "at most 310.00"),
                check("offloaded layers", 5, 5, True, "5")],
        msg="the model buffers of 2 device(s) match the plan (per-device buffer evidence); 6 buffer and layer "
            "checks match")


@pytest.mark.parametrize("logged, ok", [(1369.43, True), (1369.44, True), (1369.42, True), (1369.45, False),
                                        (1369.41, False), (1400.0, False)])
def test_a_device_buffer_must_equal_the_plan_within_a_hundredth_of_a_mib(logged, ok):
    lines = [model_buf("CUDA0", logged) if x == BUF_CUDA0 else x for x in DEVICES_LOG]
    v = verify_placement(log(*lines), expect_model_buffers=PLAN)
    assert (v["verified"], v["evidence"]) == (ok, "device_buffers")
    if not ok:
        assert v["msg"] == ("the per-device model buffers do not match the plan; model buffer CUDA0: "
                            f"{logged:.2f} MiB, expected 1369.43 +/- 0.01 MiB")


def test_a_buffer_missing_from_the_log_and_a_device_the_plan_does_not_use_fail():
    v = verify_placement(log(*DEVICES_LOG), expect_model_buffers={"CUDA0": 1369.43, "CUDA2": 5.0})
    assert v["checks"] == [check("model buffer CUDA0", 1369.43, 1369.43, True, "1369.43 +/- 0.01"),
                           check("model buffer CUDA2", 5.0, None, False, "not in the log"),
                           check("model buffer CUDA1", None, 812.5, False,
                                 "no buffer (the plan puts nothing on this device):")]
    assert (v["verified"], v["evidence"]) == (False, "device_buffers")
    assert v["msg"] == ("the per-device model buffers do not match the plan; model buffer CUDA2: not in the log, "
                        "expected 5.00 MiB; model buffer CUDA1: 812.50 MiB in the log, but the plan puts nothing there")


@pytest.mark.parametrize("option, value, words", [
    ("expect_kv_buffers", {"CUDA0": 95.0, "CUDA1": 32.0}, "KV buffer CUDA0: 96.00 MiB, expected 95.00 +/- 0.01 MiB"),
    ("expect_rs_buffers", {"CUDA0": 40.0}, "RS buffer CUDA0: 47.62 MiB, expected 40.00 +/- 0.01 MiB"),
    ("expect_compute_buffers", {"CUDA0": 300.0}, "compute buffer CUDA0: 300.50 MiB, expected at most 300.00 MiB"),
    ("expect_offloaded_layers", 4, "offloaded layers: 5, expected 4"),
])
def test_kv_recurrent_compute_and_layers_are_checked_beside_the_placement(option, value, words):
    v = verify_placement(log(*DEVICES_LOG), [UP1], expect_model_buffers=PLAN, **{option: value})
    assert not v["verified"] and v["evidence"] == "device_buffers"
    assert v["msg"] == HIDDEN + "the model buffers of 2 device(s) match the plan (per-device buffer evidence); " + words


@pytest.mark.parametrize("lines, kwargs, checks, msg", [
    # the plan's compute figure is an upper bound
    *[(DEVICES_LOG, {"expect_compute_buffers": {"CUDA0": at_most}},
       [check("compute buffer CUDA0", at_most, 300.5, ok, f"at most {at_most:.2f}")],
       "1 buffer and layer checks match" if ok else f"compute buffer CUDA0: 300.50 MiB, expected at most {at_most:.2f} MiB")
      for at_most, ok in ((300.5, True), (300.49, True), (300.48, False), (1000.0, True))],
    # the tolerance of a buffer is given in the note
    (DEVICES_LOG, {"expect_kv_buffers": {"CUDA0": 95.5, "CUDA1": 31.4}, "buffer_tolerance_mib": 0.5},
     [check("KV buffer CUDA0", 95.5, 96.0, True, "95.50 +/- 0.5"), check("KV buffer CUDA1", 31.4, 32.0, False, "31.40 +/- 0.5")],
     "KV buffer CUDA1: 32.00 MiB, expected 31.40 +/- 0.5 MiB"),
    (DEVICES_LOG, {"expect_offloaded_layers": 4}, [check("offloaded layers", 4, 5, False, "4")],
     "offloaded layers: 5, expected 4"),
    ([BUF_CUDA0, READY], {"expect_offloaded_layers": 5}, [check("offloaded layers", 5, None, False, "5")],
     "offloaded layers: None, expected 5"),
])
def test_buffer_and_layer_checks_without_a_placement_expectation(lines, kwargs, checks, msg):
    gpu = 2181.93 if lines is DEVICES_LOG else 1369.43
    assert verify_placement(log(*lines), **kwargs) == verdict(
        verified=all(c["ok"] for c in checks), gpu_model_mib=gpu, checks=checks, msg=msg)


def test_an_rpc_device_is_named_without_its_endpoint_when_it_has_one_buffer():
    """llama.cpp names an RPC device's buffers ``RPC0[host:port]``; the plan and -ot name the device ``RPC0``."""
    logged = {"RPC0[10.0.0.1:50052]": 10.5, "RPC1[10.0.0.2:50052]": 20.25, "CPU": 1.0}
    v = verify_placement({"kv_buffers": logged}, expect_kv_buffers={"RPC0": 10.5, "RPC1[10.0.0.2:50052]": 20.25})
    assert v["checks"] == [check("KV buffer RPC0", 10.5, 10.5, True, "10.50 +/- 0.01"),
                           check("KV buffer RPC1[10.0.0.2:50052]", 20.25, 20.25, True, "20.25 +/- 0.01")]
    two = {"RPC0[10.0.0.1:50052]": 10.5, "RPC0[10.0.0.1:50053]": 10.5}
    v = verify_placement({"kv_buffers": two}, expect_kv_buffers={"RPC0": 10.5})
    assert v["checks"] == [check("KV buffer RPC0", 10.5, None, False, "not in the log")]
    p = log(override(UP2, "RPC1[10.0.0.2:50052]"), override(UP1, "CPU"), model_buf("RPC0[10.0.0.1:50052]", 10.5), model_buf("RPC1[10.0.0.2:50052]", 20.25))
    v = verify_placement(p, expect_overrides={"RPC1": [UP2], "CPU": [UP1]},
                         expect_model_buffers={"RPC0": 10.5, "RPC1[10.0.0.2:50052]": 20.25})
    assert v["verified"] and "overridden to RPC1" in v["msg"], v["msg"]
    v = verify_placement(p, expect_model_buffers={"RPC0": 10.5})
    assert not v["verified"] and "model buffer RPC1[10.0.0.2:50052]: 20.25 MiB in the log" in v["msg"]


# ---------------------------------------------------------------- without per-tensor lines: the buffers

# tolerance_mib=1.0 and tolerance_pct=1.0 by default (1 % of 10 MiB is less than 1 MiB, of 1000 MiB more); the
# larger of the two counts, given to two decimals
@pytest.mark.parametrize("expected, gpu, expect, tolerances, tol, ok", [
    (None, 11.0, 10.0, {}, 1.0, True), (None, 9.0, 10.0, {}, 1.0, True), (None, 11.5, 10.0, {}, 1.0, False),
    (None, 8.99, 10.0, {}, 1.0, False), ([UP1], 1010.0, 1000.0, {}, 10.0, True), ([UP1], 990.0, 1000.0, {}, 10.0, True),
    ([UP1], 1010.5, 1000.0, {}, 10.0, False), ([UP1], 989.5, 1000.0, {}, 10.0, False),
    (None, 1005.0, 1000.0, {"tolerance_mib": 2.0, "tolerance_pct": 0.5}, 5.0, True),
    (None, 1005.0, 1000.0, {"tolerance_mib": 4.99, "tolerance_pct": 0.0}, 4.99, False),
    (None, 1010.0, 1000.0, {"tolerance_mib": 1.0, "tolerance_pct": 0.5}, 5.0, False),
    (None, 1010.0, 1009.5, {"tolerance_mib": 1.0, "tolerance_pct": 0}, 1.0, True),
    (None, 1001.0, 1000.0, {"tolerance_mib": 1.234, "tolerance_pct": 0.0}, 1.23, True),
])
def test_the_gpu_model_buffer_is_within_the_larger_tolerance(expected, gpu, expect, tolerances, tol, ok):
    p = log(model_buf("CUDA0", 0.0), model_buf("CUDA1", gpu), model_buf("CUDA_Host", 7.0), model_buf("CPU_Mapped", 500.0))
    assert verify_placement(p, expected, expect, **tolerances) == verdict(
        verified=ok, evidence="buffers", gpu_model_mib=gpu, gpu_model_tolerance_mib=tol,
        msg=f"{HIDDEN if expected else ''}GPU model buffer {gpu:.2f} MiB, expected {expect:.2f} MiB +/- {tol:.2f} "
            f"MiB: {'match' if ok else 'MISMATCH'}")


HOST_ONLY = [model_buf("CPU_Mapped", 8.44), kv_buf("CPU", 0.25), rs_buf("CPU", 0.04), compute_buf("CPU", 4.79), READY]
KV_CPU = check("KV buffer CPU", 0.25, 0.25, True, "0.25 +/- 0.01")
COMPUTE_CPU = check("compute buffer CPU", 5.0, 4.79, True, "at most 5.00")
HOST_EVIDENCE = ("no tensor or model buffer expected; the %d buffer(s) given match the plan (host buffer evidence); "
                 "%d buffer and layer checks match")
NEXT_TO_CUDA0 = [offloaded(0, 5), model_buf("CPU_Mapped", 8.44), kv_buf("CPU", 0.25), kv_buf("CUDA0", 96.0), READY]


@pytest.mark.parametrize("lines, kwargs, result", [
    # no tensor and no model buffer expected (a host without GPU below -lv 5): the KV, RS and compute buffers decide
    (HOST_ONLY, {"expect_kv_buffers": {"CPU": 0.25}, "expect_compute_buffers": {"CPU": 5.0}},
     dict(verified=True, evidence="host_buffers", checks=[KV_CPU, COMPUTE_CPU], msg=HOST_EVIDENCE % (2, 2))),
    (HOST_ONLY, {"expect_rs_buffers": {"CPU": 0.04}}, dict(
        verified=True, evidence="host_buffers", checks=[check("RS buffer CPU", 0.04, 0.04, True, "0.04 +/- 0.01")],
        msg=HOST_EVIDENCE % (1, 1))),
    # a mismatch among them is never verified
    (HOST_ONLY, {"expect_kv_buffers": {"CPU": 0.5}, "expect_compute_buffers": {"CPU": 5.0}}, dict(
        evidence="host_buffers", checks=[check("KV buffer CPU", 0.5, 0.25, False, "0.50 +/- 0.01"), COMPUTE_CPU],
        msg="no tensor or model buffer expected; 1 of the 2 buffer(s) given match the plan (host buffer evidence); "
            "KV buffer CPU: 0.25 MiB, expected 0.50 +/- 0.01 MiB")),
    # host buffers are no evidence next to a device buffer or a layer check
    (NEXT_TO_CUDA0, {"expect_kv_buffers": {"CPU": 0.25, "CUDA0": 96.0}}, dict(
        verified=True, checks=[KV_CPU, check("KV buffer CUDA0", 96.0, 96.0, True, "96.00 +/- 0.01")],
        msg="2 buffer and layer checks match")),
    (NEXT_TO_CUDA0, {"expect_kv_buffers": {"CPU": 0.25}, "expect_offloaded_layers": 0}, dict(
        verified=True, checks=[KV_CPU, check("offloaded layers", 0, 0, True, "0")], msg="2 buffer and layer checks match")),
    # expectations that name no buffer check nothing: no evidence
    ([kv_buf("CPU", 0.25), READY], {"expect_kv_buffers": {}}, dict(
        gpu_model_mib=None, msg="the expectations given name no buffer to check: not verified")),
    # a plan that puts no model buffer on any device is proved by the log's model buffer lines, not by their absence
    ([kv_buf("CPU", 0.25), READY], {"expect_model_buffers": {}}, dict(gpu_model_mib=None, msg=NO_BUFFER_LINES_ALONE)),
    ([model_buf("CPU_Mapped", 8.44), READY], {"expect_model_buffers": {}}, dict(
        verified=True, evidence="device_buffers",
        msg="the model buffers of 0 device(s) match the plan (per-device buffer evidence)")),
    ([kv_buf("CUDA0", 96.0), READY], {"expect_gpu_model_mib": 0.0},
     dict(gpu_model_mib=None, msg=NO_BUFFER_LINES_ALONE)),
    # without any expectation nothing is verified and the log is summed up
    ([override(UP1, "CPU"), override(DOWN1, "CPU"), BUF_CUDA0, model_buf("CUDA1", 10.5), READY], {}, dict(
        gpu_model_mib=1379.93,
        msg="no expectation given, nothing verified: 2 tensors overridden, GPU model buffer 1379.93 MiB")),
])
def test_host_buffers_alone_prove_a_host_without_gpu(lines, kwargs, result):
    assert verify_placement(log(*lines), **kwargs) == verdict(**dict(dict(gpu_model_mib=0.0), **result))


# ---------------------------------------------------------------- the per-tensor lines

PINNED_LOG = [override(UP1, "CPU"), override(DOWN1, "CPU"), override(UP2, "CUDA1"), model_buf("CUDA0", 100.0),
              model_buf("CUDA1", 50.0), READY]
PINS = [override(UP1, "CPU"), override(DOWN1, "CUDA2"), override(UP2, "CUDA1"),
        override("blk.2.ffn_down_exps.weight", "CUDA1"), READY]


@pytest.mark.parametrize("lines, kwargs, result", [
    # exactly the expected host tensors, the pins to devices listed
    (PINNED_LOG, {"expected": [UP1, DOWN1]}, dict(
        verified=True, gpu_model_mib=150.0, msg="the log shows exactly the 2 expected tensors overridden to host memory "
        "(and 1 tensors pinned to devices: CUDA1)")),
    (PINS, {"expected": [UP1]}, dict(verified=True, msg="the log shows exactly the 1 expected tensors overridden to "
                                                        "host memory (and 3 tensors pinned to devices: CUDA1, CUDA2)")),
    # exactly the expected tensors per buffer, any host buffer counting as host memory
    (PINNED_LOG, {"expect_overrides": {"CUDA1": [UP2], "CPU": [UP1, DOWN1]}}, dict(
        verified=True, gpu_model_mib=150.0, msg="the log shows exactly the 2 expected tensors overridden to host "
        "memory and exactly the 1 expected tensors overridden to CUDA1")),
    ([override(UP1, "CPU_REPACK"), override(DOWN1, "CUDA_Host"), override(UP2, "AMX"), READY],
     {"expect_overrides": {"CUDA_Host": [UP1, DOWN1, UP2]}},
     dict(verified=True, msg="the log shows exactly the 3 expected tensors overridden to host memory")),
    # a device the expectation does not name: its pins are only listed
    (PINNED_LOG, {"expect_overrides": {"CPU": [UP1, DOWN1]}}, dict(
        verified=True, gpu_model_mib=150.0, msg="the log shows exactly the 2 expected tensors overridden to host "
        "memory (and 1 tensors pinned to devices: CUDA1)")),
    # a device that is named: a pin it does not expect is unexpected
    (PINS, {"expect_overrides": {"CPU": [UP1], "CUDA1": [UP2], "CUDA2": [DOWN1]}}, dict(
        unexpected=["blk.2.ffn_down_exps.weight"], msg="1 unexpected tensors overridden: blk.2.ffn_down_exps.weight")),
    # no named buffer: no host override is expected
    (PINNED_LOG, {"expect_overrides": {}}, dict(unexpected=[DOWN1, UP1], gpu_model_mib=150.0,
                                                msg=f"2 unexpected tensors overridden: {DOWN1}, {UP1}")),
    ([override(UP2, "CUDA1"), READY], {"expect_overrides": {}}, dict(
        verified=True, msg="the log shows the expected overrides (and 1 tensors pinned to devices: CUDA1)")),
    # missing host tensors are named with where they went
    ([override(UP2, "CUDA1"), model_buf("CUDA1", 50.0), READY], {"expected": [UP2]}, dict(
        missing=[UP2], gpu_model_mib=50.0, msg=f"the log shows no tensor overridden to host memory, only to devices; "
        f"1 expected tensors not overridden to host memory: {UP2} (to CUDA1)")),
    ([override(UP1, "CPU"), READY], {"expected": [UP1, DOWN1]}, dict(
        missing=[DOWN1], msg=f"1 expected tensors not overridden to host memory: {DOWN1}")),
    # a tensor on the wrong device is missing there and unexpected where it went
    (PINNED_LOG, {"expect_overrides": {"CPU": [UP1, UP2], "CUDA1": [DOWN1]}}, dict(
        missing=[DOWN1, UP2], unexpected=[DOWN1, UP2], gpu_model_mib=150.0,
        msg=f"2 expected tensors not overridden to their expected buffers: {DOWN1} (to CPU), {UP2} (to CUDA1); "
            f"2 unexpected tensors overridden: {DOWN1}, {UP2}")),
])
def test_the_per_tensor_verdict(lines, kwargs, result):
    assert verify_placement(log(*lines), **kwargs) == verdict(evidence="per_tensor", **result)


BLOCK = ("attn_q.weight", "ffn_gate_inp.weight", "ffn_up_exps.weight", "ffn_down_exps.weight", "ffn_up_shexp.weight")
DEVICE_NAMES = ["token_embd.weight", "output.weight"] + ["blk.%d.%s" % (b, t) for b in range(4) for t in BLOCK]
EXPERTS = [n for n in DEVICE_NAMES if "_exps" in n]
ON_CUDA1 = [n for n in EXPERTS if n.startswith(("blk.2.", "blk.3."))]
ON_CPU = [n for n in EXPERTS if n not in ON_CUDA1]
PINNED_DEVICES_LOG = [override(n, b) for b, ns in (("CUDA1", ON_CUDA1), ("CPU", ON_CPU)) for n in ns] + DEVICES_LOG


def test_per_tensor_lines_decide_and_the_buffers_are_checked_as_well():
    p = log(*PINNED_DEVICES_LOG)
    overrides = {"CUDA1": ON_CUDA1, "CPU": ON_CPU}
    v = verify_placement(p, expect_overrides=overrides, expect_model_buffers=PLAN, **OTHERS)
    assert v["verified"] and v["evidence"] == "per_tensor", v["msg"]
    assert "exactly the 4 expected tensors overridden to host memory" in v["msg"]
    assert "exactly the 4 expected tensors overridden to CUDA1" in v["msg"]
    # the right tensors, a wrong buffer figure: not verified
    v = verify_placement(p, expect_overrides=overrides, expect_model_buffers=dict(PLAN, CUDA1=900.0))
    assert not v["verified"] and v["evidence"] == "per_tensor" and "model buffer CUDA1: 812.50 MiB" in v["msg"]


def test_expected_tensors_follow_llama_cpps_regex_search_and_first_match_wins():
    names = ["blk.1.ffn_up_exps.weight", "blk.10.ffn_up_exps.weight", "blk.1.ffn_up_shexp.weight"]
    assert expected_from_pattern(r"blk\.1\.ffn_.*_exps", names) == ["blk.1.ffn_up_exps.weight"]
    assert expected_from_pattern(r"exps", names) == names[:2]
    items = [r"blk\.(2|3)\.ffn_.*_exps\.weight=CUDA1", r"\.ffn_.*_exps\.weight=CPU"]
    assert expected_from_overrides(items, DEVICE_NAMES) == {"CUDA1": ON_CUDA1, "CPU": ON_CPU}
    # the other order: the general pattern comes first and takes every expert
    assert expected_from_overrides(items[::-1], DEVICE_NAMES) == {"CPU": EXPERTS}
    with pytest.raises(ValueError, match="not PATTERN=BUFFER"):
        expected_from_overrides([r"\.ffn_.*_exps\.weight"], DEVICE_NAMES)
    with pytest.raises(PatternError, match="not a valid regular expression"):
        expected_from_overrides(["blk\\.(2=CUDA1"], DEVICE_NAMES)


# ---------------------------------------------------------------- public logs

@pytest.mark.parametrize("name", PUBLIC_LOGS)
def test_no_public_log_verifies_without_its_evidence(name):
    p = parse_log(read("public/" + name))
    host = sorted(o["tensor"] for o in p["overridden"] if o["buffer"] in ("CPU", "CUDA_Host"))
    for expected in (None, [], ["blk.0.ffn_up_exps.weight"]):
        v = verify_placement(p, expected)
        if expected is None or not p["per_tensor_lines_visible"]:
            assert not v["verified"] and v["evidence"] == "none", (name, expected, v)
        elif expected != host:
            assert not v["verified"], (name, expected, v)
    if p["overridden"] == [] and not p["per_tensor_lines_visible"]:
        # hidden per-tensor lines: says so, and falls back to the GPU model buffer when there is one
        v = verify_placement(p, ["blk.0.ffn_up_exps.weight"], expect_gpu_model_mib=gpu_model_mib(p))
        ok = p["model_buffers"] and not p["load_error"] and not p["crash"]
        if not p["load_error"] and not p["crash"]:
            assert "verbosity hides the per-tensor" in v["msg"]
        assert v["verified"] is bool(ok), (name, v)
        assert v["evidence"] == ("buffers" if ok else "none")


def test_a_build_other_than_the_modelled_one_is_a_warning():
    """The real b10435 server prints "build 10435 (9e40df63b)" (tests/data/llama_logs/b10435_rpc_server_killed_lv4.log)."""
    from ansible_collections.ai_llm.moe_offload.plugins.module_utils._placement_proof import build_warning
    modelled = "0.00.155.704 I cmn  common_param: common_params_print_info: build 10435 (9e40df63b) with GNU 12.2.0"
    assert build_warning(parse_log(modelled)) is None
    assert build_warning(parse_log(modelled.replace("9e40df63b", "9e40df6"))) is None   # a shorter commit
    assert build_warning(parse_log("build: 6096 (fd1234cb) with cc (Debian 12.2.0-14+deb12u1) 12.2.0")) == (
        "llama-server runs build 6096 (fd1234cb), the collection models build 10435 (9e40df63b): its memory and log "
        "formats may differ from the plan's")
    assert "(0123abcde)" in build_warning(parse_log(modelled.replace("9e40df63b", "0123abcde")))
    assert build_warning(parse_log("main: server is listening")) is None
