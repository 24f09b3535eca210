"""Write GGUF model files with gguf-py (llama.cpp's own GGUFWriter) for tests, benchmarks and the demo.

The one place where this project makes model files. Every writer takes the output path (a directory
for split models) and keyword options, writes the file(s) and returns the path (a list for splits).
Everything is deterministic (seeded numpy RNG, generated vocabularies).

Loadable models (random weights; llama-server really loads them and answers ``/completion``):

- ``write_tiny_nemotron_h_moe(path, ...)``: ``nemotron_h_moe``, 5 blocks ``MEM*E``.
- ``write_demo_model(path)``: the same architecture, expert tensors >= 1 MiB each.
- ``write_tiny_qwen3moe(path, ...)``: ``qwen3moe``, attention + routed gate/up/down experts.

Sparse full-size header (metadata and tensor infos real, data region a hole):

- ``write_nemotron_nano_30b(outdir, ...)``: Nemotron-3-Nano-30B-A3B Q4_K_M in 6 shards, ~24.5 GB apparent.

Small header-only models for classification tests (real tensor naming of each architecture):

- ``write_nemotron_h``, ``write_qwen2moe``, ``write_mixtral``, ``write_deepseek2``, ``write_gpt_oss``,
  ``write_fused_gate_up``, ``write_chexps``, ``write_unknown_moe``, ``write_dense_llama``.

``write_model(kind, path, **kw)`` dispatches by name through ``ARCH_WRITERS``.
CLI: ``python tools/gguf_models.py KIND OUT [--big-endian]`` (``nemotron-nano`` takes an output directory).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, NamedTuple, Sequence

import numpy as np

import gguf
from gguf import GGMLQuantizationType as Q

ENDIANS = {"little": gguf.GGUFEndian.LITTLE, "big": gguf.GGUFEndian.BIG}


class Tensor(NamedTuple):
    """One tensor to write: name, shape in ggml ``ne`` order (fastest dimension first), ggml type."""
    name: str
    ne: tuple
    qtype: Q


def ggml_type(value) -> Q:
    """A ggml type from a name (``"f32"``, ``"q8_0"``, ``"Q4_K"``), an id or a ``GGMLQuantizationType``."""
    if isinstance(value, Q):
        return value
    if isinstance(value, int):
        return Q(value)
    return Q[str(value).upper()]


def tensor_nbytes(ne: Sequence[int], qtype: Q) -> int:
    """Bytes of a tensor of shape ``ne`` (ggml order) and type ``qtype``."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    if ne[0] % block:
        raise ValueError("row length %d is not a multiple of the %s block (%d)" % (ne[0], qtype.name, block))
    n = 1
    for d in ne:
        n *= int(d)
    return n // block * size


# --------------------------------------------------------------------------- vocabularies

def _spm_vocab(n_vocab: int):
    """A SentencePiece-style ('llama') vocab: <unk> <s> </s>, byte tokens <0x00>..<0x7F> only, pieces.

    Only ASCII bytes: with all 256 byte tokens a random model can emit a lone high byte and
    llama-server's ``/completion`` answers HTTP 500.
    """
    tokens = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    for b in range(0x80):
        tokens.append("<0x%02X>" % b)
        types.append(gguf.TokenType.BYTE)
    pieces = ["\u2581"] + [chr(c) for c in range(33, 127)]
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    pieces += ["\u2581" + c for c in letters + letters.upper()]
    pieces += ["\u2581" + a + b for a in letters for b in letters]
    pieces += [a + b for a in letters for b in letters]
    seen = set(tokens)
    for p in pieces:
        if len(tokens) >= n_vocab:
            break
        if p not in seen:
            seen.add(p)
            tokens.append(p)
            types.append(gguf.TokenType.NORMAL)
    if len(tokens) < n_vocab:
        raise ValueError("n_vocab %d is larger than the generated SPM vocab (%d)" % (n_vocab, len(tokens)))
    scores = [0.0] * 3 + [0.0] * 0x80 + [-float(i) for i in range(len(tokens) - 3 - 0x80)]
    return tokens, scores, [int(t) for t in types]


def _add_spm_tokenizer(w: gguf.GGUFWriter, n_vocab: int) -> None:
    tokens, scores, types = _spm_vocab(n_vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)


