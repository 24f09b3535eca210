"""Write GGUF model files with gguf-py (llama.cpp's own GGUFWriter) for tests, benchmarks and the demo.

The one place where this project makes model files. Every writer takes the output path (a directory
for split models) and keyword options, writes the file(s) and returns the path (a list for splits).
Everything is deterministic (seeded numpy RNG, generated vocabularies).

Loadable models (random weights; llama-server really loads them and answers ``/completion``):

- ``write_tiny_nemotron_h_moe(path, ...)``: ``nemotron_h_moe``, 5 blocks ``MEM*E``.
- ``write_demo_model(path)``: the same architecture, expert tensors >= 1 MiB each.
- ``write_tiny_qwen3moe(path, ...)``: ``qwen3moe``, attention + routed gate/up/down experts.

Sparse full-size header (metadata and tensor infos real, data region a hole):

- ``write_nemotron_nano_30b(outdir, ...)``: Nemotron-3-Nano-30B-A3B Q4_K_M in 6 shards, ~24.5 GB apparent.

Small header-only models for classification tests (real tensor naming of each architecture):

- ``write_nemotron_h``, ``write_qwen2moe``, ``write_mixtral``, ``write_deepseek2``, ``write_gpt_oss``,
  ``write_fused_gate_up``, ``write_chexps``, ``write_unknown_moe``, ``write_dense_llama``.

``write_model(kind, path, **kw)`` dispatches by name through ``ARCH_WRITERS``.
CLI: ``python tools/gguf_models.py KIND OUT [--big-endian]`` (``nemotron-nano`` takes an output directory).

The writers live by family: ``gguf_nemotron`` (the Nemotron-H models), ``gguf_transformers`` (the attention-based
ones); beneath them ``gguf_writer`` (tensors, their types and sizes, ``write_tensors``) and ``gguf_vocab`` (the
generated vocabularies).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script (python tools/gguf_models.py): the package tools is at the root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.gguf_nemotron import (  # noqa: E402  pylint: disable=wrong-import-position
    write_demo_model,
    write_nemotron_h,
    write_nemotron_nano_30b,
    write_tiny_nemotron_h_moe,
)
from tools.gguf_transformers import (  # noqa: E402  pylint: disable=wrong-import-position
    write_chexps,
    write_deepseek2,
    write_dense_llama,
    write_fused_gate_up,
    write_gpt_oss,
    write_mixtral,
    write_qwen2moe,
    write_tiny_qwen3moe,
    write_unknown_moe,
)

ARCH_WRITERS: dict = {
    "nemotron_h_moe": write_tiny_nemotron_h_moe,
    "demo": write_demo_model,
    "qwen3moe": write_tiny_qwen3moe,
    "nemotron-nano": write_nemotron_nano_30b,
    "nemotron_h": write_nemotron_h,
    "qwen2moe": write_qwen2moe,
    "mixtral": write_mixtral,
    "deepseek2": write_deepseek2,
    "gpt-oss": write_gpt_oss,
    "fused_gate_up": write_fused_gate_up,
    "chexps": write_chexps,
    "unknown_moe": write_unknown_moe,
    "dense_llama": write_dense_llama,
}


def write_model(kind: str, path, **kw):
    """Write the model ``kind`` (a key of ``ARCH_WRITERS``) to ``path``; returns what the writer returns."""
    try:
        writer = ARCH_WRITERS[kind]
    except KeyError:
        raise ValueError("unknown model kind %r (known: %s)" % (kind, ", ".join(sorted(ARCH_WRITERS)))) from None
    return writer(path, **kw)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("kind", choices=sorted(ARCH_WRITERS))
    parser.add_argument("out", help="output file (output directory for nemotron-nano)")
    parser.add_argument("--big-endian", action="store_true")
    args = parser.parse_args(argv)
    kw = {"endian": "big"} if args.big_endian else {}
    result = write_model(args.kind, args.out, **kw)
    for p in result if isinstance(result, list) else [result]:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
