"""The rules of the offload decision whose mistakes run a user's GPU out of memory: a plan fits when nothing is left
negative (free after >= 0), each mode's choice of blocks (none, all, just enough lowest-index blocks, the listed blocks
sorted once each), the largest context and slot count that fit, and the words of the input checks."""
from __future__ import annotations

from collections import namedtuple

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _common as common
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _memory_estimate as mest
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _model_facts as mfacts
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _offload_plan as op
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _plan_inputs as pin
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _plan_reason as prs
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import Options
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._tensor_classes import classify_model

T = namedtuple("T", "name shape nbytes type_id")
MIB = 1 << 20
SIZING = dict(backend="rpc", op_offload=False, margin_mib=0)  # exact bytes: no CUDA padding, no reserved copy


def f32(name, *shape):
    n = 1
    for d in shape:
        n *= d
    return T(name, tuple(shape), 4 * n, 0)


def moe_model(kinds="DEEE", context_length=4096):
    """A qwen3moe: attention in every block (4 heads, 2 KV heads of 16), a dense FFN in the ``D`` blocks and 8 routed
    experts of 64 (256 KiB a block) in the ``E`` blocks."""
    arch = "qwen3moe"
    tensors = [f32("token_embd.weight", 64, 512), f32("output.weight", 64, 512), f32("output_norm.weight", 64)]
    for b, kind in enumerate(kinds):
        p = "blk.%d." % b
        tensors += [f32(p + "attn_q.weight", 64, 64), f32(p + "attn_k.weight", 64, 32),
                    f32(p + "attn_v.weight", 64, 32), f32(p + "attn_output.weight", 64, 64)]
        if kind == "E":
            tensors += [f32(p + "ffn_gate_inp.weight", 64, 8), f32(p + "ffn_up_exps.weight", 64, 64, 8),
                        f32(p + "ffn_down_exps.weight", 64, 64, 8)]
        else:
            tensors += [f32(p + "ffn_up.weight", 64, 128), f32(p + "ffn_down.weight", 128, 64)]
    md = {"general.architecture": arch, arch + ".block_count": len(kinds), arch + ".embedding_length": 64,
          arch + ".attention.head_count": 4, arch + ".attention.head_count_kv": 2, arch + ".attention.key_length": 16,
          arch + ".attention.value_length": 16, arch + ".vocab_size": 512, arch + ".context_length": context_length,
          arch + ".expert_count": 8, arch + ".expert_used_count": 2, arch + ".expert_feed_forward_length": 64}
    return mfacts.model_facts(md, tensors, classify_model(arch, md, tensors))


@pytest.fixture(scope="module")
def moe():
    return moe_model()


def need(facts, blocks, ctx=4096, parallel=1, **kw):
    """Bytes the one GPU needs with the experts of ``blocks`` in host memory."""
    args = dict(SIZING)
    args.update(kw)
    cpu = [n for b in blocks for n in facts.expert_tensors_by_block[b]]
    return mest.estimate(facts, Options(ctx, parallel, **args), cpu_tensors=cpu)["gpus"][0]["total"]


def card(free_mib, index=0, name="GPU0"):
    return {"name": name, "memory_total_mib": 100000, "memory_free_mib": free_mib, "index": index}


# --------------------------------------------------------------------------- the fit boundary

def test_a_gpu_with_exactly_what_the_plan_needs_fits_without_offload(moe):
    """free_after = free - need: 0 fits (nothing is short), one byte less does not."""
    everything = need(moe, [])
    result = op.plan(moe, [card(everything / MIB)], None, Options(4096, **SIZING))
    assert result["fits"] is True and result["offload"] is False and result["cpu_expert_layers"] == []
    assert result["memory"]["gpus"][0]["free_after_mib"] == 0.0 and result["n_cpu_moe"] == 0
    assert result["pattern"] == "" and result["override_tensor"] == ""
    assert result["pattern_check"] == {"ok": True, "matched": 0, "tensors": [], "missed": [], "non_expert": [],
                                       "verdict": "no tensor moves"}
    short = op.plan(moe, [card((everything - 1) / MIB)], None, Options(4096, **SIZING))
    assert short["offload"] is True and short["cpu_expert_layers"] == [1] and short["n_cpu_moe"] == 2


