#!/usr/bin/env bash
# The check on a real NVIDIA GPU, in two short runs on a machine that stays up between them (each well under ten
# minutes): the planner's MiB against nvidia-smi's, its predicted tokens/s against the measured ones, and the plan's
# placement against llama.cpp's own --fit on.
#   bash benchmarks/gpu_check.sh build             llama-server with CUDA for this machine's GPU only (its compute
#                                                  capability from nvidia-smi), from the same llama.cpp sources as
#                                                  scripts/llama-cpp.sh (LLAMA_CPP_CUDA_ARCH); needs nvcc
#   bash benchmarks/gpu_check.sh measure [ARGS]    benchmarks/gpu_check.py with that build: a generated MoE model of
#                                                  a few GiB loaded with no offload, with the plan's placement, with
#                                                  --fit on, and with the first or the last blocks' experts in host
#                                                  memory; nvidia-smi's memory, the logs, the plan and the speeds in
#                                                  gpu-check/ (ARGS: gpu_check.py's, e.g. --model-mib 6144)
# Without nvidia-smi (the CPU path, as the tests run it) build links the CPU build and measure runs on the CPU.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
cd "$ROOT"
state="$ROOT/.cache/gpu-check"
mkdir -p "$state"

case "${1:-}" in
  build)
    bash scripts/setup.sh
    if command -v nvidia-smi >/dev/null; then
      cap="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')"
      command -v nvcc >/dev/null || export PATH="$PATH:/usr/local/cuda/bin"
      command -v nvcc >/dev/null || { echo "gpu_check: nvcc (the CUDA toolkit) is needed to build for the GPU" >&2; exit 1; }
      echo "gpu_check: building llama-server with CUDA for compute capability $cap"
      dest="$(LLAMA_CPP_CUDA_ARCH="$cap" bash scripts/llama-cpp.sh | tail -1)"
    else
      echo "gpu_check: no nvidia-smi: the CPU build (the CPU path)"
      dest="$(dirname "$(readlink -f .venv/bin/llama-server)")"
    fi
    "$dest/llama-server" --version 2>&1 | grep "^version:" || true
    echo "$dest" > "$state/build"
    echo "gpu_check: built: $dest/llama-server" ;;
  measure)
    shift
    [ -s "$state/build" ] || { echo "gpu_check: run 'bash benchmarks/gpu_check.sh build' first" >&2; exit 1; }
    exec python benchmarks/gpu_check.py --llama-server "$(cat "$state/build")/llama-server" "$@" ;;
  *)
    echo "usage: bash benchmarks/gpu_check.sh build | measure [gpu_check.py's arguments]" >&2
    exit 2 ;;
esac
