"""How close is the speed model? The planner's predicted decode and prompt tokens/s beside what the real
llama-server (the CPU build of scripts/llama-cpp.sh) serves, on this machine, and our placement beside llama.cpp's
own ``--fit on``.

Models: the demo model (tools/gguf_models.py ``demo``, a few MiB) and a generated qwen3moe of about 370 MiB in f32
(8 experts, 2 used: each decoded token reads about 150 MiB, so decode is bound by memory bandwidth). A CPU build
has no GPU: as in benchmarks/plan_accuracy.py, two ``ggml-rpc-server`` on 127.0.0.1 are two devices (RPC0, RPC1),
each computing with as many threads as llama-server's CPU backend (``-t``, the CPU's count), and ``-ot ...=CPU``
keeps experts in host memory exactly as on a GPU host. Placements: CPU only, the layers split over both devices
with every expert on them, with every expert in host memory, with half the MoE blocks' experts in host memory, with
the first half of the blocks on the host (``-ngl`` below all), and the plan (mode auto) for devices given only room
for their layers and half the experts.

Each row is measured as the role's speed check measures (``_speed_check``: the same ``/completion`` request, one
warm-up, then ``--runs`` runs, the medians of the server's own timings) and printed beside:

- the uncalibrated prediction: the host's bandwidth as ``host_info``'s copy probe measures it, its compute rate
  and the overhead at the model's assumed figures; an RPC device's memory and cores are this host's, so it gets the
  same figures (``gpu_bytes_per_second``, ``gpu_flops_per_second``);
- the prediction after calibration: ``_plan_calibration.calibration`` solved on two rows, CPU only and ``CALIBRATION_ROW``
  (they differ in splits: the host's effective bandwidth and the split cost from decode, then the host's compute
  rate from the prompt; the overhead held at its default), applied to every row, the RPC devices again at the host's
  figures (solved to a fixed point, since the RPC rows' GPU terms are at the host's figures too). Rows marked ``*``
  are the two calibrated on: their error shows the fit, the others the prediction.

Predictions are taken at the measured context (the prompt and half the generated tokens), as the calibration takes
them.

Against ``--fit on``: the same two RPC devices, ``--fit-target`` per device set to what the RPC server reports free
minus the free memory the plan was given, so that both see the same room; the ratio is our placement's speed over
``--fit``'s. Noise: each row's spread of runs ((max - min) / median), and the CPU-only row measured again on a fresh
server start. Targets: |error| <= 15 % per row after calibration, and ours not slower than ``--fit``'s beyond the
noise. The verdict says which were met; the exit status is non-zero only when the benchmark could not run.

Usage: python benchmarks/speed_model.py [--runs N] [--prompt-tokens N] [--predict-tokens N] [--no-large]
(defaults: the role's request, llm_server_speed_prompt_tokens 512, llm_server_speed_predict_tokens 128, 3 runs)
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / ".collections"))
sys.path.insert(0, str(ROOT))

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _speed_check as check  # noqa: E402
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._host_memory import copy_bandwidth  # noqa: E402
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_plan import plan  # noqa: E402
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_calibration import (  # noqa: E402
    answer_terms, calibration)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_inputs import PlanError, load_facts  # noqa: E402
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import Options  # noqa: E402
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._speed_model import (  # noqa: E402
    DEFAULT_HOST_FLOPS, bandwidths, predict)
from benchmarks.plan_accuracy import UNLIMITED, RpcDevices, free_port  # noqa: E402
from tools import gguf_models  # noqa: E402

CTX = 2048
# The threads of llama-server's CPU backend and of each RPC device: the same, so that an RPC device computes as fast
# as the host (ggml-rpc-server's default is one thread, llama-server's the CPU's cores).
THREADS = os.cpu_count() or 1
TARGET_ERROR = 15.0  # per cent, after calibration
CALIBRATION_ROW = "2 RPC, experts on CPU"  # calibrated on with CPU only: the most splits, every expert on the host
# device_info lines of llama-server's log (-lv 4): "  - RPC0    : 127.0.0.1:PORT (TOTAL MiB, FREE MiB free)"
_DEVICE_FREE = re.compile(r"- RPC\d+\s*: (\S+) \((\d+) MiB, (\d+) MiB free\)")


def write_large(path):
    """A qwen3moe of about 370 MiB in f32: 6 blocks of 1024 wide, 8 experts of 512 (48 MiB a block), 2 used."""
    return gguf_models.write_tiny_qwen3moe(path, n_blocks=6, n_embd=1024, n_ff_exp=512, n_expert=8, n_expert_used=2,
                                           n_vocab=1024)


class Server:
    """llama-server on a free loopback port with ``args``, until ``/health`` is 200; stopped by its own pid."""

    def __init__(self, model, args, timeout=180):
        self.url = "http://127.0.0.1:%d" % free_port()
        port = self.url.rsplit(":", 1)[1]
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(["llama-server", "-m", str(model), "-c", str(CTX), "-np", "1", "-t", str(THREADS),
                                      "--host", "127.0.0.1", "--port", port, "-lv", "4"] + list(args),
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        text = self.text()
        self.stop()
        raise RuntimeError("llama-server %s did not become healthy: %s" % (" ".join(args), text[-1500:]))

    def text(self):
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def measure(model, args, shape):
    """``(summary, spreads, log)``: ``_speed_check``'s medians of ``shape["runs"]`` runs after a warm-up, the
    spread of the runs per figure ((max - min) / median) and the server's log."""
    server = Server(model, args)
    try:
        body = check.completion_body(check.prompt_ids(server.url, shape["prompt_tokens"]), shape["predict_tokens"])
        where = "POST %s/completion" % server.url
        check.post_json(server.url, "/completion", body)
        samples = [check.timings_of(check.post_json(server.url, "/completion", body), where)
                   for _run in range(shape["runs"])]
        text = server.text()
    finally:
        server.stop()
    spreads = {}
    for key, index in (("decode", 3), ("prompt", 1)):
        values = [s[index] for s in samples]
        spreads[key] = (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else 0.0
    return check.summary(samples), spreads, text


def options(rpc_names, **kw):
    """The planner's options for RPC devices (no op offload, no margin, as benchmarks/plan_accuracy.py)."""
    return Options(CTX, 1, backend="rpc", margin_mib=0, op_offload=False, device_names=rpc_names or None,
                   experts_per_gpu=kw.pop("experts_per_gpu", False), **kw)


def placements(facts, endpoints):
    """``[(label, gpus, mode keywords)]`` of the fixed placements; the plan with limited room comes later."""
    rooms = [{"name": "rpc", "memory_free_mib": UNLIMITED, "index": i} for i in range(len(endpoints))]
    half = facts.expert_blocks[:len(facts.expert_blocks) // 2]
    layers = facts.block_count + 1 - facts.block_count // 2  # the first half of the blocks on the host
    return [("CPU only", [], {"mode": "none"}),
            ("2 RPC, experts on them", rooms, {"mode": "none", "split": [1, 1]}),
            ("2 RPC, experts on CPU", rooms, {"mode": "all", "split": [1, 1]}),
            ("2 RPC, blk %s on CPU" % ",".join(map(str, half)), rooms,
             {"mode": "layers", "cpu_expert_layers": half, "split": [1, 1]}),
            ("2 RPC, -ngl %d" % layers, rooms, {"mode": "none", "split": [1, 1], "n_gpu_layers": layers})]


def limited_rooms(facts, names):
    """Free memory per RPC device with room for its share of everything but the experts, and half of them."""
    rooms = [{"name": "rpc", "memory_free_mib": UNLIMITED, "index": i} for i in range(2)]
    bare = plan(facts, rooms, None, options(names, mode="all", split=[1, 1]))
    parts = ("model_mib", "kv_mib", "recurrent_mib", "compute_mib")
    need = [sum(g[k] for k in parts) for g in bare["memory"]["gpus"]]
    experts = sum(facts.expert_bytes_by_block().values()) / float(1 << 20)
    return [{"name": "rpc", "memory_free_mib": round(n + experts / 4, 2), "index": i} for i, n in enumerate(need)]


def server_args(answer, endpoints):
    """llama-server's flags for a plan's placement."""
    if not endpoints or not answer["devices"]:
        return ["-ngl", "0", "-fit", "off"]
    override = ",".join(o for o in [answer["override_tensor"]] + [
        "%s=%s" % (d["pattern"], d["device"]) for d in answer["device_overrides"]] if o)
    args = ["--rpc", ",".join(endpoints), "-ngl", str(answer["n_gpu_layers"] or 99), "-fit", "off"]
    if answer["tensor_split"]:
        args += ["-ts", answer["tensor_split"]]
    return args + (["-ot", override] if override else [])


def host_rates(opts, bw, flops, calibrated=None):
    """``opts`` with the RPC devices at the host's bandwidth ``bw`` and compute rate ``flops``."""
    return replace(opts, gpu_bytes_per_second={"rpc": bw}, gpu_flops_per_second={"rpc": flops},
                   calibration=calibrated)


def predicted(facts, answer, opts, got, host_bw, calibrated=None):
    """The prediction of ``answer``'s placement at the measured context: uncalibrated (the probe's figure and the
    assumed compute rate for the host and the RPC devices) or with ``calibrated`` (its host figures for both)."""
    cal = calibrated or {}
    opts = host_rates(opts, cal.get("host_bytes_per_second", host_bw),
                      cal.get("host_flops_per_second", DEFAULT_HOST_FLOPS), calibrated)
    terms, names = answer_terms(facts, answer, opts, got["prompt_tokens"] + got["predicted_tokens"] // 2,
                                got["prompt_tokens"])
    return predict(terms, bandwidths(names, opts, host_bw))


def calibrated_on(facts, measured, host_bw):
    """``_plan_calibration.calibration`` of the ``measured`` ``(answer, options, got)`` rows, the RPC devices at the
    host's figures: solved again with the figures it gives until they stop changing (the RPC rows' GPU terms move
    with the host's figures; a few rounds settle them to 0.1 %)."""
    bw, flops, cal = host_bw, DEFAULT_HOST_FLOPS, None
    for _round in range(20):
        rows = [(answer, host_rates(opts, bw, flops), got) for answer, opts, got in measured]
        cal = calibration(facts, *rows[0], more=rows[1:])
        new_bw, new_flops = cal["host_bytes_per_second"], cal.get("host_flops_per_second", flops)
        if abs(new_bw / bw - 1) < 1e-3 and abs(new_flops / flops - 1) < 1e-3:
            break
        bw, flops = new_bw, new_flops
    return cal


def error(pred, got):
    return 100.0 * (pred - got) / got if got else float("nan")


def model_rows(name, path, shape, host_bw, report):
    """Every placement of one model, measured and predicted; the plan with limited room beside ``--fit on``."""
    facts = load_facts(str(path))
    rows, measured = [], []
    with RpcDevices(2, THREADS) as rpc:
        names = ["RPC0[%s]" % e for e in rpc.endpoints]
        cases = [(label, gpus, options(names if gpus else None, **kw)) for label, gpus, kw in
                 placements(facts, rpc.endpoints)]
        rooms = limited_rooms(facts, names)
        cases.append(("plan, %s MiB free" % "+".join("%.0f" % r["memory_free_mib"] for r in rooms), rooms,
                      options(names, mode="auto", split="auto", experts_per_gpu=True)))
        reported = None
        for label, gpus, opts in cases:
            answer = plan(facts, gpus, None, opts)
            got, spread, text = measure(path, server_args(answer, rpc.endpoints if gpus else []), shape)
            print("  %s, %s: decode %.1f, prompt %.1f tokens/s" % (
                name, label, got["decode_tokens_per_second"], got["prompt_tokens_per_second"]), flush=True)
            found = _DEVICE_FREE.findall(text)
            reported = reported or (dict((e, int(free)) for e, _total, free in found) if found else None)
            if label in ("CPU only", CALIBRATION_ROW):
                measured.append((answer, opts, got))
            rows.append({"model": name, "label": label, "got": got, "spread": spread, "answer": answer,
                         "opts": opts, "raw": predicted(facts, answer, opts, got, host_bw),
                         "placement": placement_text(answer), "fitted": label in ("CPU only", CALIBRATION_ROW)})
        if reported:
            free = [reported.get(e) for e in rpc.endpoints]
            target = ",".join(str(max(0, int(f - r["memory_free_mib"]))) for f, r in zip(free, rooms))
            fit, fit_spread, text = measure(path, ["--rpc", ",".join(rpc.endpoints), "-fit", "on", "-fitt", target],
                                            shape)
            report["fit"].append({"model": name, "ours": rows[-1], "fit": fit, "spread": fit_spread,
                                  "target": target, "chosen": fit_choice(text)})
        else:
            report["problems"].append("%s: llama-server's log named no RPC device's free memory: no --fit row" % name)
        again, again_spread, _text = measure(path, ["-ngl", "0", "-fit", "off"], shape)
        report["noise"].append({"model": name, "first": rows[0]["got"], "again": again, "spread": again_spread})
    try:
        cal = calibrated_on(facts, measured, host_bw)
    except PlanError as exc:
        report["problems"].append("%s: no calibration: %s" % (name, exc))
        cal = None
    for row in rows:
        row["cal"] = predicted(facts, row["answer"], row["opts"], row["got"], host_bw, cal) if cal else row["raw"]
    report["cal"].append((name, cal))
    return rows


def placement_text(answer):
    if not answer["devices"]:
        return "cpu"
    cpu = answer["cpu_expert_layers"]
    moved = ["%s->%s" % (",".join(map(str, o["blocks"])), o["device"][:4]) for o in answer["device_overrides"]]
    layers = ", -ngl %d" % answer["n_gpu_layers"] if answer["n_gpu_layers"] is not None else ""
    return "ts %s, cpu blk %s%s%s" % (answer["tensor_split"] or "-", ",".join(map(str, cpu)) or "-",
                                      ", " + " ".join(moved) if moved else "", layers)


def fit_choice(text):
    """What ``--fit`` changed, from its log lines (``common_params_fit_impl``), shortened."""
    lines = [line.split("common_params_fit_impl:", 1)[1].strip() for line in text.splitlines()
             if "common_params_fit_impl:" in line]
    keep = [line for line in lines if re.search(r"set|n_gpu_layers|overrid|moe|reduc|no changes", line, re.I)]
    return "; ".join(keep[-2:])[:160] or "(no decision logged)"


def print_report(rows, report):
    print("\nPredicted vs measured tokens/s (predictions at the measured context; error = predicted / measured - 1)")
    head = "%-8s %-34s | %8s %8s %7s %8s %7s %6s | %8s %8s %7s %8s %7s %6s" % (
        "model", "placement", "decode", "pred", "err%", "cal", "err%", "spr%", "prompt", "pred", "err%", "cal",
        "err%", "spr%")
    print(head)
    print("-" * len(head))
    for r in rows:
        g, raw, cal = r["got"], r["raw"], r["cal"]
        cells = []
        for key, short in (("decode_tokens_per_second", "decode"), ("prompt_tokens_per_second", "prompt")):
            cells += [g[key], raw[key], error(raw[key], g[key]), cal[key], error(cal[key], g[key]),
                      100 * r["spread"][short]]
        print("%-8s %-34s | %8.1f %8.1f %+7.1f %8.1f %+7.1f %6.1f | %8.1f %8.1f %+7.1f %8.1f %+7.1f %6.1f" % (
            (r["model"][:8], ("* " if r["fitted"] else "") + r["label"][:32]) + tuple(cells)))
    print("\nplacements: " + "; ".join("%s %s: %s" % (r["model"], r["label"], r["placement"]) for r in rows))
    for name, cal in report["cal"]:
        if cal:
            print("calibration (%s, on CPU only and %s): host %.2f GB/s, split %s, overhead %s, host compute %s" % (
                name, CALIBRATION_ROW, cal["host_bytes_per_second"] / 1e9, "%.0f us" % (cal["split_seconds"] * 1e6)
                if cal.get("split_seconds") is not None else "held at the default",
                "%.0f us" % (cal["token_seconds"] * 1e6) if cal.get("token_seconds") is not None
                else "held at the default", "%.1f GFLOP/s" % (cal["host_flops_per_second"] / 1e9)
                if cal.get("host_flops_per_second") else "not solved"))
    print("\nOurs (the plan) vs llama.cpp --fit on, same two RPC devices, same room (ratio = ours / fit)")
    head = "%-8s | %9s %9s %6s | %9s %9s %6s | %s" % (
        "model", "decode", "fit", "ratio", "prompt", "fit", "ratio", "--fit-target MiB, what --fit did")
    print(head)
    print("-" * len(head))
    for f in report["fit"]:
        ours, fit = f["ours"]["got"], f["fit"]
        print("%-8s | %9.1f %9.1f %6.2f | %9.1f %9.1f %6.2f | %s: %s" % (
            f["model"][:8], ours["decode_tokens_per_second"], fit["decode_tokens_per_second"],
            ours["decode_tokens_per_second"] / fit["decode_tokens_per_second"], ours["prompt_tokens_per_second"],
            fit["prompt_tokens_per_second"], ours["prompt_tokens_per_second"] / fit["prompt_tokens_per_second"],
            f["target"], f["chosen"]))
    print("\nNoise: the CPU-only row on a fresh server start (change = again / first - 1), and each row's spread "
          "of runs above")
    for n in report["noise"]:
        print("%-8s decode %.1f then %.1f (%+.1f%%), prompt %.1f then %.1f (%+.1f%%)" % (
            n["model"][:8], n["first"]["decode_tokens_per_second"], n["again"]["decode_tokens_per_second"],
            error(n["again"]["decode_tokens_per_second"], n["first"]["decode_tokens_per_second"]),
            n["first"]["prompt_tokens_per_second"], n["again"]["prompt_tokens_per_second"],
            error(n["again"]["prompt_tokens_per_second"], n["first"]["prompt_tokens_per_second"])))


def verdict(rows, report):
    """The verdict lines: each target met or missed, in figures."""
    lines = []
    applied = [r for r in rows if not r["fitted"]]
    for key, short in (("decode_tokens_per_second", "decode"), ("prompt_tokens_per_second", "prompt")):
        for which, among in (("every row", rows), ("rows not calibrated on", applied)):
            worst = max(among, key=lambda r: abs(error(r["cal"][key], r["got"][key])))
            misses = [r for r in among if abs(error(r["cal"][key], r["got"][key])) > TARGET_ERROR]
            noisy = [r for r in misses if abs(error(r["cal"][key], r["got"][key])) <= 100 * r["spread"][short]]
            lines.append("%s after calibration |error| <= %.0f%%, %s: %s (worst %+.1f%%, %s %s)%s" % (
                short, TARGET_ERROR, which, "met" if not misses else "MISSED in %d of %d rows" % (
                    len(misses), len(among)), error(worst["cal"][key], worst["got"][key]), worst["model"],
                worst["label"], "; %d of the misses within their row's spread of runs" % len(noisy) if misses else ""))
    for f in report["fit"]:
        for key, short in (("decode_tokens_per_second", "decode"), ("prompt_tokens_per_second", "prompt")):
            ratio = f["ours"]["got"][key] / f["fit"][key]
            noise = f["ours"]["spread"][short] + f["spread"][short]
            lines.append("%s %s ours / --fit %.2f, noise %.2f: %s" % (
                f["model"], short, ratio, noise, "not slower" if ratio >= 1 - noise else "SLOWER beyond the noise"))
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--runs", type=int, default=3, help="measured runs per row after the warm-up (3)")
    parser.add_argument("--prompt-tokens", type=int, default=512, help="prompt length (512, as the role)")
    parser.add_argument("--predict-tokens", type=int, default=128, help="generated tokens (128, as the role)")
    parser.add_argument("--no-large", action="store_true", help="only the demo model")
    args = parser.parse_args(argv)
    if not (shutil.which("llama-server") and shutil.which("ggml-rpc-server")):
        print("llama-server or ggml-rpc-server is not on PATH: bash scripts/setup.sh; source scripts/env.sh")
        return 2
    shape = {"prompt_tokens": args.prompt_tokens, "predict_tokens": args.predict_tokens, "runs": args.runs}
    workdir = tempfile.mkdtemp(prefix="speed_model.")
    started = time.time()
    try:
        probe = copy_bandwidth()
        host_bw = probe["memory_bandwidth_mb_per_s"] * 1e6
        print("host_info's copy probe: %.2f GB/s (%d copies of %s MiB); request: %d prompt tokens, %d generated, "
              "%d runs after a warm-up, -c %d -np 1" % (
                  host_bw / 1e9, probe["copies"], probe["buffer_mib"], args.prompt_tokens, args.predict_tokens,
                  args.runs, CTX))
        models = [("demo", gguf_models.write_demo_model(str(Path(workdir) / "demo.gguf")))]
        if not args.no_large:
            models.append(("qwen370M", write_large(Path(workdir) / "large.gguf")))
        report = {"fit": [], "noise": [], "cal": [], "problems": []}
        rows = []
        for name, path in models:
            rows += model_rows(name, path, shape, host_bw, report)
        print_report(rows, report)
        print("\nverdict (%.0f s):" % (time.time() - started))
        for line in verdict(rows, report) + report["problems"]:
            print("  " + line)
        return 0
    except (RuntimeError, check.SpeedError, OSError, PlanError) as exc:
        print("speed_model: %s" % exc)
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