def test_auto_moves_just_enough_lowest_blocks(moe):
    """auto: the fewest MoE blocks, lowest index first (what --n-cpu-moe N moves), that make the GPU fit."""
    one, two = need(moe, [1]), need(moe, [1, 2])
    assert need(moe, []) > one > two > need(moe, [1, 2, 3])
    assert op.plan(moe, [card(one / MIB)], None, Options(4096, **SIZING))["cpu_expert_layers"] == [1]
    exact = op.plan(moe, [card(two / MIB)], None, Options(4096, **SIZING))
    assert exact["cpu_expert_layers"] == [1, 2] and exact["n_cpu_moe"] == 3
    assert exact["memory"]["gpus"][0]["free_after_mib"] == 0.0
    assert op.plan(moe, [card((two - 1) / MIB)], None, Options(4096, **SIZING))["cpu_expert_layers"] == [1, 2, 3]


def test_auto_refuses_when_even_every_expert_on_the_host_does_not_fit(moe):
    lightest = need(moe, [1, 2, 3])
    assert op.plan(moe, [card(lightest / MIB)], None, Options(4096, **SIZING))["cpu_expert_layers"] == [1, 2, 3]
    with pytest.raises(pin.PlanError) as info:
        op.plan(moe, [card((lightest - MIB) / MIB)], None, Options(4096, **SIZING))
    assert info.value.details["fits"] is False and info.value.details["cpu_expert_layers"] == [1, 2, 3]
    assert info.value.details["memory"]["gpus"][0]["free_after_mib"] == -1.0
    assert "and 1 MiB are missing on GPU0." in str(info.value)


def test_fits_is_free_after_at_least_zero_on_every_gpu_and_the_host():
    fits = op._Sizer.gpu_fits  # pylint: disable=protected-access
    assert fits({"gpus": [{"free_after": 0}, {"free_after": 5}]}) is True
    assert fits({"gpus": [{"free_after": 5}, {"free_after": -1}]}) is False
    assert fits({"gpus": []}) is True
    host_fits = op._Sizer.host_fits  # pylint: disable=protected-access
    assert [host_fits({"host": {"free_after": v}}) for v in (None, 0, 1, -1)] == [True, True, True, False]


def sizer(facts, free_mib, available_mib=None):
    options = Options(4096, margin_mib=0, op_offload=False, backend="rpc")
    host = None if available_mib is None else pin.Host(available_mib, None, 0, "MemAvailable")
    gpus = [pin.Gpu("GPU0", 0, None, None, free_mib)]
    return op._Sizer(facts, gpus, None, options, host)  # pylint: disable=protected-access


def test_the_host_fits_with_exactly_what_it_needs(moe):
    probe = sizer(moe, 100000).estimate([1, 2, 3])
    host_total = probe["host"]["total"]
    exact = sizer(moe, 100000, host_total / MIB)
    result = exact.estimate([1, 2, 3])
    assert result["host"]["free_after"] == 0 and result["host"]["available_mib"] == host_total / MIB
    assert exact.fits(result) is True
    short = sizer(moe, 100000, (host_total - 1) / MIB)
    result = short.estimate([1, 2, 3])
    assert result["host"]["free_after"] == -1 and short.fits(result) is False
    unchecked = sizer(moe, 100000).estimate([])
    assert unchecked["host"]["free_after"] is None and unchecked["host"]["free_after_mib"] is None


def test_the_gpu_free_after_is_free_memory_minus_the_total(moe):
    gpu_total = need(moe, [2])
    result = sizer(moe, gpu_total / MIB + 3).estimate([2])
    assert result["gpus"][0]["free_after"] == 3 * MIB and result["gpus"][0]["free_after_mib"] == 3.0


# --------------------------------------------------------------------------- the modes

