"""Builders for the planner's tests: the 30B Nemotron Nano (generated GGUF files), a small qwen3moe of exact sizes,
the bytes one GPU needs with chosen blocks in host memory, GPU rows as gpu_info gives them (or as the planner holds
them), the refusal of a plan, the tensors a pattern moves, and the model summary gguf_info gives for the real Gemma 3
270M Q4_K_M."""
from __future__ import annotations

import re

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _common as common
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _cuda_context as cctx
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _memory_estimate as mest
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _model_facts as mfacts
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _offload_plan as op
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _plan_inputs as pin
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import Options
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_placement import Sizer
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._tensor_classes import classify_model
from tests.helpers.memory_models import f32
from tools import gguf_models

SIZING = dict(backend="rpc", op_offload=False, margin_mib=0)  # exact bytes: no CUDA padding, no reserved copy


def nemotron_nano_30b(tmp_path_factory):
    """The facts of the generated Nemotron-3-Nano-30B-A3B in six shards (23 MoE blocks of 52, Mamba and
    attention blocks between them)."""
    return pin.load_facts(gguf_models.write_nemotron_nano_30b(tmp_path_factory.mktemp("nano"), shards=6)[0])


def exact_moe(kinds="DEEE", context_length=4096):
    """A qwen3moe of exact sizes: attention in every block (4 heads, 2 KV heads of 16), a dense FFN in the ``D``
    blocks and 8 routed experts of 64 (256 KiB a block) in the ``E`` blocks; ``"DD"`` is a dense model."""
    arch = "qwen3moe"
    tensors = [f32("token_embd.weight", 64, 512), f32("output.weight", 64, 512), f32("output_norm.weight", 64)]
    for b, kind in enumerate(kinds):
        p = "blk.%d." % b
        tensors += [f32(p + "attn_q.weight", 64, 64), f32(p + "attn_k.weight", 64, 32),
                    f32(p + "attn_v.weight", 64, 32), f32(p + "attn_output.weight", 64, 64)]
        if kind == "E":
            tensors += [f32(p + "ffn_gate_inp.weight", 64, 8), f32(p + "ffn_up_exps.weight", 64, 64, 8),
                        f32(p + "ffn_down_exps.weight", 64, 64, 8)]
        else:
            tensors += [f32(p + "ffn_up.weight", 64, 128), f32(p + "ffn_down.weight", 128, 64)]
    md = {"general.architecture": arch, arch + ".block_count": len(kinds), arch + ".embedding_length": 64,
          arch + ".attention.head_count": 4, arch + ".attention.head_count_kv": 2, arch + ".attention.key_length": 16,
          arch + ".attention.value_length": 16, arch + ".vocab_size": 512, arch + ".context_length": context_length,
          arch + ".expert_count": 8, arch + ".expert_used_count": 2, arch + ".expert_feed_forward_length": 64}
    return mfacts.model_facts(md, tensors, classify_model(arch, md, tensors))


def need(facts, blocks, ctx=4096, parallel=1, sizing=None, **kw):
    """Bytes the one GPU needs with the experts of ``blocks`` in host memory (``sizing`` SIZING unless given;
    ``sizing={}``: llama-server's defaults)."""
    sizing = SIZING if sizing is None else sizing
    cpu = [n for b in blocks for n in facts.expert_tensors_by_block[b]]
    return mest.estimate(facts, Options(ctx, parallel, **dict(sizing, **kw)), cpu_tensors=cpu)["gpus"][0]["total"]


def gpu(free, index=0, name=None, total=None):
    """A row of gpu_info: ``free`` MiB free (of ``total``, default ``free``)."""
    return {"name": name or "GPU%d" % index, "memory_total_mib": total or free, "memory_free_mib": free,
            "index": index, "uuid": "GPU-%d" % index}


def cuda_gpu(free, index=0, name=None, total=None):
    """``gpu`` for a plan of the CUDA backend: nvidia-smi shows ``free`` MiB for the buffers and the margin plus the
    card's CUDA context free before the start, and the plan takes the context off first (``_cuda_context``: the
    card's figure, or the assumption for a card without one), so that such a plan has ``free`` MiB to place."""
    row = gpu(free, index, name, total)
    context = cctx.context_of(row["name"])[0]
    row.update(memory_free_mib=free + context, memory_total_mib=row["memory_total_mib"] + context)
    return row


def sizer(facts, free_mib, available_mib=None):
    host = None if available_mib is None else pin.Host(available_mib, None, 0, "MemAvailable")
    gpus = [pin.Gpu("GPU0", 0, None, None, free_mib)]
    return Sizer(facts, gpus, None, Options(4096, **SIZING), host)


def plan_gpu(free, index):
    """A GPU as the planner holds it (``_plan_inputs.Gpu``)."""
    return pin.Gpu("GPU%d" % index, index, None, None, free)


def refusal(facts, gpus, host, options):
    """The ``PlanError`` that ``plan`` raises for these inputs."""
    with pytest.raises(pin.PlanError) as info:
        op.plan(facts, gpus, host, options)
    return info.value


def moved_by(pattern, names):
    return set(n for n in names if re.search(pattern, n))


def host_expert_mib(facts, result):
    sizes = facts.expert_bytes_by_block()
    return sum(sizes[b] for b in result["cpu_expert_layers"]) / float(common.MIB)


def gemma_summary():
    """The model summary gguf_info gives for the real Gemma 3 270M Q4_K_M (shapes and metadata of that file)."""
    md = {"general.architecture": "gemma3", "gemma3.context_length": 32768, "gemma3.embedding_length": 640,
          "gemma3.block_count": 18, "gemma3.feed_forward_length": 2048, "gemma3.attention.head_count": 4,
          "gemma3.attention.key_length": 256, "gemma3.attention.value_length": 256,
          "gemma3.attention.head_count_kv": 1, "gemma3.attention.sliding_window": 512,
          "tokenizer.ggml.tokens": {"count": 262144}}
    tensors = [["token_embd.weight", 8, [640, 262144], 178257920], ["output_norm.weight", 0, [640], 2560]]
    for b in range(18):
        p = "blk.%d." % b
        tensors += [[p + "attn_q.weight", 6, [640, 1024], 450560], [p + "attn_k.weight", 6, [640, 256], 112640],
                    [p + "attn_v.weight", 8, [640, 256], 174080], [p + "attn_output.weight", 12, [1024, 640], 368640],
                    [p + "ffn_gate.weight", 6, [640, 2048], 901120], [p + "ffn_up.weight", 6, [640, 2048], 901120],
                    [p + "ffn_down.weight", 14, [2048, 640], 1075200], [p + "attn_norm.weight", 0, [640], 2560]]
    return {"version": 1, "architecture": "gemma3", "files": ["/srv/models/gemma-3-270m-Q4_K_M.gguf"],
            "metadata": md, "tensors": tensors, "warnings": []}
