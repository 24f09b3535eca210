"""The planner beyond one GPU with host RAM to spare: experts placed per GPU, a CPU host, the host's memory,
a user's pattern, a model passed on by gguf_info without reading the file again, dense and sliding-window models."""
from __future__ import annotations

import os
import re
import shutil

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _common as common
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _memory_estimate as mest
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import Options
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._gguf import read_model
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_report import describe
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_pattern import check_pattern
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_plan import plan
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_inputs import PlanError, load_facts
from tools import gguf_models


@pytest.fixture(scope="module")
def nano(tmp_path_factory):
    return load_facts(gguf_models.write_nemotron_nano_30b(tmp_path_factory.mktemp("nano"), shards=6)[0])


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    path = tmp_path_factory.mktemp("dense") / "dense.gguf"
    return load_facts(gguf_models.write_dense_llama(str(path), n_blocks=4, n_embd=256, n_ff=1024))


def gpu(free, index, name=None):
    return {"name": name or "GPU%d" % index, "memory_total_mib": free, "memory_free_mib": free, "index": index,
            "uuid": "GPU-%d" % index}


def moved_by(pattern, names):
    return set(n for n in names if re.search(pattern, n))


def host_expert_mib(facts, result):
    sizes = facts.expert_bytes_by_block()
    return sum(sizes[b] for b in result["cpu_expert_layers"]) / float(common.MIB)


def test_experts_per_gpu_fill_a_card_the_split_leaves_room_on(nano):
    """A5500 beside a 5 GB card at 32K: the split alone keeps experts on the host; placed per GPU, none."""
    gpus = [gpu(24148, 0, "NVIDIA RTX A5500"), gpu(5000, 1, "small card")]
    result = plan(nano, gpus, None, Options(32768, 2))
    others = [plan(nano, gpus, None, Options(32768, 2, experts_per_gpu=False)), plan(nano, gpus, None, Options(32768, 2, gpu_index=0)),
              plan(nano, gpus, None, Options(32768, 2, split="auto", experts_per_gpu=False))]
    assert result["fits"] and result["placement"] == "split"
    assert host_expert_mib(nano, result) < min(host_expert_mib(nano, r) for r in others)
    assert result["cpu_expert_layers"] == [] and result["pattern"] == ""
    assert result["devices"] == [{"device": "CUDA0", "index": 0, "uuid": "GPU-0", "name": "NVIDIA RTX A5500"},
                                 {"device": "CUDA1", "index": 1, "uuid": "GPU-1", "name": "small card"}]
    (override,) = result["device_overrides"]
    assert override["device"] == "CUDA0" and override["gpu_index"] == 0 and override["blocks"]
    # every pattern is proved: it moves exactly the experts of its blocks, and llama.cpp can split the value
    assert moved_by(override["pattern"], nano.tensor_names) == set(override["tensors"]) == set(
        n for b in override["blocks"] for n in nano.expert_tensors_by_block[b])
    assert "," not in override["pattern"] and "=" not in override["pattern"]
    assert result["tensor_overrides"] == override["pattern"] + "=CUDA0"
    item, device = result["tensor_overrides"].split(",", maxsplit=1)[0].split("=", 1)
    assert (item, device) == (override["pattern"], "CUDA0")
    # the blocks whose experts moved have their layers on the other card
    split = [float(s) for s in result["tensor_split"].split(",")]
    devices = mest.layer_devices(nano.block_count, split, 2)[0]
    assert all(devices[b] == 1 for b in override["blocks"])
    assert result["reason"].startswith(
        "No routed expert goes to host memory; the experts of blocks %s go to CUDA0 (GPU 0) with -ot %s=CUDA0: "
        "everything on the GPU would need " % (", ".join(str(b) for b in override["blocks"]), override["pattern"]))
    assert all(g["free_after_mib"] >= 0 for g in result["memory"]["gpus"])


