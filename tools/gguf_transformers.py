"""The attention-based models of ``gguf_models`` in llama.cpp's tensor naming: the tiny ``qwen3moe`` llama-server loads,
and small header-only models of several architectures (their attention, routed and shared experts as each names
them).
"""
from __future__ import annotations

from typing import Callable

import gguf
from gguf import GGMLQuantizationType as Q

from tools.gguf_vocab import add_spm_tokenizer
from tools.gguf_writer import Tensor, simple_types, write_tensors


def gqa_attention(n_embd: int, n_head: int, n_head_kv: int, head_dim: int, *, qk_norm: bool = False,
                  bias: str = "", sinks: bool = False):
    """Attention tensors (llama.cpp names, ne order) of one block: q/k/v/output, optional q/k norms, sinks and
    biases (``bias="qkv"``: q/k/v biases, ``"qkvo"``: also the output bias)."""
    def block(p):
        out = [(p + "attn_q.weight", (n_embd, head_dim * n_head)),
               (p + "attn_k.weight", (n_embd, head_dim * n_head_kv)),
               (p + "attn_v.weight", (n_embd, head_dim * n_head_kv)),
               (p + "attn_output.weight", (head_dim * n_head, n_embd))]
        if bias:
            out += [(p + "attn_q.bias", (head_dim * n_head,)), (p + "attn_k.bias", (head_dim * n_head_kv,)),
                    (p + "attn_v.bias", (head_dim * n_head_kv,))]
        if bias == "qkvo":
            out.append((p + "attn_output.bias", (n_embd,)))
        if qk_norm:
            out += [(p + "attn_q_norm.weight", (head_dim,)), (p + "attn_k_norm.weight", (head_dim,))]
        if sinks:
            out.append((p + "attn_sinks.weight", (n_head,)))
        return out
    return block


def transformer_tensors(*, n_blocks: int, n_embd: int, n_vocab: int, attention: Callable[[str], list], n_ff: int = 0,
                        n_expert: int = 0, n_ff_exp: int = 0, n_ff_shexp: int = 0, shexp_gate_inp: bool = False,
                        experts: str = "split", n_chunk_expert: int = 0, n_ff_chexp: int = 0, expert_bias: bool = False,
                        router_bias: bool = False, probs_bias: bool = False, ffn_norm: str = "ffn_norm",
                        dense_blocks: int = 0, types: Callable[[str, int, tuple], Q]):
    """Tensor list of a decoder-only transformer in llama.cpp's naming.

    ``attention(prefix)`` gives the attention tensors of a block. Blocks ``< dense_blocks`` (all when
    ``n_expert == 0``) get a dense ``ffn_gate/up/down`` of width ``n_ff``; the others a router ``ffn_gate_inp``
    and routed experts: ``experts="split"`` -> ``ffn_{gate,up,down}_exps``, ``"fused"`` -> ``ffn_gate_up_exps``
    + ``ffn_down_exps``; ``n_chunk_expert`` adds chunked experts ``ffn_{gate,up,down}_chexps``; ``n_ff_shexp``
    a shared expert ``ffn_{gate,up,down}_shexp`` (and ``ffn_gate_inp_shexp`` with ``shexp_gate_inp``);
    ``expert_bias`` adds ``ffn_*_exps.bias``, ``router_bias`` ``ffn_gate_inp.bias``, ``probs_bias`` ``exp_probs_b.bias``.
    """
    def T(name, ne, bid=-1):
        return Tensor(name, tuple(ne), types(name.split(".", 2)[-1] if bid >= 0 else name, bid, tuple(ne)))

    tensors = [T("token_embd.weight", (n_embd, n_vocab))]
    for i in range(n_blocks):
        p = "blk.%d." % i
        tensors.append(T(p + "attn_norm.weight", (n_embd,), i))
        tensors += [T(name, ne, i) for name, ne in attention(p)]
        tensors.append(T(p + ffn_norm + ".weight", (n_embd,), i))
        if n_expert == 0 or i < dense_blocks:
            tensors += [T(p + "ffn_gate.weight", (n_embd, n_ff), i), T(p + "ffn_up.weight", (n_embd, n_ff), i),
                        T(p + "ffn_down.weight", (n_ff, n_embd), i)]
            continue
        tensors.append(T(p + "ffn_gate_inp.weight", (n_embd, n_expert), i))
        if router_bias:
            tensors.append(T(p + "ffn_gate_inp.bias", (n_expert,), i))
        if probs_bias:
            tensors.append(T(p + "exp_probs_b.bias", (n_expert,), i))
        up, down = (n_embd, n_ff_exp, n_expert), (n_ff_exp, n_embd, n_expert)
        if experts == "fused":
            routed = [("ffn_gate_up_exps", (n_embd, 2 * n_ff_exp, n_expert)), ("ffn_down_exps", down)]
        else:
            routed = [("ffn_gate_exps", up), ("ffn_up_exps", up), ("ffn_down_exps", down)]
        if n_chunk_expert:
            cup, cdown = (n_embd, n_ff_chexp, n_chunk_expert), (n_ff_chexp, n_embd, n_chunk_expert)
            routed += [("ffn_gate_chexps", cup), ("ffn_up_chexps", cup), ("ffn_down_chexps", cdown)]
        for name, ne in routed:
            tensors.append(T(p + name + ".weight", ne, i))
            if expert_bias:
                tensors.append(T(p + name + ".bias", ne[1:], i))
        if n_ff_shexp:
            if shexp_gate_inp:
                tensors.append(T(p + "ffn_gate_inp_shexp.weight", (n_embd,), i))
            tensors += [T(p + "ffn_gate_shexp.weight", (n_embd, n_ff_shexp), i),
                        T(p + "ffn_up_shexp.weight", (n_embd, n_ff_shexp), i),
                        T(p + "ffn_down_shexp.weight", (n_ff_shexp, n_embd), i)]
    tensors += [T("output_norm.weight", (n_embd,)), T("output.weight", (n_embd, n_vocab))]
    return tensors