def test_mode_none_keeps_every_expert_on_the_gpu_even_when_it_does_not_fit(moe):
    everything = need(moe, [])
    assert op.plan(moe, [card(everything / MIB)], None, Options(4096, mode="none", **SIZING))["cpu_expert_layers"] == []
    with pytest.raises(pin.PlanError) as info:
        op.plan(moe, [card((everything - MIB) / MIB)], None, Options(4096, mode="none", **SIZING))
    assert info.value.details["cpu_expert_layers"] == [] and info.value.details["fits"] is False
    details = info.value.details
    free = details["memory"]["gpus"][0]["free_mib"]
    total = details["memory"]["gpus"][0]["total_mib"]
    at_most = details["headroom"]["all_experts_on_cpu"]["max_ctx_size"]
    assert str(info.value) == (
        "Does not fit on GPU0 (%d MiB free): with everything on the GPU the plan needs %.0f MiB and 1 MiB are missing "
        "on GPU0. Lower mode (auto or all moves more experts), ctx_size (at most %d fits with all experts on CPU), "
        "parallel, cache_type_k/cache_type_v (q8_0 halves the KV cache), margin_mib, ubatch, or use a larger GPU."
        % (free, total, at_most))


def test_mode_all_moves_every_moe_block(moe):
    result = op.plan(moe, [card(100000)], None, Options(4096, mode="all", **SIZING))
    assert result["cpu_expert_layers"] == [1, 2, 3] and result["n_cpu_moe"] == 4 and result["offload"] is True


@pytest.mark.parametrize("layers, blocks, n_cpu_moe", [
    ([3, 1, 3], [1, 3], None), ([2, 2], [2], None), ([1, 2], [1, 2], 3), ([], [], 0), (0, [], 0), (2, [1, 2], 3),
    (3, [1, 2, 3], 4)])
def test_mode_layers_sorts_and_deduplicates_a_list_or_takes_the_first_blocks_of_a_count(
        moe, layers, blocks, n_cpu_moe):
    result = op.plan(moe, [card(100000)], None, Options(4096, mode="layers", cpu_expert_layers=layers, **SIZING))
    assert result["cpu_expert_layers"] == blocks and result["n_cpu_moe"] == n_cpu_moe
    assert result["offload"] is bool(blocks)


def test_a_cpu_host_in_auto_mode_keeps_every_expert_in_host_memory(moe):
    result = op.plan(moe, [], None, Options(4096, **SIZING))
    assert result["placement"] == "cpu" and result["cpu_expert_layers"] == [1, 2, 3] and result["n_cpu_moe"] == 4


@pytest.mark.parametrize("blocks, n", [([], 0), ([1], 2), ([1, 2], 3), ([1, 2, 3], 4), ([2], None), ([1, 3], None),
                                       ([2, 3], None)])
def test_n_cpu_moe_is_given_only_when_it_moves_exactly_the_blocks(moe, blocks, n):
    """--n-cpu-moe N moves the experts of block indices 0..N-1 (block 0 here has none)."""
    assert op._n_cpu_moe(moe, blocks) == n  # pylint: disable=protected-access


# --------------------------------------------------------------------------- the largest context and slots

def test_headroom_is_the_largest_multiple_of_256_and_slot_count_that_fit(moe):
    free = need(moe, [], ctx=3072) + 1000
    result = op.plan(moe, [card(free / MIB)], None, Options(1024, **SIZING))
    here = result["headroom"]["this_plan"]
    assert here["ctx_size_capped_at"] == 4096 and here["max_ctx_size"] == 3072
    assert need(moe, [], ctx=3328) > free
    slots = here["max_parallel"]
    assert need(moe, [], ctx=1024, parallel=slots) <= free < need(moe, [], ctx=1024, parallel=slots + 1)


def test_headroom_reaches_the_training_context_or_the_asked_one(moe):
    result = op.plan(moe, [card(100000)], None, Options(8192, **SIZING))
    assert result["headroom"]["this_plan"] == {"max_ctx_size": 8192, "max_parallel": 256, "ctx_size_capped_at": 8192}
    assert result["warnings"] == ["ctx_size 8192 is beyond the model's training context of 4096 tokens"]
    at = op.plan(moe, [card(100000)], None, Options(4096, **SIZING))
    assert at["warnings"] == [] and at["headroom"]["this_plan"]["ctx_size_capped_at"] == 4096


# --------------------------------------------------------------------------- what the plan reports

