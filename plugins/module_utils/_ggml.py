# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Facts of llama.cpp that the planner and the deploy share, each kept once.

Standard library only: this runs on target hosts (Python >= 3.9). The ggml tensor types themselves are the GGUF
reader's (``gguf.types``).

* ``CACHE_TYPES``: the KV cache types llama-server accepts for ``-ctk`` / ``-ctv``
  (common/arg.cpp ``kv_cache_types``);
* ``BLOCK_RE`` / ``block_index``: the ``blk.N.`` prefix of a repeating layer's tensors
  (src/llama-arch.cpp ``LLM_TENSOR_NAMES``);
* ``MAX_BLOCKS`` / ``LLAMA_MAX_LAYERS``: what a plausible block count is;
* ``OFFLOAD_MODES``: the placements the planner knows.
"""

from __future__ import annotations

import re

from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.types import GGML_TYPES

# KV cache types of llama-server's -ctk / -ctv: lower-case name -> (elements per block, bytes per block).
CACHE_TYPES = dict(
    (name.lower(), (block, size)) for name, block, size in GGML_TYPES.values()
    if name in ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "IQ4_NL", "Q5_0", "Q5_1"))

# Repeating layers: "blk.<N>.<rest>".
BLOCK_RE = re.compile(r"^blk\.([0-9]+)\.")
LLAMA_MAX_LAYERS = 512  # llama.cpp refuses models with more blocks (src/llama-hparams.h LLAMA_MAX_LAYERS)
MAX_BLOCKS = 65536  # more than this is a broken header, not a model: never loop over that many

# Where the routed experts go (moe_offload_plan's mode).
OFFLOAD_MODES = ("auto", "all", "none", "layers")


def block_index(name):
    """The block number of ``blk.N.<...>`` tensor names, ``None`` for global tensors."""
    match = BLOCK_RE.match(name)
    return int(match.group(1)) if match else None
