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

A model llama-server refuses to load although its header reads:

- ``write_wrong_shape(model, path)``: a copy whose ``embedding_length`` disagrees with its tensors.

``write_model(kind, path, **kw)`` dispatches by name through ``ARCH_WRITERS``.
CLI: ``python tools/gguf_models.py KIND OUT [--big-endian] [--set NAME=INT ...] [--wrong-shape]``
(``nemotron-nano`` takes an output directory; ``--set`` passes an integer option to the writer, such as
``--set shards=1``; ``--wrong-shape`` makes what was written a model llama-server cannot load).

The writers live by family: ``gguf_nemotron`` (the Nemotron-H models), ``gguf_transformers`` (the attention-based
ones); beneath them ``gguf_writer`` (tensors, their types and sizes, ``write_tensors``) and ``gguf_vocab`` (the
generated vocabularies).
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import gguf

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


def write_wrong_shape(model, path):
    """``model`` (the demo model) with every byte in place but ``embedding_length`` 128 where its tensors have
    another width: the header reads fine and llama-server refuses to load it (``check_tensor_dims``). ``path``
    may be ``model`` itself. Returns ``path``."""
    if Path(path).resolve() != Path(model).resolve():
        shutil.copyfile(model, path)
    reader = gguf.GGUFReader(str(path), "r+")
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    field = reader.fields[arch + ".embedding_length"]
    field.parts[field.data[0]][0] = 128
    reader.data.flush()
    del reader
    return Path(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("kind", choices=sorted(ARCH_WRITERS))
    parser.add_argument("out", help="output file (output directory for nemotron-nano)")
    parser.add_argument("--big-endian", action="store_true")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=INT",
                        help="an integer option of the writer (e.g. shards=1, vocab_size=1024)")
    parser.add_argument("--wrong-shape", action="store_true",
                        help="then set embedding_length to 128: the header reads, llama-server refuses the model")
    args = parser.parse_args(argv)
    kw = {"endian": "big"} if args.big_endian else {}
    for option in args.set:
        name, _sep, value = option.partition("=")
        kw[name] = int(value)
    result = write_model(args.kind, args.out, **kw)
    for p in result if isinstance(result, list) else [result]:
        if args.wrong_shape:
            write_wrong_shape(p, p)
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
