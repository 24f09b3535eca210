"""moe_offload_plan through real Ansible, with generated GGUF files and the nvidia-smi test double; bad input gives a
clear message and never a traceback, and warnings where the plan still works."""
from __future__ import annotations

import os
import re
from pathlib import Path

import gguf
import numpy as np
import pytest

from tests.helpers import gguf_layouts
from tests.helpers.module_runs import assert_clean_failure, run_with_warnings
from tools import gguf_models

DOUBLES = Path(__file__).resolve().parents[3] / "doubles"
A5500 = {"name": "NVIDIA RTX A5500", "memory_total_mib": 24564, "memory_free_mib": 24148}


@pytest.fixture(scope="module")
def nano(tmp_path_factory):
    return gguf_models.write_nemotron_nano_30b(tmp_path_factory.mktemp("nano"), shards=6)


def test_nano_on_an_a5500_at_32k_and_two_slots(ansible_module, nano):
    result = ansible_module("moe_offload_plan", {"gguf": nano[2], "gpus": [A5500], "ctx_size": 32768,
                                                 "parallel": 2}, check=True)
    assert result["failed"] is False and result["changed"] is False
    assert result["fits"] is True and result["offload"] is True
    gpu = result["memory"]["gpus"][0]
    assert (gpu["kv_mib"], gpu["recurrent_mib"], gpu["margin_mib"]) == (192.0, 95.23, 1024.0)
    assert gpu["free_after_mib"] >= 0
    assert result["override_tensor"] == result["pattern"] + "=CPU"
    assert result["pattern_check"]["ok"] is True
    assert result["pattern_check"]["matched"] == 2 * len(result["cpu_expert_layers"])
    for block in result["cpu_expert_layers"]:
        assert re.search(result["pattern"], "blk.%d.ffn_up_exps.weight" % block)
    assert not re.search(result["pattern"], "blk.%d.ffn_up_shexp.weight" % result["cpu_expert_layers"][0])
    assert result["placement"] == "single" and result["tensor_split"] == ""
    assert "host memory" in result["reason"]


def test_gpu_info_result_feeds_the_plan(ansible_module, nano):
    env = {"PATH": "%s:%s" % (DOUBLES, os.environ["PATH"]), "NVIDIA_SMI_FIXTURE": "dual_a5500_a4000"}
    gpus = ansible_module("gpu_info", {"processes": False}, extra_env=env)
    assert gpus["topology"] == "dual"
    gpus = {"gpus": gpus["gpus"], "topology": gpus["topology"]}
    result = ansible_module("moe_offload_plan", {"gguf": nano[0], "gpus": gpus, "ctx_size": 65536, "parallel": 4})
    assert result["failed"] is False
    assert result["placement"] == "split" and result["tensor_split"] == "0.605,0.395"
    assert result["visible_devices"] == ("GPU-8d4f3c2a-61b7-4e0a-9f35-2c7e1d9a4b60,"
                                         "GPU-c05e7d29-4a18-3b6f-90d2-18e4a7f65c0b")
    assert [g["name"] for g in result["memory"]["gpus"]] == ["NVIDIA RTX A5500", "NVIDIA RTX A4000"]
    one = ansible_module("moe_offload_plan", {"gguf": nano[0], "gpus": gpus, "ctx_size": 65536, "parallel": 4,
                                              "gpu_index": 1})
    assert one["placement"] == "single" and one["gpu_devices"] == [1] and one["offload"] is True


def test_gguf_info_result_is_accepted(ansible_module, nano):
    info = ansible_module("gguf_info", {"path": nano[0], "tensors": "none"})
    assert info["failed"] is False
    result = ansible_module("moe_offload_plan", {"gguf": {"files": info["files"]}, "gpus": [A5500],
                                                 "ctx_size": 8192, "mode": "all"})
    assert result["failed"] is False and len(result["cpu_expert_layers"]) == 23
    assert result["n_cpu_moe"] == 52


def test_too_small_a_card_fails_with_what_is_missing(ansible_module, nano):
    small = {"name": "RTX 4060", "memory_total_mib": 8188, "memory_free_mib": 3000}
    result = ansible_module("moe_offload_plan", {"gguf": nano[0], "gpus": [small], "ctx_size": 262144,
                                                 "parallel": 4})
    assert result["failed"] is True and result["fits"] is False
    assert re.search(r"\d+ MiB are missing", result["msg"]) and "Lower ctx_size" in result["msg"]
    assert result["memory"]["gpus"][0]["free_after_mib"] < 0