def test_experts_per_gpu_and_the_host_together(nano):
    gpus = [gpu(16000, 0), gpu(8000, 1)]
    result = plan(nano, gpus, None, Options(32768, 2))
    plain = plan(nano, gpus, None, Options(32768, 2, experts_per_gpu=False))
    assert result["fits"] and host_expert_mib(nano, result) <= host_expert_mib(nano, plain)
    cpu = set(n for b in result["cpu_expert_layers"] for n in nano.expert_tensors_by_block[b])
    assert moved_by(result["pattern"], nano.tensor_names) == cpu
    on_gpus = set(n for o in result["device_overrides"] for n in o["tensors"])
    assert not cpu & on_gpus


def test_device_names_follow_the_backend(nano):
    gpus = [gpu(24148, 3), gpu(5000, 5)]
    result = plan(nano, gpus, None, Options(32768, 2, backend="rpc", device_names=["RPC0[127.0.0.1:5001]", "RPC0[127.0.0.1:5002]"]))
    assert [d["device"] for d in result["devices"]] == ["RPC0[127.0.0.1:5001]", "RPC0[127.0.0.1:5002]"]
    assert all(o["device"].startswith("RPC0[") for o in result["device_overrides"])
    vulkan = plan(nano, gpus, None, Options(32768, 2, backend="vulkan"))
    assert [d["device"] for d in vulkan["devices"]][:1] == ["Vulkan0"]
    with pytest.raises(PlanError, match="device_names"):
        plan(nano, gpus, None, Options(32768, 2, device_names=["CUDA0"]))


def test_gpu_indices_and_the_memory_the_running_server_holds(nano):
    gpus = {"gpus": [dict(gpu(3000, 0), memory_held_by_pid_mib=21148), gpu(5000, 1)], "topology": "dual"}
    result = plan(nano, gpus, None, Options(32768, 2, gpu_indices=[0]))
    assert result["gpu_indices"] == [0] and result["memory"]["gpus"][0]["free_mib"] == 24148
    assert result["memory"]["gpus"][0]["held_by_pid_mib"] == 21148
    with pytest.raises(PlanError, match="gpu_indices 7"):
        plan(nano, gpus, None, Options(32768, 2, gpu_indices=[7]))


def test_a_cpu_host_plans_host_memory_only(nano):
    host = {"memory_available_mib": 60000, "memory_total_mib": 64000}
    result = plan(nano, [], host, Options(32768, 2))
    assert result["placement"] == "cpu" and result["devices"] == [] and result["memory"]["gpus"] == []
    assert result["cpu_expert_layers"] == nano.expert_blocks
    assert moved_by(result["pattern"], nano.tensor_names) == set(nano.expert_names)
    memory = result["memory"]["host"]
    weights = sum(t.nbytes for t in nano.tensors) / float(common.MIB)
    assert abs(memory["model_mib"] - weights) < 0.01 and memory["kv_mib"] == 192.0 and memory["recurrent_mib"] == 95.23
    assert memory["free_after_mib"] == round(60000 - memory["total_mib"], 2)
    assert result["reason"].startswith("No GPU: llama-server computes on the CPU")
    assert plan(nano, {"gpus": [], "topology": "cpu"}, None, Options(32768, 2, mode="none"))["pattern"] == ""
    with pytest.raises(PlanError) as info:
        plan(nano, [], {"memory_available_mib": 16000}, Options(32768, 2))
    host = info.value.details["memory"]["host"]
    assert str(info.value) == (
        "The host cannot hold its part: %.0f MiB of weights, %.0f MiB of KV cache and recurrent state, %.0f MiB of "
        "compute and output buffers and the 1024 MiB host margin need %.0f MiB, but 16000 MiB are available "
        "(MemAvailable), so %d MiB are missing. Free host memory, or lower ctx_size or parallel." % (
            host["model_mib"], host["kv_mib"] + host["recurrent_mib"], host["compute_mib"] + host["output_mib"],
            host["total_mib"], round(memory["total_mib"] - 16000)))


