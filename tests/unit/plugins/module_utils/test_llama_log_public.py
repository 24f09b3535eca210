"""The llama-server log parser on public logs: excerpts of real logs of other builds and backends pasted in
public issues (llama.cpp, ik_llama.cpp, ollama, LM Studio; CUDA, ROCm, Vulkan, Metal, SYCL, RPC; 2024-2026),
kept line for line in tests/data/llama_logs/public (sources in SOURCES.md). Every test asserts the exact
tensors (name, MiB, type, buffer), buffers, offloaded N/M and errors, and that no log without the evidence
verifies."""
from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_log import (
    parse_log,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._placement_proof import (
    gpu_model_mib,
    verify_placement,
)

PUBLIC_LOGS = Path(__file__).resolve().parents[3] / "data" / "llama_logs" / "public"
LOGS = sorted(p.name for p in PUBLIC_LOGS.glob("*.log"))


def read(name):
    return (PUBLIC_LOGS / name).read_text(encoding="utf-8")


def overrides(parsed):
    return [(o["tensor"], o["mib"], o["type"], o["buffer"]) for o in parsed["overridden"]]


def test_every_public_log_has_a_source():
    sources = (PUBLIC_LOGS / "SOURCES.md").read_text(encoding="utf-8")
    assert LOGS and all("`%s`" % name in sources for name in LOGS)


# ---------------------------------------------------------------- per-tensor lines of other builds


def test_ik_llama_sized_line_with_typo():
    p = parse_log(read("ik_llama_sized_overriden_cuda_host.log"))
    assert overrides(p) == [
        ("blk.20.ffn_gate_exps.weight", 272, None, "CUDA_Host"),
        ("blk.20.ffn_down_exps.weight", 176, None, "CUDA_Host"),
        ("blk.21.ffn_up_exps.weight", 272, None, "CUDA_Host"),
        ("blk.21.ffn_gate_exps.weight", 272, None, "CUDA_Host"),
        ("blk.21.ffn_down_exps.weight", 176, None, "CUDA_Host"),
        ("blk.22.ffn_down_exps.weight", 210, None, "CUDA_Host"),
    ]
    assert p["per_tensor_lines_visible"] is True
    v = verify_placement(p, [o[0] for o in overrides(p)])
    assert v["verified"] and v["evidence"] == "per_tensor"


def test_ik_llama_sized_line_spelled_overridden_after_adding_override_lines():
    p = parse_log(read("ik_llama_sized_overridden_adding_override.log"))
    assert overrides(p) == [
        ("blk.2.ffn_up_exps.weight", 1020, None, "CUDA_Host"),
        ("blk.2.ffn_gate_exps.weight", 1020, None, "CUDA_Host"),
        ("blk.2.ffn_down_exps.weight", 1020, None, "CUDA_Host"),
        ("blk.3.ffn_up_exps.weight", 1020, None, "CUDA_Host"),
    ]
    assert p["model_buffers"] == {}  # "ggml ctx size" is no buffer


def test_override_lines_glued_on_one_line_all_count():
    p = parse_log(read("ik_llama_glued_override_lines.log"))
    assert overrides(p) == [
        ("blk.33.ffn_gate_exps.weight", 1026, None, "CPU"),
        ("blk.33.ffn_down_exps.weight", 1096, None, "CPU"),
        ("blk.34.ffn_up_exps.weight", 1026, None, "CPU"),
        ("blk.34.ffn_gate_exps.weight", 1026, None, "CPU"),
        ("blk.34.ffn_down_exps.weight", 1096, None, "CPU"),
    ]


IK_CUDA1 = ["blk.57.ffn_norm.weight", "blk.57.ffn_gate_inp.weight", "blk.57.exp_probs_b.bias",
            "blk.57.ffn_gate_shexp.weight", "blk.57.ffn_down_shexp.weight", "blk.57.ffn_up_shexp.weight"]
IK_CPU = ["blk.57.ffn_gate_exps.weight", "blk.57.ffn_down_exps.weight", "blk.57.ffn_up_exps.weight"]


def test_overrides_to_another_gpu_keep_their_buffer_and_do_not_count_as_moved_to_host():
    p = parse_log(read("ik_llama_ot_cuda1_and_cpu.log"))
    assert sorted(o for o in overrides(p) if o[3] == "CUDA1") == sorted((t, None, None, "CUDA1") for t in IK_CUDA1)
    assert [o for o in overrides(p) if o[3] == "CPU"] == [(t, None, None, "CPU") for t in IK_CPU]
    # the routed experts went to host memory: proven, the CUDA1 pins are neither missing nor unexpected
    v = verify_placement(p, IK_CPU)
    assert v["verified"] and v["unexpected"] == [] and "CUDA1" in v["msg"]
    # expecting a tensor on the host that the log pins to CUDA1 fails, and says where it went
    v = verify_placement(p, IK_CPU + ["blk.57.ffn_up_shexp.weight"])
    assert not v["verified"] and v["missing"] == ["blk.57.ffn_up_shexp.weight"]
    assert "blk.57.ffn_up_shexp.weight (to CUDA1)" in v["msg"]


def test_old_overriden_line_to_rpc_and_cpu():
    p = parse_log(read("b4xxx_overriden_rpc_and_cpu.log"))
    rpc = [o[0] for o in overrides(p) if o[3] == "RPC[127.0.0.1:50053]"]
    assert rpc == ["blk.59.ffn_gate_exps.weight", "blk.59.ffn_down_exps.weight", "blk.59.ffn_up_exps.weight"]
    assert len(p["overridden"]) == 9 and all(o[1] is None and o[2] is None for o in overrides(p))
    # experts on a remote device are not "on the CPU"
    v = verify_placement(p, rpc)
    assert not v["verified"] and v["missing"] == sorted(rpc)
    assert "(to RPC[127.0.0.1:50053])" in v["msg"]
    assert len(v["unexpected"]) == 6  # norm, router, bias and shared experts went to the CPU


# ---------------------------------------------------------------- buffers of other backends and wrappers


def test_ollama_runner_two_gpus_with_go_lines_interleaved():
    p = parse_log(read("ollama_b6xxx_cuda0_cuda2_interleaved.log"))
    assert p["overridden"] == []  # "cannot be used with preferred buffer type" is no override
    assert p["offloaded_layers"] == {"offloaded": 81, "total": 81}
    assert p["model_buffers"] == {"CUDA0": 24277.75, "CUDA2": 46151.91, "CPU_Mapped": 1064.62}
    assert gpu_model_mib(p) == 70429.66
    assert p["load_error"] is None and p["crash"] is None


def test_journald_prefix_2024_buffer_lines():
    p = parse_log(read("ollama_journald_2024_cuda0_cuda1.log"))
    assert p["offloaded_layers"] == {"offloaded": 39, "total": 41}
    assert p["model_buffers"] == {"CPU": 70752.49, "CUDA0": 45460.59, "CUDA1": 22730.3}
    assert gpu_model_mib(p) == 68190.89


def test_two_cpu_buffer_lines_are_summed_and_kv_on_host_kept_apart():
    p = parse_log(read("ik_llama_two_cpu_buffers_kv_on_host.log"))
    assert p["model_buffers"] == {"CPU": 19789.55, "CUDA0": 5028.23}
    assert p["kv_buffers"] == {"CUDA_Host": 37.03, "CUDA0": 37.03}
    assert p["offloaded_layers"] == {"offloaded": 20, "total": 41}


def test_sycl_prefixed_lines_and_host_buffer():
    p = parse_log(read("b9xxx_sycl_prefixed.log"))
    assert p["model_buffers"] == {"SYCL1": 12867.08, "SYCL_Host": 20183.74}
    assert gpu_model_mib(p) == 12867.08


def test_sycl_2024_with_json_server_lines():
    p = parse_log(read("ollama_2024_sycl_json.log"))
    assert p["offloaded_layers"] == {"offloaded": 33, "total": 33}
    assert p["model_buffers"] == {"SYCL0": 5115.49, "CPU": 344.44}
    assert p["kv_buffers"] == {"SYCL0": 256.0}
    assert p["compute_buffers"] == {"SYCL0": 258.5, "SYCL_Host": 12.01}  # not the "output buffer"


def test_vulkan_init_prefix_and_host_compute():
    p = parse_log(read("vulkan_b50xx_kv_compute.log"))
    assert p["kv_buffers"] == {"Vulkan0": 19200.0}
    assert p["compute_buffers"] == {"Vulkan0": 1174.0, "Vulkan_Host": 18.01}
    assert p["load_error"] is None


def test_metal_mapped_buffer_is_the_gpu_and_dots_do_not_hide_lines():
    p = parse_log(read("metal_mtp_mtl0_mapped.log"))
    assert p["offloaded_layers"] == {"offloaded": 66, "total": 66}
    assert p["model_buffers"] == {"CPU_Mapped": 644.14, "MTL0_Mapped": 14803.73}
    assert gpu_model_mib(p) == 14803.73
    # a buffer line glued to the loader's progress dots (printed without a newline) still counts
    q = parse_log(read("metal_mtp_mtl0_mapped.log").replace(
        "....srv    load_model: initializing slots, n_slots = 1",
        "....llama_kv_cache:       MTL0 KV buffer size =  4096.00 MiB"))
    assert q["kv_buffers"] == {"MTL0": 4096.0}


def test_router_child_prefix_and_recurrent_state():
    p = parse_log(read("router_b10xxx_port_prefix_recurrent.log"))
    assert p["rs_buffers"] == {"Meta()": 149.62}
    assert p["per_tensor_lines_visible"] is True  # the DEBUG create_tensor lines are there
    assert p["overridden"] == []
    v = verify_placement(p, ["blk.62.ffn_up_exps.weight"])
    assert not v["verified"] and v["missing"] == ["blk.62.ffn_up_exps.weight"]


# ---------------------------------------------------------------- failures


def test_weights_out_of_memory_is_a_load_error_with_the_allocation():
    p = parse_log(read("b8xxx_cuda_oom_model_load.log"))
    assert p["load_error"] == ("unable to allocate CUDA0 buffer "
                               "(allocating 144817.04 MiB on device 0: cudaMalloc failed: out of memory)")
    assert p["model_buffers"] == {} and p["overridden"] == []
    v = verify_placement(p, [], expect_gpu_model_mib=0.0)
    assert not v["verified"] and "cudaMalloc failed: out of memory" in v["msg"]


def test_context_out_of_memory_is_a_load_error():
    p = parse_log(read("b59xx_context_oom_exit.log"))
    assert p["load_error"] == "failed to initialize the context: failed to allocate compute pp buffers"
    p = parse_log(read("vulkan_b50xx_oom_ctk.log"))
    assert p["load_error"] == ("failed to initialize the context: failed to allocate compute pp buffers "
                               "(Device memory allocation of size 2166360064 failed.)")
    assert p["kv_buffers"] == {"Vulkan0": 13800.0}
    p = parse_log(read("ollama_2024_rocm_context_oom.log"))
    assert p["load_error"] == (
        "failed to create context with model '/root/.ollama/models/blobs/"
        "sha256-e9e56e8bb5f0fcd4860675e6837a8f6a94e659f5fa7dce6a1076279336320f2b' "
        "(allocating 826.00 MiB on device 0: cudaMalloc failed: out of memory)")


def test_tab_indented_lm_studio_lines():
    p = parse_log(read("lmstudio_b10xxx_tab_indented_context_error.log"))
    assert p["load_error"] == ("failed to initialize the context: dflash requires ctx_other to be set "
                               "(this warning is normal during memory fitting)")


@pytest.mark.parametrize("name", ["b7xxx_kv_two_gpus_compute_retry.log", "compose_b45xx_runtime_cuda1_oom.log"])
def test_an_allocation_that_is_retried_or_refused_while_serving_is_no_load_error(name):
    p = parse_log(read(name))
    assert p["load_error"] is None and p["crash"] is None
    if name.startswith("b7xxx"):
        assert p["kv_buffers"] == {"CUDA0": 12327.0, "CUDA1": 11153.0}


def test_crash_while_serving_is_reported_and_never_verifies():
    p = parse_log(read("b10586_crash_after_load.log"))
    assert p["build"] == "b10586-b21e4de74"
    assert p["crash"] == "CUDA error: an illegal memory access was encountered"
    assert p["load_error"] is None
    v = verify_placement(p, [], expect_gpu_model_mib=0.0)
    assert not v["verified"] and "llama-server died: CUDA error" in v["msg"]
    # with a good load before it, the crash still wins
    good = read("ik_llama_sized_overriden_cuda_host.log")
    p = parse_log(good + "53.26.801.941 E CUDA error: an illegal memory access was encountered\n")
    assert len(p["overridden"]) == 6 and p["crash"]
    assert not verify_placement(p, [o["tensor"] for o in p["overridden"]])["verified"]
    # and a restart after the crash starts clean
    p = parse_log(read("b10586_crash_after_load.log") + "version: 0.2.0-dev (build 10586, commit b21e4de74)\n" + good)
    assert p["runs"] == 2 and p["crash"] is None and verify_placement(
        p, [o["tensor"] for o in p["overridden"]])["verified"]


# ---------------------------------------------------------------- what a reader's pipeline adds


def _crlf(text):
    return text.replace("\n", "\r\n")


def _ansi(text):
    return "".join("\x1b[32m%s\x1b[0m\n" % line for line in text.splitlines())


def _docker_ts(text):
    return "".join("2025-08-20T11:41:20.014123456Z %s\n" % line for line in text.splitlines())


def _compose(text):
    return "".join("ai-llm  | %s\n" % line for line in text.splitlines())


@pytest.mark.parametrize("name", LOGS)
@pytest.mark.parametrize("wrap", [_crlf, _ansi, _docker_ts, _compose, lambda t: _compose(_docker_ts(_crlf(t)))])
def test_wrapped_logs_parse_the_same(name, wrap):
    plain = parse_log(read(name))
    assert parse_log(wrap(read(name))) == plain


# ---------------------------------------------------------------- no evidence, no verification


@pytest.mark.parametrize("name", LOGS)
def test_no_public_log_verifies_without_its_evidence(name):
    p = parse_log(read(name))
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


# ---------------------------------------------------------------- through the module


def test_module_fails_on_a_crash_and_verifies_host_moves_only(ansible_module):
    r = ansible_module("llama_server_log", {"path": str(PUBLIC_LOGS / "b10586_crash_after_load.log")})
    assert r["failed"] and r["crash"] == "CUDA error: an illegal memory access was encountered"
    assert r["server_ready"] is False and r["verified"] is False
    r = ansible_module("llama_server_log", {"path": str(PUBLIC_LOGS / "ik_llama_ot_cuda1_and_cpu.log"),
                                            "expect_tensors": IK_CPU})
    assert not r["failed"] and r["verified"] and r["evidence"] == "per_tensor"
    assert {o["buffer"] for o in r["overridden"]} == {"CPU", "CUDA1"}
