"""How exact is the memory model? Real llama-server buffers beside the planner's prediction.

Part 1 starts the real llama-server (``llama-server``, the CPU build of scripts/llama-cpp.sh) on generated GGUF models of several
shapes, contexts, slot counts and offload patterns. A CPU build has no GPU, so the benchmark gives it one:
llama.cpp's RPC backend (``ggml-rpc-server`` of the same build, on 127.0.0.1) is a device like CUDA0, with its
own model, KV, RS and compute buffers, and ``-ot ...=CPU`` moves tensors from it to host memory exactly as on a
GPU host. Two RPC servers make a two-GPU box for ``--tensor-split``. The buffer lines of the log are parsed
with the collection's ``_llama_log`` parser and printed beside the prediction, with the error per component.

Part 2 is the plan table for the full-size Nemotron-3-Nano-30B-A3B Q4_K_M header (6 shards, written sparse
by tools/gguf_models.py) at ctx 32K..256K x parallel 1/2/4 on 24/16/12/8 GB cards.

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
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_pattern import (  # noqa: E402
    block_expert_pattern)
from tools import gguf_models  # noqa: E402

_OUTPUT_BUF = re.compile(r"^[\w.]+: +(\S+) +output buffer size *= *([0-9.]+) MiB", re.M)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RpcDevices(object):
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
    }


MODELS = {
    # name: (writer, kwargs)
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
}

# (ctx, parallel, offload: "none" | "all" | list of blocks, gpus, ubatch)
CASES = [
    (512, 1, "none", 1, 512),
    (4096, 1, "all", 1, 512),
    (1000, 2, "none", 1, 512),
    (8192, 4, "some", 1, 512),
    (3000, 3, "all", 1, 256),
    (16384, 2, "none", 1, 512),
    (2048, 1, "none", 2, 512),
    (4096, 2, "some", 2, 512),
]
QUICK_CASES = CASES[:3] + CASES[6:7]


def predicted(facts, ctx, parallel, cpu_tensors, gpus, ubatch):
    split = [1] * gpus if gpus > 1 else None
    # The RPC backend does not offload ops on host weights (CUDA does from 32 tokens on): op_offload False.
    return mm.estimate(facts, ctx, parallel, ubatch=ubatch, cpu_tensors=cpu_tensors, split=split, n_devices=gpus,
                       backend="rpc", margin_mib=0, op_offload=False)


def accuracy(workdir, quick=False):
    print("Part 1: llama-server (RPC devices on loopback) vs the memory model, MiB (error = predicted - measured)")
    header = "%-24s %6s %3s %-9s %2s | %-6s %9s %9s %7s | %9s %9s %7s | %8s %8s %6s | %8s %8s %7s" % (
        "model", "ctx", "np", "offload", "d", "dev", "model", "pred", "err", "KV", "pred", "err", "RS", "pred",
        "err", "compute", "pred", "err%")
    print(header)
    print("-" * len(header))
    compute_errors = []
    exact = True
    cases = QUICK_CASES if quick else CASES
    for name, (writer, kwargs) in MODELS.items():
        path = Path(workdir) / (re.sub(r"\W+", "_", name) + ".gguf")
        writer(path, **kwargs)
        facts = load_facts(str(path))
        for ctx, parallel, offload, gpus, ubatch in cases:
            blocks = [] if offload == "none" else facts.expert_blocks if offload == "all" else facts.expert_blocks[-1:]
            pattern = block_expert_pattern(facts.tensor_names, sum(facts.expert_tensors_by_block.values(), []),
                                           blocks) if blocks else ""
            cpu = set(n for b in blocks for n in facts.expert_tensors_by_block[b])
            with RpcDevices(gpus) as rpc:
                text = run_server(path, ctx, parallel, rpc.endpoints, override=pattern + "=CPU" if pattern else "",
                                  split=[1] * gpus if gpus > 1 else None, ubatch=ubatch)
            got = measured(text, rpc.endpoints)
            if got["error"] or not any(got["model"]):
                print("%-24s %6d %3d: llama-server failed: %s" % (name, ctx, parallel, got["error"] or text[-400:]))
                exact = False
                continue
            pred = predicted(facts, ctx, parallel, cpu, gpus, ubatch)
            label = offload if offload != "some" else "blk " + ",".join(map(str, blocks))
            for device in range(gpus):
                p = pred["gpus"][device]
                row = []
                for key in ("model", "kv", "recurrent"):
                    error = round(p[key + "_mib"] - got[key][device], 2)
                    exact = exact and abs(error) <= 0.01
                    row += [got[key][device], p[key + "_mib"], error]
                c_meas, c_pred = got["compute"][device], p["compute_mib"]
                c_err = 100.0 * (c_pred - c_meas) / c_meas if c_meas else 0.0
                compute_errors.append((name, ctx, parallel, c_meas, c_pred, c_err))
                print("%-24s %6d %3d %-9s %2d | RPC%-3d %9.2f %9.2f %7.2f | %9.2f %9.2f %7.2f | %8.2f %8.2f %6.2f | "
                      "%8.2f %8.2f %+6.1f%%" % ((name, ctx, parallel, label[:9], gpus, device) + tuple(row) +
                                                (c_meas, c_pred, c_err)))
            out_err = round(mm.mib(mm.output_buffer_bytes(facts, parallel)) - got["output"], 2)
            exact = exact and abs(out_err) <= 0.01
    if compute_errors:
        errors = [abs(e[-1]) for e in compute_errors]
        worst = max(compute_errors, key=lambda e: abs(e[-1]))
        print("\nweights, KV, recurrent state and output buffer exact to 0.01 MiB: %s" % ("yes" if exact else "NO"))
        print("compute buffer estimate: mean |error| %.1f%%, worst %+.1f%% (%s ctx %d np %d: measured %.2f, "
              "predicted %.2f MiB)" % (sum(errors) / len(errors), worst[-1], worst[0], worst[1], worst[2], worst[3],
                                       worst[4]))
    return exact


CARDS = [("24 GB (RTX A5500)", 24564, 24148), ("16 GB (RTX A4000)", 16376, 15746), ("12 GB (RTX 3060)", 12288, 11804),
         ("8 GB (RTX 4060)", 8188, 7796)]


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
