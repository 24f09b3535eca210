"""The block ``scripts/demo.sh`` ends with: what this run did on the demo host, and the proof of what it serves.

Read from this run's rollout report (``rollout.json`` in the report directory, which the callback
``ai_llm.moe_offload.rollout_report`` writes at the end of every run of ``playbooks/deploy.yml``), never from
``verification.json``: that file holds the last run that recreated, verified or rolled back ai-llm, so after a run
that changed nothing it still says ``changed`` and why. The header's status and the ``why:`` line are the host's
row of this run (``unchanged`` when nothing changed, ``checked`` in check mode); the proof lines come from the
``llm_server_result`` the role published in this run, which carries the last verification's proof when nothing
changed.

    python tools/demo_proof.py REPORT_DIR [--engine podman|docker]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _buffers(kind, buffers):
    return "%-16s %s" % (kind + " buffers:", ", ".join("%s %.2f MiB" % (k, m) for k, m in buffers.items()) or "-")


def proof_lines(result):
    """The proof of what runs, from an ``llm_server_result``: image, model, pattern, tensors in host memory, the
    buffers, the layers, VRAM, parity, speed, the configuration and the files."""
    lines = ["image:    %s" % result.get("image"), "model:    %s" % result.get("model")]
    if result.get("pattern"):
        lines.append("pattern:  --override-tensor '%s=CPU' (from the %s)" % (result["pattern"], result.get("pattern_source")))
    else:
        lines.append("pattern:  none (every tensor where -ngl puts it)")
    moved = result.get("tensors_moved") or []
    lines.append("moved to CPU (%d tensors): %s" % (len(moved), ", ".join(moved) or "none"))
    buffers = result.get("buffers") or {}
    lines += [_buffers(kind, buffers.get(kind) or {}) for kind in ("model", "kv", "rs", "compute")]
    layers = result.get("offloaded_layers")
    if layers:
        lines.append("offloaded layers: %s/%s" % (layers["offloaded"], layers["total"]))
    lines.append("VRAM:     %s" % (result.get("vram") or "not measured (no GPU)"))
    lines.append("parity:   %s" % result.get("parity"))
    speed = result.get("speed")
    if speed and speed.get("decode_tokens_per_second") is not None:
        before = speed.get("previous") or {}
        for kind in ("decode", "prompt"):
            was = before.get(kind + "_tokens_per_second")
            lines.append("%-9s %.1f tokens/s%s (median of %d /completion runs)" % (
                kind + ":", speed[kind + "_tokens_per_second"], " (before %.1f)" % was if was else "", speed["runs"]))
    else:
        lines.append("speed:    not measured")
    lines.append("config:   %s" % result.get("config_hash"))
    lines.append("files:    %s" % ", ".join("%s=%s" % kv for kv in (result.get("files") or {}).items()))
    return lines


# the statuses whose host serves what its result describes: the proof is printed for them
SERVING = ("changed", "unchanged", "checked")


def block(row, engine="podman"):
    """The demo's closing block for one host's row of ``rollout.json``: the header with this run's status, why,
    the proof when the host serves what the role's result describes, and how to stop the demo."""
    result = row.get("result") or {}
    serving = row["status"] in SERVING and bool(result)
    evidence = " (%s evidence from llama-server's log)" % result["evidence"] if serving and result.get("evidence") else ""
    lines = ["=== ai-llm on %s, %s%s" % (row["host"], row["status"], evidence), "why:      %s" % row["message"]]
    if serving:
        lines += proof_lines(result)
    lines.append("stop it:  bash scripts/demo.sh %s--down" % ("" if engine == "podman" else "--engine %s " % engine))
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("report_dir", type=Path)
    parser.add_argument("--engine", default="podman", choices=("podman", "docker"))
    args = parser.parse_args(argv)
    path = args.report_dir / "rollout.json"
    if not path.exists():
        print("demo: no report of this run in %s (llm_rollout_report_dir sent it elsewhere?)" % args.report_dir)
        return 0
    for row in json.loads(path.read_text(encoding="utf-8"))["hosts"]:
        print()
        print("\n".join(block(row, args.engine)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
