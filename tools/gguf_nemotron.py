"""The Nemotron-H models of ``gguf_models`` (``nemotron_h_moe`` and dense ``nemotron_h``, blocks of Mamba-2,
attention, MoE and MLP): the tiny one llama-server loads, the demo model, and the sparse full-size header of
Nemotron-3-Nano-30B-A3B Q4_K_M.
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import gguf
from gguf import GGMLQuantizationType as Q

from tools.gguf_transformers import small_kv
from tools.gguf_vocab import add_bpe_tokenizer, add_spm_tokenizer
from tools.gguf_writer import Tensor, simple_types, write_tensors

NEMOTRON_H_BLOCKS = {"M": "mamba", "*": "attention", "E": "moe", "-": "mlp"}


def _nemotron_h_block(T, i, kind, d):
    """The tensors of block ``i`` (``kind``: mamba, attention, moe or mlp) of a Nemotron-H model; ``d`` holds its
    widths (``_nemotron_h``'s arguments and the Mamba-2 sizes derived from them)."""
    p = "blk.%d." % i
    tensors = [T(p + "attn_norm.weight", (d.n_embd,), i)]
    if kind == "mamba":
        tensors += [
            T(p + "ssm_in.weight", (d.n_embd, d.d_in_proj), i),
            T(p + "ssm_conv1d.weight", (d.d_conv, d.conv_dim), i),
            T(p + "ssm_conv1d.bias", (d.conv_dim,), i),
            T(p + "ssm_dt.bias", (d.ssm_heads,), i),
            T(p + "ssm_a", (1, d.ssm_heads), i),
            T(p + "ssm_d", (1, d.ssm_heads), i),
            T(p + "ssm_norm.weight", (d.d_inner // d.n_group, d.n_group), i),
            T(p + "ssm_out.weight", (d.d_inner, d.n_embd), i),
        ]
    elif kind == "attention":
        tensors += [
            T(p + "attn_q.weight", (d.n_embd, d.head_dim * d.n_head), i),
            T(p + "attn_k.weight", (d.n_embd, d.head_dim * d.n_head_kv), i),
            T(p + "attn_v.weight", (d.n_embd, d.head_dim * d.n_head_kv), i),
            T(p + "attn_output.weight", (d.head_dim * d.n_head, d.n_embd), i),
        ]
    elif kind == "moe":
        tensors += [
            T(p + "ffn_gate_inp.weight", (d.n_embd, d.n_expert), i),
            T(p + "exp_probs_b.bias", (d.n_expert,), i),
            T(p + "ffn_up_exps.weight", (d.n_embd, d.n_ff, d.n_expert), i),
            T(p + "ffn_down_exps.weight", (d.n_ff, d.n_embd, d.n_expert), i),
            T(p + "ffn_up_shexp.weight", (d.n_embd, d.n_ff_shexp), i),
            T(p + "ffn_down_shexp.weight", (d.n_ff_shexp, d.n_embd), i),
        ]
    else:  # dense MLP (nemotron_h): squared-ReLU up/down, no gate
        tensors += [
            T(p + "ffn_up.weight", (d.n_embd, d.n_ff), i),
            T(p + "ffn_down.weight", (d.n_ff, d.n_embd), i),
        ]
    return tensors


def _nemotron_h(pattern: str, *, n_embd: int, n_vocab: int, n_head: int, n_head_kv: int, head_dim: int,
                n_ff: int, n_expert: int, n_expert_used: int, n_ff_shexp: int, ssm_heads: int, ssm_head_dim: int,
                d_state: int, n_group: int, d_conv: int, context_length: int, types: Callable[[str, int, tuple], Q]):
    """Metadata function and tensor list of a Nemotron-H (``nemotron_h`` / ``nemotron_h_moe``) model.

    ``pattern``: one letter per block, M = Mamba-2, * = attention, E = MoE, - = dense MLP.
    ``types(tensor_suffix, block_or_-1, ne)`` chooses the ggml type of each tensor.
    """
    kinds = [NEMOTRON_H_BLOCKS[c] for c in pattern]
    d_inner = ssm_heads * ssm_head_dim
    d_in_proj = 2 * d_inner + 2 * n_group * d_state + ssm_heads
    conv_dim = d_inner + 2 * n_group * d_state
    head_count_kv = [n_head_kv if k == "attention" else 0 for k in kinds]
    ffn_len = [n_ff if k in ("moe", "mlp") else 0 for k in kinds]

    def add_kv(w: gguf.GGUFWriter) -> None:
        w.add_context_length(context_length)
        w.add_embedding_length(n_embd)
        w.add_block_count(len(kinds))
        w.add_feed_forward_length(ffn_len)
        w.add_head_count(n_head)
        w.add_head_count_kv(head_count_kv)
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_layer_norm_eps(1e-5)
        w.add_ssm_conv_kernel(d_conv)
        w.add_ssm_inner_size(d_inner)
        w.add_ssm_state_size(d_state)
        w.add_ssm_time_step_rank(ssm_heads)
        w.add_ssm_group_count(n_group)
        w.add_vocab_size(n_vocab)
        if n_expert:
            w.add_expert_count(n_expert)
            w.add_expert_used_count(n_expert_used)
            w.add_expert_shared_count(1)
            w.add_expert_feed_forward_length(n_ff)
            w.add_expert_shared_feed_forward_length(n_ff_shexp)
            w.add_expert_weights_norm(True)
            w.add_expert_weights_scale(2.5)
            w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)

    def T(name, ne, bid=-1):
        return Tensor(name, tuple(ne), types(name.split(".", 2)[-1] if bid >= 0 else name, bid, tuple(ne)))

    dims = SimpleNamespace(n_embd=n_embd, d_in_proj=d_in_proj, d_conv=d_conv, conv_dim=conv_dim, ssm_heads=ssm_heads,
                           d_inner=d_inner, n_group=n_group, head_dim=head_dim, n_head=n_head, n_head_kv=n_head_kv,
                           n_expert=n_expert, n_ff=n_ff, n_ff_shexp=n_ff_shexp)
    tensors = [T("token_embd.weight", (n_embd, n_vocab))]
    for i, kind in enumerate(kinds):
        tensors += _nemotron_h_block(T, i, kind, dims)
    tensors += [T("output_norm.weight", (n_embd,)), T("output.weight", (n_embd, n_vocab))]
    return add_kv, tensors


def write_tiny_nemotron_h_moe(path, *, n_embd: int = 64, n_ff_exp: int = 32, n_expert: int = 8,
                              n_expert_used: int = 2, dtype: str = "f32", other_dtype: str = "f32",
                              endian: str = "little", context_length: int = 4096, n_vocab: int = 512,
                              seed: int = 0, shards: int = 1):
    """A tiny ``nemotron_h_moe`` (blocks ``MEM*E``) with random weights that llama-server loads.

    ``dtype``: ggml type of the routed expert tensors (``f32``, ``f16``, ``q8_0``, ``q4_0``...);
    ``other_dtype``: type of the other matrices (norms, biases, router stay F32); ``shards`` as ``write_tensors``.
    """
    add_kv, tensors = _nemotron_h(
        "MEM*E", n_embd=n_embd, n_vocab=n_vocab, n_head=4, n_head_kv=2, head_dim=n_embd // 4, n_ff=n_ff_exp,
        n_expert=n_expert, n_expert_used=n_expert_used, n_ff_shexp=2 * n_ff_exp, ssm_heads=max(1, n_embd // 16),
        ssm_head_dim=16, d_state=16, n_group=2, d_conv=4, context_length=context_length,
        types=simple_types(dtype, other_dtype))

    def kv(w):
        w.add_type("model")
        w.add_name("tiny nemotron_h_moe")
        add_kv(w)
        add_spm_tokenizer(w, n_vocab)
    return write_tensors(path, "nemotron_h_moe", kv, tensors, endian=endian, seed=seed, shards=shards)


def write_demo_model(path, *, endian: str = "little", dtype: str = "f32", seed: int = 0, shards: int = 1):
    """The demo model: ``nemotron_h_moe`` ``MEM*E`` whose 4 expert tensors are 1 MiB each in f32 (``seed``: other
    random weights, so another file; ``shards`` as ``write_tensors``)."""
    return write_tiny_nemotron_h_moe(path, n_embd=256, n_ff_exp=128, n_expert=8, n_expert_used=2,
                                     dtype=dtype, endian=endian, seed=seed, shards=shards)


# --------------------------------------------------------------------------- Nemotron-3-Nano-30B-A3B header

NANO_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"

# llama-quant's fallback when a row length is not a multiple of 256 (K-quant super-block)
_K_FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}


def _use_more_bits(i: int, n: int) -> bool:
    """llama-quant's choice of the layers that get more bits (first and last eighth, every third between)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _q4_k_m_types(pattern: str):
    """Types of llama-quant's Q4_K_M recipe for a Nemotron-H model, with its fallbacks for 2688/1856/3712 rows."""
    moe_index = {b: k for k, b in enumerate(i for i, c in enumerate(pattern) if c == "E")}
    attn_index = {b: k for k, b in enumerate(i for i, c in enumerate(pattern) if c == "*")}

    def types(suffix: str, bid: int, ne: tuple) -> Q:
        if len(ne) == 1 or "norm" in suffix or suffix in ("ssm_a", "ssm_d", "ssm_conv1d.weight", "ffn_gate_inp.weight"):
            return Q.F32
        if suffix == "output.weight":
            qtype = Q.Q6_K
        elif suffix in ("ffn_down_exps.weight", "ffn_down_shexp.weight"):
            qtype = Q.Q6_K if _use_more_bits(moe_index[bid], len(moe_index)) else Q.Q4_K
        elif suffix == "attn_v.weight":
            qtype = Q.Q6_K if _use_more_bits(attn_index[bid], len(attn_index)) else Q.Q4_K
        else:
            qtype = Q.Q4_K
        return _K_FALLBACK[qtype] if ne[0] % 256 else qtype
    return types


def write_nemotron_nano_30b(outdir, *, shards: int = 6, endian: str = "little", vocab_size: int = 131072,
                            n_merges: int = 269443, base: str = "Nemotron-3-Nano-30B-A3B-Q4_K_M",
                            n_expert: int = 128) -> list:
    """A sparse full-size Nemotron-3-Nano-30B-A3B Q4_K_M: real metadata, the 401 real tensor infos, no data.

    Files ``<base>-0000i-of-0000n.gguf`` in ``outdir`` (``<base>.gguf`` when ``shards == 1``), truncated to
    their full size (about 24.5 GB apparent, a few MB on disk). Routed experts about 21,772 MiB, the rest
    about 1,600 MiB (token_embd 231 MiB). Returns the shard paths.

    ``vocab_size``, ``n_merges`` and ``n_expert`` below the real 131072, 269443 and 128 give a model of the Nano's
    shape with a smaller tokenizer or fewer routed experts per MoE block (the routed experts' bytes scale with
    ``n_expert``): a test that plans a partial offload then needs less host memory than the real model's.
    """
    add_kv, tensors = _nemotron_h(
        NANO_PATTERN, n_embd=2688, n_vocab=vocab_size, n_head=32, n_head_kv=2, head_dim=128, n_ff=1856,
        n_expert=n_expert, n_expert_used=6, n_ff_shexp=3712, ssm_heads=64, ssm_head_dim=64, d_state=128, n_group=8,
        d_conv=4, context_length=1048576, types=_q4_k_m_types(NANO_PATTERN))

    def kv(w):
        w.add_type("model")
        w.add_name("NVIDIA Nemotron 3 Nano 30B A3B")
        w.add_basename("Nemotron-3-Nano")
        w.add_size_label("30B-A3B")
        add_kv(w)
        add_bpe_tokenizer(w, vocab_size, n_merges)
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)

    Path(outdir).mkdir(parents=True, exist_ok=True)
    result = write_tensors(Path(outdir) / (base + ".gguf"), "nemotron_h_moe", kv, tensors, endian=endian,
                           data=False, shards=shards)
    return result if isinstance(result, list) else [result]


def write_nemotron_h(path, *, n_blocks: int = 5, n_embd: int = 64, n_ff: int = 128, dtype: str = "f16",
                     endian: str = "little", data: bool = False, n_vocab: int = 512) -> str:
    """Dense hybrid ``nemotron_h`` (blocks ``M-M*-`` repeated: Mamba-2, MLP ``ffn_up``/``ffn_down``, attention)."""
    pattern = ("M-M*-" * n_blocks)[:n_blocks]
    add_kv, tensors = _nemotron_h(
        pattern, n_embd=n_embd, n_vocab=n_vocab, n_head=4, n_head_kv=2, head_dim=n_embd // 4, n_ff=n_ff,
        n_expert=0, n_expert_used=0, n_ff_shexp=0, ssm_heads=max(1, n_embd // 16), ssm_head_dim=16, d_state=16,
        n_group=2, d_conv=4, context_length=4096, types=simple_types(dtype, dtype))
    kv = small_kv("small nemotron_h", n_vocab)
    return write_tensors(path, "nemotron_h", lambda w: (add_kv(w), kv(w)), tensors, endian=endian, data=data)
