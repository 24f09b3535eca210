"""The offload decision (``_offload_plan.plan``) on the generated Nemotron Nano and a small MoE model of exact sizes."""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _common as common
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _kv_cache as kvc
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _memory_estimate as mest
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _offload_plan as op
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._pattern_check import check_pattern
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_plan import plan
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_inputs import PlanError, load_facts
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import Options
from tests.helpers.plans import (
    SIZING, cuda_gpu, exact_moe, gemma_summary, gpu, host_expert_mib, moved_by, need, plan_gpu, refusal, sizer)

NOT_A_COUNT = "cpu_expert_layers must be a count from 0 to 3 (the MoE blocks) or a list of block indices, got %r"
KNOWN = "llama-server knows bf16, f16, f32, iq4_nl, q4_0, q4_1, q5_0, q5_1, q8_0"


@pytest.mark.parametrize("free, ctx, parallel", [(24148, 32768, 2), (15746, 65536, 1), (11804, 32768, 4),
                                                 (7796, 32768, 1), (7796, 131072, 2)])
def test_nano_plans_fit_and_move_exactly_their_blocks(nano, free, ctx, parallel):
    result = plan(nano, [cuda_gpu(free)], None, Options(ctx, parallel))
    assert result["fits"] and result["offload"]
    used = result["memory"]["gpus"][0]
    assert used["free_after_mib"] >= 0 and used["kv_mib"] == round(6144 * kvc.pad(ctx, 256) / 2.0 ** 20, 2)
    wanted = set(n for b in result["cpu_expert_layers"] for n in nano.expert_tensors_by_block[b])
    assert moved_by(result["pattern"], nano.tensor_names) == wanted  # the proof, redone here
    assert result["override_tensor"] == result["pattern"] + "=CPU"
    # just enough: one block fewer (the last one chosen) would not fit
    fewer = result["cpu_expert_layers"][:-1]
    if len(result["cpu_expert_layers"]) < len(nano.expert_blocks):
        assert need(nano, fewer, ctx, parallel, sizing={}) / common.MIB > free
    # lowest index first, as --n-cpu-moe
    assert result["cpu_expert_layers"] == nano.expert_blocks[:len(result["cpu_expert_layers"])]
    assert result["n_cpu_moe"] == result["cpu_expert_layers"][-1] + 1


def test_dual_gpu_split_or_single_the_one_that_fits_and_the_memory_the_running_server_holds(nano, moe):
    dual = [cuda_gpu(24148, 0, "NVIDIA RTX A5500", 24564), cuda_gpu(15746, 1, "NVIDIA RTX A4000", 16376)]
    result = plan(nano, dual, None, Options(32768, 2))
    assert result["placement"] == "split" and result["offload"] is False  # 40 GB together hold everything
    assert result["tensor_split"] == "0.605,0.395" and result["visible_devices"] == "GPU-0,GPU-1"
    assert len(result["memory"]["gpus"]) == 2 and all(g["free_after_mib"] >= 0 for g in result["memory"]["gpus"])
    single = plan(nano, dual, None, Options(32768, 2, gpu_index=0))
    assert single["placement"] == "single" and single["visible_devices"] == "GPU-0" and single["offload"]
    forced = plan(nano, dual, None, Options(32768, 2, split=[1, 1]))
    assert forced["tensor_split"] == "0.5,0.5"
    big = [cuda_gpu(81007, 0), cuda_gpu(81007, 1)]
    assert plan(nano, big, None, Options(32768, 2))["placement"] == "single"  # one GPU is enough: no split
    # gpu_devices picks the GPUs; the memory the running server holds counts as free
    gpus = {"gpus": [dict(cuda_gpu(3000, 0), memory_held_by_pid_mib=21148), cuda_gpu(5000, 1)], "topology": "dual"}
    result = plan(nano, gpus, None, Options(32768, 2, gpu_devices=[0]))
    assert result["gpu_devices"] == [0] and result["memory"]["gpus"][0]["free_mib"] == 24148
    assert result["memory"]["gpus"][0]["held_by_pid_mib"] == 21148
    # a placement that fits wins: mode none moves nothing anywhere, so every placement keeps the same expert bytes on
    # the host (none); the 8 MiB card alone is 0.04 MiB short, the two cards split fit, and the split is the plan.
    assert 8 * common.MIB < need(moe, []) < 8.1 * common.MIB
    result = plan(moe, [gpu(8, 0), gpu(7, 1)], None, Options(4096, mode="none", **SIZING))
    assert result["fits"] is True and result["placement"] == "split" and result["cpu_expert_layers"] == []
    assert result["reason"].startswith("Everything fits on GPU0 (8 MiB free) + GPU1 (7 MiB free), split 0.533,0.467:")


