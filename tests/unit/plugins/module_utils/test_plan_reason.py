"""The plan in words (``_plan_reason``)."""
from __future__ import annotations

from collections import namedtuple

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _plan_reason as prs
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_plan import plan
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import Options
from tests.helpers.memory_models import MIB
from tests.helpers.plans import SIZING, cuda_gpu, exact_moe, gpu, need, refusal


def speed_sentence(result):
    """The sentence that closes the reason of a plan that fits: the figures of ``result["speed"]`` (derived in
    test_speed_model) in words."""
    speed = result["speed"]
    return (" Predicted speed: %.1f tokens/s decode, %.0f tokens/s prompt (not calibrated; at a full slot of %d "
            "tokens; speed.from has the terms)." % (speed["decode_tokens_per_second"],
                                                    speed["prompt_tokens_per_second"], speed["terms"]["context_tokens"]))


def test_a_plan_that_does_not_fit_names_what_to_lower_the_split_and_the_gpu_most_short(nano, moe):
    """262144 tokens for 4 slots on a 4 GiB card, short even with every expert on the host: a model with recurrent
    state can lower parallel, and CUDA's op offload reserves the room of the largest host-resident block's experts."""
    error = refusal(nano, [cuda_gpu(4096)], None, Options(262144, 4))
    details = error.details
    (short,) = details["memory"]["gpus"]
    assert details["fits"] is False and short["free_after_mib"] < 0
    assert str(error) == (
        "Does not fit on GPU0 (4096 MiB free): with the experts of 23 block(s) on CPU the plan needs %.0f MiB and "
        "%.0f MiB are missing on GPU0. Lower ctx_size (at most %d fits with all experts on CPU), parallel, "
        "cache_type_k/cache_type_v (q8_0 halves the KV cache), margin_mib, ubatch, op_offload (false, with "
        "llama-server --no-op-offload, frees the %.0f MiB the GPU reserves to compute on host-resident experts, at "
        "the cost of slower prompt processing), or use a larger GPU." % (
            short["total_mib"], -short["free_after_mib"], details["headroom"]["all_experts_on_cpu"]["max_ctx_size"],
            max(nano.expert_bytes_by_block().values()) / MIB))
    # The split is each card's share of the free memory (3 : 2); both cards are short, the missing MiB are those of the
    # card most short; the largest context that fits with every expert on the host is named.
    error = refusal(moe, [gpu(3, 0), gpu(2, 1)], None, Options(4096, split="auto", **SIZING))
    gpus = error.details["memory"]["gpus"]
    worst = min(gpus, key=lambda g: g["free_after_mib"])
    assert max(g["free_after_mib"] for g in gpus) < 0 and len(set(g["free_after_mib"] for g in gpus)) == 2
    assert str(error) == (
        "Does not fit on GPU0 (3 MiB free) + GPU1 (2 MiB free), split 0.6,0.4: with the experts of 3 block(s) on CPU "
        "the plan needs %.0f MiB and %.0f MiB are missing on %s. Lower ctx_size (at most %d fits with all experts "
        "on CPU), cache_type_k/cache_type_v (q8_0 halves the KV cache), margin_mib, ubatch, or use a larger GPU." % (
            sum(g["total_mib"] for g in gpus), -worst["free_after_mib"], worst["name"],
            error.details["headroom"]["all_experts_on_cpu"]["max_ctx_size"]))


def test_the_reason_names_what_moves_and_stays_on_an_a5500_and_what_a_host_without_gpu_keeps(nano, moe):
    """The A5500 (24148 MiB free) at 32K with two slots: the experts of two blocks go to host memory, the Nano's
    recurrent (Mamba) tensors stay on the GPU with its attention."""
    result = plan(nano, [cuda_gpu(24148)], None, Options(32768, 2))
    used, here = result["memory"]["gpus"][0], result["headroom"]["this_plan"]
    assert result["reason"] == (
        "The routed experts of 2 of the 23 MoE blocks (1, 3) go to host memory: everything on the GPU would need "
        "%.0f MiB, more than GPU0 (24148 MiB free) offers. With this plan the GPU side needs %.0f MiB (%.0f MiB "
        "saved); every attention, recurrent, router and shared-expert tensor stays on the GPU, and %.0f MiB of "
        "weights are read from host memory, in the page cache of the model file (mmap). At most %d tokens of context "
        "fit with 2 slot(s), and at most %d slot(s) at this context. Host memory was not checked (give host, the "
        "result of host_info)." % (
            used["total_mib"] + result["vram_saved_mib"], used["total_mib"], result["vram_saved_mib"],
            result["memory"]["host"]["model_mib"], here["max_ctx_size"], here["max_parallel"]) + speed_sentence(result))
    result = plan(moe, [], {"memory_available_mib": 100000}, Options(4096, **SIZING))
    host = result["memory"]["host"]
    assert result["reason"].startswith(
        "No GPU: llama-server computes on the CPU and keeps everything in host memory: the weights, the KV cache for "
        "4096 tokens and the compute buffer need %.0f MiB with the 1024 MiB margin (100000 MiB available). The "
        "whole context" % host["total_mib"])


