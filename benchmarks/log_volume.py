"""Log volume of the real llama-server per 64-token completion, at each verbosity, side by side.

For each level (the default, ``-lv 4`` and ``-lv 5``), starts the llama-server the integration tests use
(tests/helpers/llama_server.py, on PATH after ``source scripts/env.sh``) with a tiny model written by
tools/gguf_models.py and ``-ot '<experts>=CPU'``, waits for ``/health``, asks one ``/completion`` of 64 tokens
(``ignore_eos``) and prints the bytes and lines the server logged for the load and for that completion, and what
``llama_server_log`` can prove from the log at that level (per-tensor lines, per-device buffers).

Prints figures; this is not a test. Usage: python benchmarks/log_volume.py [--tokens 64] [--runs 3]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for entry in (str(ROOT), str(ROOT / ".collections")):
    if entry not in sys.path:
        sys.path.insert(0, entry)

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_log import parse_log  # noqa: E402
from tests.helpers.llama_server import SERVER, llama_server  # noqa: E402
from tools.gguf_models import write_tiny_nemotron_h_moe  # noqa: E402

LEVELS = (("default", []), ("-lv 4", ["-lv", "4"]), ("-lv 5", ["-lv", "5"]))
EXPERTS = r"\.ffn_.*_exps\.weight"


def completion(url, tokens):
    body = json.dumps({"prompt": "Hello", "n_predict": tokens, "ignore_eos": True, "temperature": 0}).encode()
    request = urllib.request.Request(url + "/completion", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as resp:
        return json.loads(resp.read())


def measure(model, args, tokens, log):
    """(load bytes, load lines, completion bytes, completion lines, generated tokens, parsed log)."""
    cmd = ["-m", model, "-c", "512", "-ngl", "99", "--no-webui", "-fit", "off", "-ot", EXPERTS + "=CPU"] + args
    with llama_server(cmd, timeout=120, log=log) as server:
        if not server.healthy:
            raise SystemExit(f"llama-server did not start ({args}): exit {server.exited}")
        time.sleep(0.5)  # the idle lines after the load
        before = os.path.getsize(log)
        with open(log, "rb") as f:
            load_lines = f.read().count(b"\n")
        answer = completion(server.url, tokens)
        time.sleep(0.5)
        after = os.path.getsize(log)
        with open(log, "rb") as f:
            data = f.read()
    generated = answer.get("tokens_predicted") or len(answer.get("tokens") or []) or tokens
    return before, load_lines, after - before, data.count(b"\n") - load_lines, generated, parse_log(data)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=1, help="runs per level (the median is shown)")
    args = parser.parse_args()
    if SERVER is None:
        raise SystemExit("no llama-server on PATH: source scripts/env.sh")
    folder = tempfile.mkdtemp(prefix="log-volume-")
    model = os.path.join(folder, "tiny.gguf")
    write_tiny_nemotron_h_moe(model)
    print(f"server {SERVER}; model {model} (tiny nemotron_h_moe); {args.tokens}-token completions\n")
    header = ("level", "load bytes", "load lines", "bytes/compl.", "lines/compl.", "B/token", "what the log proves")
    print("%-8s %12s %10s %14s %12s %10s  %s" % header)
    for name, extra in LEVELS:
        rows = []
        for run in range(args.runs):
            rows.append(measure(model, extra, args.tokens, os.path.join(folder, f"{run}-{name}.log")))
        rows.sort(key=lambda r: r[2])
        load, load_lines, comp, comp_lines, generated, parsed = rows[len(rows) // 2]
        proof = []
        if parsed["per_tensor_lines_visible"]:
            proof.append(f"{len(parsed['overridden'])} per-tensor lines")
        if parsed["model_buffers"]:
            proof.append("model buffers " + ", ".join(sorted(parsed["model_buffers"])))
        if parsed["kv_buffers"] or parsed["compute_buffers"]:
            proof.append("KV/compute buffers")
        if parsed["server_ready"]:
            proof.append("ready line")
        row = (name, load, load_lines, comp, comp_lines, comp / generated, "; ".join(proof) or "nothing")
        print("%-8s %12d %10d %14d %12d %10.0f  %s" % row)
    for entry in os.listdir(folder):
        os.unlink(os.path.join(folder, entry))
    os.rmdir(folder)


if __name__ == "__main__":
    main()
