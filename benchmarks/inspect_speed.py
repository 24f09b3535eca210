"""Header inspection speed: our GGUF reader vs gguf-py's GGUFReader vs a whole gguf_info run.

On the sparse 6-shard Nemotron-3-Nano-30B-A3B Q4_K_M header (131,072-token vocab, 269,443 merges) written by
tools/gguf_models.py (cached under .cache/bench/), each reader runs in its own subprocess so that its peak
RSS is its own (VmHWM of the child; for (c) ru_maxrss of the children: the largest single process of the run):

  (a) plugins/module_utils/_gguf.read_model on all 6 shards (in-process time of the call),
  (b) gguf-py GGUFReader on shard 1 alone (in-process time of the constructor),
  (c) ``ansible localhost -m ai_llm.moe_offload.gguf_info -a path=<shard 1>`` (whole command).

Prints figures; this is not a test. Usage: python benchmarks/inspect_speed.py [--repeat N] [--rebuild]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "bench"
READER = ROOT / "plugins" / "module_utils" / "_gguf.py"
GGUF_INFO = ROOT / "plugins" / "modules" / "gguf_info.py"
VOCAB, MERGES, SHARDS = 131072, 269443, 6

# Each child prints one JSON line: best and first wall time of its call, its own peak RSS, a result summary.
# Peak RSS is VmHWM of the child's own address space: Linux carries ru_maxrss of RUSAGE_SELF over execve from
# the parent (which may have built the model with numpy), VmHWM starts afresh with the new program.
PEAK = r"""
def peak_kb():
    try:
        with open("/proc/self/status") as f:
            return int([l for l in f if l.startswith("VmHWM:")][0].split()[1])
    except (OSError, IndexError, ValueError):
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
"""
OURS = PEAK + r"""
import importlib.util, json, sys, time
spec = importlib.util.spec_from_file_location("_gguf", sys.argv[1])
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
times = []
for _ in range(int(sys.argv[3])):
    t0 = time.perf_counter(); model = mod.read_model(sys.argv[2]); times.append(time.perf_counter() - t0)
print(json.dumps({"first": times[0], "best": min(times), "rss_kb": peak_kb(),
                  "summary": "%d files, %d tensors, tokens %r" % (len(model.files), len(model.tensors),
                                                           model.metadata["tokenizer.ggml.tokens"])}))
"""
THEIRS = PEAK + r"""
import json, sys, time
from gguf import GGUFReader
t0 = time.perf_counter(); r = GGUFReader(sys.argv[1]); took = time.perf_counter() - t0
print(json.dumps({"first": took, "best": took, "rss_kb": peak_kb(),
                  "summary": "1 file, %d tensors, %d tokens" % (len(r.tensors),
                                                                len(r.fields["tokenizer.ggml.tokens"].data))}))
"""
ANSIBLE = r"""
import json, os, resource, subprocess, sys, time
t0 = time.perf_counter()
p = subprocess.run(sys.argv[1:], capture_output=True, text=True)
took = time.perf_counter() - t0
out = p.stdout.strip().splitlines()
print(json.dumps({"first": took, "best": took, "rss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
                  "summary": "rc=%d %s" % (p.returncode, (out[0][:60] if out else p.stderr.strip()[-200:]))}))
"""


def build(rebuild):
    """The cached sparse header; written once (a few MB on disk, about 24.5 GB apparent)."""
    outdir = CACHE / ("nemotron-nano-%d-%d-%d" % (SHARDS, VOCAB, MERGES))
    marker = outdir / "complete"
    if rebuild or not marker.exists():
        sys.path.insert(0, str(ROOT))
        from tools import gguf_models
        t0 = time.perf_counter()
        files = gguf_models.write_nemotron_nano_30b(outdir, shards=SHARDS, vocab_size=VOCAB, n_merges=MERGES)
        marker.write_text("\n".join(files) + "\n")
        print("built %s in %.1f s" % (outdir, time.perf_counter() - t0))
    return marker.read_text().split()


def child(code, *args, env=None):
    proc = subprocess.run([sys.executable, "-c", code] + [str(a) for a in args], capture_output=True, text=True,
                          env=env, cwd=str(ROOT), check=False)
    if proc.returncode:
        raise SystemExit("child failed:\n%s\n%s" % (proc.stdout, proc.stderr))
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ansible_env():
    env = dict(os.environ)
    env.update({"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_COLLECTIONS_PATH": str(ROOT / ".collections"),
                "ANSIBLE_LOCALHOST_WARNING": "0", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0"})
    return env


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--repeat", type=int, default=5, help="calls of our reader in its child (best is shown)")
    parser.add_argument("--rebuild", action="store_true", help="write the cached model again")
    args = parser.parse_args()
    files = build(args.rebuild)
    apparent = sum(os.path.getsize(f) for f in files)
    on_disk = sum(os.stat(f).st_blocks * 512 for f in files)
    print("model: %d shards, %.2f GB apparent, %.1f MB on disk, header of shard 1: %s"
          % (len(files), apparent / 1e9, on_disk / 1e6, files[0]))

    rows = [("(a) _gguf.read_model, all %d shards" % len(files), child(OURS, READER, files[0], args.repeat)),
            ("(b) gguf-py GGUFReader, shard 1 only", child(THEIRS, files[0]))]
    if GGUF_INFO.exists():
        ansible = str(Path(sys.executable).parent / "ansible")
        rows.append(("(c) ansible localhost -m gguf_info (whole run)",
                     child(ANSIBLE, ansible, "localhost", "-c", "local", "-i", "localhost,",
                           "-e", "ansible_python_interpreter=" + sys.executable,
                           "-m", "ai_llm.moe_offload.gguf_info", "-a", "path=" + files[0] + " tensors=none",
                           env=ansible_env())))
    else:
        print("note: %s does not exist yet: (c) skipped" % GGUF_INFO.relative_to(ROOT))

    print()
    print("%-48s %10s %10s %10s  %s" % ("reader", "first s", "best s", "peak MB", "result"))
    for name, r in rows:
        print("%-48s %10.3f %10.3f %10.1f  %s" % (name, r["first"], r["best"], r["rss_kb"] / 1024, r["summary"]))
    ours, theirs = rows[0][1], rows[1][1]
    print()
    print("speed-up of (a) over (b): %.0fx (best), %.0fx (first call); peak RSS %.1f MB vs %.1f MB"
          % (theirs["best"] / ours["best"], theirs["first"] / ours["first"], ours["rss_kb"] / 1024,
             theirs["rss_kb"] / 1024))
    print("targets: (a) < 0.25 s and < 40 MB, >= 50x faster than (b); (c) < 3 s")


if __name__ == "__main__":
    main()
