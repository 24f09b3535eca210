"""moe_offload_plan through real Ansible, with generated GGUF files and the nvidia-smi test double; bad input gives a
clear message and never a traceback, and warnings where the plan still works."""
from __future__ import annotations

import os
import re
from pathlib import Path

import gguf
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
    assert result["memory"]["gpus"][0]["margin_mib"] == 1024.0  # the module's default margin_mib
    assert result["override_tensor"] == result["pattern"] + "=CPU"
    assert result["placement"] == "single" and result["tensor_split"] == ""
    assert "host memory" in result["reason"]


def test_gpu_info_result_feeds_the_plan(ansible_module, nano):
    env = {"PATH": "%s:%s" % (DOUBLES, os.environ["PATH"]), "NVIDIA_SMI_FIXTURE": "dual_a5500_a4000"}
    gpus = ansible_module("gpu_info", {"processes": False}, extra_env=env)
    assert gpus["topology"] == "dual"
    gpus = {"gpus": gpus["gpus"], "topology": gpus["topology"]}
    result = ansible_module("moe_offload_plan", {"gguf": nano[0], "gpus": gpus, "ctx_size": 65536, "parallel": 4})
    assert result["failed"] is False
    # llama.cpp's --tensor-split shares of the free memory less each card's CUDA context (neither card has a figure
    # in _cuda_context's table: the assumed 555 MiB each): 24148 - 555 : 15746 - 555 = 23593 : 15191
    assert result["placement"] == "split" and result["tensor_split"] == "0.608,0.392"
    assert [(d["cuda_context_mib"], d["cuda_context_source"]) for d in result["devices"]] == [(555, "assumed")] * 2
    assert result["visible_devices"] == ("GPU-8d4f3c2a-61b7-4e0a-9f35-2c7e1d9a4b60,"
                                         "GPU-c05e7d29-4a18-3b6f-90d2-18e4a7f65c0b")
    assert [g["name"] for g in result["memory"]["gpus"]] == ["NVIDIA RTX A5500", "NVIDIA RTX A4000"]


def test_one_planner_call_without_gguf_info_or_gpu(ansible_module, nano):
    """A CPU host (gpus: []), its memory and the model read once: what the role needs from one call."""
    result = ansible_module("moe_offload_plan", {"gguf": nano[0], "gpus": [], "ctx_size": 4096,
                                                 "host": {"memory_available_mib": 100000}}, check=True)
    assert result["failed"] is False and result["placement"] == "cpu" and result["fits"] is True
    assert result["pattern_check"]["ok"] is True and result["pattern_check"]["matched"] == 46
    assert result["memory"]["host"]["available_mib"] == 100000
    short = ansible_module("moe_offload_plan", {"gguf": nano[0], "gpus": [], "ctx_size": 4096,
                                                "host": {"memory_available_mib": 1000}})
    assert short["failed"] is True and short["fits"] is False
    assert re.search(r"The host cannot hold its part: .* so \d+ MiB are missing", short["msg"])


def test_a_gguf_info_result_is_planned_on_the_controller_without_the_file(ansible_module, tmp_path):
    """gguf_info's ``files`` are read on the host; given its result, the action plugin plans on the controller: the
    same plan, also once the file is gone (nothing reads it again), and a user's pattern checked as gguf_info checks
    it."""
    path = gguf_models.write_nemotron_nano_30b(tmp_path)[0]
    pattern = r"blk\.(1|3)\.ffn_.*_exps\.weight"
    info = ansible_module("gguf_info", {"path": path, "tensors": "none", "pattern": pattern})
    assert info["model"]["version"] == 1 and len(info["model"]["tensors"]) == 401
    args = {"gpus": [A5500], "ctx_size": 65536, "parallel": 2, "host": {"memory_available_mib": 64000}}
    on_host = ansible_module("moe_offload_plan", dict(args, gguf={"files": info["files"]}))
    os.unlink(path)
    on_controller = ansible_module("moe_offload_plan", dict(args, gguf=info), check=True)
    assert on_host["failed"] is False and on_host["offload"] is True
    for key in ("pattern", "cpu_expert_layers", "memory", "reason", "placement", "pattern_check", "fits"):
        assert on_controller[key] == on_host[key], key
    mine = ansible_module("moe_offload_plan", {"gguf": info["model"], "gpus": [A5500], "ctx_size": 32768,
                                               "pattern": pattern})
    assert mine["failed"] is False and mine["cpu_expert_layers"] == [1, 3] and mine["pattern"] == pattern
    check = info["pattern_check"]
    assert mine["pattern_check"]["verdict"] == check["verdict"] and mine["pattern_check"]["tensors"] == check["matched"]
    bad = ansible_module("moe_offload_plan", {"gguf": info["model"], "gpus": [A5500], "ctx_size": 32768,
                                              "pattern": "blk\\.[0-9]{1,2}"})
    assert bad["failed"] is True and "contains ','" in bad["msg"]
    refused = ansible_module("moe_offload_plan", dict(args, gguf=info, cache_type_k="q6_k"))
    assert refused["failed"] is True and "cache_type_k" in refused["msg"]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return gguf_models.write_tiny_qwen3moe(tmp_path_factory.mktemp("q") / "q.gguf", n_blocks=3, n_embd=128)


@pytest.mark.parametrize("args, words", [
    ({"gpus": "RTX 4090"}, ["gpus must be the registered result of gpu_info or a list"]),
    ({"cache_type_k": "q3_k"}, ["value of cache_type_k must be one of", "q3_k"]),
    ({"gguf": "/nonexistent/model.gguf"}, ["/nonexistent/model.gguf"]),
    ({"bogus": 1}, ["Unsupported parameters"]),
])
def test_moe_offload_plan_bad_input(ansible_module, qwen, args, words):
    full = {"gguf": qwen, "gpus": [A5500], "ctx_size": 4096}
    full.update(args)
    assert_clean_failure(ansible_module("moe_offload_plan", full), *words)


def test_ctx_beyond_training_length_warns_once(ansible_module, qwen, tmp_path):
    result, warnings = run_with_warnings(ansible_module, tmp_path / "ansible.log", "moe_offload_plan",
                                         {"gguf": qwen, "gpus": [A5500], "ctx_size": 100000})
    assert result["failed"] is False and result["fits"] is True
    assert [w for w in warnings if "training context" in w] == [
        "ctx_size 100000 is beyond the model's training context of 4096 tokens"]


def test_implausible_block_number_fails_cleanly(ansible_module, tmp_path):
    layout = gguf_layouts.make_layout("qwen3moe", 4)
    layout.tensors.append(("blk.4000000000.ffn_up_exps.weight", (256, 256, 2), gguf.GGMLQuantizationType.F16))
    files = gguf_layouts.write_layout(layout, tmp_path, 4, shards=2)
    assert_clean_failure(ansible_module("moe_offload_plan", {"gguf": files[0], "gpus": [A5500], "ctx_size": 4096}),
                         "implausible")
