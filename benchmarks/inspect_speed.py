"""Reading speed of the parsers, measured side by side with an earlier revision (``--baseline REV``).

Each measurement runs in its own child process, so that its peak RSS (VmHWM) is its own:

* ``header``: the sparse 6-shard Nemotron-3-Nano-30B-A3B Q4_K_M header (131,072-token vocab, 269,443 merges)
  written by tools/gguf_models.py (cached under .cache/bench/): (a) ``gguf.model.read_model`` on all 6 shards,
  (b) gguf-py's ``GGUFReader`` on shard 1 alone, (c) ``ansible localhost -m ai_llm.moe_offload.gguf_info``;
* ``sparse``: a sparse file of 64 GiB (``--sparse-gib``) whose header (a few hundred bytes) claims a string array
  that spans the unwritten part: ``read_gguf`` until it reports the duplicate key that follows;
* ``pattern``: the offload pattern builder on 1k, 12k and 50k tensors: a stacked-expert model (``expert_pattern``),
  every other block (``block_expert_pattern``), names that defeat every naming convention (each expert has a
  non-expert twin ``x<name>``) and the experts of irregular blocks asked of ``expert_pattern`` (only the list of
  their names is exact: spelled out, or refused over the length bound);
* ``log``: ``parse_log`` on a 100 MB (``--log-mib``) llama-server log at ``-lv 5`` (restarts, loads with their
  per-tensor lines, per-token debug lines), read from a file;
* ``limit`` (not run by default: it starts the real llama-server a few dozen times): the longest ``-ot`` pattern
  of each costly shape (nested groups, an alternation, a literal, listed names) that llama-server still loads
  with, found by bisection, and how it fails above (exit code, last line).

Prints figures; this is not a test. Usage:
  python benchmarks/inspect_speed.py [--only header,sparse,pattern,log] [--baseline REV] [--repeat N] [--rebuild]
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "bench"
CURRENT = ROOT / ".collections"
VOCAB, MERGES, SHARDS = 131072, 269443, 6
MU = "ansible_collections.ai_llm.moe_offload.plugins.module_utils"

# Every child: the collection tree first on sys.path, the task, one JSON line with its time and its own peak RSS
# (VmHWM of the child's address space: ru_maxrss would carry over the parent's across execve).
CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
MU = "ansible_collections.ai_llm.moe_offload.plugins.module_utils"


def peak_kb():
    try:
        with open("/proc/self/status") as f:
            return int([l for l in f if l.startswith("VmHWM:")][0].split()[1])
    except (OSError, IndexError, ValueError):
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def gguf_model():
    import importlib
    try:
        return importlib.import_module(MU + ".gguf.model")
    except ImportError:  # a baseline whose reader is the one module _gguf
        return importlib.import_module(MU + "._gguf")


def header(path, repeat):
    gguf = gguf_model()
    times = []
    for _ in range(int(repeat)):
        t0 = time.perf_counter()
        model = gguf.read_model(path)
        times.append(time.perf_counter() - t0)
    return min(times), "%d files, %d tensors, first call %.3f s" % (len(model.files), len(model.tensors), times[0])


def gguf_py(path):
    from gguf import GGUFReader
    t0 = time.perf_counter()
    r = GGUFReader(path)
    return time.perf_counter() - t0, "1 file, %d tensors, %d tokens" % (
        len(r.tensors), len(r.fields["tokenizer.ggml.tokens"].data))


def sparse(path):
    gguf = gguf_model()
    t0 = time.perf_counter()
    try:
        gguf.read_gguf(path)
        result = "read"
    except gguf.GGUFError as exc:
        result = exc.reason
    return time.perf_counter() - t0, result


def pattern(kind, n):
    import importlib
    op = importlib.import_module(MU + "._offload_pattern")
    n = int(n)
    names = ["token_embd.weight", "output_norm.weight", "output.weight"]
    block = 0
    while len(names) < n:
        names += ["blk.%d.%s" % (block, t) for t in (
            "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
            "ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")]
        block += 1
    names = names[:n]
    experts = [x for x in names if "_exps." in x]
    wanted = experts
    if kind == "twins":  # every expert has a non-expert twin "x<name>": no convention separates them
        experts = ["blk.%d.ffn_%s_exps.weight" % (i // 3, ("gate", "up", "down")[i % 3]) for i in range(n // 2)]
        names = experts + ["x" + e for e in experts]
        wanted = experts
    elif kind == "subset":  # the experts of irregular blocks: only the list of their names is exact
        wanted = [x for x in experts if int(x.split(".")[1]) * 7919 % 13 < 4]
    t0 = time.perf_counter()
    try:
        if kind == "blocks":
            result = op.block_expert_pattern(names, experts, range(0, block, 2))
        else:
            result = op.expert_pattern(names, wanted)
        summary = "%d tensors: %d-byte pattern" % (len(names), len(result))
    except op.PatternError as exc:
        summary = "%d tensors: refused (%s)" % (len(names), str(exc)[:70])
    return time.perf_counter() - t0, summary


def log(path):
    import importlib
    ll = importlib.import_module(MU + "._llama_log")
    t0 = time.perf_counter()
    if "exit_code" in ll.parse_log.__code__.co_varnames:  # streams from the file
        with open(path, "rb") as f:
            p = ll.parse_log(f)
    else:  # the earlier parser takes the whole text
        with open(path, "rb") as f:
            p = ll.parse_log(f.read().decode("utf-8", "replace"))
    return time.perf_counter() - t0, "%d runs, %d overridden, ready %s" % (p["runs"], len(p["overridden"]),
                                                                          p["server_ready"])


took, summary = globals()[sys.argv[2]](*sys.argv[3:])
print(json.dumps({"s": took, "rss_kb": peak_kb(), "summary": summary}))
"""


