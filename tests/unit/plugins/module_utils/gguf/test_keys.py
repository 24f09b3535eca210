"""The key table is gguf-py's: every key this collection reads has the name and the string of llama.cpp's
gguf-py ``gguf/constants.py`` ``Keys`` (the installed gguf package is the reference)."""
from __future__ import annotations

import gguf
import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf import keys
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.keys import LLM, TABLE, arch_key, arch_prefix

KEYS = [(cls, name) for cls in TABLE for name in vars(cls) if name.isupper()]


def test_the_table_lists_each_of_its_classes_and_no_key_twice():
    assert sorted(c.__name__ for c in TABLE) == sorted(
        n for n, v in vars(keys).items() if isinstance(v, type) and v.__module__ == keys.__name__)
    values = [getattr(cls, name) for cls, name in KEYS]
    assert len(values) == len(set(values))


@pytest.mark.parametrize("cls,name", KEYS, ids=["%s.%s" % (c.__name__, n) for c, n in KEYS])
def test_every_key_is_gguf_pys(cls, name):
    assert getattr(cls, name) == getattr(getattr(gguf.Keys, cls.__name__), name)


def test_arch_key_fills_the_architecture_in_as_gguf_py_does():
    assert arch_key(LLM.BLOCK_COUNT, "qwen3moe") == "qwen3moe.block_count"
    assert arch_key(LLM.EXPERT_COUNT, "gpt-oss") == gguf.Keys.LLM.EXPERT_COUNT.format(arch="gpt-oss")
    assert arch_key("general.architecture", "x") == "general.architecture"
    assert arch_prefix("qwen3moe") == "qwen3moe."
