"""tools/gguf_nemotron.py: the tiny nemotron_h_moe is the same file twice and has the expert type asked for, and
the sparse 6-shard Nemotron-3-Nano-30B-A3B Q4_K_M header is read back shard by shard with the collection's
reader, each shard cross-checked with gguf-py's own GGUFReader.
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
from tools import gguf_nemotron


def test_deterministic(tmp_path):
    a, b = (Path(gguf_nemotron.write_tiny_nemotron_h_moe(tmp_path / name)) for name in ("a.gguf", "b.gguf"))
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.parametrize("dtype,type_name", [("f16", "F16"), ("q8_0", "Q8_0"), ("q4_0", "Q4_0")])
def test_expert_dtype(tmp_path, dtype, type_name):
    path = gguf_nemotron.write_tiny_nemotron_h_moe(tmp_path / "m.gguf", dtype=dtype)
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert {types[n] for n in types if n.endswith("_exps.weight")} == {type_name}
    assert types["blk.1.ffn_up_shexp.weight"] == "F32"


@pytest.fixture(scope="module", params=["little", "big"])
def nano(request, tmp_path_factory):
    """The sparse Nemotron-3-Nano header with a small vocabulary (the tensor infos are the real ones)."""
    outdir = tmp_path_factory.mktemp("nano-" + request.param)
    files = gguf_nemotron.write_nemotron_nano_30b(str(outdir), shards=6, endian=request.param, vocab_size=2048,
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