def child(tree, task, *args, env=None, timeout=3600):
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, str(tree), task] + [str(a) for a in args],
                              capture_output=True, text=True, env=env, cwd=str(ROOT), check=False, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"s": float(timeout), "rss_kb": 0, "summary": "stopped after %d s" % timeout}
    if proc.returncode:
        return {"s": float("nan"), "rss_kb": 0, "summary": "failed: " + (proc.stderr.strip()[-150:])}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def baseline_tree(rev):
    """The module utils of ``rev`` extracted into a temporary collection tree."""
    data = subprocess.run(["git", "archive", rev, "plugins/module_utils"], cwd=str(ROOT), capture_output=True,
                          check=True).stdout
    tree = Path(tempfile.mkdtemp(prefix="inspect-speed-"))
    dest = tree / "ansible_collections" / "ai_llm" / "moe_offload"
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(dest)  # our own repository's files
    return tree


def print_rows(title, rows):
    print()
    print("%-58s %12s %10s  %s" % (title, "seconds", "peak MB", "result"))
    for name, r in rows:
        print("%-58s %12.3f %10.1f  %s" % (name, r["s"], r["rss_kb"] / 1024, r["summary"]))


def bench_header(trees, args):
    outdir = CACHE / ("nemotron-nano-%d-%d-%d" % (SHARDS, VOCAB, MERGES))
    marker = outdir / "complete"
    if args.rebuild or not marker.exists():
        sys.path.insert(0, str(ROOT))
        from tools import gguf_models
        t0 = time.perf_counter()
        files = gguf_models.write_nemotron_nano_30b(outdir, shards=SHARDS, vocab_size=VOCAB, n_merges=MERGES)
        marker.write_text("\n".join(files) + "\n")
        print("built %s in %.1f s" % (outdir, time.perf_counter() - t0))
    files = marker.read_text().split()
    apparent = sum(os.path.getsize(f) for f in files)
    on_disk = sum(os.stat(f).st_blocks * 512 for f in files)
    print("\nheader: %d shards, %.2f GB apparent, %.1f MB on disk" % (len(files), apparent / 1e9, on_disk / 1e6))
    rows = [("(a) gguf.model.read_model, all %d shards [%s]" % (len(files), name),
             child(tree, "header", files[0], args.repeat)) for name, tree in trees]
    rows.append(("(b) gguf-py GGUFReader, shard 1 only", child(CURRENT, "gguf_py", files[0])))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_COLLECTIONS_PATH=str(CURRENT),
               ANSIBLE_LOCALHOST_WARNING="0", ANSIBLE_INVENTORY_UNPARSED_WARNING="0")
    cmd = [str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local", "-i", "localhost,", "-e",
           "ansible_python_interpreter=" + sys.executable, "-m", "ai_llm.moe_offload.gguf_info", "-a",
           "path=" + files[0] + " tensors=none"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    rows.append(("(c) ansible localhost -m gguf_info (whole run)",
                 {"s": time.perf_counter() - t0, "rss_kb": 0, "summary": "rc=%d" % proc.returncode}))
    print_rows("GGUF header", rows)


def sparse_file(path, apparent):
    """A GGUF header claiming a string array that spans the whole unwritten part, then a duplicate key."""
    def s(text):
        return struct.pack("<Q", len(text)) + text.encode()
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 3) + s("general.architecture") + struct.pack("<I", 8) + s("x")
    head += s("tokenizer.ggml.tokens") + struct.pack("<II", 9, 8)
    count = (apparent - len(head) - 8 - 64) // 8
    with open(path, "wb") as f:
        f.write(head + struct.pack("<Q", count))
        f.seek(len(head) + 8 + count * 8)
        f.write(s("general.architecture") + struct.pack("<I", 8) + s("y"))
    return os.path.getsize(path)


