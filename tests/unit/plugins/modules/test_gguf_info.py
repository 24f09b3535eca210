"""The gguf_info module, run through Ansible itself on real GGUF files written with gguf-py: random layouts of
other architectures, split and big-endian, and files that are not models (a clear message, never a traceback)."""
from __future__ import annotations

import os
import re

import pytest

from tests.helpers import gguf_layouts
from tests.helpers.module_runs import assert_clean_failure
from tools.gguf_models import write_tiny_nemotron_h_moe

NANO = r"\.ffn_.*_exps\.weight"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_nemotron_h_moe(tmp_path_factory.mktemp("tiny") / "tiny-nemotron.gguf")


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


@pytest.mark.parametrize("kind, message", [
    ("text", "%s: at byte 0: file of 20 bytes is too short for a GGUF header (24 bytes)"),
    ("missing", "%s: no such file"),
    ("directory", "%s: is a directory, not a .gguf file"),
    ("fifo", "%s: at byte 0: cannot open: not a regular file (a FIFO)"),
    ("loop", "%s: a broken symbolic link or a symlink loop"),
])
def test_paths_that_are_not_models(ansible_module, tmp_path, kind, message):
    path = tmp_path / "model.gguf"
    if kind == "text":
        path.write_text("this is not a model\n")
    elif kind == "directory":
        path = tmp_path
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "loop":
        os.symlink(path, path)
    result = ansible_module("gguf_info", {"path": str(path)})
    assert_clean_failure(result)
    assert result["msg"] == message % path
    if kind in ("text", "fifo"):  # the reader's error: its path, byte and reason come as fields too
        assert "%s: at byte %d: %s" % (result["path"], result["offset"], result["reason"]) == result["msg"]


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
