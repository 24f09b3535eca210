"""tools/gguf_models.py writes what it says: each kind of its registry (every architecture, both byte orders) read
back with the collection's reader, each file cross-checked with gguf-py's own GGUFReader. The families' own
checks: test_gguf_nemotron.py, test_gguf_transformers.py.
"""
from __future__ import annotations

import os

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.model import read_model
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.values import SkippedArray
from tests.helpers.gguf_files import cross_check
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


def test_the_command_line_passes_integer_options_and_writes_a_model_of_the_wrong_shape(tmp_path, capsys):
    assert gguf_models.main(["nemotron-nano", str(tmp_path / "nano"), "--set", "shards=1", "--set", "vocab_size=1024",
                             "--set", "n_merges=1000"]) == 0
    nano = tmp_path / "nano" / "Nemotron-3-Nano-30B-A3B-Q4_K_M.gguf"
    assert capsys.readouterr().out == "%s\n" % nano
    assert read_model(str(nano)).metadata["tokenizer.ggml.tokens"] == SkippedArray(8, 1024)
    assert gguf_models.main(["demo", str(tmp_path / "wrong.gguf"), "--wrong-shape"]) == 0
    wrong = read_model(str(tmp_path / "wrong.gguf"))
    # the header claims 128 while token_embd keeps the demo model's width of 256: llama-server's check_tensor_dims
    assert wrong.metadata["nemotron_h_moe.embedding_length"] == 128
    assert {t.name: t.shape for t in wrong.tensors}["token_embd.weight"][0] == 256
    assert wrong.file_bytes == os.path.getsize(gguf_models.write_demo_model(tmp_path / "demo.gguf"))
