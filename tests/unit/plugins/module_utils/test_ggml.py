"""Facts of llama.cpp (plugins/module_utils/_ggml.py): the block number of a tensor name."""
from __future__ import annotations

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import block_index


def test_block_index_reads_the_whole_number():
    names = ["blk.10.ffn_up_exps.weight", "blk.1.attn_q.weight", "output.weight", "v.blk.1.attn_q.weight"]
    assert [block_index(n) for n in names] == [10, 1, None, None]