def test_the_kv_report_of_a_plain_cache(moe):
    result = op.plan(moe, [card(100000)], None, Options(1000, 3, **SIZING))
    assert result["kv_cache"] == {"layout": "kv", "cells": 512, "streams": 3, "full_blocks": [0, 1, 2, 3],
                                  "swa_blocks": [], "swa_cells": 0, "window": 0, "window_kind": "",
                                  "reused_blocks": [], "recurrent_blocks": []}
    assert result["n_ctx"] == 1536
    assert result["memory"]["gpus"][0]["kv_mib"] == common.mib(4 * 2 * 32 * 2 * 1536)


def test_the_memory_report_names_every_figure(moe):
    result = op.plan(moe, [card(100000)], {"memory_available_mib": 50000}, Options(4096, **SIZING))
    (gpu,) = result["memory"]["gpus"]
    assert sorted(gpu) == ["compute_mib", "free_after_mib", "free_mib", "held_by_pid_mib", "index", "kv_mib",
                           "margin_mib", "model_mib", "name", "recurrent_mib", "total_mib"]
    assert gpu["free_after_mib"] == round(100000 - gpu["total_mib"], 2)
    host = result["memory"]["host"]
    assert sorted(host) == ["available_mib", "compute_mib", "free_after_mib", "kv_mib", "margin_mib", "mmap",
                            "model_mib", "output_mib", "pinned", "recurrent_mib", "total_mib"]
    assert host["available_mib"] == 50000 and host["margin_mib"] == 1024.0


@pytest.mark.parametrize("shares, text", [([3, 1], "0.75,0.25"), ([1, 1, 1], "0.333,0.333,0.333"), ([0, 2], "0,1"),
                                          ([2, 0], "1,0"), ([24148, 15746], "0.605,0.395")])
def test_split_text_is_each_share_of_the_whole(shares, text):
    assert prs.split_text(shares) == text  # pylint: disable=protected-access


def test_a_placement_that_fits_wins_over_one_that_does_not_whatever_it_moves(moe):
    """mode none moves nothing anywhere, so every placement keeps the same expert bytes on the host (none): the
    8 MiB card alone is 0.04 MiB short, the two cards split fit, and the split is the plan."""
    assert 8 * MIB < need(moe, []) < 8.1 * MIB
    result = op.plan(moe, [card(8, 0, "GPU0"), card(7, 1, "GPU1")], None, Options(4096, mode="none", **SIZING))
    assert result["fits"] is True and result["placement"] == "split" and result["cpu_expert_layers"] == []
    assert result["reason"].startswith("Everything fits on GPU0 (8 MiB free) + GPU1 (7 MiB free), split 0.533,0.467:")


# --------------------------------------------------------------------------- the words of the reason

def test_the_reason_of_mode_all_names_the_blocks_the_card_and_the_saving(moe):
    result = op.plan(moe, [card(need(moe, []) / MIB)], None, Options(4096, mode="all", **SIZING))
    gpu, here = result["memory"]["gpus"][0], result["headroom"]["this_plan"]
    assert result["reason"] == (
        "All routed experts (3 MoE blocks) go to host memory: as mode all asks, on GPU0 (8 MiB free). With this "
        "plan the GPU side needs %.0f MiB (%.0f MiB saved); every attention, router and shared-expert tensor stays "
        "on the GPU, and %.0f MiB of weights are read from host memory, in the page cache of the model file (mmap). "
        "The whole context searched (4096 tokens, the training context) fits with 1 slot(s), and at most %d slot(s) "
        "at this context. Host memory was not checked (give host, the result of host_info)." % (
            gpu["total_mib"], result["vram_saved_mib"], result["memory"]["host"]["model_mib"], here["max_parallel"]))


def test_two_short_gpus_name_the_split_and_the_one_most_short(moe):
    """The split is each card's share of the free memory (3 : 2); both cards are short, the missing MiB are
    those of the card most short; the largest context that fits with every expert on the host is named."""
    with pytest.raises(pin.PlanError) as info:
        op.plan(moe, [card(3, 0, "GPU0"), card(2, 1, "GPU1")], None, Options(4096, split="auto", **SIZING))
    gpus = info.value.details["memory"]["gpus"]
    worst = min(gpus, key=lambda g: g["free_after_mib"])
    assert max(g["free_after_mib"] for g in gpus) < 0 and len(set(g["free_after_mib"] for g in gpus)) == 2
    assert str(info.value) == (
        "Does not fit on GPU0 (3 MiB free) + GPU1 (2 MiB free), split 0.6,0.4: with the experts of 3 block(s) on CPU "
        "the plan needs %.0f MiB and %.0f MiB are missing on %s. Lower ctx_size (at most %d fits with all experts "
        "on CPU), cache_type_k/cache_type_v (q8_0 halves the KV cache), margin_mib, ubatch, or use a larger GPU." % (
            sum(g["total_mib"] for g in gpus), -worst["free_after_mib"], worst["name"],
            info.value.details["headroom"]["all_experts_on_cpu"]["max_ctx_size"]))


