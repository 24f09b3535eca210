"""What gguf_info reports for a path (plugins/module_utils/_model_inspection.report), which llm_server_service_info
runs in the same call: the same result as the model read and described, and one message per way a path is not a
readable model (the file named)."""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_inspection import ReportError, describe, report
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.error import GGUFError
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.model import read_model
from tools.gguf_models import write_demo_model


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return write_demo_model(str(tmp_path_factory.mktemp("m") / "demo.gguf"))


@pytest.mark.parametrize("tensors", ["none", "experts", "all"])
def test_the_report_of_a_path_is_the_description_of_its_model(demo, tensors):
    assert report(demo, tensors) == describe(read_model(demo), tensors)
    assert ("tensors" in report(demo, tensors)[0]) is (tensors != "none")
    assert report(demo) == report(demo, "experts")  # what gguf_info's tensors option defaults to


def test_a_tensor_row_names_its_block_and_its_file(demo):
    assert report(demo)[0]["tensors"][0] == {"name": "blk.1.ffn_up_exps.weight", "type": "f32", "shape": [256, 128, 8],
                                             "bytes": 1048576, "block": 1, "file": demo, "class": "routed_experts"}


def test_a_users_pattern_is_checked(demo):
    result, _warnings = report(demo, "none", r"blk\.1\.ffn_(up|down)_exps\.weight$")
    assert result["pattern_check"]["matched"] == ["blk.1.ffn_down_exps.weight", "blk.1.ffn_up_exps.weight"]
    assert "pattern_check" not in report(demo, "none")[0]


def test_paths_that_are_not_models(tmp_path):
    (tmp_path / "gone.gguf").symlink_to(tmp_path / "nowhere.gguf")
    (tmp_path / "loop.gguf").symlink_to(tmp_path / "loop.gguf")
    broken = "a broken symbolic link or a symlink loop"
    for path, words in ((tmp_path / "none.gguf", "no such file"), (tmp_path, "is a directory, not a .gguf file"),
                        (tmp_path / "gone.gguf", broken), (tmp_path / "loop.gguf", broken)):
        with pytest.raises(ReportError) as failed:
            report(str(path))
        assert str(failed.value) == "%s: %s" % (path, words) and failed.value.fields == {}


def test_a_malformed_file_names_the_byte(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00")
    with pytest.raises(GGUFError) as direct:
        read_model(str(bad))
    with pytest.raises(ReportError) as failed:
        report(str(bad))
    assert str(failed.value) == str(direct.value)
    assert failed.value.fields == {"path": direct.value.path, "offset": direct.value.offset,
                                   "reason": direct.value.reason}