@pytest.mark.parametrize("fits_with, less, moved, n_cpu_moe", [
    ([], 0, [], 0), ([], 1, [1], 2), ([1], 0, [1], 2), ([1, 2], 0, [1, 2], 3), ([1, 2], 1, [1, 2, 3], 4),
    ([1, 2, 3], 0, [1, 2, 3], 4)])
def test_auto_moves_the_fewest_lowest_blocks_that_make_the_gpu_fit(moe, fits_with, less, moved, n_cpu_moe):
    """free_after = free - need: 0 fits, one byte less moves the next block (lowest index first, as --n-cpu-moe N)."""
    result = plan(moe, [gpu((need(moe, fits_with) - less) / common.MIB)], None, Options(4096, **SIZING))
    assert result["fits"] is True and result["offload"] is bool(moved)
    assert result["cpu_expert_layers"] == moved and result["n_cpu_moe"] == n_cpu_moe
    if not less:
        assert result["memory"]["gpus"][0]["free_after_mib"] == 0.0


def test_mode_none_keeps_every_expert_on_the_gpu_even_when_it_does_not_fit(moe):
    everything = need(moe, [])
    none = Options(4096, mode="none", **SIZING)
    assert plan(moe, [gpu(everything / common.MIB)], None, none)["cpu_expert_layers"] == []
    error = refusal(moe, [gpu((everything - common.MIB) / common.MIB)], None, none)
    details = error.details
    (short,) = details["memory"]["gpus"]
    assert details["cpu_expert_layers"] == [] and details["fits"] is False
    at_most = details["headroom"]["all_experts_on_cpu"]["max_ctx_size"]
    every = sizer(moe, (everything - common.MIB) / common.MIB).largest([1, 2, 3], {}, 4096, 1)
    assert at_most == every["max_ctx_size"] > details["headroom"]["this_plan"]["max_ctx_size"]
    assert str(error) == (
        "Does not fit on GPU0 (%d MiB free): with everything on the GPU the plan needs %.0f MiB and 1 MiB are missing "
        "on GPU0. Lower mode (auto or all moves more experts), ctx_size (at most %d fits with all experts on CPU), "
        "parallel, cache_type_k/cache_type_v (q8_0 halves the KV cache), margin_mib, ubatch, or use a larger GPU."
        % (short["free_mib"], short["total_mib"], at_most))


@pytest.mark.parametrize("mode, layers, blocks, n_cpu_moe", [
    ("all", None, [1, 2, 3], 4), ("layers", [3, 1, 3], [1, 3], None), ("layers", [2, 2], [2], None),
    ("layers", [1, 2], [1, 2], 3), ("layers", [], [], 0), ("layers", 0, [], 0), ("layers", 2, [1, 2], 3),
    ("layers", 3, [1, 2, 3], 4), ("layers", [1], [1], 2), ("layers", [2, 3], [2, 3], None)])
def test_mode_all_moves_every_moe_block_and_layers_a_sorted_list_or_the_first_blocks_of_a_count(
        moe, mode, layers, blocks, n_cpu_moe):
    """n_cpu_moe only where --n-cpu-moe N (block indices 0..N-1; block 0 here has no experts) moves exactly them."""
    result = plan(moe, [gpu(100000)], None, Options(4096, mode=mode, cpu_expert_layers=layers, **SIZING))
    assert result["cpu_expert_layers"] == blocks and result["n_cpu_moe"] == n_cpu_moe
    assert result["offload"] is bool(blocks)


def test_headroom_is_the_largest_multiple_of_256_and_slot_count_that_fit_up_to_the_training_context(moe):
    free = need(moe, [], ctx=3072) + 1000
    result = plan(moe, [gpu(free / common.MIB)], None, Options(1024, **SIZING))
    here = result["headroom"]["this_plan"]
    assert here["ctx_size_capped_at"] == 4096 and here["max_ctx_size"] == 3072
    assert need(moe, [], ctx=3328) > free
    slots = here["max_parallel"]
    assert need(moe, [], ctx=1024, parallel=slots) <= free < need(moe, [], ctx=1024, parallel=slots + 1)
    # each slot needs at least one cell: at 256 slots the smallest context is 256, and it counts when it fits
    least = plan(moe, [gpu(need(moe, [], ctx=256, parallel=256) / common.MIB)], None,
                 Options(256, 256, mode="none", **SIZING))
    assert need(moe, [], ctx=512, parallel=256) > need(moe, [], ctx=256, parallel=256)
    assert least["headroom"]["this_plan"]["max_ctx_size"] == 256
    # the search stops at the training context, or at the asked context beyond it
    result = plan(moe, [gpu(100000)], None, Options(8192, **SIZING))
    assert result["headroom"]["this_plan"] == {"max_ctx_size": 8192, "max_parallel": 256, "ctx_size_capped_at": 8192}
    assert result["warnings"] == ["ctx_size 8192 is beyond the model's training context of 4096 tokens"]
    at = plan(moe, [gpu(100000)], None, Options(4096, **SIZING))
    assert at["warnings"] == [] and at["headroom"]["this_plan"]["ctx_size_capped_at"] == 4096


