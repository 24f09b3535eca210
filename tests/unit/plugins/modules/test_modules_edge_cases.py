"""Module runs through Ansible itself on edge cases: gguf_info on random layouts and on files that are not models,
moe_offload_plan on bad input (a clear message and never a traceback; warnings where the plan still works)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from tools.gguf_models import write_tiny_qwen3moe

from tests.helpers import gguf_layouts as H

ROOT = Path(__file__).resolve().parents[4]

GPU = {"name": "NVIDIA RTX A5500", "memory_total_mib": 24564, "memory_free_mib": 24148}


def run_with_warnings(module, args):
    """Run a module like ``ansible_module`` and also return the [WARNING] lines Ansible prints on stderr."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".collections"),
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.minimal", ANSIBLE_CALLBACK_RESULT_FORMAT="json",
               ANSIBLE_LOCALHOST_WARNING="0", ANSIBLE_INVENTORY_UNPARSED_WARNING="0")
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local", "-i", "localhost,", "-e",
         "ansible_python_interpreter=" + sys.executable, "-m", "ai_llm.moe_offload." + module, "-a", json.dumps(args)],
        capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=120, check=False)
    match = re.search(r"^localhost \| ([A-Z]+!?) => ", proc.stdout, re.MULTILINE)
    assert match, proc.stdout + proc.stderr
    result = json.JSONDecoder().raw_decode(proc.stdout[match.end():].lstrip())[0]
    result.setdefault("failed", match.group(1).endswith("!"))
    return result, re.findall(r"\[WARNING\]: (.*)", proc.stderr)


def assert_clean_failure(result, *words):
    assert result["failed"] is True, result
    text = json.dumps(result)
    assert "Traceback" not in text and "module_stderr" not in result and "exception" not in result
    assert "Module failed" not in result["msg"]
    for word in words:
        assert word in result["msg"], result["msg"]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return write_tiny_qwen3moe(tmp_path_factory.mktemp("q") / "q.gguf", n_blocks=3, n_embd=128)


@pytest.mark.parametrize("arch, shards, endian", [
    ("qwen3next", 3, "big"), ("gpt-oss", 2, "little"), ("granitehybrid", 4, "big")])
def test_gguf_info_on_other_architectures_shards_and_endianness(ansible_module, tmp_path, arch, shards, endian):
    layout = H.make_layout(arch, 21)
    files = H.write_layout(layout, tmp_path, 21, shards=shards, endian=endian)
    result = ansible_module("gguf_info", {"path": files[1], "tensors": "none"})
    assert result["failed"] is False and result["files"] == files
    assert result["expert_tensors"] == layout.experts
    assert sorted(n for n in layout.names if re.search(result["offload_pattern"], n)) == layout.experts
    assert sum(result["bytes"].values()) == layout.total_bytes


def test_gguf_info_on_a_fifo_and_a_symlink_loop(ansible_module, tmp_path):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    assert_clean_failure(ansible_module("gguf_info", {"path": str(fifo)}), "not a regular file (a FIFO)")
    loop = tmp_path / "loop.gguf"
    os.symlink(loop, loop)
    assert_clean_failure(ansible_module("gguf_info", {"path": str(loop)}), "symlink loop")


@pytest.mark.parametrize("args, words", [
    ({"gpus": "RTX 4090"}, ["gpus must be the registered result of gpu_info or a list"]),
    ({"gpus": [dict(GPU, vram_gb=24)]}, ["unknown field(s) vram_gb"]),
    ({"gpus": [dict(GPU, memory_free_mib="lots")]}, ["memory_free_mib must be a number"]),
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
    full = {"gguf": qwen, "gpus": [GPU], "ctx_size": 4096}
    full.update(args)
    assert_clean_failure(ansible_module("moe_offload_plan", full), *words)


def test_ctx_beyond_training_length_warns_once(qwen):
    result, warnings = run_with_warnings("moe_offload_plan", {"gguf": qwen, "gpus": [GPU], "ctx_size": 100000})
    assert result["failed"] is False and result["fits"] is True
    assert [w for w in warnings if "training context" in w] == [
        "ctx_size 100000 is beyond the model's training context of 4096 tokens"]


def test_gguf_lacking_metadata_falls_back_to_shapes_with_warnings(tmp_path):
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
    result, warnings = run_with_warnings("moe_offload_plan", {"gguf": path, "gpus": [GPU], "ctx_size": 1000,
                                                              "parallel": 3})
    assert result["failed"] is False
    assert result["memory"]["gpus"][0]["kv_mib"] == 0.19  # (32 + 32) x 2 bytes x 3 slots x 512 cells = 196,608
    assert any("embedding_length missing" in w for w in warnings)
    assert any("KV widths of blocks 0 taken from the attn_k/attn_v tensor shapes" in w for w in warnings)


def test_implausible_block_number_fails_cleanly(ansible_module, tmp_path):
    layout = H.make_layout("qwen3moe", 4)
    layout.tensors.append(("blk.4000000000.ffn_up_exps.weight", (256, 256, 2), gguf.GGMLQuantizationType.F16))
    files = H.write_layout(layout, tmp_path, 4, shards=2)
    info = ansible_module("gguf_info", {"path": files[0], "tensors": "none"})
    assert info["failed"] is False and info["block_count"] == 4000000001
    assert_clean_failure(ansible_module("moe_offload_plan", {"gguf": files[0], "gpus": [GPU], "ctx_size": 4096}),
                         "implausible")
