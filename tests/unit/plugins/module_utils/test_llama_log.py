"""Unit tests of the llama-server log parser on the older log formats (tests/data/llama_logs) and on
single lines of every era. The real logs of the installed build are captured by
tests/integration/test_llama_log_real_server.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_log import (
    parse_log,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._placement_proof import (
    expected_from_pattern,
    gpu_model_mib,
    is_device_buffer,
    verify_placement,
)

DATA = Path(__file__).resolve().parents[3] / "data" / "llama_logs"
NEMOTRON = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
NEMOTRON_EXPERTS = sorted("blk.%d.ffn_%s_exps.weight" % (b, k)
                          for b, c in enumerate(NEMOTRON) if c == "E" for k in ("up", "down"))
QWEN3_EXPERTS = sorted("blk.%d.ffn_%s_exps.weight" % (b, k) for b in range(48) for k in ("gate", "up", "down"))


def read(name):
    return (DATA / name).read_text()


def names(parsed):
    return sorted(o["tensor"] for o in parsed["overridden"])


# ---------------------------------------------------------------- the older-format logs


def test_b7500_nemotron_cuda_lv4():
    p = parse_log(read("b7500_nemotron_cuda_lv4_overridden_cuda_host.log"))
    assert p["build"] == "b7500-1a2b3c4" and p["build_number"] == 7500
    assert names(p) == NEMOTRON_EXPERTS
    first = p["overridden"][0]
    assert first == {"tensor": "blk.1.ffn_up_exps.weight", "mib": 418, "type": "q5_0", "buffer": "CUDA_Host"}
    assert {o["type"] for o in p["overridden"]} == {"q5_0", "q8_0"}
    assert p["offloaded_layers"] == {"offloaded": 53, "total": 53}
    assert p["model_buffers"] == {"CUDA0": 1369.43, "CUDA_Host": 21772.21, "CPU_Mapped": 231.0}
    assert p["kv_buffers"] == {"CUDA0": 768.0}
    assert p["rs_buffers"] == {"CUDA0": 47.62}
    assert p["compute_buffers"] == {"CUDA0": 1078.13, "CUDA_Host": 268.02}
    assert p["mmap_override_warning"] is False  # the WARN exists only since PR #20978
    assert p["per_tensor_lines_visible"] is True
    assert p["load_error"] is None
    assert gpu_model_mib(p) == 1369.43
    v = verify_placement(p, NEMOTRON_EXPERTS)
    assert v["verified"] and v["evidence"] == "per_tensor" and not v["missing"] and not v["unexpected"]


def test_b7500_default_verbosity_needs_buffer_evidence():
    p = parse_log(read("b7500_nemotron_cuda_default_verbosity.log"))
    assert p["overridden"] == [] and p["per_tensor_lines_visible"] is False
    assert p["model_buffers"]["CUDA0"] == 1369.43
    # the tensor list alone cannot be proven: never verified, and the reason is given
    v = verify_placement(p, NEMOTRON_EXPERTS)
    assert not v["verified"] and v["evidence"] == "none"
    assert "verbosity hides the per-tensor" in v["msg"]
    # the planner's prediction decides instead
    v = verify_placement(p, NEMOTRON_EXPERTS, expect_gpu_model_mib=1369.0, tolerance_mib=1.0, tolerance_pct=0)
    assert v["verified"] and v["evidence"] == "buffers"
    assert v["missing"] == [] and v["unexpected"] == []
    # all experts on the GPU would be ~23140 MiB: a far prediction fails, with both numbers
    v = verify_placement(p, NEMOTRON_EXPERTS, expect_gpu_model_mib=23140.0)
    assert not v["verified"] and v["evidence"] == "buffers"
    assert "1369.43" in v["msg"] and "23140.00" in v["msg"]


def test_b5200_overriden_without_size():
    p = parse_log(read("b5200_load_tensors_overriden_nosize_qwen3moe.log"))
    assert p["build"] == "b5200-9a8b7c6"
    assert names(p) == QWEN3_EXPERTS
    assert all(o["mib"] is None and o["type"] is None and o["buffer"] == "CPU" for o in p["overridden"])
    assert p["kv_buffers"] == {"CUDA0": 3072.0}  # the "init:" KV prefix
    assert p["compute_buffers"] == {"CUDA0": 2144.0, "CUDA_Host": 68.01}
    assert p["model_buffers"] == {"CUDA0": 1166.26, "CPU_Mapped": 17221.87}
    assert p["offloaded_layers"] == {"offloaded": 49, "total": 49}
    assert verify_placement(p, QWEN3_EXPERTS)["verified"]


def test_ik_llama_tensor_line_and_2024_names():
    p = parse_log(read("ik_llama_llm_load_tensors_Tensor_overriden_qwen3moe.log"))
    assert p["build"] == "b3701-5e6f7a8"
    assert names(p) == QWEN3_EXPERTS
    # "llm_load_tensors: CUDA0 buffer size" (no "model"), llama_kv_cache_init:, llama_new_context_with_model:
    assert p["model_buffers"] == {"CPU": 15936.0, "CUDA_Host": 243.1, "CUDA0": 1045.73}
    assert p["kv_buffers"] == {"CUDA0": 3072.0}
    assert p["compute_buffers"] == {"CUDA0": 2144.0, "CUDA_Host": 68.01}
    assert gpu_model_mib(p) == 1045.73  # CUDA_Host is host memory
    v = verify_placement(p, QWEN3_EXPERTS[:-1])
    assert not v["verified"] and v["unexpected"] == [QWEN3_EXPERTS[-1]]
    assert QWEN3_EXPERTS[-1] in v["msg"]


# ---------------------------------------------------------------- single lines of every era

@pytest.mark.parametrize("line,expected", [
    ("tensor blk.1.ffn_up_exps.weight (418 MiB q5_0) buffer type overridden to CPU",
     {"tensor": "blk.1.ffn_up_exps.weight", "mib": 418, "type": "q5_0", "buffer": "CPU"}),
    ("0.00.011.842 D tensor blk.1.ffn_down_exps.weight (0 MiB f32) buffer type overridden to CPU_REPACK",
     {"tensor": "blk.1.ffn_down_exps.weight", "mib": 0, "type": "f32", "buffer": "CPU_REPACK"}),
    ("tensor blk.3.ffn_gate_exps.weight buffer type overriden to AMX",
     {"tensor": "blk.3.ffn_gate_exps.weight", "mib": None, "type": None, "buffer": "AMX"}),
    ("Tensor blk.7.ffn_up_exps.weight buffer type overriden to CUDA_Host",
     {"tensor": "blk.7.ffn_up_exps.weight", "mib": None, "type": None, "buffer": "CUDA_Host"}),
    ("\x1b[32m0.01.002.000 D tensor blk.0.ffn_up_exps.weight (12 MiB mxfp4) buffer type overridden to CPU\x1b[0m",
     {"tensor": "blk.0.ffn_up_exps.weight", "mib": 12, "type": "mxfp4", "buffer": "CPU"}),
])
def test_override_line_forms(line, expected):
    p = parse_log(line + "\n")
    assert p["overridden"] == [expected]
    assert p["per_tensor_lines_visible"] is True


@pytest.mark.parametrize("prefix", ["llama_kv_cache_init", "init", "llama_kv_cache_unified", "llama_kv_cache"])
def test_kv_prefixes(prefix):
    p = parse_log("%s: %10s KV buffer size = %8.2f MiB\n" % (prefix, "CUDA1", 96.0))
    assert p["kv_buffers"] == {"CUDA1": 96.0}


@pytest.mark.parametrize("prefix", ["llama_new_context_with_model", "llama_init_from_model", "llama_context",
                                    "sched_reserve"])
def test_compute_prefixes(prefix):
    p = parse_log("%s: %10s compute buffer size = %8.2f MiB\n" % (prefix, "Vulkan0", 300.5))
    assert p["compute_buffers"] == {"Vulkan0": 300.5}


@pytest.mark.parametrize("line", [
    "llm_load_tensors:      CUDA0 buffer size =  1000.00 MiB",
    "llm_load_tensors:      CUDA0 model buffer size =  1000.00 MiB",
    "load_tensors:        CUDA0 model buffer size =  1000.00 MiB",
    "0.00.012.476 I load_tensors:        CUDA0 model buffer size =  1000.00 MiB",
])
def test_model_buffer_prefixes(line):
    assert parse_log(line)["model_buffers"] == {"CUDA0": 1000.0}


def test_mmap_warning_both_wordings():
    for advice in ("consider using --no-mmap for better performance", "consider using --load-mode none"):
        line = "0.00.011.839 W llama_model_loader: tensor overrides to CPU are used with mmap enabled - " + advice
        assert parse_log(line)["mmap_override_warning"] is True
    assert parse_log("load_tensors: offloaded 6/6 layers to GPU")["mmap_override_warning"] is False


def test_cpu_mapped_is_summed_per_shard_and_device_buffers():
    text = "\n".join([
        "load_tensors: offloaded 53/53 layers to GPU",
        "load_tensors:        CUDA0 model buffer size =   700.00 MiB",
        "load_tensors:        CUDA1 model buffer size =   669.43 MiB",
        "load_tensors:   CPU_Mapped model buffer size =  3900.00 MiB",
        "load_tensors:   CPU_Mapped model buffer size =  4000.50 MiB",
    ])
    p = parse_log(text)
    assert p["model_buffers"]["CPU_Mapped"] == 7900.5
    assert gpu_model_mib(p) == 1369.43
    assert [is_device_buffer(b) for b in ("CUDA0", "Vulkan0", "ROCm1", "Metal", "RPC[10.0.0.2:50052]")] == [True] * 5
    assert [is_device_buffer(b) for b in ("CPU", "CPU_Mapped", "CPU_REPACK", "CUDA_Host", "AMX")] == [False] * 5


def test_llm_load_tensors_prefix_with_old_override_line():
    text = "\n".join([
        "build: 4500 (aaaa111) with cc (GCC) 11.4.0 for x86_64-linux-gnu",
        "llm_load_tensors: layer   0 assigned to device CUDA0",
        "tensor blk.0.ffn_up_exps.weight buffer type overriden to CPU",
        "llm_load_tensors: offloaded 2/2 layers to GPU",
        "llm_load_tensors:        CPU buffer size =   100.00 MiB",
        "llm_load_tensors:      CUDA0 buffer size =    50.00 MiB",
    ])
    p = parse_log(text)
    assert p["build"] == "b4500-aaaa111"
    assert names(p) == ["blk.0.ffn_up_exps.weight"]
    assert p["model_buffers"] == {"CPU": 100.0, "CUDA0": 50.0}


@pytest.mark.parametrize("service", ["ai-llm-1  | ", "ai-llm | ", "[ai-llm] | "])
def test_compose_logs_service_prefix(service):
    text = "\n".join(service + line for line in read("b7500_nemotron_cuda_lv4_overridden_cuda_host.log").splitlines())
    p = parse_log(text)
    assert len(p["overridden"]) == 46 and p["model_buffers"]["CUDA0"] == 1369.43 and p["build"] == "b7500-1a2b3c4"
    # the memory breakdown table is not a service prefix
    assert parse_log("common_memory_breakdown_print: | memory breakdown [MiB] |")["runs"] == 1


def test_version_output_is_a_build():
    assert parse_log("version: 0.1.0-dev (build 1, commit 7e4c0a9)\n")["build"] == "b1-7e4c0a9"
    assert parse_log("version: 5200 (9a8b7c6)\nbuilt with cc for x86_64\n")["build"] == "b5200-9a8b7c6"


# ---------------------------------------------------------------- loads, runs, errors

def _load(pattern_tensors, gpu_mib, marker=True, debug=True):
    lines = []
    if marker:
        lines.append("llama_model_loader: loaded meta data with 40 key-value pairs and 21 tensors from m.gguf")
        lines.append("load_tensors: loading model tensors, this can take a while... (mmap = true)")
    if debug:
        lines.append("load_tensors: layer   0 assigned to device CUDA0, is_swa = 0")
    lines += ["tensor %s (1 MiB f16) buffer type overridden to CPU" % t for t in pattern_tensors]
    lines += ["load_tensors: offloaded 3/3 layers to GPU",
              "load_tensors:        CUDA0 model buffer size = %8.2f MiB" % gpu_mib,
              "llama_kv_cache:      CUDA0 KV buffer size =     1.00 MiB",
              "sched_reserve:      CUDA0 compute buffer size =     2.00 MiB"]
    return lines


@pytest.mark.parametrize("marker", [True, False])
def test_fit_dry_run_then_real_load_takes_the_last(marker):
    text = "\n".join(_load(["blk.0.a"], 0.0, marker) + ["common_fit_params: successfully fit params"]
                     + _load(["blk.0.b", "blk.1.b"], 55.0, marker))
    p = parse_log(text)
    assert p["loads"] == 2
    assert names(p) == ["blk.0.b", "blk.1.b"]
    assert p["model_buffers"] == {"CUDA0": 55.0}  # not 55 + the dry run's 0
    assert p["kv_buffers"] == {"CUDA0": 1.0}


def test_restarted_container_takes_the_last_run():
    run1 = ["build: 7500 (1a2b3c4) with cc for x86_64"] + _load(["blk.0.a"], 10.0)
    run2 = ["build: 7600 (5d6e7f8) with cc for x86_64"] + _load(["blk.9.z"], 20.0)
    p = parse_log("\n".join(run1 + ["srv  operator(): cleaning up before exit..."] + run2))
    assert p["runs"] == 2 and p["build"] == "b7600-5d6e7f8"
    assert names(p) == ["blk.9.z"] and p["model_buffers"] == {"CUDA0": 20.0}


def test_failed_run_then_good_run_has_no_error_and_good_then_failed_has_it():
    bad = ["build: 7500 (1a2b3c4) with cc for x86_64",
           "llama_model_load: error loading model: tensor 'blk.0.x' data is not within the file bounds",
           "llama_model_load_from_file_impl: failed to load model",
           "srv    load_model: failed to load model, '/models/m.gguf'",
           "srv  llama_server: exiting due to model loading error"]
    good = ["build: 7500 (1a2b3c4) with cc for x86_64"] + _load(["blk.0.a"], 10.0)
    p = parse_log("\n".join(bad + good))
    assert p["load_error"] is None and names(p) == ["blk.0.a"]
    p = parse_log("\n".join(good + bad))
    assert p["load_error"] == "tensor 'blk.0.x' data is not within the file bounds"
    assert p["overridden"] == [] and p["model_buffers"] == {}
    v = verify_placement(p, ["blk.0.a"], expect_gpu_model_mib=10.0)
    assert not v["verified"] and "failed to load" in v["msg"] and "file bounds" in v["msg"]


def test_only_the_exit_line_is_still_a_load_error():
    p = parse_log("0.00.005.832 E srv  llama_server: exiting due to model loading error\n")
    assert p["load_error"] == "exiting due to model loading error"


def test_restart_with_hidden_build_line_does_not_keep_the_old_build():
    run1 = ["build: 7500 (1a2b3c4) with cc for x86_64"] + _load(["blk.0.a"], 10.0)
    run2 = ["0.00.004.435 I cmn  common_param: common_params_print_info: verbosity = 3 (adjust with the `-lv N` CLI arg)",
            "0.00.006.076 I srv    load_model: loading model 'm.gguf'",
            "0.00.006.700 W llama_model_loader: tensor overrides to CPU are used with mmap enabled - consider using "
            "--no-mmap for better performance"]
    p = parse_log("\n".join(run1 + run2))
    assert p["runs"] == 2 and p["build"] is None
    assert p["overridden"] == [] and p["model_buffers"] == {} and p["mmap_override_warning"] is True
    assert p["per_tensor_lines_visible"] is False


# ---------------------------------------------------------------- verification never passes without evidence

def test_no_evidence_never_verifies():
    for text in ("", "srv  llama_server: model loaded\n", "\n".join(_load([], 5.0, debug=False))):
        p = parse_log(text)
        assert p["per_tensor_lines_visible"] is False
        for kw in ({"expected": ["blk.0.a"]}, {"expected": []}, {}):
            v = verify_placement(p, **kw)
            assert v["verified"] is False and v["evidence"] == "none", (text, kw)


def test_buffer_evidence_needs_model_buffer_lines():
    v = verify_placement(parse_log("srv  llama_server: model loaded\n"), ["x"], expect_gpu_model_mib=0.0)
    assert not v["verified"] and v["evidence"] == "none" and "no model buffer lines" in v["msg"]


def test_pattern_that_matches_nothing_is_reported():
    p = parse_log("\n".join(_load([], 5.0)))
    assert p["per_tensor_lines_visible"] is True  # the DEBUG "layer assigned" lines are there
    v = verify_placement(p, ["blk.0.ffn_up_exps.weight"])
    assert not v["verified"] and v["missing"] == ["blk.0.ffn_up_exps.weight"]
    assert "no overridden tensor" in v["msg"]


def test_tolerance_is_the_larger_of_mib_and_percent():
    p = parse_log("load_tensors:        CUDA0 model buffer size =  1010.00 MiB\n")
    assert not verify_placement(p, None, 1000.0, tolerance_mib=1.0, tolerance_pct=0.5)["verified"]
    v = verify_placement(p, None, 1000.0, tolerance_mib=1.0, tolerance_pct=1.0)
    assert v["verified"] and v["gpu_model_tolerance_mib"] == 10.0
    assert verify_placement(p, None, 1009.5, tolerance_mib=1.0, tolerance_pct=0)["verified"]


def test_expected_from_pattern_is_re_search():
    all_names = ["blk.1.ffn_up_exps.weight", "blk.10.ffn_up_exps.weight", "blk.1.ffn_up_shexp.weight"]
    assert expected_from_pattern(r"blk\.1\.ffn_.*_exps", all_names) == ["blk.1.ffn_up_exps.weight"]
    assert expected_from_pattern(r"exps", all_names) == all_names[:2]