def test_the_reports_of_a_plan_that_moves_nothing_and_the_cache_options_that_reach_it(moe):
    result = plan(moe, [gpu(100000)], {"memory_available_mib": 50000}, Options(1000, 3, **SIZING))
    assert result["pattern"] == "" and result["override_tensor"] == "" and result["vram_saved_mib"] == 0
    assert "so no expert moves to host memory and the GPU keeps full speed." in result["reason"]
    assert result["pattern_check"] == {"ok": True, "matched": 0, "tensors": [], "missed": [], "non_expert": [],
                                       "verdict": "no tensor moves"}
    assert result["kv_cache"] == {"layout": "kv", "cells": 512, "streams": 3, "full_blocks": [0, 1, 2, 3],
                                  "swa_blocks": [], "swa_cells": 0, "window": 0, "window_kind": "",
                                  "reused_blocks": [], "recurrent_blocks": []}
    assert result["n_ctx"] == 1536
    (used,) = result["memory"]["gpus"]
    assert used["kv_mib"] == common.mib(4 * 2 * 32 * 2 * 1536)
    assert sorted(used) == ["compute_mib", "free_after_mib", "free_mib", "held_by_pid_mib", "index", "kv_mib",
                            "margin_mib", "model_mib", "name", "recurrent_mib", "total_mib"]
    assert used["free_after_mib"] == round(100000 - used["total_mib"], 2)
    host = result["memory"]["host"]
    assert sorted(host) == ["available_mib", "compute_mib", "free_after_mib", "kv_mib", "margin_mib", "mmap",
                            "model_mib", "output_mib", "pinned", "recurrent_mib", "total_mib"]
    assert host["available_mib"] == 50000 and host["margin_mib"] == 1024.0
    # V as f32 with K f16: 2 + 4 instead of 2 + 2 bytes an element; -kvu: one stream of 4096 cells instead of two of
    # 2048, as the estimate sizes it.
    plain = plan(moe, [gpu(100)], None, Options(4096, **SIZING))["memory"]["gpus"][0]["kv_mib"]
    wide = plan(moe, [gpu(100)], None, Options(4096, cache_type_v="f32", **SIZING))["memory"]["gpus"][0]
    assert wide["kv_mib"] == plain * 1.5
    unified = plan(moe, [gpu(100)], None, Options(4096, 2, kv_unified=True, **SIZING))["memory"]["gpus"][0]
    assert unified["total_mib"] == common.mib(need(moe, [], parallel=2, kv_unified=True))
    assert unified["total_mib"] != common.mib(need(moe, [], parallel=2))


def test_a_refusal_before_any_sizing_keeps_its_check_and_the_warnings(moe, monkeypatch):
    """An unusable pattern, options the estimate refuses, and a dense model asked to move experts."""
    error = refusal(moe, [gpu(100)], None, Options(4096, pattern="", **SIZING))
    assert str(error) == "pattern '' cannot be used: %s" % error.details["pattern_check"]["verdict"]
    assert set(error.details) == {"pattern_check", "warnings"}
    assert error.details["pattern_check"]["ok"] is False and error.details["warnings"] == []
    error = refusal(moe, [gpu(100)], None, Options(8192, cache_type_v="q8_0", flash_attn="off", **SIZING))
    assert str(error) == ("a quantized V cache (cache_type_v=q8_0) needs flash attention: set flash_attn to on or "
                          "auto, or use cache_type_v f16")
    assert error.details == {"warnings": ["ctx_size 8192 is beyond the model's training context of 4096 tokens"]}
    dense = exact_moe("DD")
    for mode, layers in (("all", None), ("layers", 0)):
        error = refusal(dense, [gpu(100000)], None, Options(4096, mode=mode, cpu_expert_layers=layers))
        assert str(error) == "the model has no routed experts: there is nothing to move (use mode none or auto)"
    # The guard behind every generated pattern: one that moves more than the blocks' experts is never used.
    monkeypatch.setattr(op, "block_expert_pattern", lambda names, experts, blocks: r"blk\.1\.")
    error = refusal(moe, [gpu(100)], None, Options(4096, mode="layers", cpu_expert_layers=[1], **SIZING))
    assert str(error).startswith(r"the pattern blk\.1\. does not match exactly the experts of blocks 1: ")