def _bpe_vocab(n_vocab: int, n_merges: int, n_special: int = 1000):
    """A GPT-2 style (byte-level BPE) vocab of exactly ``n_vocab`` tokens and ``n_merges`` merges."""
    tokens = ["<unk>", "<s>", "</s>"] + ["<SPECIAL_%d>" % i for i in range(3, n_special)]
    tokens = tokens[:min(n_special, n_vocab)]
    types = [int(gguf.TokenType.CONTROL)] * len(tokens)
    # GPT-2 bytes_to_unicode: printable stand-ins for the 256 bytes
    byte_chars = [chr(b) for b in range(33, 127)] + [chr(b) for b in range(161, 173)] + [chr(b) for b in range(174, 256)]
    byte_chars += [chr(256 + i) for i in range(256 - len(byte_chars))]
    alphabet = "etaoinshrdlucmfwypvbgkjqxz"
    for c in byte_chars:
        if len(tokens) >= n_vocab:
            break
        tokens.append(c)
        types.append(int(gguf.TokenType.NORMAL))
    seen = set(tokens)
    i = 0
    while len(tokens) < n_vocab:
        s, k = "", i
        while True:  # bijective base-26 word
            s = alphabet[k % 26] + s
            k = k // 26 - 1
            if k < 0:
                break
        word = ("\u0120" if i % 3 == 0 else "") + s
        i += 1
        if word not in seen:  # llama.cpp asserts that token strings are unique
            seen.add(word)
            tokens.append(word)
            types.append(int(gguf.TokenType.NORMAL))
    merges = []
    n_words = max(1, n_vocab - n_special - 256)
    j = 0
    while len(merges) < n_merges:
        left = tokens[n_special + 256 + (j % n_words)] if n_vocab > n_special + 256 else "a"
        right = alphabet[(j // n_words) % 26] + ("" if j < n_words * 26 else str(j // (n_words * 26)))
        merges.append(left + " " + right)
        j += 1
    return tokens, types, merges


def _add_bpe_tokenizer(w: gguf.GGUFWriter, n_vocab: int, n_merges: int, pre: str = "default") -> None:
    tokens, types, merges = _bpe_vocab(n_vocab, n_merges)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)


# --------------------------------------------------------------------------- writing

def _random_weights(rng: np.random.Generator, t: Tensor) -> np.ndarray:
    """f32 values for ``t`` that keep a random model numerically tame."""
    shape = tuple(int(d) for d in reversed(t.ne))
    name = t.name
    if name.endswith("norm.weight") or name.endswith(".ssm_d"):
        return np.ones(shape, dtype=np.float32)
    if name.endswith(".ssm_a"):
        return -rng.uniform(0.5, 2.0, size=shape).astype(np.float32)
    if name.endswith(".bias") or name.endswith("_sinks"):
        return (rng.standard_normal(shape) * 0.01).astype(np.float32)
    return (rng.standard_normal(shape) * 0.02).astype(np.float32)


def _encode(data: np.ndarray, qtype: Q) -> np.ndarray:
    if qtype == Q.F32:
        return data
    if qtype == Q.F16:
        return data.astype(np.float16)
    return gguf.quants.quantize(data, qtype)


def _write_gguf(path, arch: str, add_kv: Callable[[gguf.GGUFWriter], None], tensors: Sequence[Tensor], *,
                endian: str = "little", data: bool = True, seed: int = 0, shards: int = 1):
    """Write ``tensors`` with metadata from ``add_kv``.

    ``data=True``: random weights (seeded) are written. ``data=False``: only header, metadata and tensor
    infos are written and each file is truncated to its full size (a sparse file, the data reads as zeros).
    ``shards > 1``: ``path`` is ``DIR/BASE.gguf`` and the files are ``BASE-0000i-of-0000n.gguf``, split by
    size, with ``split.*`` keys in every shard and the model metadata only in the first.
    Returns the path, or the list of shard paths.
    """
    path = Path(path)
    w = gguf.GGUFWriter(path, arch, endianess=ENDIANS[endian])
    add_kv(w)
    rng = np.random.default_rng(seed)
    total = sum(tensor_nbytes(t.ne, t.qtype) for t in tensors)
    done = 0
    for t in tensors:
        if shards > 1 and len(w.tensors) < shards and done >= total * len(w.tensors) / shards and w.tensors[-1]:
            w.tensors.append({})  # start the next shard (what GGUFWriter does itself for split_max_size)
        nbytes = tensor_nbytes(t.ne, t.qtype)
        if data:
            w.add_tensor(t.name, _encode(_random_weights(rng, t), t.qtype), raw_dtype=None if t.qtype in (Q.F32, Q.F16) else t.qtype)
        else:
            w.add_tensor_info(t.name, tuple(reversed(t.ne)), np.dtype(np.float32), nbytes, raw_dtype=t.qtype)
        done += nbytes
    if shards > 1 and len(w.tensors) != shards:
        raise ValueError("cannot split %d tensors into %d shards" % (len(tensors), shards))
    files = w.format_shard_names(path)
    w.write_header_to_file(path)
    w.write_kv_data_to_file()
    if data:
        w.write_tensors_to_file()
        w.close()
    else:
        w.write_ti_data_to_file()
        sizes = []
        for fout, shard in zip(w.fout, w.tensors):
            start = gguf.GGUFWriter.ggml_pad(fout.tell(), w.data_alignment)
            sizes.append(start + sum(gguf.GGUFWriter.ggml_pad(ti.nbytes, w.data_alignment) for ti in shard.values()))
        w.close()
        for f, size in zip(files, sizes):
            os.truncate(f, size)
    return [str(f) for f in files] if shards > 1 else str(path)


# --------------------------------------------------------------------------- nemotron_h / nemotron_h_moe

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


def _simple_types(expert_type, other_type="f32"):
    """Vectors, norms, SSM A/D, conv and router in F32; routed experts ``expert_type``; rest ``other_type``."""
    expert_type, other_type = ggml_type(expert_type), ggml_type(other_type)

    def types(suffix: str, bid: int, ne: tuple) -> Q:
        if (len(ne) == 1 or suffix.endswith(".bias") or "norm" in suffix or suffix in ("ssm_a", "ssm_d", "ssm_conv1d.weight")
                or suffix.startswith("ffn_gate_inp")):
            return Q.F32
        if "_exps" in suffix or "_chexps" in suffix:
            return expert_type
        return other_type
    return types


def write_tiny_nemotron_h_moe(path, *, n_embd: int = 64, n_ff_exp: int = 32, n_expert: int = 8,
                              n_expert_used: int = 2, dtype: str = "f32", other_dtype: str = "f32",
                              endian: str = "little", context_length: int = 4096, n_vocab: int = 512,
                              seed: int = 0, shards: int = 1):
    """A tiny ``nemotron_h_moe`` (blocks ``MEM*E``) with random weights that llama-server loads.

    ``dtype``: ggml type of the routed expert tensors (``f32``, ``f16``, ``q8_0``, ``q4_0``...);
    ``other_dtype``: type of the other matrices (norms, biases, router stay F32); ``shards`` as ``_write_gguf``.
    """
    add_kv, tensors = _nemotron_h(
        "MEM*E", n_embd=n_embd, n_vocab=n_vocab, n_head=4, n_head_kv=2, head_dim=n_embd // 4, n_ff=n_ff_exp,
        n_expert=n_expert, n_expert_used=n_expert_used, n_ff_shexp=2 * n_ff_exp, ssm_heads=max(1, n_embd // 16),
        ssm_head_dim=16, d_state=16, n_group=2, d_conv=4, context_length=context_length,
        types=_simple_types(dtype, other_dtype))

    def kv(w):
        w.add_type("model")
        w.add_name("tiny nemotron_h_moe")
        add_kv(w)
        _add_spm_tokenizer(w, n_vocab)
    return _write_gguf(path, "nemotron_h_moe", kv, tensors, endian=endian, seed=seed, shards=shards)


def write_demo_model(path, *, endian: str = "little", dtype: str = "f32", seed: int = 0, shards: int = 1):
    """The demo model: ``nemotron_h_moe`` ``MEM*E`` whose 4 expert tensors are 1 MiB each in f32 (``seed``: other
    random weights, so another file; ``shards`` as ``_write_gguf``)."""
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
                            n_merges: int = 269443, base: str = "Nemotron-3-Nano-30B-A3B-Q4_K_M") -> list:
    """A sparse full-size Nemotron-3-Nano-30B-A3B Q4_K_M: real metadata, the 401 real tensor infos, no data.

    Files ``<base>-0000i-of-0000n.gguf`` in ``outdir`` (``<base>.gguf`` when ``shards == 1``), truncated to
    their full size (about 24.5 GB apparent, a few MB on disk). Routed experts about 21,772 MiB, the rest
    about 1,600 MiB (token_embd 231 MiB). Returns the shard paths.
    """
    add_kv, tensors = _nemotron_h(
        NANO_PATTERN, n_embd=2688, n_vocab=vocab_size, n_head=32, n_head_kv=2, head_dim=128, n_ff=1856,
        n_expert=128, n_expert_used=6, n_ff_shexp=3712, ssm_heads=64, ssm_head_dim=64, d_state=128, n_group=8,
        d_conv=4, context_length=1048576, types=_q4_k_m_types(NANO_PATTERN))

    def kv(w):
        w.add_type("model")
        w.add_name("NVIDIA Nemotron 3 Nano 30B A3B")
        w.add_basename("Nemotron-3-Nano")
        w.add_size_label("30B-A3B")
        add_kv(w)
        _add_bpe_tokenizer(w, vocab_size, n_merges)
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)

    Path(outdir).mkdir(parents=True, exist_ok=True)
    result = _write_gguf(Path(outdir) / (base + ".gguf"), "nemotron_h_moe", kv, tensors, endian=endian,
                         data=False, shards=shards)
    return result if isinstance(result, list) else [result]


