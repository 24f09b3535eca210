"""The gguf_info module, run through Ansible itself on real GGUF files written with gguf-py: random layouts of
other architectures, split and big-endian, and files that are not models (a clear message, never a traceback)."""
from __future__ import annotations

import os
import re

import gguf
import numpy as np
import pytest

from tests.helpers import gguf_layouts
from tests.helpers.module_runs import assert_clean_failure
from tools.gguf_models import write_model, write_nemotron_nano_30b, write_tiny_nemotron_h_moe

NANO = r"\.ffn_.*_exps\.weight"


def write_names(path, arch, names):
    """A small GGUF whose tensors have the given names (4x4 f32 each, 4x4x2 for experts)."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1 + max([int(n.split(".")[1]) for n in names if n.startswith("blk.")] or [-1]))
    for name in names:
        shape = (2, 4, 4) if "_exps" in name else (4, 4)
        writer.add_tensor(name, np.zeros(shape, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_nemotron_h_moe(tmp_path_factory.mktemp("tiny") / "tiny-nemotron.gguf")


@pytest.fixture(scope="module")
def nano(tmp_path_factory):
    return write_nemotron_nano_30b(tmp_path_factory.mktemp("nano"), shards=6)


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    return write_model("dense_llama", tmp_path_factory.mktemp("dense") / "dense.gguf")


def test_tiny_nemotron(ansible_module, tiny):
    result = ansible_module("gguf_info", {"path": tiny})
    assert result["failed"] is False and result["changed"] is False
    assert result["architecture"] == "nemotron_h_moe"
    assert result["files"] == [tiny]
    assert result["offload_pattern"] == NANO
    assert result["offload_pattern_matches"] == result["expert_tensors"]
    assert result["expert_tensors"] and all(re.search(NANO, n) for n in result["expert_tensors"])
    assert sum(result["bytes"].values()) == result["tensor_bytes"]
    # the default tensors=experts lists exactly the routed experts
    assert sorted(t["name"] for t in result["tensors"]) == result["expert_tensors"]
    assert {t["class"] for t in result["tensors"]} == {"routed_experts"}
    assert "pattern_check" not in result
    kinds = result["layer_kinds"]
    assert set(kinds) == {"attention", "recurrent", "moe", "dense_ffn"}
    assert kinds["moe"] and kinds["recurrent"] and kinds["attention"]
    assert result["block_count"] == len(set(kinds["moe"]) | set(kinds["recurrent"]) | set(kinds["attention"]))


def test_check_mode_gives_the_same_result(ansible_module, tiny):
    normal = ansible_module("gguf_info", {"path": tiny, "tensors": "none"})
    checked = ansible_module("gguf_info", {"path": tiny, "tensors": "none"}, check=True)
    assert checked["failed"] is False and checked["changed"] is False
    for key in ("offload_pattern", "expert_tensors", "layer_kinds", "bytes", "tensor_count"):
        assert checked[key] == normal[key]
    assert "tensors" not in checked


def test_tensors_all_lists_every_tensor(ansible_module, tiny):
    result = ansible_module("gguf_info", {"path": tiny, "tensors": "all"})
    assert len(result["tensors"]) == result["tensor_count"]
    first = result["tensors"][0]
    assert set(first) == {"name", "type", "shape", "bytes", "class", "block", "file"}
    assert sum(t["bytes"] for t in result["tensors"]) == result["tensor_bytes"]
    by_name = {t["name"]: t for t in result["tensors"]}
    assert by_name["token_embd.weight"]["class"] == "token_embd" and by_name["token_embd.weight"]["block"] is None
    assert by_name["blk.1.ffn_gate_inp.weight"]["class"] == "router"
    assert by_name["blk.1.ffn_up_exps.weight"]["block"] == 1
    assert by_name["blk.1.ffn_up_exps.weight"]["type"] == "f32"


def test_pattern_check_good(ansible_module, tiny):
    result = ansible_module("gguf_info", {"path": tiny, "tensors": "none", "pattern": NANO})
    check = result["pattern_check"]
    assert check["ok"] is True and check["missed"] == [] and check["non_expert"] == []
    assert check["matched"] == result["expert_tensors"]


@pytest.mark.parametrize("pattern, classes, verdict", [
    ("exp", {"shared_experts", "router"}, "wrong"),
    ("ffn_", {"shared_experts", "router"}, "wrong"),
    (r"\.ffn_.*_exps\.weight=CPU", set(), "unusable"),
    ("ffn_(up", set(), "unusable"),
])
def test_pattern_check_bad(ansible_module, tiny, pattern, classes, verdict):
    result = ansible_module("gguf_info", {"path": tiny, "tensors": "none", "pattern": pattern})
    assert result["failed"] is False
    check = result["pattern_check"]
    assert check["ok"] is False
    assert check["verdict"].startswith(verdict)
    assert {item["class"] for item in check["non_expert"]} == classes


def test_dense_model_has_nothing_to_offload(ansible_module, dense):
    result = ansible_module("gguf_info", {"path": dense})
    assert result["failed"] is False
    assert result["offload_pattern"] == "" and result["offload_pattern_matches"] == []
    assert result["expert_tensors"] == [] and result["tensors"] == []
    assert "nothing to offload" in result["msg"]
    assert result["layer_kinds"] == {"attention": [0, 1], "recurrent": [], "moe": [], "dense_ffn": [0, 1]}
    assert result["bytes"]["routed_experts"] == 0 and result["expert_count"] == 0


def test_six_shard_nemotron_nano_header(ansible_module, nano):
    result = ansible_module("gguf_info", {"path": nano[2], "tensors": "none"})
    assert result["failed"] is False
    assert result["files"] == nano
    assert result["tensor_count"] == 401 and result["block_count"] == 52
    assert len(result["expert_tensors"]) == 46
    assert result["offload_pattern"] == NANO and len(result["offload_pattern_matches"]) == 46
    assert [len(result["layer_kinds"][k]) for k in ("recurrent", "moe", "attention")] == [23, 23, 6]
    assert result["layer_kinds"]["attention"] == [5, 12, 19, 26, 33, 42]
    assert (result["expert_count"], result["expert_used_count"], result["expert_shared_count"]) == (128, 6, 1)
    mib = 1024 ** 2
    # reference: routed experts about 21,772 MiB, the rest about 1,600 MiB
    assert abs(result["bytes"]["routed_experts"] / mib - 21772) < 50
    assert abs((result["tensor_bytes"] - result["bytes"]["routed_experts"]) / mib - 1600) < 50
    assert result["file_bytes"] > result["tensor_bytes"]


def test_malformed_file_fails_with_file_offset_and_reason(ansible_module, tiny, tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(open(tiny, "rb").read()[:200])
    result = ansible_module("gguf_info", {"path": str(broken)})
    assert_clean_failure(result)
    assert re.match(r"^%s: at byte [0-9]+: " % re.escape(str(broken)), result["msg"]), result["msg"]
    assert result["path"] == str(broken) and isinstance(result["offset"], int) and result["reason"]


def test_not_a_gguf_file(ansible_module, tmp_path):
    text = tmp_path / "model.gguf"
    text.write_text("this is not a model\n")
    result = ansible_module("gguf_info", {"path": str(text)})
    assert_clean_failure(result)
    assert str(text) in result["msg"] and "at byte 0" in result["msg"]


def test_missing_file_and_directory(ansible_module, tmp_path):
    result = ansible_module("gguf_info", {"path": str(tmp_path / "nope.gguf")})
    assert_clean_failure(result)
    assert result["msg"] == "%s: no such file" % (tmp_path / "nope.gguf")
    result = ansible_module("gguf_info", {"path": str(tmp_path)})
    assert_clean_failure(result)
    assert "is a directory" in result["msg"]


def test_unknown_moe_architecture_following_the_conventions(ansible_module, tmp_path):
    names = ["token_embd.weight", "output.weight"] + [
        "blk.%d.%s" % (i, s) for i in range(12)
        for s in ("attn_q.weight", "ffn_gate_inp.weight", "ffn_gate_up_exps.weight", "ffn_gate_up_exps.bias",
                  "ffn_down_chexps.weight", "ffn_up_shexp.weight")]
    path = write_names(tmp_path / "brand-new.gguf", "brand_new_moe", names)
    result = ansible_module("gguf_info", {"path": path, "tensors": "none"})
    assert len(result["expert_tensors"]) == 36
    assert result["offload_pattern_matches"] == result["expert_tensors"]
    assert result["expert_count"] == 2 and result["expert_shared_count"] == 1
    assert result["layer_kinds"]["moe"] == list(range(12))


@pytest.mark.parametrize("kind, pattern", [
    ("qwen3moe", NANO),
    ("deepseek2", NANO),
    ("gpt-oss", r"\.ffn_.*_exps\."),
    ("chexps", r"\.ffn_.*_(ch)?exps\.weight"),
])
def test_other_architectures(ansible_module, tmp_path, kind, pattern):
    path = write_model(kind, tmp_path / (kind + ".gguf"), endian="big")
    result = ansible_module("gguf_info", {"path": path})
    assert result["failed"] is False
    assert result["offload_pattern"] == pattern
    assert result["offload_pattern_matches"] == result["expert_tensors"]
    assert sorted(t["name"] for t in result["tensors"]) == result["expert_tensors"]
    if kind == "gpt-oss":
        assert {t["type"] for t in result["tensors"] if t["name"].endswith(".weight")} == {"mxfp4"}
        assert any(t["name"].endswith(".bias") for t in result["tensors"])


@pytest.mark.parametrize("arch, shards, endian", [
    ("qwen3next", 3, "big"), ("gpt-oss", 2, "little"), ("granitehybrid", 4, "big")])
def test_gguf_info_on_other_architectures_shards_and_endianness(ansible_module, tmp_path, arch, shards, endian):
    layout = gguf_layouts.make_layout(arch, 21)
    files = gguf_layouts.write_layout(layout, tmp_path, 21, shards=shards, endian=endian)
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


def test_an_implausible_block_number_is_reported(ansible_module, tmp_path):
    layout = gguf_layouts.make_layout("qwen3moe", 4)
    layout.tensors.append(("blk.4000000000.ffn_up_exps.weight", (256, 256, 2), gguf.GGMLQuantizationType.F16))
    files = gguf_layouts.write_layout(layout, tmp_path, 4, shards=2)
    info = ansible_module("gguf_info", {"path": files[0], "tensors": "none"})
    assert info["failed"] is False and info["block_count"] == 4000000001
