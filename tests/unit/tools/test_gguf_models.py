"""tools/gguf_models.py writes what it says: each kind (every architecture, both byte orders, and the sparse
6-shard Nemotron-3-Nano-30B-A3B Q4_K_M header) read back with the collection's reader, each file cross-checked
with gguf-py's own GGUFReader.
"""
from __future__ import annotations

import os
from pathlib import Path

import gguf
import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.model import read_model
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.values import SkippedArray
from tests.helpers.gguf_files import MIB, cross_check
from tests.helpers.tensor_names import NEMOTRON_NANO_LAYOUT
from tools import gguf_models

# kind -> (general.architecture, tensor count, routed-expert tensor count), counted by hand from the layouts
EXPECTED = {
    "nemotron_h_moe": ("nemotron_h_moe", 40, 4),   # MEM*E: 3 globals + 2x9 Mamba + 2x7 MoE + 5 attention
    "demo": ("nemotron_h_moe", 40, 4),
    "qwen3moe": ("qwen3moe", 27, 6),               # 3 + 2 blocks x (norm, q/k/v/o, q/k norm, ffn_norm, router, 3 exps)
    "nemotron_h": ("nemotron_h", 32, 0),           # M-M*-: 3 + 2x9 + 2x3 + 5
    "qwen2moe": ("qwen2moe", 54, 9),               # 3 + 3 x 17
    "mixtral": ("llama", 33, 9),                   # 3 + 3 x 10
    "deepseek2": ("deepseek2", 70, 9),             # 3 + 1 dense x 13 + 3 MoE x 18
    "gpt-oss": ("gpt-oss", 41, 6),                 # 3 + 2 x 19 (exps .bias are not counted here)
    "fused_gate_up": ("qwen3moe", 25, 4),          # 3 + 2 x 11
    "chexps": ("grovemoe", 33, 12),                # 3 + 2 x 15 (3 exps + 3 chexps)
    "unknown_moe": ("mymoe", 42, 9),               # 3 + 3 x 13
    "dense_llama": ("llama", 21, 0),               # 3 + 2 x 9
}
EXPERT_SUFFIXES = ("_exps.weight", "_chexps.weight")


def test_every_kind_is_tested():
    assert set(EXPECTED) == set(gguf_models.ARCH_WRITERS) - {"nemotron-nano"}


def test_deterministic(tmp_path):
    a, b = (Path(gguf_models.write_tiny_nemotron_h_moe(tmp_path / name)) for name in ("a.gguf", "b.gguf"))
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.parametrize("dtype,type_name", [("f16", "F16"), ("q8_0", "Q8_0"), ("q4_0", "Q4_0")])
def test_expert_dtype(tmp_path, dtype, type_name):
    path = gguf_models.write_tiny_nemotron_h_moe(tmp_path / "m.gguf", dtype=dtype)
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert {types[n] for n in types if n.endswith("_exps.weight")} == {type_name}
    assert types["blk.1.ffn_up_shexp.weight"] == "F32"


def test_gpt_oss_experts_are_mxfp4_with_f32_biases(tmp_path):
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(gguf_models.write_gpt_oss(tmp_path / "g.gguf")).tensors}
    assert types["blk.0.ffn_down_exps.weight"] == gguf.GGMLQuantizationType.MXFP4
    assert types["blk.0.ffn_down_exps.bias"] == gguf.GGMLQuantizationType.F32
    assert "blk.0.attn_sinks.weight" in types


@pytest.mark.parametrize("endian", ["little", "big"])
@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_every_kind_reads_back(tmp_path, kind, endian):
    path = gguf_models.write_model(kind, str(tmp_path / (kind + ".gguf")), endian=endian)
    model = read_model(path)
    names = model.tensor_names
    assert (model.architecture, len(names), sum(n.endswith(EXPERT_SUFFIXES) for n in names)) == EXPECTED[kind]
    assert model.files == [path] and model.file_bytes == os.path.getsize(path)
    assert model.warnings == []
    assert all(t.nbytes is not None and t.nbytes > 0 for t in model.tensors)
    (shard,) = model.shards
    assert shard.byte_order == endian
    ref = cross_check(path, shard)
    assert os.path.getsize(path) == ref.tensors[-1].data_offset + ref.tensors[-1].n_bytes
    block_count = model.metadata.get(model.architecture + ".block_count")
    assert isinstance(block_count, int) and block_count > 0


@pytest.fixture(scope="module", params=["little", "big"])
def nano(request, tmp_path_factory):
    """The sparse Nemotron-3-Nano header with a small vocabulary (the tensor infos are the real ones)."""
    outdir = tmp_path_factory.mktemp("nano-" + request.param)
    files = gguf_models.write_nemotron_nano_30b(str(outdir), shards=6, endian=request.param, vocab_size=2048,
                                                n_merges=3000)
    return request.param, files


def test_nemotron_nano_6_shards(nano):
    endian, files = nano
    assert [os.path.basename(f) for f in files] == [
        "Nemotron-3-Nano-30B-A3B-Q4_K_M-%05d-of-00006.gguf" % i for i in range(1, 7)]
    model = read_model(files[3])
    assert model.files == files and model.architecture == "nemotron_h_moe"
    assert len(model.tensors) == 401
    for i, shard in enumerate(model.shards):
        split = [shard.metadata["split." + key] for key in ("no", "count", "tensors.count")]
        assert (split, "nemotron_h_moe.block_count" in shard.metadata) == ([i, 6, 401], i == 0)
        assert shard.file_size == shard.data_offset + shard.tensors[-1].offset + shard.tensors[-1].nbytes
        assert shard.byte_order == endian
        cross_check(shard.path, shard)
    assert [t.shard for t in model.tensors] == sorted(t.shard for t in model.tensors)
    assert {t.shard for t in model.tensors} == set(range(6))
    assert all(t.file == files[t.shard] for t in model.tensors)
    md = model.metadata
    assert (md["tokenizer.ggml.tokens"], md["tokenizer.ggml.merges"]) == (SkippedArray(8, 2048), SkippedArray(8, 3000))
    # the per-layer arrays that define the layer kinds are kept
    head_count_kv = md["nemotron_h_moe.attention.head_count_kv"]
    ffn = md["nemotron_h_moe.feed_forward_length"]
    assert len(head_count_kv) == len(ffn) == 52
    assert [i for i, n in enumerate(head_count_kv) if n > 0] == [
        i for i, c in enumerate(NEMOTRON_NANO_LAYOUT) if c == "*"]
    assert [i for i, n in enumerate(ffn) if n > 0] == [i for i, c in enumerate(NEMOTRON_NANO_LAYOUT) if c == "E"]
    experts = [t for t in model.tensors if "_exps." in t.name]
    assert len(experts) == 46
    by_name = {t.name: t for t in model.tensors}
    up = by_name["blk.1.ffn_up_exps.weight"]
    # the quantizer falls back from K-quants: 2688 is not a multiple of 256 (reference, section 3)
    assert (up.shape, up.type_name) == ((2688, 1856, 128), "Q5_0")
    assert by_name["blk.1.ffn_down_exps.weight"].shape == (1856, 2688, 128)
    assert by_name["token_embd.weight"].type_name == "Q5_0"  # 231 MiB at 131,072 tokens
    assert {t.type_name for t in experts} <= {"Q5_0", "Q8_0", "Q4_K", "Q6_K"}
    assert round(sum(t.nbytes for t in experts) / MIB) == 21772  # reference, section 3
