"""The offload decision on real (generated) GGUF files: which blocks, which GPU(s), the proof, the failures."""
from __future__ import annotations

import math
import re

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _common as common
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _kv_cache as kvc
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _memory_estimate as mest
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import Options
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_plan import plan
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_inputs import PlanError, load_facts
from tools import gguf_models


@pytest.fixture(scope="module")
def nano(tmp_path_factory):
    return load_facts(gguf_models.write_nemotron_nano_30b(tmp_path_factory.mktemp("nano"), shards=6)[0])


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return load_facts(gguf_models.write_demo_model(str(tmp_path_factory.mktemp("demo") / "demo.gguf")))


def card(free, name="GPU", total=None):
    return {"name": name, "memory_total_mib": total or free, "memory_free_mib": free}


def need_mib(facts, blocks, **kw):
    cpu = [n for b in blocks for n in facts.expert_tensors_by_block[b]]
    result = mest.estimate(facts, Options(**kw), cpu_tensors=cpu)
    return max(g["total"] for g in result["gpus"]) / float(common.MIB)


def moved(result, names):
    return set(n for n in names if re.search(result["pattern"], n))


@pytest.mark.parametrize("free, ctx, parallel", [(24148, 32768, 2), (15746, 65536, 1), (11804, 32768, 4),
                                                 (7796, 32768, 1), (7796, 131072, 2)])
def test_nano_plans_fit_and_move_exactly_their_blocks(nano, free, ctx, parallel):
    result = plan(nano, [card(free)], None, Options(ctx, parallel))
    assert result["fits"] and result["offload"]
    gpu = result["memory"]["gpus"][0]
    assert gpu["free_after_mib"] >= 0 and gpu["kv_mib"] == round(6144 * kvc.pad(ctx, 256) / 2.0 ** 20, 2)
    wanted = set(n for b in result["cpu_expert_layers"] for n in nano.expert_tensors_by_block[b])
    assert moved(result, nano.tensor_names) == wanted  # the proof, redone here
    assert result["override_tensor"] == result["pattern"] + "=CPU"
    # just enough: one block fewer (the last one chosen) would not fit
    fewer = result["cpu_expert_layers"][:-1]
    if len(result["cpu_expert_layers"]) < len(nano.expert_blocks):
        assert need_mib(nano, fewer, ctx_size=ctx, parallel=parallel) > free
    # lowest index first, as --n-cpu-moe
    assert result["cpu_expert_layers"] == nano.expert_blocks[:len(result["cpu_expert_layers"])]
    assert result["n_cpu_moe"] == result["cpu_expert_layers"][-1] + 1


def test_nano_on_a_large_card_needs_no_offload(nano):
    result = plan(nano, [card(81007, "NVIDIA H100 80GB HBM3", 81559)], None, Options(32768, 2))
    assert result["offload"] is False and result["pattern"] == "" and result["override_tensor"] == ""
    assert result["cpu_expert_layers"] == [] and result["vram_saved_mib"] == 0
    assert "no expert moves" in result["reason"]
    assert result["headroom"]["this_plan"]["max_ctx_size"] > 32768


def test_nano_all_experts_gpu_weights(nano):
    result = plan(nano, [card(24148)], None, Options(32768, 2, mode="all"))
    assert len(result["cpu_expert_layers"]) == 23
    assert result["pattern"] == r"\.ffn_.*_exps\.weight" or moved(result, nano.tensor_names) == set(
        n for names in nano.expert_tensors_by_block.values() for n in names)
    assert 1369 <= result["memory"]["gpus"][0]["model_mib"] < 1371


def test_does_not_fit_says_how_much_is_missing(nano):
    with pytest.raises(PlanError) as info:
        plan(nano, [card(4096)], None, Options(262144, 4))
    message = str(info.value)
    missing = re.search(r"(\d+) MiB are missing", message)
    assert missing and int(missing.group(1)) > 0
    assert "ctx_size" in message and "cache_type_k" in message and "--no-op-offload" in message
    assert info.value.details["fits"] is False
    assert info.value.details["memory"]["gpus"][0]["free_after_mib"] == -int(missing.group(1)) or \
        math.isclose(-info.value.details["memory"]["gpus"][0]["free_after_mib"], int(missing.group(1)), abs_tol=1)


def test_headroom(nano):
    result = plan(nano, [card(24148)], None, Options(32768, 2))
    here = result["headroom"]["this_plan"]
    assert here["max_ctx_size"] >= 32768 and here["max_parallel"] >= 2
    assert need_mib(nano, result["cpu_expert_layers"], ctx_size=here["max_ctx_size"] + 256, parallel=2) > 24148
    everything = result["headroom"]["all_experts_on_cpu"]
    assert everything["max_ctx_size"] >= here["max_ctx_size"] and everything["max_parallel"] >= here["max_parallel"]