def test_a_short_gpu_with_op_offload_names_the_copy_it_reserves(moe):
    """CUDA with op offload reserves the room of the largest host-resident block's experts (up and down,
    64 x 64 x 8 F32 each: 0.25 MiB); --no-op-offload frees it."""
    with pytest.raises(pin.PlanError) as info:
        op.plan(moe, [card(1)], None, Options(4096, backend="cuda", margin_mib=0, op_offload=True))
    assert str(info.value).endswith(
        "Lower ctx_size, cache_type_k/cache_type_v (q8_0 halves the KV cache), margin_mib, ubatch, op_offload "
        "(false, with llama-server --no-op-offload, frees the %.0f MiB the GPU reserves to compute on host-resident "
        "experts, at the cost of slower prompt processing), or use a larger GPU." % (2 * 64 * 64 * 8 * 4 / MIB))


def test_the_reason_of_a_host_without_gpu_gives_the_memory_available(moe):
    result = op.plan(moe, [], {"memory_available_mib": 100000}, Options(4096, **SIZING))
    host = result["memory"]["host"]
    assert result["reason"].startswith(
        "No GPU: llama-server computes on the CPU and keeps everything in host memory: the weights, the KV cache for "
        "4096 tokens and the compute buffer need %.0f MiB with the 1024 MiB margin (100000 MiB available). The "
        "whole context" % host["total_mib"])


def test_the_reason_of_a_given_pattern_that_moves_no_expert_counts_what_it_moves(moe):
    """``output\\.weight`` moves output.weight and every attn_output.weight (a search, as llama.cpp's
    std::regex_search), no expert: the head counts those tensors and gives the check's verdict."""
    result = op.plan(moe, [card(need(moe, []) / MIB)], None, Options(4096, pattern=r"output\.weight", **SIZING))
    check = result["pattern_check"]
    assert result["cpu_expert_layers"] == [] and check["matched"] == 0 and len(check["non_expert"]) == 5
    assert result["reason"].startswith("The given pattern moves 5 tensor(s) to host memory (%s): as the given "
                                       "pattern asks, on GPU0 (8 MiB free)." % check["verdict"])


def test_the_largest_context_may_equal_the_slots(moe):
    """Each slot needs at least one cell: at 256 slots the smallest context is 256, and it counts when it fits."""
    result = op.plan(moe, [card(need(moe, [], ctx=256, parallel=256) / MIB)], None, Options(256, 256, mode="none", **SIZING))
    assert need(moe, [], ctx=512, parallel=256) > need(moe, [], ctx=256, parallel=256)
    assert result["headroom"]["this_plan"]["max_ctx_size"] == 256


def test_the_v_cache_type_reaches_the_plan(moe):
    plain = op.plan(moe, [card(100)], None, Options(4096, **SIZING))["memory"]["gpus"][0]["kv_mib"]
    assert op.plan(moe, [card(100)], None, Options(4096, cache_type_v="f32", **SIZING))["memory"]["gpus"][0]["kv_mib"] == \
        plain * 1.5  # K stays f16 (2 bytes), V doubles to f32: 2 + 4 instead of 2 + 2 bytes an element


def test_a_unified_cache_reaches_the_plan(moe):
    """-kvu: one stream of 4096 cells instead of two of 2048; the plan sizes what the estimate gives for it."""
    unified = op.plan(moe, [card(100)], None, Options(4096, 2, kv_unified=True, **SIZING))["memory"]["gpus"][0]
    assert unified["total_mib"] == common.mib(need(moe, [], parallel=2, kv_unified=True))
    assert unified["total_mib"] != common.mib(need(moe, [], parallel=2))