def bench_sparse(trees, args):
    folder = Path(tempfile.mkdtemp(prefix="inspect-speed-sparse-"))
    rows = []
    try:
        sizes = [256 << 20, 1 << 30, args.sparse_gib << 30]
        for name, tree in trees:
            for size in sizes:
                if name != "current" and size > args.baseline_sparse_mib << 20:
                    continue
                path = folder / ("sparse-%d.gguf" % size)
                if not path.exists():
                    sparse_file(path, size)
                rows.append(("read_gguf, sparse %s, %d KB on disk [%s]" % (
                    "%d GiB" % (size >> 30) if size >= 1 << 30 else "%d MiB" % (size >> 20),
                    os.stat(path).st_blocks // 2, name), child(tree, "sparse", path)))
    finally:
        for p in folder.iterdir():
            p.unlink()
        folder.rmdir()
    print_rows("sparse file (header in the first KB)", rows)


def bench_pattern(trees, _args):
    rows = []
    for kind in ("experts", "blocks", "twins", "subset"):
        for n in (1000, 12000, 50000):
            for name, tree in trees:
                rows.append(("%s, %d tensors [%s]" % (kind, n, name), child(tree, "pattern", kind, n)))
    print_rows("offload pattern builder", rows)


def log_file(mib):
    path = CACHE / ("llama-server-lv5-%dmib.log" % mib)
    if path.exists():
        return path
    CACHE.mkdir(parents=True, exist_ok=True)
    load = ["0.00.011.%03d I llama_model_loader: - kv %3d: key.%d u32 = %d" % (i % 1000, i, i, i) for i in range(40)]
    load += ["0.00.012.%03d D tensor blk.%d.ffn_%s_exps.weight (418 MiB q5_0) buffer type overridden to CPU"
             % (b % 1000, b, k) for b in range(52) for k in ("up", "down")]
    load += ["0.00.013.000 I load_tensors: offloaded 53/53 layers to GPU",
             "0.00.013.001 I load_tensors:        CUDA0 model buffer size =  1369.43 MiB",
             "0.00.013.002 I load_tensors:   CPU_Mapped model buffer size = 21772.21 MiB",
             "0.00.014.000 I llama_kv_cache:      CUDA0 KV buffer size =   768.00 MiB",
             "0.00.014.100 I sched_reserve:      CUDA0 compute buffer size =  1078.13 MiB",
             "0.00.015.000 I srv  llama_server: model loaded",
             "0.00.015.100 I srv  llama_server: server is listening on http://127.0.0.1:8080"]
    tokens = ["1.%02d.%03d.%03d D slot update_slots: id  0 | task %d | n_past = %d, n_tokens = 1"
              % (i // 60000 % 100, i // 1000 % 60, i % 1000, i // 64, i) for i in range(20000)]
    run = "\n".join(["0.00.001.000 I cmn  common_param: common_params_print_info: build 1 (7e4c0a9) with GNU 11.4.0"]
                    + load + tokens) + "\n"
    with open(path, "w") as f:
        while f.tell() < mib << 20:
            f.write(run)
    return path


def bench_log(trees, args):
    path = log_file(args.log_mib)
    rows = [("parse_log, %.0f MB at -lv 5 [%s]" % (os.path.getsize(path) / 1e6, name), child(tree, "log", path))
            for name, tree in trees]
    print_rows("llama-server log", rows)


def bench_limit(_trees, args):
    sys.path[:0] = [str(ROOT), str(CURRENT)]
    from tests.integration.test_offload_pattern_llama_server import _shape, run_with_pattern  # noqa: E402
    from tools.gguf_models import write_tiny_qwen3moe  # noqa: E402
    folder = Path(tempfile.mkdtemp(prefix="inspect-speed-limit-"))
    model = write_tiny_qwen3moe(folder / "qwen3moe.gguf", n_blocks=4)
    print("\nlongest -ot pattern llama-server loads with (bisection over bytes, %d KiB to %d KiB)"
          % (args.limit_low_kib, args.limit_high_kib))
    print("%-16s %14s %14s  %s" % ("shape", "loads at B", "fails at B", "how it fails"))
    for kind in ("nested groups", "alternation", "literal", "listed names"):
        low, high, how = args.limit_low_kib << 10, args.limit_high_kib << 10, "did not fail"
        exited, err = run_with_pattern(model, _shape(kind, high), timeout=60)
        if exited is None:
            print("%-16s %14s %14s  %s" % (kind, ">= %d" % high, "-", how))
            continue
        how = "exit %s: %s" % (exited, (err.strip().splitlines() or [""])[-1][:70])
        while high - low > 512:
            mid = (low + high) // 2
            exited, err = run_with_pattern(model, _shape(kind, mid), timeout=60)
            if exited is None:
                low = mid
            else:
                high, how = mid, "exit %s: %s" % (exited, (err.strip().splitlines() or [""])[-1][:70])
        print("%-16s %14d %14d  %s" % (kind, low, high, how))
    for p in folder.iterdir():
        p.unlink()
    folder.rmdir()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--only", default="header,sparse,pattern,log", help="comma-separated benchmarks to run")
    parser.add_argument("--baseline", metavar="REV", help="also measure the module utils of this git revision")
    parser.add_argument("--repeat", type=int, default=5, help="calls of read_model in its child (best is shown)")
    parser.add_argument("--rebuild", action="store_true", help="write the cached model again")
    parser.add_argument("--sparse-gib", type=int, default=64, help="apparent size of the big sparse file")
    parser.add_argument("--baseline-sparse-mib", type=int, default=1024,
                        help="largest sparse file the baseline reads (an earlier reader's time follows the size)")
    parser.add_argument("--log-mib", type=int, default=100, help="size of the generated log")
    parser.add_argument("--limit-low-kib", type=int, default=16, help="limit: a size every shape loads with")
    parser.add_argument("--limit-high-kib", type=int, default=160, help="limit: the largest size tried")
    args = parser.parse_args()
    trees = [("current", CURRENT)]
    if args.baseline:
        trees.insert(0, ("baseline %s" % args.baseline, baseline_tree(args.baseline)))
    benches = {"header": bench_header, "sparse": bench_sparse, "pattern": bench_pattern, "log": bench_log,
               "limit": bench_limit}
    for name in args.only.split(","):
        benches[name](trees, args)


if __name__ == "__main__":
    main()