@pytest.mark.parametrize("backend, names", [("cuda", ["CUDA0", "CUDA1"]), ("vulkan", ["Vulkan0", "Vulkan1"]),
                                            ("rpc", ["RPC0", "RPC1"]), ("cpu", ["CPU0", "CPU1"]),
                                            ("metal", ["METAL0", "METAL1"])])
def test_device_names_number_the_gpus_of_the_plan(backend, names):
    gpus = [plan_gpu(1, 3), plan_gpu(1, 5)]
    assert op._device_names(gpus, backend, None) == names  # pylint: disable=protected-access
    assert op._device_names(gpus, backend, ["X", "Y"]) == ["X", "Y"]  # pylint: disable=protected-access


@pytest.mark.parametrize("names", [["CUDA0"], ["CUDA0", ""], ["CUDA0", "A,B"], ["CUDA0", 1]])
def test_device_names_must_be_one_plain_name_per_gpu(names):
    gpus = [plan_gpu(1, 0), plan_gpu(1, 1)]
    with pytest.raises(PlanError) as info:
        op._device_names(gpus, "cuda", names)  # pylint: disable=protected-access
    assert str(info.value) == "device_names must give one name (without ',') per GPU of the plan (2), got %r" % (
        names,)


@pytest.mark.parametrize("kwargs, message", [
    (dict(ctx_size=0), "ctx_size must be a whole number >= 1, got 0"),
    (dict(parallel=0), "parallel must be a whole number >= 1, got 0"),
    (dict(cache_type_k="q6_k"), "unknown cache_type_k 'q6_k': " + KNOWN),
    (dict(cache_type_v="q6_k"), "unknown cache_type_v 'q6_k': " + KNOWN),
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
    (dict(mode="layers", cpu_expert_layers=4), NOT_A_COUNT % 4),
    (dict(mode="layers", cpu_expert_layers=-1), NOT_A_COUNT % -1),
    (dict(mode="layers", cpu_expert_layers=True), NOT_A_COUNT % True),
    (dict(mode="auto", cpu_expert_layers=1), "cpu_expert_layers only goes with mode layers"),
])
def test_bad_options_are_refused_with_what_to_change(moe, kwargs, message):
    assert str(refusal(moe, [gpu(100000)], None, Options(**dict({"ctx_size": 4096}, **kwargs)))) == message


def test_experts_per_gpu_fill_a_card_the_split_leaves_room_on_apart_from_those_of_the_host(nano):
    """A5500 beside a 5 GB card at 32K: the split alone keeps experts on the host; placed per GPU, none."""
    gpus = [gpu(24148, 0, "NVIDIA RTX A5500"), gpu(5000, 1, "small card")]
    result = plan(nano, gpus, None, Options(32768, 2))
    others = [plan(nano, gpus, None, Options(32768, 2, **kw)) for kw in (
        dict(experts_per_gpu=False), dict(gpu_index=0), dict(split="auto", experts_per_gpu=False))]
    assert result["fits"] and result["placement"] == "split"
    assert host_expert_mib(nano, result) < min(host_expert_mib(nano, r) for r in others)
    assert result["cpu_expert_layers"] == [] and result["pattern"] == ""
    assert result["devices"] == [{"device": "CUDA0", "index": 0, "uuid": "GPU-0", "name": "NVIDIA RTX A5500", "pci_bus_id": None},
                                 {"device": "CUDA1", "index": 1, "uuid": "GPU-1", "name": "small card", "pci_bus_id": None}]
    (override,) = result["device_overrides"]
    assert override["device"] == "CUDA0" and override["gpu_index"] == 0 and override["blocks"]
    # every pattern is proved: it moves exactly the experts of its blocks, and llama.cpp can split the value
    assert moved_by(override["pattern"], nano.tensor_names) == set(override["tensors"]) == set(
        n for b in override["blocks"] for n in nano.expert_tensors_by_block[b])
    assert "," not in override["pattern"] and "=" not in override["pattern"]
    # the blocks whose experts moved have their layers on the other card
    split = [float(s) for s in result["tensor_split"].split(",")]
    devices = mest.layer_devices(nano.block_count, split, 2)[0]
    assert all(devices[b] == 1 for b in override["blocks"])
    assert result["reason"].startswith(
        "No routed expert goes to host memory; the experts of blocks %s go to CUDA0 (GPU 0) with -ot %s=CUDA0: "
        "everything on the GPU would need " % (", ".join(str(b) for b in override["blocks"]), override["pattern"]))
    assert all(g["free_after_mib"] >= 0 for g in result["memory"]["gpus"])
    names = ["RPC0[127.0.0.1:5001]", "RPC0[127.0.0.1:5002]"]
    named = plan(nano, gpus, None, Options(32768, 2, backend="rpc", device_names=names))
    assert [d["device"] for d in named["devices"]] == names
    assert [o["device"] for o in named["device_overrides"]] == names[:1]
    # experts both on the host and on another card: no tensor goes to both
    gpus = [gpu(16000, 0), gpu(8000, 1)]
    result = plan(nano, gpus, None, Options(32768, 2))
    plain = plan(nano, gpus, None, Options(32768, 2, experts_per_gpu=False))
    assert result["fits"] and host_expert_mib(nano, result) <= host_expert_mib(nano, plain)
    cpu = set(n for b in result["cpu_expert_layers"] for n in nano.expert_tensors_by_block[b])
    assert moved_by(result["pattern"], nano.tensor_names) == cpu
    on_gpus = set(n for o in result["device_overrides"] for n in o["tensors"])
    assert not cpu & on_gpus