def test_the_host_must_hold_the_experts_it_gets(nano):
    """A5500 at 32K with all experts on CPU: about 21.8 GiB in host memory, pinned with --no-mmap."""
    gpus = [gpu(24148, 0)]
    result = plan(nano, gpus, {"memory_available_mib": 40000}, Options(32768, 2, mode="all", mmap=False))
    host = result["memory"]["host"]
    assert host["pinned"] is True and host["mmap"] is False
    assert 21700 < host["model_mib"] - 231 < 21850  # the routed experts plus token_embd (231 MiB)
    assert "pinned (--no-mmap)" in result["reason"]
    with pytest.raises(PlanError) as info:
        plan(nano, gpus, {"memory_available_mib": 20000}, Options(32768, 2, mode="all"))
    message = str(info.value)
    missing = re.search(r"so (\d+) MiB are missing", message)
    assert missing and int(missing.group(1)) == round(info.value.details["memory"]["host"]["total_mib"] - 20000)
    host = info.value.details["memory"]["host"]
    assert host["kv_mib"] + host["recurrent_mib"] == 0  # the GPU keeps the caches: no such part in the message
    assert message == (
        "The host cannot hold its part: %.0f MiB of weights, %.0f MiB of compute and output buffers and the 1024 MiB "
        "host margin need %.0f MiB, but 20000 MiB are available (MemAvailable), so %s MiB are missing. Free host "
        "memory, or keep more of the model on the GPUs (mode auto, a larger GPU, a smaller ctx_size)." % (
            host["model_mib"], host["compute_mib"] + host["output_mib"], host["total_mib"], missing.group(1)))
    assert info.value.details["fits"] is False
    # a cgroup limit below MemAvailable is what counts; the running server's memory comes back
    limited = {"memory_available_mib": 60000, "cgroup": {"limit_mib": 20000, "usage_mib": 1000}}
    with pytest.raises(PlanError, match="the cgroup limit of 20000 MiB"):
        plan(nano, gpus, limited, Options(32768, 2, mode="all"))
    back = plan(nano, gpus, {"memory_available_mib": 2000, "memory_held_by_pid_mib": 22000}, Options(32768, 2, mode="all"))
    assert back["memory"]["host"]["available_mib"] == 24000


def test_without_host_the_host_is_not_checked(nano):
    result = plan(nano, [gpu(24148, 0)], None, Options(32768, 2))
    assert result["memory"]["host"]["available_mib"] is None and result["memory"]["host"]["free_after_mib"] is None
    assert "Host memory was not checked" in result["reason"]


def test_a_users_pattern_is_checked_and_sized(nano):
    pattern = r"blk\.(1|3)\.ffn_.*_exps\.weight"
    result = plan(nano, [gpu(24148, 0)], None, Options(32768, 2, pattern=pattern))
    assert result["pattern"] == pattern and result["override_tensor"] == pattern + "=CPU"
    assert result["cpu_expert_layers"] == [1, 3] and result["n_cpu_moe"] is None
    same = check_pattern(pattern, nano.tensor_names, nano.expert_names, nano.tensor_class)
    assert result["pattern_check"]["verdict"] == same["verdict"] and result["pattern_check"]["ok"] is False
    assert result["pattern_check"]["tensors"] == same["matched"] and result["pattern_check"]["matched"] == 4
    sized = mest.estimate(nano, Options(32768, 2), cpu_tensors=same["matched"])["gpus"][0]["total_mib"]
    assert result["memory"]["gpus"][0]["total_mib"] == sized
    greedy = plan(nano, [gpu(24148, 0)], None, Options(32768, 2, pattern=r"exps|shexp"))
    assert greedy["pattern_check"]["non_expert"] and greedy["memory"]["gpus"][0]["model_mib"] < 1370
    with pytest.raises(PlanError, match="cannot be used: unusable: it contains ','"):
        plan(nano, [gpu(24148, 0)], None, Options(32768, 2, pattern=r"blk\.[0-9]{1,2}\.ffn"))
    with pytest.raises(PlanError, match="either pattern"):
        plan(nano, [gpu(24148, 0)], None, Options(32768, 2, pattern=pattern, mode="all"))