@pytest.mark.parametrize("args, words", [
    ({"gpus": [{"name": "x", "memory_free_mib": 1, "colour": "red"}]}, "unknown field"),
    ({"ctx_size": 0}, "ctx_size must be"),
    ({"parallel": 0}, "parallel must be"),
    ({"cache_type_k": "q6_k"}, "value of cache_type_k must be one of"),
    ({"mode": "layers", "cpu_expert_layers": [0]}, "hold no routed experts"),
    ({"gguf": "/nonexistent/model.gguf"}, "model.gguf"),
    ({"bogus": 1}, "Unsupported parameters"),
])
def test_bad_input_fails_cleanly(ansible_module, nano, args, words):
    base = {"gguf": nano[0], "gpus": [A5500], "ctx_size": 4096}
    base.update(args)
    result = ansible_module("moe_offload_plan", base)
    assert result["failed"] is True
    assert words in result["msg"]
    assert "Traceback" not in result.get("module_stderr", "") + result.get("exception", "")


def test_one_planner_call_without_gguf_info_or_gpu(ansible_module, nano):
    """A CPU host (gpus: []), the host's memory and the model read once: what the role needs from one call."""
    host = ansible_module("host_info", {})
    result = ansible_module("moe_offload_plan", {"gguf": nano[0], "gpus": [], "ctx_size": 4096,
                                                 "host": {"memory_available_mib": 100000}}, check=True)
    assert result["failed"] is False and result["placement"] == "cpu" and result["fits"] is True
    assert result["pattern_check"]["ok"] is True and result["pattern_check"]["matched"] == 46
    assert result["memory"]["host"]["available_mib"] == 100000
    short = ansible_module("moe_offload_plan", {"gguf": nano[0], "gpus": [], "ctx_size": 4096,
                                                "host": {"memory_available_mib": 1000}})
    assert short["failed"] is True and short["fits"] is False
    assert re.search(r"The host cannot hold its part: .* so \d+ MiB are missing", short["msg"])
    assert host["memory_available_mib"] > 0


def test_gguf_info_model_and_a_users_pattern(ansible_module, nano):
    info = ansible_module("gguf_info", {"path": nano[0], "tensors": "none"})
    assert info["model"]["version"] == 1 and len(info["model"]["tensors"]) == 401
    pattern = r"blk\.(1|3)\.ffn_.*_exps\.weight"
    result = ansible_module("moe_offload_plan", {"gguf": info, "gpus": [A5500], "ctx_size": 32768,
                                                 "pattern": pattern})
    assert result["failed"] is False and result["cpu_expert_layers"] == [1, 3] and result["pattern"] == pattern
    check = ansible_module("gguf_info", {"path": nano[0], "tensors": "none", "pattern": pattern})["pattern_check"]
    assert result["pattern_check"]["verdict"] == check["verdict"] and result["pattern_check"]["tensors"] == check["matched"]
    bad = ansible_module("moe_offload_plan", {"gguf": info["model"], "gpus": [A5500], "ctx_size": 32768,
                                              "pattern": "blk\\.[0-9]{1,2}"})
    assert bad["failed"] is True and "contains ','" in bad["msg"]


def test_a_gguf_info_result_is_planned_on_the_controller_without_the_file(ansible_module, tmp_path):
    """Given gguf_info's result, the action plugin plans on the controller: the same plan as the module gives for
    the file, also once the file is gone (nothing reads it again)."""
    path = gguf_models.write_nemotron_nano_30b(tmp_path)[0]
    info = ansible_module("gguf_info", {"path": path, "tensors": "none"})
    args = {"gpus": [A5500], "ctx_size": 65536, "parallel": 2, "host": {"memory_available_mib": 64000}}
    on_host = ansible_module("moe_offload_plan", dict(args, gguf=path))
    os.unlink(path)
    on_controller = ansible_module("moe_offload_plan", dict(args, gguf=info), check=True)
    assert on_host["failed"] is False and on_host["offload"] is True
    for key in ("pattern", "cpu_expert_layers", "memory", "reason", "placement", "pattern_check", "fits"):
        assert on_controller[key] == on_host[key], key
    gone = ansible_module("moe_offload_plan", dict(args, gguf=path))
    assert gone["failed"] is True and path in gone["msg"]
    refused = ansible_module("moe_offload_plan", dict(args, gguf=info, cache_type_k="q6_k"))
    assert refused["failed"] is True and "cache_type_k" in refused["msg"]
    short = ansible_module("moe_offload_plan", dict(args, gguf=info, host={"memory_available_mib": 1000}))
    assert short["failed"] is True and short["fits"] is False and re.search(r"\d+ MiB are missing", short["msg"])