def test_a_cpu_host_plans_host_memory_only_and_the_host_must_hold_the_experts_it_gets(nano):
    host = {"memory_available_mib": 60000, "memory_total_mib": 64000}
    result = plan(nano, [], host, Options(32768, 2))
    assert result["placement"] == "cpu" and result["devices"] == [] and result["memory"]["gpus"] == []
    assert result["cpu_expert_layers"] == nano.expert_blocks and result["n_cpu_moe"] == 52
    assert moved_by(result["pattern"], nano.tensor_names) == set(nano.expert_names)
    memory = result["memory"]["host"]
    weights = sum(t.nbytes for t in nano.tensors) / float(common.MIB)
    assert abs(memory["model_mib"] - weights) < 0.01 and memory["kv_mib"] == 192.0 and memory["recurrent_mib"] == 95.23
    assert memory["free_after_mib"] == round(60000 - memory["total_mib"], 2)
    assert plan(nano, {"gpus": [], "topology": "cpu"}, None, Options(32768, 2, mode="none"))["pattern"] == ""
    # A5500 at 32K with all experts on CPU: about 1.3 GiB of weights on the GPU, 21.8 GiB in host memory, pinned with
    # --no-mmap.
    gpus = [gpu(24148, 0)]
    result = plan(nano, gpus, {"memory_available_mib": 40000}, Options(32768, 2, mode="all", mmap=False))
    assert len(result["cpu_expert_layers"]) == 23
    assert moved_by(result["pattern"], nano.tensor_names) == set(nano.expert_names)
    assert 1369 <= result["memory"]["gpus"][0]["model_mib"] < 1371
    host = result["memory"]["host"]
    assert host["pinned"] is True and host["mmap"] is False
    assert 21700 < host["model_mib"] - 231 < 21850  # the routed experts plus token_embd (231 MiB)
    assert "pinned (--no-mmap)" in result["reason"]
    # a cgroup limit below MemAvailable is what counts
    limited = {"memory_available_mib": 60000, "cgroup": {"limit_mib": 20000, "usage_mib": 1000}}
    assert "the cgroup limit of 20000 MiB" in str(refusal(nano, gpus, limited, Options(32768, 2, mode="all")))


def test_a_users_pattern_is_checked_and_sized(nano):
    pattern = r"blk\.(1|3)\.ffn_.*_exps\.weight"
    result = plan(nano, [gpu(24148, 0)], None, Options(32768, 2, pattern=pattern))
    assert result["pattern"] == pattern and result["override_tensor"] == pattern + "=CPU"
    assert result["cpu_expert_layers"] == [1, 3] and result["n_cpu_moe"] is None
    same = check_pattern(pattern, nano.tensor_names, nano.expert_names, nano.tensor_class)
    assert result["pattern_check"]["verdict"] == same["verdict"] and result["pattern_check"]["ok"] is False
    assert result["pattern_check"]["tensors"] == same["matched"] and result["pattern_check"]["matched"] == 4
    sized = mest.estimate(nano, Options(32768, 2), cpu_tensors=same["matched"])["gpus"][0]["total_mib"]
    assert result["memory"]["gpus"][0]["total_mib"] == sized
    greedy = plan(nano, [gpu(24148, 0)], None, Options(32768, 2, pattern=r"exps|shexp"))
    assert greedy["pattern_check"]["non_expert"] and greedy["memory"]["gpus"][0]["model_mib"] < 1370
    bad = refusal(nano, [gpu(24148, 0)], None, Options(32768, 2, pattern=r"blk\.[0-9]{1,2}\.ffn"))
    assert "cannot be used: unusable: it contains ','" in str(bad)


