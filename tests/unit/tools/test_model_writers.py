"""tools/gguf_models.py writes what it says: each kind read back with gguf-py's own GGUFReader.

(Named test_model_writers.py: tests/unit/plugins/module_utils/test_gguf_models.py already holds that basename.)
"""
from __future__ import annotations

import os

import gguf
import pytest

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


def read(path):
    reader = gguf.GGUFReader(path)
    return reader, reader.fields["general.architecture"].contents()


def test_every_kind_is_tested():
    assert set(EXPECTED) == set(gguf_models.ARCH_WRITERS) - {"nemotron-nano"}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_kind_reads_back(tmp_path, kind):
    path = gguf_models.write_model(kind, tmp_path / (kind + ".gguf"))
    reader, arch = read(path)
    names = [t.name for t in reader.tensors]
    assert (arch, len(names), sum(n.endswith(EXPERT_SUFFIXES) for n in names)) == EXPECTED[kind]
    assert len(set(names)) == len(names)
    assert os.path.getsize(path) == reader.tensors[-1].data_offset + reader.tensors[-1].n_bytes


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_big_endian(tmp_path, kind):
    path = gguf_models.write_model(kind, tmp_path / (kind + ".gguf"), endian="big")
    reader, arch = read(path)
    assert reader.endianess == gguf.GGUFEndian.BIG
    assert (arch, len(reader.tensors)) == EXPECTED[kind][:2]


def test_deterministic(tmp_path):
    a = gguf_models.write_tiny_nemotron_h_moe(tmp_path / "a.gguf")
    b = gguf_models.write_tiny_nemotron_h_moe(tmp_path / "b.gguf")
    with open(a, "rb") as fa, open(b, "rb") as fb:
        assert fa.read() == fb.read()


@pytest.mark.parametrize("dtype,type_name", [("f16", "F16"), ("q8_0", "Q8_0"), ("q4_0", "Q4_0")])
def test_expert_dtype(tmp_path, dtype, type_name):
    reader = read(gguf_models.write_tiny_nemotron_h_moe(tmp_path / "m.gguf", dtype=dtype))[0]
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert {types[n] for n in types if n.endswith("_exps.weight")} == {type_name}
    assert types["blk.1.ffn_up_shexp.weight"] == "F32"


def test_gpt_oss_experts_are_mxfp4_with_f32_biases(tmp_path):
    reader = read(gguf_models.write_gpt_oss(tmp_path / "g.gguf"))[0]
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["blk.0.ffn_down_exps.weight"] == gguf.GGMLQuantizationType.MXFP4
    assert types["blk.0.ffn_down_exps.bias"] == gguf.GGMLQuantizationType.F32
    assert "blk.0.attn_sinks.weight" in types


def test_nemotron_nano_header(tmp_path):
    files = gguf_models.write_nemotron_nano_30b(tmp_path, vocab_size=1000, n_merges=1000)
    assert [os.path.basename(f) for f in files] == [
        "Nemotron-3-Nano-30B-A3B-Q4_K_M-%05d-of-00006.gguf" % i for i in range(1, 7)]
    tensors = []
    for i, f in enumerate(files):
        reader = gguf.GGUFReader(f)
        assert reader.fields["split.no"].contents() == i
        assert reader.fields["split.count"].contents() == 6
        assert reader.fields["split.tensors.count"].contents() == 401
        assert ("nemotron_h_moe.block_count" in reader.fields) == (i == 0)
        assert os.path.getsize(f) == reader.tensors[-1].data_offset + reader.tensors[-1].n_bytes
        tensors += reader.tensors
    assert len(tensors) == 401
    by_name = {t.name: t for t in tensors}
    up = by_name["blk.1.ffn_up_exps.weight"]
    assert (list(up.shape), up.tensor_type.name) == ([2688, 1856, 128], "Q5_0")
    assert list(by_name["blk.1.ffn_down_exps.weight"].shape) == [1856, 2688, 128]
    experts = sum(t.n_bytes for t in tensors if t.name.endswith("_exps.weight"))
    assert sum(t.name.endswith("_exps.weight") for t in tensors) == 46
    assert round(experts / 2**20) == 21772  # reference, section 3
    assert by_name["token_embd.weight"].tensor_type.name == "Q5_0"  # 231 MiB at 131,072 tokens
