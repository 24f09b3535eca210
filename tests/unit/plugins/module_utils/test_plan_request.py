"""moe_offload_plan's options and one planner call (plugins/module_utils/_plan_request.py), which the module runs on
the host and its action plugin on the controller: which models are planned without a file, how cpu_expert_layers
arrives from YAML, and what a refused plan returns."""
from __future__ import annotations

import os

import pytest

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._gguf import read_model
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_report import describe
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_request import (
    ARGUMENT_SPEC,
    FAILURE_KEYS,
    MUTUALLY_EXCLUSIVE,
    model_in_hand,
    run,
)
from tools import gguf_models

A5500 = {"name": "NVIDIA RTX A5500", "memory_total_mib": 24564, "memory_free_mib": 24148}


@pytest.fixture(scope="module")
def nano(tmp_path_factory):
    path = gguf_models.write_nemotron_nano_30b(tmp_path_factory.mktemp("nano"), shards=1)[0]
    return path, describe(read_model(path), "none")[0]


def params(**values):
    """The options as Ansible hands them to the module: validated, with every default."""
    checked = ArgumentSpecValidator(ARGUMENT_SPEC, mutually_exclusive=MUTUALLY_EXCLUSIVE).validate(values)
    assert not checked.error_messages, checked.error_messages
    return checked.validated_parameters


def test_a_gguf_info_result_or_its_model_is_in_hand(nano):
    _path, info = nano
    assert model_in_hand(info) is True and model_in_hand(info["model"]) is True
    assert model_in_hand({"files": info["files"]}) is False  # read from its first file, on the host
    assert model_in_hand(info["files"][0]) is False and model_in_hand(None) is False
    assert model_in_hand({"model": "x"}) is False and model_in_hand({"tensors": []}) is False


def test_the_same_plan_from_the_file_and_from_the_result_without_the_file(nano, tmp_path):
    path, _info = nano
    args = dict(gpus=[A5500], ctx_size=65536, parallel=2, host={"memory_available_mib": 64000})
    from_file, warnings_file = run(params(gguf=path, **args))
    copy = tmp_path / "copy.gguf"
    os.link(path, copy)
    info_of_copy = describe(read_model(str(copy)), "none")[0]
    os.unlink(copy)
    from_result, warnings_result = run(params(gguf=info_of_copy, **args))
    assert "failed" not in from_file and from_file["offload"] is True
    assert from_result == from_file and warnings_result == warnings_file
    assert "warnings" not in from_result


@pytest.mark.parametrize("given, planned", [("3", [1, 3, 6]), (" 5 ", [1, 3, 6, 8, 10]), (["3", 1, "3"], [1, 3]),
                                            (4, [1, 3, 6, 8])])
def test_cpu_expert_layers_as_yaml_gives_it(nano, given, planned):
    """A count takes the first MoE blocks of the Nano (1, 3, 6, 8, 10, ...); a list is sorted and deduplicated."""
    _path, info = nano
    result, _warnings = run(params(gguf=info, gpus=[A5500], ctx_size=8192, mode="layers", cpu_expert_layers=given))
    assert "failed" not in result, result
    assert result["cpu_expert_layers"] == planned


def test_cpu_expert_layers_that_are_not_numbers_are_refused(nano):
    _path, info = nano
    result, warnings = run(params(gguf=info, gpus=[A5500], ctx_size=8192, mode="layers", cpu_expert_layers=["x"]))
    assert result == {"failed": True, "msg": "cpu_expert_layers must be a count or a list of block indices, got "
                                             "['x']"} and warnings == []


def test_a_refused_plan_returns_its_numbers_and_keeps_its_warnings(nano):
    """A context beyond the training context warns (llama.cpp warns too: n_ctx_seq > n_ctx_train); when that plan
    does not fit, the warning still reaches the user beside the refusal and the plan's numbers."""
    _path, info = nano
    small = {"name": "RTX 4060", "memory_total_mib": 8188, "memory_free_mib": 3000}
    result, warnings = run(params(gguf=info, gpus=[small], ctx_size=1048576 * 2, parallel=1))
    assert result["failed"] is True and result["fits"] is False and "MiB are missing" in result["msg"]
    assert set(result) <= set(FAILURE_KEYS) | {"failed", "msg"} and "memory" in result
    assert warnings == ["ctx_size 2097152 is beyond the model's training context of 1048576 tokens"]
    bad, warnings = run(params(gguf={"files": []}, gpus=[A5500], ctx_size=8192))
    assert bad == {"failed": True, "msg": "gguf is a dict without files or model: pass a path or the registered "
                                          "result of gguf_info"} and warnings == []


def test_the_options_refuse_what_the_module_refuses():
    checked = ArgumentSpecValidator(ARGUMENT_SPEC, mutually_exclusive=MUTUALLY_EXCLUSIVE).validate(
        {"gguf": "m.gguf", "gpus": [], "ctx_size": 1, "gpu_index": 0, "gpu_devices": [0]})
    assert any("mutually exclusive" in m for m in checked.error_messages)
    checked = ArgumentSpecValidator(ARGUMENT_SPEC).validate({"gguf": "m.gguf", "gpus": [], "ctx_size": 1,
                                                             "cache_type_k": "q6_k"})
    assert any("cache_type_k" in m for m in checked.error_messages)
    defaults = params(gguf="m.gguf", gpus=[], ctx_size=1)
    assert (defaults["parallel"], defaults["margin_mib"], defaults["host_margin_mib"], defaults["ubatch"]) == (
        1, 1024, 1024, 512)
    assert (defaults["mode"], defaults["flash_attn"], defaults["mmap"], defaults["experts_per_gpu"]) == (
        "auto", "auto", True, True)