@pytest.mark.parametrize("text_of, given, text", [
    (prs.split_text, [3, 1], "0.75,0.25"), (prs.split_text, [1, 1, 1], "0.333,0.333,0.333"),
    (prs.split_text, [0, 2], "0,1"), (prs.split_text, [2, 0], "1,0"), (prs.split_text, [24148, 15746], "0.605,0.395"),
    (prs.blocks_text, [], "none"), (prs.blocks_text, [1, 3], "1, 3")])
def test_split_text_is_each_share_of_the_whole_and_blocks_text_lists_the_blocks(text_of, given, text):
    assert text_of(given) == text


def test_the_reason_of_mode_all_or_of_a_given_pattern_names_what_moves_the_card_and_the_saving(moe):
    result = plan(moe, [gpu(need(moe, []) / MIB)], None, Options(4096, mode="all", **SIZING))
    used, here = result["memory"]["gpus"][0], result["headroom"]["this_plan"]
    assert result["reason"] == (
        "All routed experts (3 MoE blocks) go to host memory: as mode all asks, on GPU0 (8 MiB free). With this "
        "plan the GPU side needs %.0f MiB (%.0f MiB saved); every attention, router and shared-expert tensor stays "
        "on the GPU, and %.0f MiB of weights are read from host memory, in the page cache of the model file (mmap). "
        "The whole context searched (4096 tokens, the training context) fits with 1 slot(s), and at most %d slot(s) "
        "at this context. Host memory was not checked (give host, the result of host_info)." % (
            used["total_mib"], result["vram_saved_mib"], result["memory"]["host"]["model_mib"], here["max_parallel"])
        + speed_sentence(result))
    # ``output\.weight`` moves output.weight and every attn_output.weight (a search, as llama.cpp's std::regex_search),
    # no expert: the head counts those tensors and gives the check's verdict.
    result = plan(moe, [gpu(need(moe, []) / MIB)], None, Options(4096, pattern=r"output\.weight", **SIZING))
    check = result["pattern_check"]
    assert result["cpu_expert_layers"] == [] and check["matched"] == 0 and len(check["non_expert"]) == 5
    assert result["reason"].startswith("The given pattern moves 5 tensor(s) to host memory (%s): as the given "
                                       "pattern asks, on GPU0 (8 MiB free)." % check["verdict"])


@pytest.mark.parametrize("mode", [dict(), dict(mode="layers", cpu_expert_layers=3)])
def test_a_gpu_too_small_for_any_context_names_ctx_size_without_a_figure(moe, mode):
    """No context fits 1 MiB; CUDA with op offload reserves the room of the largest host-resident block's experts
    (up and down, 64 x 64 x 8 F32 each: 0.25 MiB), which --no-op-offload frees; mode layers that moves every block
    is not told to lower mode."""
    error = refusal(moe, [gpu(1)], None, Options(4096, backend="cuda", margin_mib=0, op_offload=True, **mode))
    assert error.details["headroom"]["all_experts_on_cpu"]["max_ctx_size"] == 0
    assert str(error).endswith(
        "Lower ctx_size, cache_type_k/cache_type_v (q8_0 halves the KV cache), margin_mib, ubatch, op_offload "
        "(false, with llama-server --no-op-offload, frees the %.0f MiB the GPU reserves to compute on host-resident "
        "experts, at the cost of slower prompt processing), or use a larger GPU." % (2 * 64 * 64 * 8 * 4 / MIB))


