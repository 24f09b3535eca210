# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The stages of a start of llama-server, read from its log: where a start that is not ready yet is.

Standard library only (runs on target hosts, Python >= 3.9).
"""
from __future__ import annotations

# The stages of a start of llama-server (b10435), by the line it prints when it enters each, in that order:
# tools/server/server-context.cpp load_model ("loading model '%s'", "initializing, n_slots = ..."),
# src/llama-model.cpp load_tensors ("loading model tensors, this can take a while..."), src/llama-context.cpp
# llama_context::llama_context ("constructing llama_context"), common/common.cpp common_init_from_params
# ("warming up the model with an empty run"), tools/server/server.cpp main ("model loaded", "listening on").
STAGES = (
    ("loading model '", "reading the model's header"),
    ("loading model tensors", "loading the tensors"),
    ("constructing llama_context", "making the context (KV cache, compute buffers)"),
    ("warming up the model", "warming up"),
    ("initializing, n_slots", "making the slots"),
    ("model loaded", "model loaded"),
    ("listening on", "listening"),
)
# one line per tensor as the loader creates it (src/llama-model.cpp create_tensor, at -lv 5)
TENSOR_CREATED = "create_tensor: loading tensor "


def load_stage(lines):
    """Where the last start of llama-server in ``lines`` (its log) is, in words: its last stage (``STAGES``), with
    the tensors created so far while it loads them; ``"starting"`` before the first stage line."""
    stage, created = "starting", 0
    for line in lines:
        if TENSOR_CREATED in line:
            created += 1
            continue
        for marker, name in STAGES:
            if marker in line:
                stage, created = name, 0
                break
    if stage == STAGES[1][1] and created:
        return "%s (%d created)" % (stage, created)
    return stage