def test_gemma_fits_with_its_small_sliding_cache_and_warnings_reach_the_user_on_failure_too():
    """The measured need of Gemma 3 270M at 32768/1 (111 MiB of KV) fits 1800 MiB with the margin."""
    facts = load_facts(gemma_summary())
    result = plan(facts, [cuda_gpu(1800, 0)], None, Options(32768, 1))
    assert result["fits"] and result["memory"]["gpus"][0]["kv_mib"] == 111.0
    assert result["kv_cache"] == {"layout": "iswa", "cells": 32768, "streams": 1, "full_blocks": [5, 11, 17],
                                  "swa_blocks": [b for b in range(18) if b not in (5, 11, 17)], "swa_cells": 1024,
                                  "window": 512, "window_kind": "standard", "reused_blocks": [],
                                  "recurrent_blocks": []}
    assert "(15 of its 18 blocks keep a sliding window: 1024 cells per slot)" in result["reason"]
    assert "expert" not in result["reason"]
    # --swa-full: every block keeps the whole context, 18 x 32768 cells x (256 + 256) x 2 bytes = 576 MiB
    full = plan(facts, [cuda_gpu(4000, 0)], None, Options(32768, 1, swa_full=True))
    assert full["memory"]["gpus"][0]["kv_mib"] == 576.0
    # an architecture not known here: its warning reaches the user, with a plan and with a refusal
    summary = gemma_summary()
    facts = load_facts(dict(summary, architecture="mygemma", metadata=dict(
        (k.replace("gemma3", "mygemma"), v) for k, v in summary["metadata"].items())))
    (warning,) = [w for w in facts.warnings if "not known here" in w]
    assert warning in plan(facts, [cuda_gpu(4000, 0)], None, Options(32768, 1))["warnings"]
    assert warning in refusal(facts, [cuda_gpu(1000, 0)], None, Options(32768, 1)).details["warnings"]


