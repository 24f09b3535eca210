"""The gguf_summary_lines filter on gguf_info results of GGUF files written with tools/gguf_models.py.

The expected lines are written out by hand: they are the text that playbooks/inspect.yml printed before the filter
(two Jinja templates, summary and tensor listing), for the same results.
"""
from __future__ import annotations

import json
import re

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.ai_llm.moe_offload.plugins.filter.gguf_summary_lines import FilterModule, gguf_summary_lines
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_inspection import describe
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.model import read_model
from tests.helpers.gguf_files import field_offsets, patch
from tools.gguf_models import write_dense_llama, write_mixtral, write_nemotron_nano_30b


def gguf_info(path, tensors="experts", pattern=None):
    """The result gguf_info registers for ``path`` (its ``describe`` call, through JSON as Ansible passes it)."""
    result, _warnings = describe(read_model(path), tensors, pattern)
    return json.loads(json.dumps(dict(result, changed=False)))


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    """A Mixtral-style MoE (3 blocks of 8 experts, q8_0) whose last expert tensor has an unknown type."""
    path = write_mixtral(tmp_path_factory.mktemp("mixtral") / "mixtral.gguf", n_embd=1024, n_ff_exp=2048)
    patch(path, field_offsets(path)[1]["blk.2.ffn_down_exps.weight"]["type"], "I", 99)  # no ggml knows type 99
    return path


@pytest.fixture(scope="module")
def nano(tmp_path_factory):
    return write_nemotron_nano_30b(tmp_path_factory.mktemp("nano"), shards=6)


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    return write_dense_llama(tmp_path_factory.mktemp("dense") / "dense.gguf", n_blocks=1)


def test_moe_with_a_wrong_pattern_and_a_tensor_of_unknown_size(mixtral):
    result = gguf_info(mixtral, "experts", "ffn_gate")
    assert gguf_summary_lines(result) == [
        "model (1 file, 0.17 GiB): %s" % mixtral,
        "architecture: llama, 3 blocks, 33 tensors (0.15 GiB)",
        "attention layers (3): 0,1,2",
        "recurrent layers (0): -",
        "moe layers (3): 0,1,2",
        "dense_ffn layers (0): -",
        "routed experts: 9 tensors, 0.13 GiB (8 experts, 2 used per token, 0 shared)",
        "GPU weights with experts offloaded: 0.02 GiB (all but experts and token_embd)",
        r"pattern \.ffn_.*_exps\.weight matches 9 tensors: exactly the routed experts",
        "your pattern ffn_gate: wrong: misses 6 of the 9 routed-expert tensors (e.g. blk.0.ffn_down_exps.weight);"
        " also moves 3 non-expert tensor(s): 3 router (e.g. blk.0.ffn_gate_inp.weight)",
        r"LLM_MOE_OFFLOAD_PATTERN=\.ffn_.*_exps\.weight",
    ]
    shapes = {"gate": "1024x2048x8", "up": "1024x2048x8", "down": "2048x1024x8"}
    experts = ["blk.%d.ffn_%s_exps.weight  q8_0  %s  17.0 MiB  routed_experts" % (block, kind, shape)
               for block in range(3) for kind, shape in shapes.items()]
    assert gguf_summary_lines(result, show="experts") == experts[:-1] + [
        "blk.2.ffn_down_exps.weight  unknown(99)  2048x1024x8  size unknown  routed_experts"]


def test_six_shard_nemotron_nano_summary_and_a_pattern_that_moves_more(nano):
    result = gguf_info(nano[2], "none", "exp")
    assert gguf_summary_lines(result) == [
        "model (6 files, 22.83 GiB): %s" % nano[0],
        "architecture: nemotron_h_moe, 52 blocks, 401 tensors (22.82 GiB)",
        "attention layers (6): 5,12,19,26,33,42",
        "recurrent layers (23): 0,2,4,7,9,11,14,16,18,21,23,25,28,30,32,35,37,39,41,44,46,48,50",
        "moe layers (23): 1,3,6,8,10,13,15,17,20,22,24,27,29,31,34,36,38,40,43,45,47,49,51",
        "dense_ffn layers (0): -",
        "routed experts: 46 tensors, 21.26 GiB (128 experts, 6 used per token, 1 shared)",
        "GPU weights with experts offloaded: 1.34 GiB (all but experts and token_embd)",
        r"pattern \.ffn_.*_exps\.weight matches 46 tensors: exactly the routed experts",
        "your pattern exp: wrong: also moves 69 non-expert tensor(s): 23 router, 46 shared experts"
        " (e.g. blk.1.exp_probs_b.bias)",
        r"LLM_MOE_OFFLOAD_PATTERN=\.ffn_.*_exps\.weight",
    ]
    # tensors=none lists no tensor: the playbook skips the listing, the filter says there is none
    assert gguf_summary_lines(result, show="none") == []
    assert gguf_summary_lines(result, show="all") == ["no tensors"]
    assert gguf_summary_lines(result, show="experts") == ["no routed-expert tensors"]