def test_a_gguf_info_result_is_not_read_again(tmp_path):
    files = gguf_models.write_nemotron_nano_30b(tmp_path / "nano", shards=6)
    info, _warnings = describe(read_model(files[0]), "none")
    from_file = load_facts(files[0])
    shutil.rmtree(tmp_path / "nano")
    assert not os.path.exists(files[0])
    for given in (info, info["model"]):
        facts = load_facts(given)
        assert facts.path == files[0]
        assert facts.kv_blocks == from_file.kv_blocks and facts.recurrent_blocks == from_file.recurrent_blocks
        assert [(t.name, t.nbytes, t.shape) for t in facts.tensors] == [
            (t.name, t.nbytes, t.shape) for t in from_file.tensors]
        assert facts.n_vocab == 131072
        options = Options(32768, 2)
        assert plan(facts, [gpu(24148, 0)], None, options)["cpu_expert_layers"] == plan(
            from_file, [gpu(24148, 0)], None, options)["cpu_expert_layers"]
    with pytest.raises(PlanError, match=r"gguf.model.tensors\[0\] must be"):
        load_facts(dict(info["model"], tensors=[["x", 0, [-1], 4]]))
    with pytest.raises(PlanError, match="gguf.model.version"):
        load_facts(dict(info["model"], version=7))


def test_a_gguf_info_result_without_its_summary_is_read_from_its_first_file(tmp_path):
    """``{files: [...]}`` and ``{path: ...}`` (gguf_info's keys) name the file to read; a summary that lists no file
    is named ``gguf.model`` in messages; a dict with neither is refused."""
    path = gguf_models.write_tiny_nemotron_h_moe(str(tmp_path / "tiny.gguf"))
    from_path = load_facts(path)
    for given in ({"files": [path, str(tmp_path / "unread.gguf")]}, {"path": path}, {"files": [], "path": path}):
        facts = load_facts(given)
        assert facts.path == path
        assert [(t.name, t.nbytes) for t in facts.tensors] == [(t.name, t.nbytes) for t in from_path.tensors]
    info, _warnings = describe(read_model(path), "none")
    assert load_facts(dict(info["model"], files=[])).path == "gguf.model"
    with pytest.raises(PlanError) as error:
        load_facts({"files": [], "size": 1})
    assert str(error.value) == "gguf is a dict without files or model: pass a path or the registered result of gguf_info"
    with pytest.raises(PlanError) as error:
        load_facts({"path": str(tmp_path / "missing.gguf")})
    assert str(error.value) == "%s: at byte 0: cannot open: %s" % (tmp_path / "missing.gguf", os.strerror(2))


def test_dense_model_plain_words_and_the_largest_context(dense):
    fits = plan(dense, [gpu(2000, 0)], None, Options(4096, 2, margin_mib=256))
    reason = fits["reason"]
    assert fits["offload"] is False and fits["pattern"] == "" and fits["device_overrides"] == []
    assert "expert" not in reason and "recurrent" not in reason
    assert reason.startswith("Everything fits on GPU0 (2000 MiB free): the weights, the KV cache for 4096 tokens "
                             "and the compute buffer need ")
    here = fits["headroom"]["this_plan"]
    assert here == {"max_ctx_size": 4096, "max_parallel": 256, "ctx_size_capped_at": 4096}
    assert reason.endswith("The whole context searched (4096 tokens, the training context) fits with 2 slot(s), and "
                           "256 slots or more at this context. Host memory was not checked (give host, the result of "
                           "host_info).")
    tight = plan(dense, [gpu(272, 0)], None, Options(1024, 2, margin_mib=256))
    here = tight["headroom"]["this_plan"]
    assert "At most %d tokens of context fit with 2 slot(s), and at most %d slot(s) at this context." % (
        here["max_ctx_size"], here["max_parallel"]) in tight["reason"]
    assert 1024 <= here["max_ctx_size"] < 4096 and 2 <= here["max_parallel"] < 256
    with pytest.raises(PlanError) as info:
        plan(dense, [gpu(300, 0)], None, Options(32768, 1, margin_mib=256))
    message = str(info.value)
    assert "expert" not in message and "recurrent" not in message
    assert re.search(r"Does not fit on GPU0 \(300 MiB free\): the weights, the KV cache for 32768 tokens and the "
                     r"compute buffer need \d+ MiB and \d+ MiB are missing on GPU0\. Lower ctx_size \(at most \d+ "
                     r"fits\)", message)
    with pytest.raises(PlanError, match="no routed experts"):
        plan(dense, [gpu(2000, 0)], None, Options(4096, mode="all"))


