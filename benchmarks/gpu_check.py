"""The planner against a real GPU: planned MiB beside nvidia-smi's, predicted tokens/s beside measured, and llama.cpp's
``--fit on`` beside both. ``bash benchmarks/gpu_check.sh measure`` runs it after ``build``; see that script.

One generated qwen3moe model (``--model-mib``, f32: big enough that decode is bound by memory bandwidth), the GPUs
as ``nvidia-smi`` reads them (``_nvidia_smi.read``), the host as ``host_info`` reads it, one plan (the module's
defaults, ``--ctx-size`` and one slot) and three loads of the same llama-server:

- ``none``: every layer on the GPUs (``-ngl 99``), nothing moved;
- ``plan``: the plan's placement (``-ot``, ``-ts`` and the device overrides it answers);
- ``fit``: llama.cpp's own ``--fit on``;
- ``first`` and ``last``: every layer on the GPUs with the routed experts of the first ``--host-blocks`` blocks, or of
  the last as many, in host memory (the same bytes leave the GPU in both: the blocks of the generated model are
  alike). Which end the experts leave from is a choice the planner makes; another fork reported about 10 % more
  prompt speed with the last blocks' experts on the host (ikawrakow/ik_llama.cpp#2262), and these two loads
  measure it with this llama-server on this GPU.

Each load runs at ``-lv 4`` (the buffer lines). Each: ``nvidia-smi``'s memory used per GPU while it serves (minus
what was used before it started), the devices of its ``using device`` lines (which card each ``CUDA<n>`` is), the
CUDA context of each device (``_cuda_context.measure``: the memory nvidia-smi shows for the server's process there
minus the buffers its log reports), the speed as the role's speed check measures it (``_speed_check``: one warm-up,
then ``--runs`` runs, the medians), its log.
Written to ``--out``: ``results.json`` (the plan, every load's figures) and one ``<load>.log`` per load; the table
is printed. Without nvidia-smi (the CPU path, which the tests run) every load runs on the CPU, ``nvidia-smi`` MiB
are ``None`` and the plan is a CPU plan.

Usage: python benchmarks/gpu_check.py [--out DIR] [--model-mib N] [--ctx-size N] [--runs N] [--prompt-tokens N]
       [--predict-tokens N] [--host-blocks N] [--llama-server PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / ".collections"))
sys.path.insert(0, str(ROOT))

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._cuda_context import measure as context_of_devices  # noqa: E402
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._host_memory import gather  # noqa: E402
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_devices import normalize_pci_bus_id  # noqa: E402
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_log import parse_log  # noqa: E402
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._nvidia_smi import read  # noqa: E402
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_pattern import block_expert_pattern  # noqa: E402
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_inputs import load_facts  # noqa: E402
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_request import ARGUMENT_SPEC, run  # noqa: E402
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._speed_check import measure  # noqa: E402
from benchmarks import speed_model  # noqa: E402
from tools import gguf_models  # noqa: E402

# qwen3moe blocks of 1024 wide with 16 experts of 512, 4 used, in f32: 96 MiB of experts a block
BLOCK_EXPERT_MIB = 3 * 16 * 1024 * 512 * 4 / 2 ** 20


def run_command(argv):
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def write_model(path, mib):
    """A qwen3moe of about ``mib`` MiB: as many blocks of ``BLOCK_EXPERT_MIB`` as that takes (at least 2); returns
    the number of blocks."""
    blocks = max(2, int(round(mib / BLOCK_EXPERT_MIB)))
    gguf_models.write_tiny_qwen3moe(path, n_blocks=blocks, n_embd=1024, n_ff_exp=512, n_expert=16, n_expert_used=4,
                                    n_vocab=1024)
    return blocks


def the_plan(model, gpus, host, ctx):
    """The planner's answer for the model on these GPUs and this host, with the module's defaults."""
    params = dict((k, v.get("default")) for k, v in ARGUMENT_SPEC.items())
    params.update(gguf=str(model), gpus=gpus, host=host, ctx_size=ctx, parallel=1)
    answer, warnings = run(params)
    if answer.get("failed"):
        raise SystemExit("gpu_check: the plan failed: %s" % answer["msg"])
    return answer, warnings


LOADS = ("none", "plan", "fit", "first", "last")


def end_patterns(model, count):
    """``{"first": pattern, "last": pattern}``: regexes proved (by the collection's own pattern builder) to match
    exactly the routed experts of the first ``count`` expert blocks of ``model``, and of the last ``count``."""
    facts = load_facts(str(model))
    blocks = facts.expert_blocks
    if not 0 < count < len(blocks):
        raise SystemExit("gpu_check: --host-blocks must be between 1 and %d (the model's expert blocks less one), "
                         "not %d" % (len(blocks) - 1, count))
    return {name: block_expert_pattern(facts.tensor_names, facts.expert_names, chosen)
            for name, chosen in (("first", blocks[:count]), ("last", blocks[-count:]))}


def load_args(name, answer, gpu, ends):
    """llama-server's flags of one load (``ends``: the patterns of ``end_patterns``)."""
    if not gpu:
        return ["-ngl", "0", "-fit", "off"]
    if name == "none":
        return ["-ngl", "99", "-fit", "off"]
    if name in ends:
        return ["-ngl", "99", "-fit", "off", "-ot", "%s=CPU" % ends[name]]
    if name == "fit":
        return ["-fit", "on"]
    override = ",".join(o for o in [answer["override_tensor"]] + [
        "%s=%s" % (d["pattern"], d["device"]) for d in answer["device_overrides"]] if o)
    args = ["-ngl", str(answer.get("n_gpu_layers") or 99), "-fit", "off"]
    if answer["tensor_split"]:
        args += ["-ts", answer["tensor_split"]]
    return args + (["-ot", override] if override else [])


def devices_and_context(log, gpus):
    """The ``using device`` lines of a load's log, and the CUDA context of each of its CUDA devices (``gpus``: the
    GPUs as nvidia-smi reads them with the server's pid), each device matched to its GPU by PCI bus id."""
    parsed = parse_log(log)
    by_bus = {normalize_pci_bus_id(g.get("pci_bus_id")): g for g in gpus}
    planned = [dict(device=d["device"], index=by_bus[d["pci_bus_id"]]["index"], uuid=by_bus[d["pci_bus_id"]]["uuid"],
                    name=by_bus[d["pci_bus_id"]]["name"]) for d in parsed.get("devices") or [] if d["pci_bus_id"] in by_bus]
    return parsed.get("devices") or [], context_of_devices(planned, gpus, parsed)


def used_mib(gpu):
    """nvidia-smi's memory used per GPU (MiB), ``None`` without a GPU."""
    if not gpu:
        return None
    return [g["memory_used_mib"] for g in read(shutil.which, run_command)["gpus"]]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--out", default=str(ROOT / "gpu-check"))
    parser.add_argument("--model-mib", type=float, default=None, help="default: 3072 with a GPU, 200 without")
    parser.add_argument("--ctx-size", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--predict-tokens", type=int, default=128)
    parser.add_argument("--host-blocks", type=int, default=None,
                        help="the expert blocks of the first/last loads in host memory (default: half of them)")
    parser.add_argument("--llama-server", default=None, help="default: llama-server on PATH")
    args = parser.parse_args(argv)
    if args.llama_server:
        os.environ["PATH"] = str(Path(args.llama_server).resolve().parent) + os.pathsep + os.environ["PATH"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu_info = read(shutil.which, run_command)
    gpu = bool(gpu_info["gpus"])
    model = out / "moe.gguf"
    mib = args.model_mib if args.model_mib is not None else (3072 if gpu else 200)
    print("gpu_check: %s; writing a qwen3moe of about %.0f MiB to %s" % (
        ", ".join("%s (%d MiB free)" % (g["name"], g["memory_free_mib"]) for g in gpu_info["gpus"]) or "no GPU",
        mib, model), flush=True)
    blocks = write_model(model, mib)
    ends = end_patterns(model, args.host_blocks if args.host_blocks is not None else max(1, blocks // 2))
    answer, warnings = the_plan(model, gpu_info, gather(), args.ctx_size)
    loads = {}
    for name in LOADS:
        # (the last -c is the one that counts)
        flags = ["-c", str(args.ctx_size), "-lv", "4"] + load_args(name, answer, gpu, ends)
        before = used_mib(gpu)
        server = speed_model.Server(model, flags, timeout=600)
        try:
            during = used_mib(gpu)
            got = measure(server.url, args.prompt_tokens, args.predict_tokens, args.runs)
            log = server.text()
            (out / ("%s.log" % name)).write_text(log)
            serving = read(shutil.which, run_command, pid=server.proc.pid)["gpus"] if gpu else []
            devices, context = devices_and_context(log, serving)
        finally:
            server.stop()
        loads[name] = {"args": flags, "speed": got, "devices": devices, "cuda_context": context,
                       "nvidia_smi_mib": None if before is None else [d - b for d, b in zip(during, before)]}
        print("gpu_check: %-4s %-60s decode %8.1f  prompt %9.1f tokens/s  nvidia-smi %s MiB" % (
            name, " ".join(flags)[:60], got["decode_tokens_per_second"], got["prompt_tokens_per_second"],
            loads[name]["nvidia_smi_mib"]), flush=True)
        for device in devices:
            print("gpu_check:      %s is %s (%s)" % (device["device"], device["description"], device["id"]), flush=True)
        for row in context:
            print("gpu_check:      %s CUDA context %d MiB (%s MiB held, %s MiB of buffers)" % (
                row["device"], row["context_mib"], row["held_mib"], row["buffers_mib"]), flush=True)
    planned = [g["total_mib"] for g in answer["memory"]["gpus"]]
    results = {"gpus": gpu_info["gpus"], "model": str(model), "plan": answer, "warnings": warnings, "ends": ends,
               "planned_mib": planned, "predicted": answer["speed"], "loads": loads}
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    measured = loads["plan"]
    print("planned MiB per GPU:     %s" % (planned or "none (a CPU plan)"))
    print("nvidia-smi MiB per GPU:  %s" % measured["nvidia_smi_mib"])
    print("predicted tokens/s:      decode %s, prompt %s (%s)" % (
        answer["speed"]["decode_tokens_per_second"], answer["speed"]["prompt_tokens_per_second"],
        "calibrated" if answer["speed"]["calibrated"] else "not calibrated"))
    print("measured tokens/s:       decode %.1f, prompt %.1f" % (
        measured["speed"]["decode_tokens_per_second"], measured["speed"]["prompt_tokens_per_second"]))
    fit = loads["fit"]["speed"]
    print("plan / --fit:            decode %.2f, prompt %.2f" % (
        measured["speed"]["decode_tokens_per_second"] / fit["decode_tokens_per_second"],
        measured["speed"]["prompt_tokens_per_second"] / fit["prompt_tokens_per_second"]))
    first, last = loads["first"]["speed"], loads["last"]["speed"]
    print("last / first blocks' experts on the host: decode %.2f, prompt %.2f" % (
        last["decode_tokens_per_second"] / first["decode_tokens_per_second"],
        last["prompt_tokens_per_second"] / first["prompt_tokens_per_second"]))
    print("written: %s" % (out / "results.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
