"""tools/gguf_transformers.py: the gpt-oss writer's experts are MXFP4 with F32 biases, beside the attention sinks."""
from __future__ import annotations

import gguf

from tools import gguf_transformers


def test_gpt_oss_experts_are_mxfp4_with_f32_biases(tmp_path):
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(gguf_transformers.write_gpt_oss(tmp_path / "g.gguf")).tensors}
    assert types["blk.0.ffn_down_exps.weight"] == gguf.GGMLQuantizationType.MXFP4
    assert types["blk.0.ffn_down_exps.bias"] == gguf.GGMLQuantizationType.F32
    assert "blk.0.attn_sinks.weight" in types