# --------------------------------------------------------------------------- attention-only transformers

def _gqa_attention(n_embd: int, n_head: int, n_head_kv: int, head_dim: int, *, qk_norm: bool = False,
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


def _transformer(*, n_blocks: int, n_embd: int, n_vocab: int, attention: Callable[[str], list], n_ff: int = 0,
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


def _add_transformer_kv(w: gguf.GGUFWriter, *, n_blocks: int, n_embd: int, n_head: int, n_head_kv: int,
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
    tensors = _transformer(n_blocks=n_blocks, n_embd=n_embd, n_vocab=n_vocab, n_expert=n_expert, n_ff_exp=n_ff_exp,
                           attention=_gqa_attention(n_embd, 4, 2, n_embd // 4, qk_norm=True),
                           types=_simple_types(dtype, other_dtype))

    def kv(w):
        w.add_type("model")
        w.add_name("tiny qwen3moe")
        _add_transformer_kv(w, n_ff=4 * n_ff_exp, context_length=context_length, n_expert=n_expert,
                            n_expert_used=n_expert_used, n_ff_exp=n_ff_exp, **dims)
        _add_spm_tokenizer(w, n_vocab)
    return _write_gguf(path, "qwen3moe", kv, tensors, endian=endian, seed=seed)


# --------------------------------------------------------------------------- small header-only models
#
# Tensor infos and metadata follow llama.cpp's conventions for each architecture; by default the data
# region is a hole (``data=False``), ``data=True`` writes seeded random weights instead.

def _small_kv(name: str, n_vocab: int, **transformer_kv):
    def kv(w):
        w.add_type("model")
        w.add_name(name)
        if transformer_kv:
            _add_transformer_kv(w, **transformer_kv)  # pylint: disable=missing-kwoa  # callers pass them all
        _add_spm_tokenizer(w, n_vocab)
    return kv


def write_nemotron_h(path, *, n_blocks: int = 5, n_embd: int = 64, n_ff: int = 128, dtype: str = "f16",
                     endian: str = "little", data: bool = False, n_vocab: int = 512) -> str:
    """Dense hybrid ``nemotron_h`` (blocks ``M-M*-`` repeated: Mamba-2, MLP ``ffn_up``/``ffn_down``, attention)."""
    pattern = ("M-M*-" * n_blocks)[:n_blocks]
    add_kv, tensors = _nemotron_h(
        pattern, n_embd=n_embd, n_vocab=n_vocab, n_head=4, n_head_kv=2, head_dim=n_embd // 4, n_ff=n_ff,
        n_expert=0, n_expert_used=0, n_ff_shexp=0, ssm_heads=max(1, n_embd // 16), ssm_head_dim=16, d_state=16,
        n_group=2, d_conv=4, context_length=4096, types=_simple_types(dtype, dtype))
    kv = _small_kv("small nemotron_h", n_vocab)
    return _write_gguf(path, "nemotron_h", lambda w: (add_kv(w), kv(w)), tensors, endian=endian, data=data)


def _moe_writer(path, arch: str, *, n_blocks: int, n_embd: int, n_expert: int, n_expert_used: int, n_ff_exp: int,
                expert_dtype, other_dtype, endian: str, data: bool, n_vocab: int, extra_kv=None,
                attention=None, n_ff: int = 0, kv_overrides=None, **transformer):
    """Shared body of the attention + MoE writers below."""
    dims = dict(n_blocks=n_blocks, n_embd=n_embd, n_head=4, n_head_kv=2, head_dim=n_embd // 4)
    dims.update(kv_overrides or {})
    attention = attention or _gqa_attention(n_embd, 4, 2, n_embd // 4)
    tensors = _transformer(n_blocks=n_blocks, n_embd=n_embd, n_vocab=n_vocab, attention=attention,
                           n_ff=n_ff or 2 * n_ff_exp, n_expert=n_expert, n_ff_exp=n_ff_exp,
                           types=_simple_types(expert_dtype, other_dtype), **transformer)
    kv = _small_kv("small " + arch, n_vocab, n_ff=n_ff or 2 * n_ff_exp, context_length=4096, n_expert=n_expert,
                   n_expert_used=n_expert_used, n_ff_exp=n_ff_exp, **dims)

    def all_kv(w):
        kv(w)
        if extra_kv:
            extra_kv(w)
    return _write_gguf(path, arch, all_kv, tensors, endian=endian, data=data)


def write_qwen2moe(path, *, n_blocks: int = 3, n_embd: int = 64, n_expert: int = 8, n_expert_used: int = 2,
                   n_ff_exp: int = 32, expert_dtype="q8_0", other_dtype="f16", endian: str = "little",
                   data: bool = False, n_vocab: int = 512) -> str:
    """``qwen2moe``: attention with q/k/v biases, routed experts, shared expert with ``ffn_gate_inp_shexp``."""
    return _moe_writer(path, "qwen2moe", n_blocks=n_blocks, n_embd=n_embd, n_expert=n_expert,
                       n_expert_used=n_expert_used, n_ff_exp=n_ff_exp, expert_dtype=expert_dtype,
                       other_dtype=other_dtype, endian=endian, data=data, n_vocab=n_vocab,
                       attention=_gqa_attention(n_embd, 4, 2, n_embd // 4, bias="qkv"),
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
                       attention=_gqa_attention(n_embd, 4, 2, n_embd // 4, bias="qkvo", sinks=True),
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
                       attention=_gqa_attention(n_embd, 4, 2, n_embd // 4, qk_norm=True), experts="fused")


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
                       attention=_gqa_attention(n_embd, 4, 2, n_embd // 4, qk_norm=True),
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


# --------------------------------------------------------------------------- registry and CLI

ARCH_WRITERS: dict = {
    "nemotron_h_moe": write_tiny_nemotron_h_moe,
    "demo": write_demo_model,
    "qwen3moe": write_tiny_qwen3moe,
    "nemotron-nano": write_nemotron_nano_30b,
    "nemotron_h": write_nemotron_h,
    "qwen2moe": write_qwen2moe,
    "mixtral": write_mixtral,
    "deepseek2": write_deepseek2,
    "gpt-oss": write_gpt_oss,
    "fused_gate_up": write_fused_gate_up,
    "chexps": write_chexps,
    "unknown_moe": write_unknown_moe,
    "dense_llama": write_dense_llama,
}


def write_model(kind: str, path, **kw):
    """Write the model ``kind`` (a key of ``ARCH_WRITERS``) to ``path``; returns what the writer returns."""
    try:
        writer = ARCH_WRITERS[kind]
    except KeyError:
        raise ValueError("unknown model kind %r (known: %s)" % (kind, ", ".join(sorted(ARCH_WRITERS)))) from None
    return writer(path, **kw)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("kind", choices=sorted(ARCH_WRITERS))
    parser.add_argument("out", help="output file (output directory for nemotron-nano)")
    parser.add_argument("--big-endian", action="store_true")
    args = parser.parse_args(argv)
    kw = {"endian": "big"} if args.big_endian else {}
    result = write_model(args.kind, args.out, **kw)
    for p in result if isinstance(result, list) else [result]:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
