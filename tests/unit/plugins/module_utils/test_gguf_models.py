"""The GGUF reader on the project's model writers (tools/gguf_models.py): every architecture, both byte
orders, and the sparse 6-shard Nemotron-3-Nano-30B-A3B Q4_K_M header; each file cross-checked with GGUFReader."""
from __future__ import annotations

import inspect
import os

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._gguf import (
    GGUFError,
    SkippedArray,
    find_split_files,
    read_model,
)
from test_gguf_reader import cross_check, expect_error
from tools import gguf_models

KINDS = sorted(k for k in gguf_models.ARCH_WRITERS if k != "nemotron-nano")
NANO_LAYOUT = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"  # reference, section 3
MIB = 1 << 20


def endians_of(kind):
    writer = gguf_models.ARCH_WRITERS[kind]
    return ["little", "big"] if "endian" in inspect.signature(writer).parameters else ["little"]


@pytest.mark.parametrize("kind,endian", [(k, e) for k in KINDS for e in endians_of(k)])
def test_every_architecture(tmp_path, kind, endian):
    kw = {"endian": endian} if endian == "big" else {}
    written = gguf_models.write_model(kind, str(tmp_path / (kind + ".gguf")), **kw)
    files = written if isinstance(written, list) else [written]
    model = read_model(files[0])
    assert model.files == files
    assert model.architecture == model.metadata["general.architecture"]
    assert model.file_bytes == sum(os.path.getsize(f) for f in files)
    assert model.warnings == []
    assert len({t.name for t in model.tensors}) == len(model.tensors) > 0
    assert all(t.nbytes is not None and t.nbytes > 0 for t in model.tensors)
    for shard in model.shards:
        assert shard.byte_order == endian
        cross_check(shard.path, shard)
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
    for shard in files:
        assert find_split_files(shard) == files
    model = read_model(files[3])
    assert model.files == files and model.architecture == "nemotron_h_moe"
    assert len(model.tensors) == 401
    assert [t.shard for t in model.tensors] == sorted(t.shard for t in model.tensors)
    assert {t.shard for t in model.tensors} == set(range(6))
    assert all(t.file == files[t.shard] for t in model.tensors)
    md = model.metadata
    assert md["split.count"] == 6 and md["split.tensors.count"] == 401
    assert md["tokenizer.ggml.tokens"] == SkippedArray(8, 2048)
    assert md["tokenizer.ggml.merges"] == SkippedArray(8, 3000)
    # the per-layer arrays that define the layer kinds are kept
    head_count_kv = md["nemotron_h_moe.attention.head_count_kv"]
    ffn = md["nemotron_h_moe.feed_forward_length"]
    assert len(head_count_kv) == len(ffn) == 52
    assert [i for i, n in enumerate(head_count_kv) if n > 0] == [i for i, c in enumerate(NANO_LAYOUT) if c == "*"]
    assert [i for i, n in enumerate(ffn) if n > 0] == [i for i, c in enumerate(NANO_LAYOUT) if c == "E"]
    experts = [t for t in model.tensors if "_exps." in t.name]
    assert len(experts) == 46
    up = next(t for t in experts if t.name == "blk.1.ffn_up_exps.weight")
    assert up.shape == (2688, 1856, 128)
    # the quantizer falls back from K-quants: 2688 is not a multiple of 256 (reference, section 3)
    assert {t.type_name for t in experts} <= {"Q5_0", "Q8_0", "Q4_K", "Q6_K"}
    assert abs(sum(t.nbytes for t in experts) / MIB - 21772) < 5
    assert model.file_bytes == sum(os.path.getsize(f) for f in files)
    assert model.file_bytes > sum(t.nbytes for t in model.tensors)
    assert all(shard.byte_order == endian for shard in model.shards)
    for shard in model.shards:
        cross_check(shard.path, shard)


def test_nemotron_nano_missing_shard(nano, tmp_path):
    _endian, files = nano
    for i, f in enumerate(files):
        if i != 4:
            os.symlink(f, str(tmp_path / os.path.basename(f)))
    given = str(tmp_path / os.path.basename(files[0]))
    err = expect_error(given, 0, "shard 5 of 6 is missing", reader=read_model)
    assert os.path.basename(files[4]) in err.reason
    with pytest.raises(GGUFError):
        find_split_files(str(tmp_path / os.path.basename(files[5])))
