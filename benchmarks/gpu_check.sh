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
#   bash benchmarks/gpu_check.sh device [ARGS]     on a lent GPU machine, with the carry of benchmarks/cuda_build.sh
#                                                  (.cache/gpu-check/llama-server-cuda<ARCH>.tar.xz): unpack it,
#                                                  find the machine's CUDA 13 runtime and cuBLAS, check with ldd that
#                                                  every library resolves, then one measure of at most five minutes
# Without nvidia-smi (the CPU path, as the tests run it) build links the CPU build and measure runs on the CPU.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
cd "$ROOT"
state="${GPU_CHECK_STATE:-$ROOT/.cache/gpu-check}"   # (GPU_CHECK_STATE: another folder for the builds and the carry)
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
  device)
    shift
    carries=("$state"/llama-server-cuda*.tar.xz)
    carry="${carries[0]}"
    [ -f "$carry" ] || { echo "gpu_check: no $state/llama-server-cuda*.tar.xz: bash benchmarks/cuda_build.sh makes it" >&2; exit 1; }
    rm -rf "$state/device" && mkdir -p "$state/device"
    tar -C "$state/device" -xJf "$carry"
    bin="$(dirname "$(ls "$state"/device/*/llama-server)")"
    # the CUDA 13 runtime and cuBLAS the carry leaves out: the machine's own (its PyTorch's wheels, or a toolkit)
    for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
      found="$(find / -xdev -name "$lib" -not -path "$bin/*" 2>/dev/null | head -1)"
      [ -z "$found" ] || LD_LIBRARY_PATH="$(dirname "$found")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    done
    export LD_LIBRARY_PATH
    missing="$(ldd "$bin/llama-server" "$bin"/libggml-cuda.so 2>&1 | grep "not found" | sort -u || true)"
    if [ -n "$missing" ]; then
      echo "gpu_check: libraries not found (LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}):" >&2; echo "$missing" >&2; exit 1
    fi
    ldd "$bin/libggml-cuda.so" | grep -E "cudart|cublas|libcuda"
    exec timeout 300 python benchmarks/gpu_check.py --llama-server "$bin/llama-server" "$@" ;;
  *)
    echo "usage: bash benchmarks/gpu_check.sh build | measure [gpu_check.py's arguments] | device [...]" >&2
    exit 2 ;;
esac
