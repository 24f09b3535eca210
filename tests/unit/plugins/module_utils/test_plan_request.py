"""moe_offload_plan's options and one planner call (plugins/module_utils/_plan_request.py), which the module runs on
the host and its action plugin on the controller."""
from __future__ import annotations

import pytest

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_inspection import describe
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_request import (
    ARGUMENT_SPEC,
    FAILURE_KEYS,
    MUTUALLY_EXCLUSIVE,
    model_in_hand,
    run,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.model import read_model
from tools import gguf_models

A5500 = {"name": "NVIDIA RTX A5500", "memory_total_mib": 24564, "memory_free_mib": 24148}


@pytest.fixture(scope="module")
def nano(tmp_path_factory):
    """gguf_info's result for the generated Nemotron Nano in one file."""
    return describe(read_model(gguf_models.write_nemotron_nano_30b(tmp_path_factory.mktemp("nano"), shards=1)[0]),
                    "none")[0]


def params(**values):
    """The options as Ansible hands them to the module: validated, with every default."""
    checked = ArgumentSpecValidator(ARGUMENT_SPEC, mutually_exclusive=MUTUALLY_EXCLUSIVE).validate(values)
    assert not checked.error_messages, checked.error_messages
    return checked.validated_parameters


def test_a_gguf_info_result_or_its_model_is_in_hand(nano):
    assert model_in_hand(nano) is True and model_in_hand(nano["model"]) is True
    assert model_in_hand({"files": nano["files"]}) is False  # read from its first file, on the host
    assert model_in_hand(nano["files"][0]) is False and model_in_hand(None) is False
    assert model_in_hand({"model": "x"}) is False and model_in_hand({"tensors": []}) is False


@pytest.mark.parametrize("given, planned", [("3", [1, 3, 6]), (" 5 ", [1, 3, 6, 8, 10]), (["3", 1, "3"], [1, 3]),
                                            (4, [1, 3, 6, 8])])
def test_cpu_expert_layers_as_yaml_gives_it(nano, given, planned):
    """A count takes the first MoE blocks of the Nano (1, 3, 6, 8, 10, ...); a list is sorted and deduplicated."""
    result, warnings = run(params(gguf=nano, gpus=[A5500], ctx_size=8192, mode="layers", cpu_expert_layers=given))
    assert "failed" not in result, result
    assert result["cpu_expert_layers"] == planned
    assert "warnings" not in result and warnings == []


@pytest.mark.parametrize("args, message", [
    (dict(mode="layers", cpu_expert_layers=["x"]),
     "cpu_expert_layers must be a count or a list of block indices, got ['x']"),
    (dict(gguf={"files": []}),
     "gguf is a dict without files or model: pass a path or the registered result of gguf_info"),
])
def test_input_that_cannot_be_planned_fails_with_its_message_alone(nano, args, message):
    result, warnings = run(params(**dict(dict(gguf=nano, gpus=[A5500], ctx_size=8192), **args)))
    assert result == {"failed": True, "msg": message} and warnings == []


def test_a_refused_plan_returns_its_numbers_and_keeps_its_warnings(nano):
    """A context beyond the training context warns (llama.cpp warns too: n_ctx_seq > n_ctx_train); when that plan
    does not fit, the warning still reaches the user beside the refusal and the plan's numbers."""
    small = {"name": "RTX 4060", "memory_total_mib": 8188, "memory_free_mib": 3000}
    result, warnings = run(params(gguf=nano, gpus=[small], ctx_size=1048576 * 2, parallel=1))
    assert result["failed"] is True and result["fits"] is False and "MiB are missing" in result["msg"]
    assert set(result) <= set(FAILURE_KEYS) | {"failed", "msg"} and "memory" in result
    assert warnings == ["ctx_size 2097152 is beyond the model's training context of 1048576 tokens"]


def test_the_options_refuse_what_the_module_refuses():
    validator = ArgumentSpecValidator(ARGUMENT_SPEC, mutually_exclusive=MUTUALLY_EXCLUSIVE)
    for extra, words in [(dict(gpu_index=0, gpu_devices=[0]), "mutually exclusive"),
                         (dict(cache_type_k="q6_k"), "cache_type_k")]:
        checked = validator.validate(dict(gguf="m.gguf", gpus=[], ctx_size=1, **extra))
        assert any(words in m for m in checked.error_messages)
    defaults = dict(parallel=1, margin_mib=1024, host_margin_mib=1024, ubatch=512, mode="auto", flash_attn="auto",
                    mmap=True, experts_per_gpu=True)
    given = params(gguf="m.gguf", gpus=[], ctx_size=1)
    assert dict((k, given[k]) for k in defaults) == defaults


def test_the_plan_takes_the_cuda_context_off_the_free_memory_and_a_stored_measurement_wins(nano):
    """Without a measurement the A5500 (not in _cuda_context's table) counts the assumed 555 MiB: 24148 - 555 =
    23593 MiB free for the buffers and the margin. A measurement of that card (its uuid) replaces the figure."""
    gpus = {"gpus": [dict(A5500, index=0, uuid="GPU-8d4f")], "topology": "single"}
    assumed, _w = run(params(gguf=nano, gpus=gpus, ctx_size=4096))
    assert assumed["memory"]["gpus"][0]["free_mib"] == 23593
    assert [(d["cuda_context_mib"], d["cuda_context_source"]) for d in assumed["devices"]] == [(555, "assumed")]
    stored = [{"index": 0, "uuid": "GPU-8d4f", "name": "NVIDIA RTX A5500", "context_mib": 300}]
    measured, _w = run(params(gguf=nano, gpus=gpus, ctx_size=4096, cuda_context=stored))
    assert measured["memory"]["gpus"][0]["free_mib"] == 24148 - 300
    assert [(d["cuda_context_mib"], d["cuda_context_source"]) for d in measured["devices"]] == [(300, "measured")]
    # the same buffers, 255 MiB more room after them
    assert measured["memory"]["gpus"][0]["free_after_mib"] - assumed["memory"]["gpus"][0]["free_after_mib"] == 255
    # a measurement of another card is not this one's
    other, _w = run(params(gguf=nano, gpus=gpus, ctx_size=4096, cuda_context=[dict(stored[0], uuid="GPU-else")]))
    assert other["devices"][0]["cuda_context_source"] == "assumed"
    wrong, _w = run(params(gguf=nano, gpus=gpus, ctx_size=4096, cuda_context=[{"name": "NVIDIA RTX A5500"}]))
    assert wrong["failed"] and wrong["msg"] == "cuda_context[0].context_mib must be a number of MiB >= 0, got None"
