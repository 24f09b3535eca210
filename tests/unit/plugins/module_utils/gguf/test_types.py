"""The ggml tensor types (plugins/module_utils/gguf/types.py): the type table and tensor sizes against gguf-py's
(``GGML_QUANT_SIZES``, ggml.h ``enum ggml_type``)."""
from __future__ import annotations

import gguf
import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.header import read_gguf
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.types import (
    GGML_TYPES, REMOVED_TYPE_IDS, tensor_nbytes)
from tests.helpers.gguf_files import cross_check, write_gguf


def test_type_table_is_gguf_py_table():
    """Every id of ggml's type table (ggml.h enum ggml_type), with the block sizes llama.cpp's gguf-py uses."""
    assert set(GGML_TYPES) == {int(q) for q in gguf.GGML_QUANT_SIZES}
    for q, (block, size) in gguf.GGML_QUANT_SIZES.items():
        assert GGML_TYPES[int(q)] == (q.name, block, size)
    for removed in (4, 5, 31, 32, 33, 36, 37, 38):
        assert removed not in GGML_TYPES and removed in REMOVED_TYPE_IDS
        assert removed not in {int(q) for q in gguf.GGMLQuantizationType}  # gguf-py dropped them too


def test_tensor_nbytes():
    assert tensor_nbytes(12, (2816, 1856, 128)) == 2816 // 256 * 144 * 1856 * 128
    assert tensor_nbytes(6, (2688, 1856, 128)) == 2688 // 32 * 22 * 1856 * 128
    assert tensor_nbytes(0, ()) == 4
    assert tensor_nbytes(0, (3, 0)) == 0
    assert tensor_nbytes(99, (32,)) is None
    with pytest.raises(ValueError, match="not a multiple"):
        tensor_nbytes(12, (2688, 1856))  # 2688 is not a multiple of 256: why Q4_K falls back to Q5_0


def test_every_ggml_type_as_a_tensor(tmp_path, endian):
    tensors = [("t.%s" % name, (block * 2, 3), tid) for tid, (name, block, _size) in sorted(GGML_TYPES.items())]
    path = write_gguf(tmp_path / "types.gguf", [], tensors, endian=endian)[0]
    gf = read_gguf(path)
    for t, (tid, (name, block, size)) in zip(gf.tensors, sorted(GGML_TYPES.items())):
        assert (t.type_id, t.type_name, t.nbytes) == (tid, name, 2 * size * 3)
    cross_check(path, gf)