def test_an_unusable_pattern_is_refused_with_its_check_and_the_warnings(moe):
    with pytest.raises(pin.PlanError) as info:
        op.plan(moe, [card(100)], None, Options(4096, pattern="", **SIZING))
    assert str(info.value) == "pattern '' cannot be used: %s" % info.value.details["pattern_check"]["verdict"]
    assert set(info.value.details) == {"pattern_check", "warnings"}
    assert info.value.details["pattern_check"]["ok"] is False and info.value.details["warnings"] == []


def test_a_built_pattern_that_the_proof_rejects_is_an_error(moe, monkeypatch):
    """The guard behind every generated pattern: one that moves more than the blocks' experts is never used."""
    monkeypatch.setattr(op, "block_expert_pattern", lambda names, experts, blocks: r"blk\.1\.")
    with pytest.raises(pin.PlanError) as info:
        op.plan(moe, [card(100)], None, Options(4096, mode="layers", cpu_expert_layers=[1], **SIZING))
    assert str(info.value).startswith(r"the pattern blk\.1\. does not match exactly the experts of blocks 1: ")


def test_blocks_text():
    assert prs.blocks_text([]) == "none" and prs.blocks_text([1, 3]) == "1, 3"  # pylint: disable=protected-access


@pytest.mark.parametrize("backend, names", [("cuda", ["CUDA0", "CUDA1"]), ("vulkan", ["Vulkan0", "Vulkan1"]),
                                            ("rpc", ["RPC0", "RPC1"]), ("cpu", ["CPU0", "CPU1"]),
                                            ("metal", ["METAL0", "METAL1"])])
def test_device_names_number_the_gpus_of_the_plan(backend, names):
    gpus = [pin.Gpu("a", 3, None, None, 1), pin.Gpu("b", 5, None, None, 1)]
    assert op._device_names(gpus, backend, None) == names  # pylint: disable=protected-access
    assert op._device_names(gpus, backend, ["X", "Y"]) == ["X", "Y"]  # pylint: disable=protected-access


@pytest.mark.parametrize("names", [["CUDA0"], ["CUDA0", ""], ["CUDA0", "A,B"], ["CUDA0", 1]])
def test_device_names_must_be_one_plain_name_per_gpu(names):
    gpus = [pin.Gpu("a", 0, None, None, 1), pin.Gpu("b", 1, None, None, 1)]
    with pytest.raises(pin.PlanError) as info:
        op._device_names(gpus, "cuda", names)  # pylint: disable=protected-access
    assert str(info.value) == "device_names must give one name (without ',') per GPU of the plan (2), got %r" % (
        names,)


# --------------------------------------------------------------------------- the GPUs, the host, the placements

def test_normalize_gpus_counts_the_running_servers_memory_as_free():
    gpus = pin.normalize_gpus({"gpus": [
        {"name": "A", "memory_total_mib": 24564, "memory_used_mib": 416, "memory_held_by_pid_mib": 100, "uuid": "U"},
        {"memory_free_mib": 8000, "index": 7}]})
    assert gpus == [pin.Gpu("A", 0, "U", 24564, 24148 + 100, 100), pin.Gpu("GPU 1", 7, None, None, 8000, 0)]
    assert pin.normalize_gpus([]) == []
    assert pin.normalize_gpus([card(1000, 0), card(2000, 1)], [1]) == [pin.Gpu("GPU0", 1, None, 100000, 2000, 0)]


@pytest.mark.parametrize("gpus, message", [
    ({"topology": "cpu"}, "gpus is a dict without a gpus list: pass the registered result of gpu_info or a list"),
    ("GPU0", "gpus must be the registered result of gpu_info or a list of {name, memory_total_mib, memory_free_mib}, "
             "got 'GPU0'"),
    (["x"], "gpus[0] must be a dict with name, memory_total_mib and memory_free_mib"),
    ([{"memory_free_mib": -1}], "gpus[0].memory_free_mib must be a number of MiB >= 0, got -1"),
    ([{"memory_free_mib": True}], "gpus[0].memory_free_mib must be a number of MiB >= 0, got True"),
    ([{"memory_free_mib": float("inf")}], "gpus[0].memory_free_mib must be a number of MiB >= 0, got inf"),
    ([{"memory_total_mib": 100, "memory_used_mib": 101}],
     "gpus[0]: memory_used_mib 101 is more than memory_total_mib 100"),
    ([{"name": "GB10", "memory_total_mib": 100}],
     "gpus[0] (GB10) reports no free memory (nvidia-smi printed [N/A]?): give memory_free_mib in a gpus list"),
    ([{"memory_free_mib": 100, "mig_devices": [{}]}],
     "gpus[0] (None) is in MIG mode: plan for one MIG device by passing a gpus list with its memory"),
])
def test_normalize_gpus_errors(gpus, message):
    with pytest.raises(pin.PlanError) as info:
        pin.normalize_gpus(gpus)
    assert str(info.value) == message


