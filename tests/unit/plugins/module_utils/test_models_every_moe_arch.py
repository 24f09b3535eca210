"""Inspection of random layouts: every MoE architecture gguf-py knows, random quant types, shards and byte orders;
dense models; implausible block numbers; a fuzz campaign on real multi-shard files."""
from __future__ import annotations

import os
import random
import re
import shutil
import signal
import struct

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_inspection import describe
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_plan import plan
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_inputs import PlanError, load_facts
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import Options
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._tensor_classes import MAX_BLOCKS
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.error import GGUFError
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.model import read_model

from tests.helpers import gguf_layouts as H

SEEDS = (11, 12)
GPU = [{"name": "test card", "memory_total_mib": 24564, "memory_free_mib": 20000}]


def check_layout(layout, files):
    model = read_model(files[-1])  # any shard finds the others
    result, _warnings = describe(model, "all")
    assert result["files"] == files
    assert result["expert_tensors"] == layout.experts
    pattern = result["offload_pattern"]
    moved = sorted(n for n in layout.names if pattern and re.search(pattern, n))
    assert moved == layout.experts, pattern
    assert result["offload_pattern_matches"] == layout.experts
    assert "," not in pattern and "=" not in pattern
    assert result["tensor_bytes"] == layout.total_bytes == sum(result["bytes"].values())
    assert result["bytes"]["routed_experts"] == sum(
        H.gguf_writer.tensor_nbytes(ne, q) for n, ne, q in layout.tensors if n in set(layout.experts))
    assert result["block_count"] == layout.blocks
    kinds = result["layer_kinds"]
    assert {b: {k for k in kinds if b in kinds[k]} for b in range(layout.blocks)} == layout.kinds
    return result


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("arch", H.moe_architectures())
def test_every_moe_architecture_of_gguf_py(tmp_path, arch, seed):
    layout = H.make_layout(arch, seed)
    files = H.write_layout(layout, tmp_path, seed)
    result = check_layout(layout, files)
    assert result["expert_tensors"]
    assert result["expert_count"] == layout.metadata["%s.expert_count" % arch][0]


@pytest.mark.parametrize("arch", H.dense_architectures()[::3] + ["llama", "deepseek2", "nemotron_h"])
def test_dense_models_get_an_empty_pattern(tmp_path, arch):
    layout = H.make_layout(arch, 5, moe=False)
    files = H.write_layout(layout, tmp_path, 5)
    result = check_layout(layout, files)
    assert result["expert_tensors"] == [] and result["offload_pattern"] == ""
    assert "nothing to offload" in result["msg"]


def test_implausible_block_numbers_do_not_hang(tmp_path):
    """A block_count of 2**31 or a tensor named blk.4000000000.x is refused quickly, without a loop over every block
    number."""
    layout = H.make_layout("qwen3moe", 3)
    layout.metadata["qwen3moe.block_count"] = (2 ** 31, H.gguf.GGUFValueType.UINT32)
    files = H.write_layout(layout, tmp_path / "a", 3, shards=2)
    signal.alarm(20)
    try:
        result, warnings = describe(read_model(files[0]), "none")
        assert result["block_count"] == layout.blocks and any("implausible" in w for w in warnings)
        layout.tensors.append(("blk.4000000000.ffn_up_exps.weight", (256, 256, 2), H.gguf.GGMLQuantizationType.F16))
        files = H.write_layout(layout, tmp_path / "b", 3, shards=1)
        result, warnings = describe(read_model(files[0]), "none")
        assert result["block_count"] == 4000000001 and result["layer_kinds"]["moe"][-1] == 4000000000
        assert any("only the blocks that hold tensors" in w for w in warnings)
        with pytest.raises(PlanError, match="implausible"):
            plan(load_facts(files[0]), GPU, None, Options(4096))
    finally:
        signal.alarm(0)
    assert 4000000000 > MAX_BLOCKS


# --------------------------------------------------------------------------- fuzz campaign on multi-shard files

@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    base = tmp_path_factory.mktemp("fuzz")
    archs = ["qwen3moe", "gpt-oss", "deepseek2", "nemotron_h_moe", "granitehybrid", "lfm2moe"]
    return [H.write_layout(H.make_layout(arch, i), base / str(i), i, shards=2 + i % 3, endian=("little", "big")[i % 2])
            for i, arch in enumerate(archs)]


def _mutate(rng, files, sources):
    kind = rng.choice(("flip", "u64", "u32", "truncate", "foreign", "duplicate", "swap"))
    target = rng.choice(files)
    size = os.path.getsize(target)
    header = min(size, 6000)
    with open(target, "r+b") as f:
        if kind == "flip":
            for _i in range(rng.randint(1, 8)):
                pos = rng.randrange(header)
                f.seek(pos)
                byte = f.read(1)[0]
                f.seek(pos)
                f.write(bytes([byte ^ (1 << rng.randrange(8))]))
        elif kind == "u64":
            f.seek(rng.randrange(header - 8))
            f.write(struct.pack("<Q", rng.choice((0, 1, 2 ** 31, 2 ** 32 - 1, 2 ** 63 - 1, 2 ** 64 - 1))))
        elif kind == "u32":
            f.seek(rng.randrange(header - 4))
            f.write(struct.pack(rng.choice("<>") + "I", rng.choice((0, 1, 7, 13, 513, 2 ** 31, 2 ** 32 - 1))))
        elif kind == "truncate":
            f.truncate(rng.randrange(size))
    if kind == "foreign":  # a shard of another model under this name
        shutil.copy(rng.choice(rng.choice(sources)), target)
    elif kind == "duplicate" and len(files) > 1:
        shutil.copy(files[0], files[1])
    elif kind == "swap" and len(files) > 1:
        os.rename(files[0], files[0] + ".tmp")
        os.rename(files[1], files[0])
        os.rename(files[0] + ".tmp", files[1])
    return kind


@pytest.mark.parametrize("seed", range(4))
def test_mutated_multi_shard_files_fail_cleanly(tmp_path, sources, seed):
    """Only GGUFError from the reader and PlanError from the planner; never a hang or another exception."""
    rng = random.Random(seed)
    outcomes = {"read error": 0, "ok": 0, "plan error": 0}
    for i in range(60):
        src = rng.choice(sources)
        folder = tmp_path / str(i)
        folder.mkdir()
        files = [shutil.copy(f, folder) for f in src]
        _mutate(rng, files, sources)
        path = rng.choice(files)
        signal.alarm(20)
        try:
            try:
                model = read_model(path)
            except GGUFError as exc:
                assert str(exc).startswith(exc.path + ": at byte %d: " % exc.offset) and exc.reason
                outcomes["read error"] += 1
                continue
            describe(model, "all", r"\.ffn_.*_exps\.")
            try:
                plan(load_facts(path), GPU, None, Options(4096, 2))
                outcomes["ok"] += 1
            except PlanError as exc:
                assert str(exc)
                outcomes["plan error"] += 1
        finally:
            signal.alarm(0)
    assert outcomes["read error"] > 0 and outcomes["ok"] > 0
