"""The proof at llama-server's default verbosity: the model buffer of every device against the plan, the KV,
recurrent-state and compute buffers, the offloaded layers; and overrides to a chosen device (``-ot ...=CUDA1``).

The lines are printed with the formats of llama.cpp's source: src/llama-model.cpp ``load_tensors``
(``"%s: %12s model buffer size = %8.2f MiB"``, ``"%s: offloaded %d/%d layers to GPU"``), src/llama-kv-cache.cpp
(``"%s: %10s KV buffer size = %8.2f MiB"``), src/llama-memory-recurrent.cpp (``RS buffer size``) and
src/llama-context.cpp (``"%s: %10s compute buffer size = %8.2f MiB"``), and src/llama-model-loader.cpp
``create_tensor`` for the DEBUG override line.
"""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_log import (
    parse_log,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._placement_proof import (
    expected_from_overrides,
    verify_placement,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_pattern import PatternError

BLOCK_TENSORS = ("attn_q.weight", "ffn_gate_inp.weight", "ffn_up_exps.weight", "ffn_down_exps.weight",
                 "ffn_up_shexp.weight")
NAMES = ["token_embd.weight", "output.weight"] + ["blk.%d.%s" % (b, t) for b in range(4) for t in BLOCK_TENSORS]
EXPERTS = [n for n in NAMES if "_exps" in n]
ON_CUDA1 = [n for n in EXPERTS if n.startswith(("blk.2.", "blk.3."))]
ON_CPU = [n for n in EXPERTS if n not in ON_CUDA1]


def line(fmt, *args):
    return "0.01.000.000 I " + fmt % args


def default_verbosity_log(cuda0=1369.43, cuda1=812.5, extra=(), debug=False):
    lines = [
        line("%s", "srv    load_model: loading model 'm.gguf'"),
        line("%s: offloaded %d/%d layers to GPU", "load_tensors", 5, 5),
        line("%s: %12s model buffer size = %8.2f MiB", "load_tensors", "CUDA0", cuda0),
        line("%s: %12s model buffer size = %8.2f MiB", "load_tensors", "CUDA1", cuda1),
        line("%s: %12s model buffer size = %8.2f MiB", "load_tensors", "CPU_Mapped", 10240.0),
        line("%s: %10s KV buffer size = %8.2f MiB", "llama_kv_cache", "CUDA0", 96.0),
        line("%s: %10s KV buffer size = %8.2f MiB", "llama_kv_cache", "CUDA1", 32.0),
        line("%s: %10s RS buffer size = %8.2f MiB", "llama_memory_recurrent", "CUDA0", 47.62),
        line("%s: %10s compute buffer size = %8.2f MiB", "sched_reserve", "CUDA0", 300.5),
        line("%s: %10s compute buffer size = %8.2f MiB", "sched_reserve", "CUDA_Host", 20.01),
        line("%s", "srv  llama_server: model loaded"),
    ]
    if debug:
        overrides = ["0.01.000.000 D tensor %s (%d MiB %s) buffer type overridden to %s" % (n, 100, "q8_0", b)
                     for b, names in (("CUDA1", ON_CUDA1), ("CPU", ON_CPU)) for n in names]
        lines[1:1] = overrides
    return "\n".join(lines + list(extra)) + "\n"


PLAN = {"CUDA0": 1369.43, "CUDA1": 812.5}
OTHERS = dict(expect_kv_buffers={"CUDA0": 96.0, "CUDA1": 32.0}, expect_rs_buffers={"CUDA0": 47.62},
              expect_compute_buffers={"CUDA0": 310.0, "CUDA_Host": 20.01}, expect_offloaded_layers=5)


def test_the_per_device_model_buffers_prove_the_placement_at_the_default_verbosity():
    p = parse_log(default_verbosity_log())
    assert p["per_tensor_lines_visible"] is False
    v = verify_placement(p, ON_CPU, expect_model_buffers=PLAN, require_ready=True, **OTHERS)
    assert v["verified"] and v["evidence"] == "device_buffers", v["msg"]
    assert "verbosity hides the per-tensor" in v["msg"] and "match the plan" in v["msg"]
    assert {c["check"] for c in v["checks"]} == {
        "model buffer CUDA0", "model buffer CUDA1", "KV buffer CUDA0", "KV buffer CUDA1", "RS buffer CUDA0",
        "compute buffer CUDA0", "compute buffer CUDA_Host", "offloaded layers"}
    assert all(c["ok"] for c in v["checks"])


def test_a_host_without_gpu_is_proved_by_its_host_buffers_alone():
    """No tensor and no model buffer expected (a host without GPU below -lv 5): the KV and compute buffers given
    decide, and a mismatch among them is never verified."""
    text = "\n".join([line("%s: %12s model buffer size = %8.2f MiB", "load_tensors", "CPU_Mapped", 8.44),
                      line("%s: %10s KV buffer size = %8.2f MiB", "llama_kv_cache", "CPU", 0.25),
                      line("%s: %10s compute buffer size = %8.2f MiB", "sched_reserve", "CPU", 4.79),
                      line("%s", "srv  llama_server: model loaded")]) + "\n"
    v = verify_placement(parse_log(text), None, expect_kv_buffers={"CPU": 0.25}, expect_compute_buffers={"CPU": 5.0})
    assert v["verified"] and v["evidence"] == "host_buffers", v["msg"]
    bad = verify_placement(parse_log(text), None, expect_kv_buffers={"CPU": 0.5}, expect_compute_buffers={"CPU": 5.0})
    assert not bad["verified"] and "KV buffer CPU" in bad["msg"]
    assert verify_placement(parse_log(text), None)["evidence"] == "none"


@pytest.mark.parametrize("logged, ok", [(1369.43, True), (1369.44, True), (1369.42, True), (1369.45, False),
                                        (1369.41, False), (1400.0, False)])
def test_a_device_buffer_must_equal_the_plan_within_a_hundredth_of_a_mib(logged, ok):
    v = verify_placement(parse_log(default_verbosity_log(cuda0=logged)), expect_model_buffers=PLAN)
    assert v["verified"] is ok
    assert v["evidence"] == "device_buffers"
    if not ok:
        assert f"model buffer CUDA0: {logged:.2f} MiB, expected 1369.43 +/- 0.01 MiB" in v["msg"]


def test_a_device_the_plan_does_not_use_or_a_missing_device_fails():
    v = verify_placement(parse_log(default_verbosity_log()), expect_model_buffers={"CUDA0": 1369.43})
    assert not v["verified"] and "model buffer CUDA1: 812.50 MiB in the log, but the plan puts nothing there" in v["msg"]
    v = verify_placement(parse_log(default_verbosity_log()), expect_model_buffers=dict(PLAN, CUDA2=5.0))
    assert not v["verified"] and "model buffer CUDA2: not in the log, expected 5.00 MiB" in v["msg"]


@pytest.mark.parametrize("option, value, words", [
    ("expect_kv_buffers", {"CUDA0": 95.0, "CUDA1": 32.0}, "KV buffer CUDA0: 96.00 MiB, expected 95.00 +/- 0.01"),
    ("expect_rs_buffers", {"CUDA0": 40.0}, "RS buffer CUDA0: 47.62 MiB"),
    ("expect_compute_buffers", {"CUDA0": 300.0}, "compute buffer CUDA0: 300.50 MiB, expected at most 300.00"),
    ("expect_offloaded_layers", 4, "offloaded layers: 5, expected 4"),
])
def test_kv_recurrent_compute_and_layers_are_checked(option, value, words):
    v = verify_placement(parse_log(default_verbosity_log()), expect_model_buffers=PLAN, **{option: value})
    assert not v["verified"] and v["evidence"] == "device_buffers" and words in v["msg"]


def test_the_compute_figure_is_an_upper_bound():
    v = verify_placement(parse_log(default_verbosity_log()), expect_compute_buffers={"CUDA0": 1000.0})
    assert v["verified"] and v["evidence"] == "none"


def test_per_tensor_lines_decide_and_the_buffers_are_checked_as_well():
    p = parse_log(default_verbosity_log(debug=True))
    overrides = {"CUDA1": ON_CUDA1, "CPU": ON_CPU}
    v = verify_placement(p, expect_overrides=overrides, expect_model_buffers=PLAN, **OTHERS)
    assert v["verified"] and v["evidence"] == "per_tensor", v["msg"]
    assert "exactly the 4 expected tensors overridden to host memory" in v["msg"]
    assert "exactly the 4 expected tensors overridden to CUDA1" in v["msg"]
    # the right tensors, a wrong buffer figure: not verified
    v = verify_placement(p, expect_overrides=overrides, expect_model_buffers=dict(PLAN, CUDA1=900.0))
    assert not v["verified"] and v["evidence"] == "per_tensor" and "model buffer CUDA1: 812.50 MiB" in v["msg"]


def test_an_expert_on_the_wrong_device_is_missing_and_unexpected():
    p = parse_log(default_verbosity_log(debug=True))
    swapped = {"CUDA1": ON_CPU[:1] + ON_CUDA1[1:], "CPU": ON_CUDA1[:1] + ON_CPU[1:]}
    v = verify_placement(p, expect_overrides=swapped)
    assert not v["verified"]
    assert v["missing"] == sorted([ON_CPU[0], ON_CUDA1[0]])
    assert v["unexpected"] == sorted([ON_CPU[0], ON_CUDA1[0]])
    assert f"{ON_CUDA1[0]} (to CUDA1)" in v["msg"] and "their expected buffers" in v["msg"]


def test_overrides_to_a_device_nobody_expected_are_unexpected_once_that_device_is_expected():
    p = parse_log(default_verbosity_log(debug=True))
    v = verify_placement(p, expect_overrides={"CPU": ON_CPU})  # CUDA1 not named: its pins are only listed
    assert v["verified"] and "tensors pinned to devices: CUDA1" in v["msg"]
    v = verify_placement(p, expect_overrides={"CPU": ON_CPU, "CUDA1": ON_CUDA1[:2]})
    assert not v["verified"] and v["unexpected"] == sorted(ON_CUDA1[2:])


def test_expected_overrides_follow_llama_cpps_first_match_wins():
    items = [r"blk\.(2|3)\.ffn_.*_exps\.weight=CUDA1", r"\.ffn_.*_exps\.weight=CPU"]
    assert expected_from_overrides(items, NAMES) == {"CUDA1": ON_CUDA1, "CPU": ON_CPU}
    # the other order: the general pattern comes first and takes every expert
    assert expected_from_overrides(items[::-1], NAMES) == {"CPU": EXPERTS}
    with pytest.raises(ValueError, match="not PATTERN=BUFFER"):
        expected_from_overrides([r"\.ffn_.*_exps\.weight"], NAMES)
    with pytest.raises(PatternError, match="not a valid regular expression"):
        expected_from_overrides(["blk\\.(2=CUDA1"], NAMES)


def test_an_rpc_device_is_named_without_its_endpoint():
    """llama.cpp names an RPC device's buffers ``RPC0[host:port]``; the plan and -ot name the device ``RPC0``."""
    text = "\n".join([
        "tensor blk.2.ffn_up_exps.weight (1 MiB f32) buffer type overridden to RPC1[10.0.0.2:50052]",
        "tensor blk.1.ffn_up_exps.weight (1 MiB f32) buffer type overridden to CPU",
        line("%s: %12s model buffer size = %8.2f MiB", "load_tensors", "RPC0[10.0.0.1:50052]", 10.5),
        line("%s: %12s model buffer size = %8.2f MiB", "load_tensors", "RPC1[10.0.0.2:50052]", 20.25),
    ])
    p = parse_log(text)
    v = verify_placement(p, expect_overrides={"RPC1": ["blk.2.ffn_up_exps.weight"], "CPU": ["blk.1.ffn_up_exps.weight"]},
                         expect_model_buffers={"RPC0": 10.5, "RPC1[10.0.0.2:50052]": 20.25})
    assert v["verified"] and "overridden to RPC1" in v["msg"], v["msg"]
    v = verify_placement(p, expect_model_buffers={"RPC0": 10.5})
    assert not v["verified"] and "model buffer RPC1[10.0.0.2:50052]: 20.25 MiB in the log" in v["msg"]
