"""The escapes of the patterns built from tensor names: a ``.`` of a name is a literal dot (``\\.``), never
"any character", in the stems and the explicit list alike. llama.cpp builds ``std::regex`` (ECMAScript) from the
``--override-tensor`` pattern and keeps the override whose ``std::regex_search`` finds the tensor name
(src/llama-model-loader.cpp ``create_tensor``), where an unescaped ``.`` matches any character: a name that
differs from an expert tensor's only where the expert's has a dot would be moved too."""
from __future__ import annotations

import re

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _offload_pattern as op


def test_escape_writes_a_dot_as_a_literal():
    assert op.escape("blk.0.ffn_up_exps.weight") == r"blk\.0\.ffn_up_exps\.weight"
    assert op.escape("x(y)|z*") == r"x\(y\)\|z\*"
    assert op.escape("a,b=c") == "a.b.c"                       # readable; the proof rejects an over-match
    assert op.escape("a,b=c", exact=True) == r"a\x2cb\x3dc"
    for name in ("blk.0.moe.up.weight", "a.b", "."):
        assert re.fullmatch(op.escape(name), name)
        assert re.fullmatch(op.escape(name), name.replace(".", "X")) is None


@pytest.mark.parametrize("experts, others", [
    # the stem fallback: \.moe\.up\.weight$
    (["blk.0.moe.up.weight", "blk.1.moe.up.weight"], ["blk.0.moeXup.weight", "blk.1.moe_up.weight", "output.weight"]),
    # the explicit list: one block's names, beside the same stems of other blocks and look-alikes
    (["blk.2.moe.up.weight"], ["blk.0.moe.up.weight", "blk.2.moe_up.weight", "blk.2Xmoe.up.weight"]),
])
def test_a_pattern_never_moves_a_name_that_differs_at_a_dot(experts, others):
    pattern = op.expert_pattern(experts + others, experts)
    search = re.compile(pattern).search
    assert sorted(n for n in experts + others if search(n)) == sorted(experts)
    assert "\\." in pattern
