#!/usr/bin/env bash
# Builds the local CPU image localhost/ai-llm:cpu-<llama build> FROM scratch, without any registry:
# a static busybox, the llama-server that scripts/llama-cpp.sh built (.venv/bin/llama-server) with every
# shared library ldd lists for it and the ggml backend libraries it loads at start (libggml-cpu*.so:
# the CPU backend for the CPU it runs on, libggml-rpc.so), llama.cpp's licence texts, and
# images/ai-llm/start-llama-server as the ENTRYPOINT.
#
#   bash images/ai-llm/build.sh            build when the tag is missing or holds another llama-server build,
#                                          print the tag
#   bash images/ai-llm/build.sh --force    rebuild (after editing start-llama-server)
#   bash images/ai-llm/build.sh --print-tag
#   --checkout (with any of the above): the tag ends in -start-<first 12 hex digits of the sha256 of this
#   checkout's start-llama-server>, so that an image built from another version of it (another checkout on the
#   same machine) is never taken for this one: the image of the demo, the tests and the molecule scenarios
# Environment: AI_LLM_IMAGE (default localhost/ai-llm:cpu-b<build>), CONTAINER_ENGINE (podman|docker).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../../scripts/env.sh"
cd "$ROOT"

engine="${CONTAINER_ENGINE:-podman}"
if ! command -v llama-server >/dev/null; then
  echo "build.sh: llama-server is not on PATH: bash scripts/setup.sh" >&2
  exit 1
fi
bin="$(readlink -f "$(command -v llama-server)")"
bindir="$(dirname "$bin")"
# "version: 0.1.0-dev (build <N>, commit <hash>)" -> b<N>
llama_build="b$("$bin" --version 2>&1 | sed -n 's/^version: .*(build \([0-9]*\),.*/\1/p')"
[ "$llama_build" != "b" ] || { echo "build.sh: cannot read the build of $bin" >&2; exit 1; }
# The build the collection models (plugins/module_utils/_llama_build.py, BUILD): an image of another build would run
# a server whose memory and log formats the planner and the proof were not written for.
modelled="b$(sed -n 's/^BUILD = \([0-9][0-9]*\).*/\1/p' "$ROOT/plugins/module_utils/_llama_build.py")"
[ "$llama_build" = "$modelled" ] || {
  echo "build.sh: $bin is llama.cpp $llama_build, the collection models $modelled: bash scripts/setup.sh" >&2; exit 1; }
tag="${AI_LLM_IMAGE:-localhost/ai-llm:cpu-${llama_build}}"
# The build directory's name (scripts/llama-cpp.sh: build, CPU variants, hash of the flags) tells builds apart.
binary_id="$(basename "$bindir")"

force=0 print_tag=0
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    --print-tag) print_tag=1 ;;
    --checkout) tag="$tag-start-$(sha256sum "$HERE/start-llama-server" | cut -c1-12)" ;;
    *) echo "usage: $0 [--force|--print-tag] [--checkout]" >&2; exit 64 ;;
  esac
done
if [ "$print_tag" = 1 ]; then echo "$tag"; exit 0; fi

mkdir -p "$ROOT/build"
exec 8>"$ROOT/build/.ai-llm-image.lock"
flock 8     # one build at a time in this checkout (tests running in parallel share the stage folder below)

if [ "$force" = 0 ] && [ "$("$engine" image inspect --format '{{ index .Labels "ai_llm.llama_server" }}' "$tag" \
                             2>/dev/null)" = "$binary_id" ]; then
  echo "$tag"
  exit 0
fi

busybox=/bin/busybox     # Debian's busybox-static (scripts/setup.sh installs it)
if [ ! -x "$busybox" ] || ldd "$busybox" >/dev/null 2>&1; then
  echo "build.sh: $busybox is missing or not static: apt-get install busybox-static" >&2
  exit 1
fi

stage="$ROOT/build/ai-llm-image"
rm -rf "$stage"
mkdir -p "$stage/rootfs/bin" "$stage/rootfs/opt/llama/bin" "$stage/rootfs/tmp" "$stage/rootfs/etc" \
         "$stage/rootfs/usr/local/bin" "$stage/rootfs/models"
chmod 1777 "$stage/rootfs/tmp"
cp "$busybox" "$stage/rootfs/bin/busybox"
for applet in sh cat ls env ps sleep wget; do ln -s busybox "$stage/rootfs/bin/$applet"; done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' > "$stage/rootfs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$stage/rootfs/etc/group"

cp -L "$bin" "$stage/rootfs/opt/llama/bin/llama-server"
# ldd lists the whole closure: llama.cpp's own libraries go next to the binary (RUNPATH $ORIGIN),
# system libraries and the loader to the path ldd resolved them to.
ldd "$bin" | while read -r a b c _; do
  if [ "$b" = "=>" ] && [ -n "$c" ] && [ -e "$c" ]; then src="$c"; name="$a"
  elif [ "${a#/}" != "$a" ]; then src="$a"; name=""        # the loader line: /lib64/ld-linux-x86-64.so.2
  else continue; fi
  if [ "$(cd "$(dirname "$src")" && pwd -P)" = "$(cd "$bindir" && pwd -P)" ]; then
    cp -L "$src" "$stage/rootfs/opt/llama/bin/$name"
  else
    mkdir -p "$stage/rootfs$(dirname "$src")"
    cp -L "$src" "$stage/rootfs$src"
  fi
done
# The ggml backends are only dlopen'ed (from the binary's directory), so ldd does not list them: copy every
# one, with what they link to beyond the binary's closure (libgomp for the CPU backend).
for lib in "$bindir"/libggml-*.so*; do
  [ -e "$stage/rootfs/opt/llama/bin/$(basename "$lib")" ] || cp -L "$lib" "$stage/rootfs/opt/llama/bin/"
  ldd "$lib" | while read -r a b c _; do
    if [ "$b" = "=>" ] && [ -e "$c" ] && [ "$(cd "$(dirname "$c")" && pwd -P)" != "$(cd "$bindir" && pwd -P)" ] \
       && [ ! -e "$stage/rootfs$c" ]; then
      mkdir -p "$stage/rootfs$(dirname "$c")"
      cp -L "$c" "$stage/rootfs$c"
    fi
  done
done
mkdir -p "$stage/rootfs/opt/llama/share"
cp -r "$bindir/LICENSE" "$bindir/licenses" "$stage/rootfs/opt/llama/share/"

tar -C "$stage/rootfs" --owner=0 --group=0 --numeric-owner -cf "$stage/rootfs.tar" .
cp "$HERE/Dockerfile" "$HERE/start-llama-server" "$stage/"
"$engine" build -q --build-arg "LLAMA_BUILD=$llama_build" --build-arg "LLAMA_SERVER_ID=$binary_id" -t "$tag" -f "$stage/Dockerfile" "$stage" >/dev/null
rm -rf "$stage/rootfs"
echo "$tag"