def test_normalize_gpus_unknown_fields_and_indices():
    with pytest.raises(pin.PlanError, match=r"^gpus\[0\] has unknown field\(s\) vram \(known: "):
        pin.normalize_gpus([{"memory_free_mib": 1, "vram": 2}])
    with pytest.raises(pin.PlanError) as info:
        pin.normalize_gpus([card(1000, 0), card(1000, 1)], [1, 4, 5])
    assert str(info.value) == "gpu_indices 4, 5 are not among the GPUs (0, 1)"
    with pytest.raises(pin.PlanError) as info:
        pin.normalize_gpus([], [0])
    assert str(info.value) == "gpu_indices 0 are not among the GPUs (none)"


def test_normalize_host_takes_the_smaller_of_memavailable_and_the_cgroup_room():
    assert pin.normalize_host(None) is None
    assert pin.normalize_host({"memory_available_mib": 1000.004, "memory_total_mib": 2000}) == pin.Host(
        1000.0, 2000, 0, "MemAvailable")
    held = pin.normalize_host({"memory_available_mib": 1000, "memory_held_by_pid_mib": 500})
    assert held == pin.Host(1500, None, 500, "MemAvailable")
    limited = pin.normalize_host({"memory_available_mib": 60000, "memory_held_by_pid_mib": 500,
                                 "cgroup": {"limit_mib": 20000, "usage_mib": 1000}})
    assert limited == pin.Host(19500, None, 500, "the cgroup limit of 20000 MiB")
    roomy = {"memory_available_mib": 1000, "cgroup": {"limit_mib": 20000, "usage_mib": 1000}}
    assert pin.normalize_host(roomy) == pin.Host(1000, None, 0, "MemAvailable")
    equal = {"memory_available_mib": 19000, "cgroup": {"limit_mib": 20000, "usage_mib": 1000}}
    assert pin.normalize_host(equal).limited_by == "MemAvailable"
    assert pin.normalize_host({"memory_available_mib": 10, "cgroup": {"limit_mib": None}}).limited_by == "MemAvailable"


@pytest.mark.parametrize("host, message", [
    ([], "host must be the registered result of host_info or a dict with memory_available_mib, got []"),
    ({}, "host has no memory_available_mib: pass the registered result of host_info"),
    ({"memory_available_mib": -5}, "host.memory_available_mib must be a number of MiB >= 0, got -5"),
    ({"memory_available_mib": 5, "cgroup": {"limit_mib": "x"}},
     "host.cgroup.limit_mib must be a number of MiB >= 0, got 'x'"),
])
def test_normalize_host_errors(host, message):
    with pytest.raises(pin.PlanError) as info:
        pin.normalize_host(host)
    assert str(info.value) == message


def gpu(free, index):
    return pin.Gpu("GPU%d" % index, index, None, None, free)


def test_placements_in_the_order_they_are_preferred():
    placements = op._placements  # pylint: disable=protected-access
    a, b = gpu(1000, 0), gpu(3000, 1)
    assert placements([], None, None) == [("cpu", [], None)]
    assert placements([a], None, None) == [("single", [a], None)]
    assert placements([a, b], None, None) == [("single", [b], None), ("split", [a, b], [1000, 3000])]
    assert placements([a, b], None, "none") == [("single", [b], None)]
    assert placements([a, b], None, "auto") == [("split", [a, b], [1000, 3000])]
    assert placements([a, b], None, [1, 0]) == [("split", [a, b], [1, 0])]
    assert placements([a, b], 0, None) == [("single", [a], None)]
    assert placements([a, b], 0, "none") == [("single", [a], None)]