def test_layers_mode(demo):
    blocks = demo.expert_blocks
    assert blocks == [1, 4]
    by_count = plan(demo, [card(4096)], None, Options(512, mode="layers", cpu_expert_layers=1, margin_mib=0))
    assert by_count["cpu_expert_layers"] == [1] and by_count["n_cpu_moe"] == 2
    by_list = plan(demo, [card(4096)], None, Options(512, mode="layers", cpu_expert_layers=[4], margin_mib=0))
    assert by_list["cpu_expert_layers"] == [4] and by_list["n_cpu_moe"] is None
    assert moved(by_list, demo.tensor_names) == set(demo.expert_tensors_by_block[4])
    with pytest.raises(PlanError, match="hold no routed experts"):
        plan(demo, [card(4096)], None, Options(512, mode="layers", cpu_expert_layers=[0]))
    with pytest.raises(PlanError, match="needs cpu_expert_layers"):
        plan(demo, [card(4096)], None, Options(512, mode="layers"))


def test_auto_on_the_demo_model_moves_one_block_when_one_is_enough(demo):
    kw = dict(ctx_size=512, parallel=1, margin_mib=0, op_offload=False)
    none = need_mib(demo, [], **kw)
    one = need_mib(demo, [1], **kw)
    assert one < none
    free = int(math.ceil(one))
    if free >= none:
        pytest.skip("the demo model's blocks are too small to tell at MiB granularity")
    result = plan(demo, [card(free)], None, Options(512, margin_mib=0, op_offload=False))
    assert result["cpu_expert_layers"] == [1] and result["fits"]
    assert plan(demo, [card(int(math.ceil(none)))], None, Options(512, margin_mib=0, op_offload=False))["offload"] is False


def test_dual_gpu_split_or_single(nano):
    dual = [dict(card(24148, "NVIDIA RTX A5500", 24564), index=0, uuid="GPU-a"),
            dict(card(15746, "NVIDIA RTX A4000", 16376), index=1, uuid="GPU-b")]
    result = plan(nano, dual, None, Options(32768, 2))
    assert result["placement"] == "split" and result["offload"] is False  # 40 GB together hold everything
    assert result["tensor_split"] == "0.605,0.395" and result["visible_devices"] == "GPU-a,GPU-b"
    assert len(result["memory"]["gpus"]) == 2 and all(g["free_after_mib"] >= 0 for g in result["memory"]["gpus"])
    single = plan(nano, dual, None, Options(32768, 2, gpu_index=0))
    assert single["placement"] == "single" and single["visible_devices"] == "GPU-a" and single["offload"]
    forced = plan(nano, dual, None, Options(32768, 2, split=[1, 1]))
    assert forced["tensor_split"] == "0.5,0.5"
    big = [dict(card(81007), index=0), dict(card(81007), index=1)]
    assert plan(nano, big, None, Options(32768, 2))["placement"] == "single"  # one GPU is enough: no split
    with pytest.raises(PlanError, match="not both"):
        plan(nano, dual, None, Options(32768, gpu_index=0, split="auto"))
    with pytest.raises(PlanError, match="gpu_index 7"):
        plan(nano, dual, None, Options(32768, gpu_index=7))


@pytest.mark.parametrize("kwargs, words", [
    (dict(gpus=[{"name": "x", "memory_free_mib": 1000, "vram": 3}]), "unknown field"),
    (dict(gpus=[{"name": "GB10", "memory_total_mib": None, "memory_free_mib": None}]), "no free memory"),
    (dict(ctx_size=0), "ctx_size must be"),
    (dict(parallel=0), "parallel must be"),
    (dict(cache_type_k="q6_k"), "unknown cache_type_k"),
    (dict(mode="some"), "unknown mode"),
    (dict(split=[1]), "one share"),
    (dict(margin_mib=-1), "margin_mib"),
])
def test_bad_input_is_a_clear_plan_error(nano, kwargs, words):
    args = dict(gpus=[card(24148)], ctx_size=4096)
    args.update(kwargs)
    if "split" in kwargs:
        args["gpus"] = [card(1000), card(1000)]
    gpus = args.pop("gpus")
    with pytest.raises(PlanError, match=words):
        plan(nano, gpus, None, Options(**args))


def test_beyond_training_context_warns(demo):
    result = plan(demo, [card(81007)], None, Options(8192))
    assert any("training context" in w for w in result["warnings"])


def test_load_facts_errors(tmp_path):
    with pytest.raises(PlanError):
        load_facts(str(tmp_path / "missing.gguf"))
    with pytest.raises(PlanError, match="without files"):
        load_facts({"changed": False})
    for wrong in (42, ""):
        with pytest.raises(PlanError) as info:
            load_facts(wrong)
        assert str(info.value) == "gguf must be a path or the result of gguf_info, got %r" % (wrong,)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00")
    with pytest.raises(PlanError):
        load_facts(str(bad))
