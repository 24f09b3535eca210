# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The GGUF metadata keys this collection reads, one table, named as gguf-py names them.

Names and values are those of llama.cpp's gguf-py, ``gguf/constants.py`` class ``Keys`` (the same strings as
``src/llama-arch.cpp`` ``LLM_KV_NAMES``); ``tests/unit/plugins/module_utils/gguf/test_keys.py`` checks every one
against the installed gguf-py. Per-architecture keys are format strings with an ``{arch}`` field:
``arch_key(LLM.BLOCK_COUNT, "qwen3moe")`` is ``"qwen3moe.block_count"``. Standard library only (this file runs on
the target hosts)."""
from __future__ import annotations


class General:
    ARCHITECTURE = "general.architecture"
    ALIGNMENT = "general.alignment"


class LLM:
    VOCAB_SIZE = "{arch}.vocab_size"
    CONTEXT_LENGTH = "{arch}.context_length"
    EMBEDDING_LENGTH = "{arch}.embedding_length"
    BLOCK_COUNT = "{arch}.block_count"
    FEED_FORWARD_LENGTH = "{arch}.feed_forward_length"
    EXPERT_FEED_FORWARD_LENGTH = "{arch}.expert_feed_forward_length"
    EXPERT_COUNT = "{arch}.expert_count"
    EXPERT_USED_COUNT = "{arch}.expert_used_count"
    EXPERT_SHARED_COUNT = "{arch}.expert_shared_count"
    TOKEN_SHIFT_COUNT = "{arch}.token_shift_count"


class Attention:
    HEAD_COUNT = "{arch}.attention.head_count"
    HEAD_COUNT_KV = "{arch}.attention.head_count_kv"
    KEY_LENGTH = "{arch}.attention.key_length"
    VALUE_LENGTH = "{arch}.attention.value_length"
    KEY_LENGTH_MLA = "{arch}.attention.key_length_mla"
    VALUE_LENGTH_MLA = "{arch}.attention.value_length_mla"
    KEY_LENGTH_SWA = "{arch}.attention.key_length_swa"
    VALUE_LENGTH_SWA = "{arch}.attention.value_length_swa"
    SLIDING_WINDOW = "{arch}.attention.sliding_window"
    SLIDING_WINDOW_PATTERN = "{arch}.attention.sliding_window_pattern"
    SHARED_KV_LAYERS = "{arch}.attention.shared_kv_layers"


class SSM:
    CONV_KERNEL = "{arch}.ssm.conv_kernel"
    INNER_SIZE = "{arch}.ssm.inner_size"
    STATE_SIZE = "{arch}.ssm.state_size"
    TIME_STEP_RANK = "{arch}.ssm.time_step_rank"
    GROUP_COUNT = "{arch}.ssm.group_count"


class WKV:
    HEAD_SIZE = "{arch}.wkv.head_size"


class ShortConv:
    L_CACHE = "{arch}.shortconv.l_cache"


class Split:
    LLM_KV_SPLIT_NO = "split.no"
    LLM_KV_SPLIT_COUNT = "split.count"
    LLM_KV_SPLIT_TENSORS_COUNT = "split.tensors.count"


class Tokenizer:
    LIST = "tokenizer.ggml.tokens"
    UNK_ID = "tokenizer.ggml.unknown_token_id"


TABLE = (General, LLM, Attention, SSM, WKV, ShortConv, Split, Tokenizer)


def arch_key(template, arch):
    """The key ``template`` (one of the ``{arch}`` keys above) for the architecture ``arch``."""
    return template.format(arch=arch)


def arch_prefix(arch):
    """The start every per-architecture key of ``arch`` shares (``"qwen3moe."``), as gguf-py's ``{arch}.`` keys."""
    return arch_key("{arch}.", arch)