def add_transformer_kv(w: gguf.GGUFWriter, *, n_blocks: int, n_embd: int, n_head: int, n_head_kv: int,
                       head_dim: int, n_ff: int, context_length: int, n_expert: int = 0, n_expert_used: int = 0,
                       n_ff_exp: int = 0, key_length: int = 0, value_length: int = 0, rope_dim: int = 0) -> None:
    w.add_context_length(context_length)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_blocks)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(key_length or head_dim)
    w.add_value_length(value_length or head_dim)
    w.add_rope_dimension_count(rope_dim or head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    if n_expert:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(n_expert_used)
        w.add_expert_feed_forward_length(n_ff_exp)


def write_tiny_qwen3moe(path, *, n_blocks: int = 2, n_embd: int = 64, n_ff_exp: int = 32, n_expert: int = 8,
                        n_expert_used: int = 2, dtype: str = "f32", other_dtype: str = "f32", endian: str = "little",
                        context_length: int = 4096, n_vocab: int = 512, seed: int = 0) -> str:
    """A tiny ``qwen3moe`` (attention + router + ``ffn_{gate,up,down}_exps``, no shared expert) that loads."""
    dims = dict(n_blocks=n_blocks, n_embd=n_embd, n_head=4, n_head_kv=2, head_dim=n_embd // 4)
    tensors = transformer_tensors(n_blocks=n_blocks, n_embd=n_embd, n_vocab=n_vocab, n_expert=n_expert, n_ff_exp=n_ff_exp,
                                  attention=gqa_attention(n_embd, 4, 2, n_embd // 4, qk_norm=True),
                                  types=simple_types(dtype, other_dtype))

    def kv(w):
        w.add_type("model")
        w.add_name("tiny qwen3moe")
        add_transformer_kv(w, n_ff=4 * n_ff_exp, context_length=context_length, n_expert=n_expert,
                           n_expert_used=n_expert_used, n_ff_exp=n_ff_exp, **dims)
        add_spm_tokenizer(w, n_vocab)
    return write_tensors(path, "qwen3moe", kv, tensors, endian=endian, seed=seed)


# --------------------------------------------------------------------------- small header-only models
#
# Tensor infos and metadata follow llama.cpp's conventions for each architecture; by default the data
# region is a hole (``data=False``), ``data=True`` writes seeded random weights instead.

def small_kv(name: str, n_vocab: int, **transformer_kv):
    def kv(w):
        w.add_type("model")
        w.add_name(name)
        if transformer_kv:
            add_transformer_kv(w, **transformer_kv)  # pylint: disable=missing-kwoa  # callers pass them all
        add_spm_tokenizer(w, n_vocab)
    return kv


def _moe_writer(path, arch: str, *, n_blocks: int, n_embd: int, n_expert: int, n_expert_used: int, n_ff_exp: int,
                expert_dtype, other_dtype, endian: str, data: bool, n_vocab: int, extra_kv=None,
                attention=None, n_ff: int = 0, kv_overrides=None, **transformer):
    """Shared body of the attention + MoE writers below."""
    dims = dict(n_blocks=n_blocks, n_embd=n_embd, n_head=4, n_head_kv=2, head_dim=n_embd // 4)
    dims.update(kv_overrides or {})
    attention = attention or gqa_attention(n_embd, 4, 2, n_embd // 4)
    tensors = transformer_tensors(n_blocks=n_blocks, n_embd=n_embd, n_vocab=n_vocab, attention=attention,
                                  n_ff=n_ff or 2 * n_ff_exp, n_expert=n_expert, n_ff_exp=n_ff_exp,
                                  types=simple_types(expert_dtype, other_dtype), **transformer)
    kv = small_kv("small " + arch, n_vocab, n_ff=n_ff or 2 * n_ff_exp, context_length=4096, n_expert=n_expert,
                  n_expert_used=n_expert_used, n_ff_exp=n_ff_exp, **dims)

    def all_kv(w):
        kv(w)
        if extra_kv:
            extra_kv(w)
    return write_tensors(path, arch, all_kv, tensors, endian=endian, data=data)


def write_qwen2moe(path, *, n_blocks: int = 3, n_embd: int = 64, n_expert: int = 8, n_expert_used: int = 2,
                   n_ff_exp: int = 32, expert_dtype="q8_0", other_dtype="f16", endian: str = "little",
                   data: bool = False, n_vocab: int = 512) -> str:
    """``qwen2moe``: attention with q/k/v biases, routed experts, shared expert with ``ffn_gate_inp_shexp``."""
    return _moe_writer(path, "qwen2moe", n_blocks=n_blocks, n_embd=n_embd, n_expert=n_expert,
                       n_expert_used=n_expert_used, n_ff_exp=n_ff_exp, expert_dtype=expert_dtype,
                       other_dtype=other_dtype, endian=endian, data=data, n_vocab=n_vocab,
                       attention=gqa_attention(n_embd, 4, 2, n_embd // 4, bias="qkv"),
                       n_ff_shexp=4 * n_ff_exp, shexp_gate_inp=True,
                       extra_kv=lambda w: w.add_expert_shared_feed_forward_length(4 * n_ff_exp))


def write_mixtral(path, *, n_blocks: int = 3, n_embd: int = 64, n_expert: int = 8, n_expert_used: int = 2,
                  n_ff_exp: int = 128, expert_dtype="q8_0", other_dtype="f16", endian: str = "little",
                  data: bool = False, n_vocab: int = 512) -> str:
    """Mixtral: architecture ``llama`` with ``expert_count > 0`` and ``ffn_{gate,up,down}_exps``."""
    return _moe_writer(path, "llama", n_blocks=n_blocks, n_embd=n_embd, n_expert=n_expert,
                       n_expert_used=n_expert_used, n_ff_exp=n_ff_exp, n_ff=n_ff_exp, expert_dtype=expert_dtype,
                       other_dtype=other_dtype, endian=endian, data=data, n_vocab=n_vocab)


def _mla_attention(n_embd: int, n_head: int, q_lora_rank: int, kv_lora_rank: int, qk_nope: int, qk_rope: int,
                   v_head: int):
    """DeepSeek-V2/V3 multi-head latent attention tensors (with the split ``attn_k_b``/``attn_v_b``)."""
    def block(p):
        return [(p + "attn_q_a.weight", (n_embd, q_lora_rank)),
                (p + "attn_q_a_norm.weight", (q_lora_rank,)),
                (p + "attn_q_b.weight", (q_lora_rank, n_head * (qk_nope + qk_rope))),
                (p + "attn_kv_a_mqa.weight", (n_embd, kv_lora_rank + qk_rope)),
                (p + "attn_kv_a_norm.weight", (kv_lora_rank,)),
                (p + "attn_k_b.weight", (qk_nope, kv_lora_rank, n_head)),
                (p + "attn_v_b.weight", (kv_lora_rank, v_head, n_head)),
                (p + "attn_output.weight", (n_head * v_head, n_embd))]
    return block


def write_deepseek2(path, *, n_blocks: int = 4, leading_dense_block_count: int = 1, n_embd: int = 64,
                    n_expert: int = 16, n_expert_used: int = 4, n_expert_shared: int = 1, n_ff_exp: int = 32,
                    expert_dtype="q8_0", other_dtype="f16", endian: str = "little", data: bool = False,
                    n_vocab: int = 512) -> str:
    """``deepseek2``: MLA attention; the first ``leading_dense_block_count`` blocks dense ``ffn_gate/up/down``,
    the others router + ``exp_probs_b`` + ``ffn_*_exps`` + shared ``ffn_*_shexp``."""
    n_head, q_lora, kv_lora, nope, rope, v_head = 4, 32, 32, 32, 32, 32

    def extra_kv(w):
        w.add_leading_dense_block_count(leading_dense_block_count)
        w.add_expert_shared_count(n_expert_shared)
        w.add_expert_weights_scale(2.5)
        w.add_expert_weights_norm(True)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_q_lora_rank(q_lora)
        w.add_kv_lora_rank(kv_lora)
        w.add_key_length_mla(nope + rope)
        w.add_value_length_mla(v_head)

    path = _moe_writer(path, "deepseek2", n_blocks=n_blocks, n_embd=n_embd, n_expert=n_expert,
                       n_expert_used=n_expert_used, n_ff_exp=n_ff_exp, n_ff=4 * n_ff_exp, expert_dtype=expert_dtype,
                       other_dtype=other_dtype, endian=endian, data=data, n_vocab=n_vocab,
                       attention=_mla_attention(n_embd, n_head, q_lora, kv_lora, nope, rope, v_head),
                       dense_blocks=leading_dense_block_count, n_ff_shexp=n_ff_exp * n_expert_shared,
                       probs_bias=True, extra_kv=extra_kv,
                       kv_overrides=dict(n_head=n_head, n_head_kv=1, key_length=kv_lora + rope, value_length=kv_lora,
                                         rope_dim=rope))
    return path


def write_gpt_oss(path, *, n_blocks: int = 2, n_embd: int = 64, n_expert: int = 8, n_expert_used: int = 4,
                  n_ff_exp: int = 64, expert_dtype="mxfp4", other_dtype="f16", endian: str = "little",
                  data: bool = False, n_vocab: int = 512) -> str:
    """``gpt-oss``: attention with biases and ``attn_sinks``, ``post_attention_norm``, router with bias,
    MXFP4 experts with ``ffn_{gate,up,down}_exps.bias``."""
    def extra_kv(w):
        w.add_sliding_window(128)
    return _moe_writer(path, "gpt-oss", n_blocks=n_blocks, n_embd=n_embd, n_expert=n_expert,
                       n_expert_used=n_expert_used, n_ff_exp=n_ff_exp, n_ff=n_ff_exp, expert_dtype=expert_dtype,
                       other_dtype=other_dtype, endian=endian, data=data, n_vocab=n_vocab,
                       attention=gqa_attention(n_embd, 4, 2, n_embd // 4, bias="qkvo", sinks=True),
                       ffn_norm="post_attention_norm", router_bias=True, expert_bias=True, extra_kv=extra_kv)


def write_fused_gate_up(path, *, arch: str = "qwen3moe", n_blocks: int = 2, n_embd: int = 64, n_expert: int = 8,
                        n_expert_used: int = 2, n_ff_exp: int = 32, expert_dtype="q8_0", other_dtype="f16",
                        endian: str = "little", data: bool = False, n_vocab: int = 512) -> str:
    """A MoE whose gate and up experts are one fused ``ffn_gate_up_exps {n_embd, 2*n_ff_exp, n_expert}``.

    Naming test only: llama-server b10434 does not load fused experts for ``qwen3moe`` (gguf-py lists
    ``ffn_gate_up_exps`` for qwen3next, qwen35moe, gemma4, deepseek2-ocr and mistral4).
    """
    return _moe_writer(path, arch, n_blocks=n_blocks, n_embd=n_embd, n_expert=n_expert,
                       n_expert_used=n_expert_used, n_ff_exp=n_ff_exp, expert_dtype=expert_dtype,
                       other_dtype=other_dtype, endian=endian, data=data, n_vocab=n_vocab,
                       attention=gqa_attention(n_embd, 4, 2, n_embd // 4, qk_norm=True), experts="fused")


def write_chexps(path, *, n_blocks: int = 2, n_embd: int = 64, n_expert: int = 16, n_expert_used: int = 4,
                 experts_per_group: int = 2, n_ff_exp: int = 32, n_ff_chexp: int = 32, expert_dtype="q8_0",
                 other_dtype="f16", endian: str = "little", data: bool = False, n_vocab: int = 512) -> str:
    """``grovemoe``: routed ``ffn_*_exps`` plus chunked (adjugate) experts ``ffn_*_chexps`` of
    ``n_expert / experts_per_group`` chunks."""
    def extra_kv(w):
        w.add_expert_chunk_feed_forward_length(n_ff_chexp)
        w.add_experts_per_group(experts_per_group)
        w.add_expert_group_scale(0.05)
    return _moe_writer(path, "grovemoe", n_blocks=n_blocks, n_embd=n_embd, n_expert=n_expert,
                       n_expert_used=n_expert_used, n_ff_exp=n_ff_exp, expert_dtype=expert_dtype,
                       other_dtype=other_dtype, endian=endian, data=data, n_vocab=n_vocab,
                       attention=gqa_attention(n_embd, 4, 2, n_embd // 4, qk_norm=True),
                       n_chunk_expert=n_expert // experts_per_group, n_ff_chexp=n_ff_chexp, extra_kv=extra_kv)


def write_unknown_moe(path, *, arch: str = "mymoe", n_blocks: int = 3, n_embd: int = 64, n_expert: int = 8,
                      n_expert_used: int = 2, n_ff_exp: int = 32, expert_dtype="q8_0", other_dtype="f16",
                      endian: str = "little", data: bool = False, n_vocab: int = 512) -> str:
    """An architecture no tool knows (``general.architecture`` is just the string ``arch``) that follows
    llama.cpp's naming: ``ffn_{gate,up,down}_exps`` and a shared expert ``ffn_*_shexp``."""
    return _moe_writer(path, arch, n_blocks=n_blocks, n_embd=n_embd, n_expert=n_expert,
                       n_expert_used=n_expert_used, n_ff_exp=n_ff_exp, expert_dtype=expert_dtype,
                       other_dtype=other_dtype, endian=endian, data=data, n_vocab=n_vocab, n_ff_shexp=2 * n_ff_exp,
                       extra_kv=lambda w: (w.add_expert_shared_count(1),
                                           w.add_expert_shared_feed_forward_length(2 * n_ff_exp)))


def write_dense_llama(path, *, n_blocks: int = 2, n_embd: int = 64, n_ff: int = 128, dtype="q8_0",
                      endian: str = "little", data: bool = False, n_vocab: int = 512) -> str:
    """A dense ``llama`` (no experts at all)."""
    return _moe_writer(path, "llama", n_blocks=n_blocks, n_embd=n_embd, n_expert=0, n_expert_used=0, n_ff_exp=0,
                       n_ff=n_ff, expert_dtype=dtype, other_dtype=dtype, endian=endian, data=data, n_vocab=n_vocab)