def test_dense_model_has_nothing_to_offload(dense):
    summary = [
        "model (1 file, 0.00 GiB): %s" % dense,
        "architecture: llama, 1 blocks, 12 tensors (0.00 GiB)",
        "attention layers (1): 0",
        "recurrent layers (0): -",
        "moe layers (0): -",
        "dense_ffn layers (1): 0",
        "routed experts: none, nothing to offload (dense model: use -ngl alone)",
    ]
    assert gguf_summary_lines(gguf_info(dense)) == summary + ["LLM_MOE_OFFLOAD_PATTERN="]
    result = gguf_info(dense, "all", "exps")
    assert gguf_summary_lines(result) == summary + [
        "your pattern exps: ok: the model has no routed experts and the pattern moves nothing",
        "LLM_MOE_OFFLOAD_PATTERN=",
    ]
    assert gguf_summary_lines(result, "all") == [
        "token_embd.weight  q8_0  64x512  0.0 MiB  token_embd",
        "blk.0.attn_norm.weight  f32  64  0.0 MiB  norm",
        "blk.0.attn_q.weight  q8_0  64x64  0.0 MiB  attention",
        "blk.0.attn_k.weight  q8_0  64x32  0.0 MiB  attention",
        "blk.0.attn_v.weight  q8_0  64x32  0.0 MiB  attention",
        "blk.0.attn_output.weight  q8_0  64x64  0.0 MiB  attention",
        "blk.0.ffn_norm.weight  f32  64  0.0 MiB  norm",
        "blk.0.ffn_gate.weight  q8_0  64x128  0.0 MiB  dense_ffn",
        "blk.0.ffn_up.weight  q8_0  64x128  0.0 MiB  dense_ffn",
        "blk.0.ffn_down.weight  q8_0  128x64  0.0 MiB  dense_ffn",
        "output_norm.weight  f32  64  0.0 MiB  norm",
        "output.weight  q8_0  64x512  0.0 MiB  output",
    ]


def test_the_registered_module_result_gives_the_same_lines(ansible_module, mixtral):
    """gguf_info run through Ansible: its registered result reads as the describe() result above."""
    registered = ansible_module("gguf_info", {"path": mixtral, "pattern": "ffn_gate"})
    assert registered["failed"] is False
    expected = gguf_info(mixtral, "experts", "ffn_gate")
    for show in ("summary", "experts"):
        assert gguf_summary_lines(registered, show=show) == gguf_summary_lines(expected, show=show)


def test_text_as_the_templates_printed_it(dense):
    """No architecture prints as nothing; the lines are stripped as a whole and a line end in a value splits."""
    result = gguf_info(dense, "all")
    result["architecture"] = None
    result["files"][0] = "/models/a\nb.gguf"
    result["tensors"][0]["name"] = "  token_embd.weight"
    result["tensors"][-1]["class"] = "output "
    summary = gguf_summary_lines(result)
    assert summary[:3] == ["model (1 file, 0.00 GiB): /models/a", "b.gguf",
                           "architecture: , 1 blocks, 12 tensors (0.00 GiB)"]
    lines = gguf_summary_lines(result, "all")
    assert lines[0] == "token_embd.weight  q8_0  64x512  0.0 MiB  token_embd"
    assert lines[-1] == "output.weight  q8_0  64x512  0.0 MiB  output"


@pytest.mark.parametrize("report,show,message", [
    (["not", "a", "dict"], "summary", "expects the registered result of gguf_info (a dict), got list"),
    ({"files": ["/m.gguf"]}, "summary", "the gguf_info result has no 'layer_kinds'"),
    ({"tensors": [{"name": "x"}]}, "experts", "the gguf_info result has no 'type'"),
    ({}, "tensors", "show is 'tensors', not one of summary, none, experts, all"),
])
def test_refusals(report, show, message):
    with pytest.raises(AnsibleFilterError, match="^" + re.escape("gguf_summary_lines: " + message) + "$"):
        gguf_summary_lines(report, show)


def test_filter_is_registered():
    assert FilterModule().filters() == {"gguf_summary_lines": gguf_summary_lines}