@pytest.mark.parametrize("model, gpus, available, mode, parts, advice", [
    ("nano", [], 16000, "auto", "{weights} MiB of weights, {state} MiB of KV cache and recurrent state",
     "lower ctx_size or parallel."),
    ("moe", [gpu(100)], 1000, "all", "{weights} MiB of weights",
     "keep more of the model on the GPUs (mode auto, a larger GPU, a smaller ctx_size)."),
    ("moe", [gpu(100)], 1000, "auto", "{weights} MiB of weights",
     "keep more of the model on the GPUs (a larger GPU, a smaller ctx_size)."),
])
def test_a_short_host_names_the_parts_it_keeps_and_what_to_change(request, model, gpus, available, mode, parts, advice):
    """The caches are a host part only on a CPU host (a GPU keeps them otherwise); mode auto is advised only where
    another mode was asked."""
    error = refusal(request.getfixturevalue(model), gpus, {"memory_available_mib": available},
                    Options(4096, mode=mode, **SIZING))
    host = error.details["memory"]["host"]
    assert error.details["fits"] is False
    figures = {"weights": "%.0f" % host["model_mib"], "state": "%.0f" % (host["kv_mib"] + host["recurrent_mib"])}
    assert str(error) == (
        "The host cannot hold its part: %s, %.0f MiB of compute and output buffers and the 1024 MiB host margin need "
        "%.0f MiB, but %d MiB are available (MemAvailable), so %.0f MiB are missing. Free host memory, or %s" % (
            parts.format(**figures), host["compute_mib"] + host["output_mib"], host["total_mib"], available,
            -host["free_after_mib"], advice))


@pytest.mark.parametrize("kv, recurrent, text", [
    ({"full_blocks": [], "swa_blocks": []}, {0: (1, 1)},
     "the weights, the recurrent state of 2 slot(s) and the compute buffer"),
    ({"full_blocks": [1], "swa_blocks": []}, {},
     "the weights, the KV cache for 8192 tokens and the compute buffer"),
    ({"full_blocks": [], "swa_blocks": [0, 2], "window_kind": "sliding", "swa_cells": 4352}, {},
     "the weights, the KV cache for 8192 tokens (2 of its 2 blocks keep a sliding window: 4352 cells per slot) and "
     "the compute buffer"),
    ({"full_blocks": [3], "swa_blocks": [0, 1, 2], "window_kind": "chunked", "swa_cells": 8192}, {0: (1, 1)},
     "the weights, the KV cache for 8192 tokens (3 of its 4 blocks keep a chunked window: 8192 cells per slot), the "
     "recurrent state of 2 slot(s) and the compute buffer"),
])
def test_the_plan_says_what_it_counts_and_names_only_what_the_model_has(kv, recurrent, text):
    """A cache of sliding-window blocks only (gemma-style), or of chunked-attention blocks (llama4's
    n_chunk_attention), is named with its window; a model without attention has no KV cache to name."""
    facts = namedtuple("Facts", "recurrent_blocks")(recurrent)
    assert prs._contents(facts, {"kv_cache": kv, "n_ctx": 8192}, 2) == text  # pylint: disable=protected-access


def test_a_dense_model_in_plain_words_with_the_largest_context():
    """No expert and no recurrent state to name: what fits, the largest context and slot count, what is short."""
    dense = exact_moe("DD")
    roomy = plan(dense, [gpu(100)], None, Options(4096, 2, **SIZING))
    assert roomy["offload"] is False and roomy["pattern"] == "" and roomy["device_overrides"] == []
    assert roomy["headroom"]["this_plan"] == {"max_ctx_size": 4096, "max_parallel": 256, "ctx_size_capped_at": 4096}
    assert roomy["reason"] == (
        "Everything fits on GPU0 (100 MiB free): the weights, the KV cache for 4096 tokens and the compute buffer "
        "need %.0f MiB including the 0 MiB margin. The whole context searched (4096 tokens, the training context) "
        "fits with 2 slot(s), and 256 slots or more at this context. Host memory was not checked (give host, the "
        "result of host_info)." % roomy["memory"]["gpus"][0]["total_mib"] + speed_sentence(roomy))
    tight = plan(dense, [gpu(need(dense, [], 2048, 2) / MIB)], None, Options(1024, 2, **SIZING))
    here = tight["headroom"]["this_plan"]
    assert here["max_ctx_size"] == 2048 and 2 <= here["max_parallel"] < 256
    assert ("At most 2048 tokens of context fit with 2 slot(s), and at most %d slot(s) at this context. Host memory"
            % here["max_parallel"]) in tight["reason"]
    error = refusal(dense, [gpu(need(dense, []) / MIB - 1)], None, Options(4096, **SIZING))
    (short,) = error.details["memory"]["gpus"]
    assert str(error) == (
        "Does not fit on GPU0 (%d MiB free): the weights, the KV cache for 4096 tokens and the compute buffer need "
        "%.0f MiB and 1 MiB are missing on GPU0. Lower ctx_size (at most %d fits), cache_type_k/cache_type_v (q8_0 "
        "halves the KV cache), margin_mib, ubatch, or use a larger GPU." % (
            short["free_mib"], short["total_mib"], error.details["headroom"]["all_experts_on_cpu"]["max_ctx_size"]))
