"""The options of a plan (``_plan_options.Options``): frozen, llama-server's defaults, flash attention as llama.cpp
reads ``-fa`` (``auto`` turns it on where the backend has it), and the same options at another context or slot
count for the planner's headroom search."""
from __future__ import annotations

import dataclasses

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import (
    DEFAULT_BATCH, DEFAULT_HOST_MARGIN_MIB, DEFAULT_MARGIN_MIB, Options)


def test_defaults_are_llama_server_s_the_options_frozen_and_at_changes_only_context_and_slots():
    """common/common.h: n_parallel 1, n_batch 2048, n_ubatch 512, f16 caches, flash attention auto, mmap on."""
    options = Options(4096)
    assert (options.parallel, options.batch, options.ubatch, options.cache_type_k, options.cache_type_v) == (
        1, 2048, 512, "f16", "f16")
    assert (options.flash_attn, options.mmap, options.op_offload, options.kv_unified, options.swa_full) == (
        "auto", True, True, False, False)
    assert (DEFAULT_BATCH, DEFAULT_MARGIN_MIB, DEFAULT_HOST_MARGIN_MIB) == (2048, 1024, 1024)
    assert (options.mode, options.split, options.pattern, options.experts_per_gpu) == ("auto", None, None, True)
    options = Options(4096, 2, cache_type_k="q8_0", mode="all")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.ctx_size = 8192  # type: ignore[misc]
    wider = options.at(8192)
    assert (wider.ctx_size, wider.parallel, wider.cache_type_k, wider.mode) == (8192, 2, "q8_0", "all")
    assert options.at(None, 4) == dataclasses.replace(options, parallel=4)
    assert options.at() == options and options.ctx_size == 4096


@pytest.mark.parametrize("value, flash", [
    ("auto", True), ("on", True), (True, True), ("true", True), ("enabled", True),
    ("off", False), (False, False), ("false", False)])
def test_flash_attention_is_on_for_on_and_auto(value, flash):
    assert Options(4096, flash_attn=value).flash is flash
