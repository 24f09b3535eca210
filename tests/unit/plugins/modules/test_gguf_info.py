"""The gguf_info module, run through Ansible itself on a real GGUF file written with gguf-py, and on files that are
not models (a clear message, never a traceback)."""
from __future__ import annotations

import re

import pytest

from tests.helpers.module_runs import assert_clean_failure
from tools.gguf_models import write_tiny_nemotron_h_moe

NANO = r"\.ffn_.*_exps\.weight"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_nemotron_h_moe(tmp_path_factory.mktemp("tiny") / "tiny-nemotron.gguf")


def test_tiny_nemotron_with_the_default_tensors_all_of_them_and_in_check_mode(ansible_module, tiny):
    result = ansible_module("gguf_info", {"path": tiny})
    assert result["failed"] is False and result["changed"] is False
    assert result["architecture"] == "nemotron_h_moe"
    assert result["files"] == [tiny]
    assert result["offload_pattern"] == NANO
    assert result["expert_tensors"] and all(re.search(NANO, n) for n in result["expert_tensors"])
    # the default tensors=experts lists exactly the routed experts
    assert sorted(t["name"] for t in result["tensors"]) == result["expert_tensors"]
    assert {t["class"] for t in result["tensors"]} == {"routed_experts"}
    assert "pattern_check" not in result
    # tensors=all lists every tensor, and check mode returns the same
    result = ansible_module("gguf_info", {"path": tiny, "tensors": "all"})
    checked = ansible_module("gguf_info", {"path": tiny, "tensors": "all"}, check=True)
    assert checked["failed"] is False and checked["changed"] is False
    for key in ("offload_pattern", "expert_tensors", "layer_kinds", "bytes", "tensor_count", "tensors"):
        assert checked[key] == result[key]
    assert len(result["tensors"]) == result["tensor_count"]


def test_pattern_check(ansible_module, tiny):
    """The verdicts themselves are check_pattern's (test_pattern_check.py)."""
    result = ansible_module("gguf_info", {"path": tiny, "tensors": "none", "pattern": "exp"})
    assert result["failed"] is False
    check = result["pattern_check"]
    assert check["ok"] is False
    assert check["verdict"].startswith("wrong: ")
    assert {item["class"] for item in check["non_expert"]} == {"shared_experts", "router"}


@pytest.mark.parametrize("kind, message", [
    ("text", "%s: at byte 0: file of 20 bytes is too short for a GGUF header (24 bytes)"),
    ("directory", "%s: is a directory, not a .gguf file"),
])
def test_paths_that_are_not_models(ansible_module, tmp_path, kind, message):
    path = tmp_path / "model.gguf"
    if kind == "text":
        path.write_text("this is not a model\n")
    else:
        path = tmp_path
    result = ansible_module("gguf_info", {"path": str(path)})
    assert_clean_failure(result)
    assert result["msg"] == message % path
    if kind == "text":  # the reader's error: its path, byte and reason come as fields too
        assert "%s: at byte %d: %s" % (result["path"], result["offset"], result["reason"]) == result["msg"]