# bad input: a clear message and never a traceback; warnings where the plan still works
@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return gguf_models.write_tiny_qwen3moe(tmp_path_factory.mktemp("q") / "q.gguf", n_blocks=3, n_embd=128)


@pytest.mark.parametrize("args, words", [
    ({"gpus": "RTX 4090"}, ["gpus must be the registered result of gpu_info or a list"]),
    ({"gpus": [dict(A5500, vram_gb=24)]}, ["unknown field(s) vram_gb"]),
    ({"gpus": [dict(A5500, memory_free_mib="lots")]}, ["memory_free_mib must be a number"]),
    ({"gpus": [{"name": "x", "memory_free_mib": float("inf")}]}, ["memory_free_mib must be a number"]),
    ({"gpus": [{"name": "x", "memory_total_mib": 100, "memory_used_mib": "a"}]}, ["memory_used_mib must be a number"]),
    ({"gpus": [{"name": "x", "memory_total_mib": 100, "memory_used_mib": 200}]}, ["more than memory_total_mib"]),
    ({"ctx_size": 0}, ["ctx_size must be a whole number >= 1"]),
    ({"parallel": 0}, ["parallel must be a whole number >= 1"]),
    ({"cache_type_k": "q3_k"}, ["cache_type_k", "q3_k"]),
    ({"cache_type_v": "q8_0", "flash_attn": "off"}, ["needs flash attention"]),
    ({"mode": "layers", "cpu_expert_layers": [7]}, ["hold no routed experts"]),
    ({"gguf": {"x": 1}}, ["gguf is a dict without files"]),
])
def test_moe_offload_plan_bad_input(ansible_module, qwen, args, words):
    full = {"gguf": qwen, "gpus": [A5500], "ctx_size": 4096}
    full.update(args)
    assert_clean_failure(ansible_module("moe_offload_plan", full), *words)


def test_ctx_beyond_training_length_warns_once(ansible_module, qwen, tmp_path):
    result, warnings = run_with_warnings(ansible_module, tmp_path / "ansible.log", "moe_offload_plan", {"gguf": qwen, "gpus": [A5500], "ctx_size": 100000})
    assert result["failed"] is False and result["fits"] is True
    assert [w for w in warnings if "training context" in w] == [
        "ctx_size 100000 is beyond the model's training context of 4096 tokens"]


def test_gguf_lacking_metadata_falls_back_to_shapes_with_warnings(ansible_module, tmp_path):
    path = str(tmp_path / "bare.gguf")
    writer = gguf.GGUFWriter(path, "qwen3moe")
    for name, shape in [("token_embd.weight", (32, 64)), ("blk.0.attn_q.weight", (64, 64)),
                        ("blk.0.attn_k.weight", (32, 64)), ("blk.0.attn_v.weight", (32, 64)),
                        ("blk.0.ffn_up_exps.weight", (4, 32, 64)), ("output.weight", (32, 64))]:
        writer.add_tensor(name, np.zeros(shape, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    result, warnings = run_with_warnings(ansible_module, tmp_path / "ansible.log", "moe_offload_plan",
                                         {"gguf": path, "gpus": [A5500], "ctx_size": 1000, "parallel": 3})
    assert result["failed"] is False
    assert result["memory"]["gpus"][0]["kv_mib"] == 0.19  # (32 + 32) x 2 bytes x 3 slots x 512 cells = 196,608
    assert any("embedding_length missing" in w for w in warnings)
    assert any("KV widths of blocks 0 taken from the attn_k/attn_v tensor shapes" in w for w in warnings)


def test_implausible_block_number_fails_cleanly(ansible_module, tmp_path):
    layout = gguf_layouts.make_layout("qwen3moe", 4)
    layout.tensors.append(("blk.4000000000.ffn_up_exps.weight", (256, 256, 2), gguf.GGMLQuantizationType.F16))
    files = gguf_layouts.write_layout(layout, tmp_path, 4, shards=2)
    assert_clean_failure(ansible_module("moe_offload_plan", {"gguf": files[0], "gpus": [A5500], "ctx_size": 4096}),
                         "implausible")