@pytest.mark.parametrize("mode, blocks, short, missing", [
    ("none", [], 1, "0.01"), ("none", [], common.MIB // 2, "0.50"), ("none", [], common.MIB, "1"),
    ("auto", [1, 2, 3], common.MIB, "1"),  # auto refuses when even every expert on the host does not fit
])
def test_a_gpu_short_by_less_than_a_mib_is_told_short(moe, mode, blocks, short, missing):
    """The decision counts bytes: a GPU one byte short is refused, and its report and reason say it is short."""
    error = refusal(moe, [gpu((need(moe, blocks) - short) / common.MIB)], None, Options(4096, mode=mode, **SIZING))
    assert error.details["fits"] is False and error.details["cpu_expert_layers"] == blocks
    assert error.details["memory"]["gpus"][0]["free_after_mib"] == -float(missing)
    assert (" and %s MiB are missing on GPU0. " % missing) in str(error)


def test_goal_speed_keeps_the_fastest_placement_that_fits_and_the_reason_compares_them(moe):
    """GPU 0 (not in the table: 500 GB/s) has the most free memory, GPU 1 is an H200 (4800 GB/s). With no split
    cost, the split reads part of the model at 4800 GB/s where GPU 0 alone reads all of it at 500 GB/s: goal fit keeps
    the one GPU (no expert moves either way), goal speed the split."""
    gpus = [gpu(100, 0, "GPU0"), gpu(90, 1, "NVIDIA H200")]
    options = dict(SIZING, calibration={"split_seconds": 0.0})
    fit = plan(moe, gpus, None, Options(4096, **options))
    fast = plan(moe, gpus, None, Options(4096, goal="speed", **options))
    assert (fit["goal"], fit["placement"], fast["goal"], fast["placement"]) == ("fit", "single", "speed", "split")
    assert [c["placement"] for c in fast["candidates"]] == ["single", "split"]
    single, split = fast["candidates"]
    assert split["chosen"] and not single["chosen"] and single["fits"] and split["fits"]
    assert split["speed"]["decode_tokens_per_second"] > single["speed"]["decode_tokens_per_second"]
    assert fast["speed"]["calibrated"] is True and fast["speed"]["decode_tokens_per_second"] == \
        split["speed"]["decode_tokens_per_second"]
    assert fast["reason"].endswith(
        " Goal speed: split over GPUs 0, 1 with no expert in host memory predicts %.1f tokens/s decode, ahead of GPU 0 "
        "alone with no expert in host memory (%.1f)." % (split["speed"]["decode_tokens_per_second"],
                                                         single["speed"]["decode_tokens_per_second"]))
    assert "Goal speed" not in fit["reason"] and fit["candidates"][0]["chosen"]
    with pytest.raises(PlanError, match="unknown goal 'fastest'"):
        plan(moe, gpus, None, Options(4096, goal="fastest"))


def test_the_host_s_bandwidth_comes_from_host_info_or_a_calibration_and_changes_only_the_host_s_part(moe):
    """The experts of every block in host memory: per token the host part is B / bandwidth, so 1/decode at 10 GB/s
    (host_info's 10000 MB/s) minus 1/decode at 20 GB/s (calibrated) is B x (1/10e9 - 1/20e9)."""
    host = {"memory_available_mib": 100000, "memory_bandwidth_mb_per_s": 10000}
    measured = plan(moe, [gpu(100)], host, Options(4096, mode="all", **SIZING))
    calibrated = plan(moe, [gpu(100)], host, Options(4096, mode="all", calibration={
        "host_bytes_per_second": 20e9, "measured": {"decode_tokens_per_second": 50.0}}, **SIZING))
    assert "host 0.00 GB at 10 GB/s (measured by host_info)" in measured["speed"]["from"]
    assert measured["speed"]["calibrated"] is False and calibrated["speed"]["calibrated"] is True
    host_bytes = measured["speed"]["terms"]["decode_host_bytes"]
    assert host_bytes == 3 * 2 * 64 * 64 * 8 * 4 * 2 // 8  # 3 blocks, up and down experts, 2 of 8 read
    difference = 1 / measured["speed"]["decode_tokens_per_second"] - 1 / calibrated["speed"]["decode_tokens_per_second"]
    assert difference == pytest.approx(host_bytes * (1 / 10e9 - 1 / 20e9), rel=2e-3)
    with pytest.raises(PlanError, match="calibration has unknown key"):
        plan(moe, [gpu(100)], host, Options(4096, calibration={"bandwidth": 1}, **SIZING))


def test_goal_speed_keeps_fewer_layers_on_the_gpu_when_the_whole_dense_model_does_not_fit():
    """A dense model one byte too large for the GPU (flash attention on): goal fit has nothing to move and refuses;
    goal speed weighs the most layers that fit (-ngl 4 of the 5 layers: block 0 on the host) and keeps them."""
    dense = exact_moe("DDDD")
    sizing = dict(SIZING, flash_attn="on")
    free = (need(dense, [], **sizing) - 1) / float(common.MIB)
    refused = refusal(dense, [gpu(free)], None, Options(4096, **sizing))
    assert str(refused).endswith(" Fewer layers on the GPU fit: goal speed weighs them (-ngl 4).")
    assert refused.details["reason"] == str(refused)
    assert "Fewer layers" not in str(refusal(dense, [gpu(0.5)], None, Options(4096, **sizing)))  # not even one fits
    result = plan(dense, [gpu(free)], None, Options(4096, goal="speed", **sizing))
    assert result["fits"] and result["n_gpu_layers"] == 4 and result["pattern"] == "" and not result["offload"]
    every, layered = result["candidates"]
    assert (every["n_gpu_layers"], every["fits"], layered["n_gpu_layers"], layered["chosen"]) == (None, False, 4, True)
    host = result["memory"]["host"]
    assert host["kv_mib"] == round(kvc.kv_cache_bytes(dense, Options(4096, **SIZING))[0] / float(common.MIB), 2)
    assert result["reason"].startswith("With -ngl 4 the weights, KV cache and recurrent state of block 0 stay in host "
                                       "memory and the CPU computes them; the other blocks and the output layer fit")
    assert result["speed"]["terms"]["decode_host_bytes"] > 0


def test_goal_speed_weighs_fewer_layers_against_moving_experts_on_nemotron_nano(nano):
    """On a 24 GB card at 32K x 2 the most layers that fit with every expert beside its layer are 49 of 53 (50 do
    not fit); they read the dense weights of 4 blocks from host memory each token, where moving the experts of two
    blocks reads 6/128 of them: goal speed keeps the experts' move, and the reason names both."""
    free = 24148
    result = plan(nano, [gpu(free)], None, Options(32768, 2, goal="speed"))
    moved, layered = result["candidates"]
    assert moved["chosen"] and moved["n_gpu_layers"] is None and result["n_gpu_layers"] is None
    assert layered["n_gpu_layers"] == 49 and layered["fits"] and layered["cpu_expert_layers"] == []
    for layers, fits in ((49, True), (50, False)):
        used = mest.estimate(nano, Options(32768, 2, n_gpu_layers=layers))["gpus"][0]["total"]
        assert (used <= free * common.MIB) is fits
    assert layered["speed"]["decode_tokens_per_second"] < moved["speed"]["decode_tokens_per_second"]
    assert "ahead of GPU 0 alone with -ngl 49 (blocks 0-3 on the CPU) (%.1f)." % (
        layered["speed"]["decode_tokens_per_second"]) in result["reason"]
    fit = plan(nano, [gpu(free)], None, Options(32768, 2))
    assert [c["n_gpu_layers"] for c in fit["candidates"]] == [None]  # goal fit weighs every layer only


def test_the_most_layers_that_fit_are_searched_past_where_flash_attention_turns_off(nano):
    """Fewer layers need less memory except where an attention block (5, 12, ...) reaches the host and flash
    attention turns off: -ngl 47 leaves blocks 0-5 there and needs more than -ngl 48. With room for 48 the search
    finds 48, where halving the range would stop below 47."""
    def total(layers):
        return mest.estimate(nano, Options(32768, 2, n_gpu_layers=layers))["gpus"][0]["total"]
    assert total(47) > total(48)
    free = total(48) / float(common.MIB) + 1
    layered = plan(nano, [cuda_gpu(free)], None, Options(32768, 2, goal="speed"))["candidates"][-1]
    assert layered["n_gpu_layers"] == 48 and all(total(n) > free * common.MIB for n in range(49, 53))


def test_a_given_n_gpu_layers_is_sized_as_given():
    """-ngl 3 of a 4-block model: blocks 0 and 1 with their KV cache on the host; more layers than the model has
    are every layer; a count below 0 is refused."""
    dense = exact_moe("DDDD")
    result = plan(dense, [gpu(1000)], None, Options(4096, n_gpu_layers=3, **SIZING))
    kv = kvc.kv_cache_bytes(dense, Options(4096, **SIZING))
    assert result["n_gpu_layers"] == 3 and result["memory"]["host"]["kv_mib"] == round((kv[0] + kv[1]) / 2.0 ** 20, 2)
    assert plan(dense, [gpu(1000)], None, Options(4096, n_gpu_layers=99, **SIZING))["n_gpu_layers"] is None
    # flash_attn auto: llama.cpp turns it off for an attention block on the host; the KQ scores of 4 heads over 4096
    # cells for 512 tokens (32 MiB in F32) then count on the GPU
    assert result["warnings"] == ["with -ngl 3 and flash_attn auto llama.cpp turns flash attention off (it runs the "
                                  "attention of a block left on the host on the GPU): the plan is sized without it"]
    on = plan(dense, [gpu(1000)], None, Options(4096, n_gpu_layers=3, **dict(SIZING, flash_attn="on")))
    assert on["warnings"] == [] and result["memory"]["gpus"][0]["compute_mib"] - on["memory"]["gpus"][0][
        "compute_mib"] >= 32
    with pytest.raises(PlanError, match="n_gpu_layers must be a count of layers >= 0, got -1"):
        plan(dense, [gpu(1000)], None, Options(4096, n_gpu_layers=-1, **SIZING))


def test_goal_speed_also_weighs_fewer_layers_with_every_expert_in_host_memory_when_nothing_else_fits(moe):
    """Every expert in host memory needs one byte more than the GPU has: goal speed weighs the most layers that fit
    with every expert beside its layer (-ngl 3) and with every expert in host memory (-ngl 4), and keeps the one
    predicted faster; a placement with both is reported with both, its pattern moving exactly the experts."""
    sizing = dict(SIZING, flash_attn="on")
    free = (need(moe, moe.expert_blocks, **sizing) - 1) / float(common.MIB)
    with pytest.raises(PlanError, match="Does not fit"):
        plan(moe, [gpu(free)], None, Options(4096, **sizing))
    result = plan(moe, [gpu(free)], None, Options(4096, goal="speed", **sizing))
    every, layered, both = result["candidates"]
    assert [(c["n_gpu_layers"], c["cpu_expert_layers"], c["fits"]) for c in (every, layered, both)] == [
        (None, [1, 2, 3], False), (3, [], True), (4, [1, 2, 3], True)]
    fastest = max((layered, both), key=lambda c: c["speed"]["decode_tokens_per_second"])
    assert fastest["chosen"] and result["n_gpu_layers"] == fastest["n_gpu_layers"]
    given = plan(moe, [gpu(1000)], None, Options(4096, mode="all", n_gpu_layers=4, **sizing))
    assert moved_by(given["pattern"], moe.tensor_names) == set(moe.expert_names)
    assert given["reason"].startswith("All routed experts (3 MoE blocks) go to host memory")
    assert " With -ngl 4 the weights, KV cache and recurrent state of block 0 also stay in host memory and the CPU " \
        "computes them." in given["reason"]