@pytest.mark.parametrize("gpus, index, split, message", [
    ([], 0, None, "gpu_index 0 is not among the GPUs (none: a CPU host)"),
    ([gpu(1, 0), gpu(1, 2)], 1, None, "gpu_index 1 is not among the GPUs (0, 2)"),
    ([gpu(1, 0), gpu(1, 1)], 0, "auto", "give either gpu_index (serve from one GPU) or split (spread over all), not "
                                        "both"),
    ([gpu(1, 0), gpu(1, 1)], None, [1], "split must give one share >= 0 per GPU (2 GPUs), got [1]"),
    ([gpu(1, 0), gpu(1, 1)], None, [1, -1], "split must give one share >= 0 per GPU (2 GPUs), got [1, -1]"),
    ([gpu(1, 0), gpu(1, 1)], None, [0, 0], "split must give one share >= 0 per GPU (2 GPUs), got [0, 0]"),
    ([gpu(1, 0), gpu(1, 1)], None, [True, 1], "split must give one share >= 0 per GPU (2 GPUs), got [True, 1]"),
    ([gpu(1, 0), gpu(1, 1)], None, "even", "split must be auto, none or a list of shares, got 'even'"),
])
def test_placement_errors(gpus, index, split, message):
    with pytest.raises(pin.PlanError) as info:
        op._placements(gpus, index, split)  # pylint: disable=protected-access
    assert str(info.value) == message


# --------------------------------------------------------------------------- the input checks

@pytest.mark.parametrize("kwargs, message", [
    (dict(cache_type_v="q6_k"), "unknown cache_type_v 'q6_k': llama-server knows bf16, f16, f32, iq4_nl, q4_0, q4_1, "
                                "q5_0, q5_1, q8_0"),
    (dict(ubatch=0), "ubatch must be a whole number >= 1, got 0"),
    (dict(margin_mib=-1), "margin_mib must be >= 0, got -1"),
    (dict(margin_mib=None), "margin_mib must be >= 0, got None"),
    (dict(host_margin_mib=True), "host_margin_mib must be >= 0, got True"),
    (dict(mode="some"), "unknown mode 'some' (one of auto, all, none, layers)"),
    (dict(pattern="exps", mode="all"), "give either pattern (it decides what moves to host memory) or mode all, "
                                       "not both"),
    (dict(pattern="exps", mode="layers", cpu_expert_layers=1),
     "give either pattern (it decides what moves to host memory) or mode layers with cpu_expert_layers, not both"),
    (dict(mode="layers"), "mode layers needs cpu_expert_layers: a count of MoE blocks or a list of block indices"),
    (dict(mode="layers", cpu_expert_layers=[0, 2, 9]),
     "cpu_expert_layers names block(s) 0, 9 that hold no routed experts (MoE blocks: 1, 2, 3)"),
    (dict(mode="layers", cpu_expert_layers=4),
     "cpu_expert_layers must be a count from 0 to 3 (the MoE blocks) or a list of block indices, got 4"),
    (dict(mode="layers", cpu_expert_layers=-1),
     "cpu_expert_layers must be a count from 0 to 3 (the MoE blocks) or a list of block indices, got -1"),
    (dict(mode="layers", cpu_expert_layers=True),
     "cpu_expert_layers must be a count from 0 to 3 (the MoE blocks) or a list of block indices, got True"),
    (dict(mode="auto", cpu_expert_layers=1), "cpu_expert_layers only goes with mode layers"),
])
def test_bad_options_are_refused_with_what_to_change(moe, kwargs, message):
    with pytest.raises(pin.PlanError) as info:
        op.plan(moe, [card(100000)], None, Options(4096, **kwargs))
    assert str(info.value) == message


def test_a_dense_model_has_no_experts_to_move():
    dense = moe_model("DD")
    for mode, layers in (("all", None), ("layers", 0)):
        with pytest.raises(pin.PlanError) as info:
            op.plan(dense, [card(100000)], None, Options(4096, mode=mode, cpu_expert_layers=layers))
        assert str(info.value) == "the model has no routed experts: there is nothing to move (use mode none or auto)"
    assert op.plan(dense, [card(100000)], None, Options(4096, **SIZING))["cpu_expert_layers"] == []


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