def gemma_summary(window_key=True):
    """The model summary gguf_info gives for the real Gemma 3 270M Q4_K_M (shapes and metadata of that file)."""
    md = {"general.architecture": "gemma3", "gemma3.context_length": 32768, "gemma3.embedding_length": 640,
          "gemma3.block_count": 18, "gemma3.feed_forward_length": 2048, "gemma3.attention.head_count": 4,
          "gemma3.attention.key_length": 256, "gemma3.attention.value_length": 256,
          "gemma3.attention.head_count_kv": 1, "tokenizer.ggml.tokens": {"count": 262144}}
    if window_key:
        md["gemma3.attention.sliding_window"] = 512
    tensors = [["token_embd.weight", 8, [640, 262144], 178257920], ["output_norm.weight", 0, [640], 2560]]
    for b in range(18):
        p = "blk.%d." % b
        tensors += [[p + "attn_q.weight", 6, [640, 1024], 450560], [p + "attn_k.weight", 6, [640, 256], 112640],
                    [p + "attn_v.weight", 8, [640, 256], 174080], [p + "attn_output.weight", 12, [1024, 640], 368640],
                    [p + "ffn_gate.weight", 6, [640, 2048], 901120], [p + "ffn_up.weight", 6, [640, 2048], 901120],
                    [p + "ffn_down.weight", 14, [2048, 640], 1075200], [p + "attn_norm.weight", 0, [640], 2560]]
    return {"version": 1, "architecture": "gemma3", "files": ["/srv/models/gemma-3-270m-Q4_K_M.gguf"],
            "metadata": md, "tensors": tensors, "warnings": []}


def test_sliding_window_model_fits_where_the_old_planner_refused():
    """The measured need of Gemma 3 270M at 32768/1 (111 MiB of KV) fits 1800 MiB with the margin."""
    facts = load_facts(gemma_summary())
    result = plan(facts, [gpu(1800, 0)], None, Options(32768, 1))
    assert result["fits"] and result["memory"]["gpus"][0]["kv_mib"] == 111.0
    assert result["kv_cache"] == {"layout": "iswa", "cells": 32768, "streams": 1, "full_blocks": [5, 11, 17],
                                  "swa_blocks": [b for b in range(18) if b not in (5, 11, 17)], "swa_cells": 1024,
                                  "window": 512, "window_kind": "standard", "reused_blocks": [],
                                  "recurrent_blocks": []}
    assert "(15 of its 18 blocks keep a sliding window: 1024 cells per slot)" in result["reason"]
    assert "expert" not in result["reason"]
    # --swa-full: every block keeps the whole context, 18 x 32768 cells x (256 + 256) x 2 bytes = 576 MiB
    full = plan(facts, [gpu(4000, 0)], None, Options(32768, 1, swa_full=True))
    assert full["memory"]["gpus"][0]["kv_mib"] == 576.0


def test_warnings_reach_the_user_on_failure_too():
    facts = load_facts(dict(gemma_summary(), architecture="mygemma", metadata=dict(
        (k.replace("gemma3", "mygemma"), v) for k, v in gemma_summary()["metadata"].items()),
        tensors=gemma_summary()["tensors"]))
    warning = [w for w in facts.warnings if "not known here" in w]
    assert warning
    assert warning[0] in plan(facts, [gpu(4000, 0)], None, Options(32768, 1))["warnings"]
    with pytest.raises(PlanError) as info:
        plan(facts, [gpu(1000, 0)], None, Options(32768, 1))
    assert warning[0] in info.value.details["warnings"]
