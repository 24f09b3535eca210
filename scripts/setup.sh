#!/usr/bin/env bash
# One-time (and idempotent) set-up of a fresh Debian 12 machine for this project, by profile:
#   bash scripts/setup.sh            the demo and a deploy from this machine: the system packages of profile demo in
#                                    requirements/debian.txt, a Python virtual environment in .venv installed from its
#                                    lock (requirements/dev.txt), llama.cpp's llama-server and ggml-rpc-server
#                                    (scripts/llama-cpp.sh: built once, then cached in ~/.cache/ai-llm-moe-offload/llama.cpp/)
#                                    and the collection link .collections/ansible_collections/ai_llm/moe_offload -> ../../..
#   bash scripts/setup.sh --docker   and docker: the packages of profile docker, compose v2 as docker's CLI plugin
#                                    (scripts/docker.sh install); scripts/demo.sh --engine docker runs this
#   bash scripts/setup.sh --tests    everything the tests need (docker included): the packages of profile tests and
#                                    the venvs of galaxy-importer and of the execution environment's tools;
#                                    scripts/test.sh runs this
#   --list (with the others)         print the packages and environments of the profile; install nothing
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"

docker=0 tests=0 list=0
for arg in "$@"; do
  case "$arg" in
    --docker) docker=1 ;;
    --tests) tests=1 docker=1 ;;
    --list) list=1 ;;
    *) echo "setup: unknown option $arg (--docker, --tests, --list)" >&2; exit 2 ;;
  esac
done
profiles=demo
[ "$docker" -eq 0 ] || profiles+=" docker"
[ "$tests" -eq 0 ] || profiles+=" tests"
# the environments besides .venv, each "DIR LOCK": galaxy-importer (Galaxy's checks of a collection tarball) pins
# older packages than .venv's; ansible-builder and ansible-runner (the execution environment and the AWX job engine)
# in a venv of their own
tool_venvs=()
[ "$tests" -eq 0 ] || tool_venvs+=(".cache/venvs/galaxy-importer requirements/galaxy-importer.txt"
                                   ".cache/venvs/ee requirements/ee.txt")

# requirements/debian.txt: one package a line, then '#' and its profile ("demo:"); a line without a package is a
# comment. A package line without a known profile stops the set-up.
packages=$(awk -v want=" $profiles " '
  { split($0, part, "#"); n = split(part[1], words, " ") }
  n == 0 { next }
  { profile = part[2]; sub(/^[ \t]+/, "", profile); sub(/:.*/, "", profile) }
  n != 1 || profile !~ /^(demo|docker|tests)$/ {
    printf "setup: requirements/debian.txt line %d: want \"PACKAGE  # PROFILE: why\" (demo, docker or tests), got: %s\n",
      NR, $0 > "/dev/stderr"; exit 1 }
  index(want, " " profile " ") { print words[1] }' requirements/debian.txt)
mapfile -t APT_PACKAGES <<<"$packages"
if [ "$list" -eq 1 ]; then
  echo "debian: ${APT_PACKAGES[*]}"
  echo "venv: .venv requirements/dev.txt"
  for venv in "${tool_venvs[@]}"; do echo "venv: $venv"; done
  echo "llama.cpp: scripts/llama-cpp.sh"
  [ "$docker" -eq 0 ] || echo "docker: scripts/docker.sh install"
  exit 0
fi
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing system packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY="${PYTHON:-python3}"
# .venv and the tools' own venvs, each installed from its lock (scripts/lock.sh writes them; scripts/venv.sh makes an
# environment again when its lock changes)
bash scripts/venv.sh .venv "$PY" requirements/dev.txt

# The clone is the collection (ansible.cfg: collections_path = ./.collections): the link is tracked by git;
# make it again where a checkout lost it (a copy without symlinks).
link=.collections/ansible_collections/ai_llm/moe_offload
if [ ! -e "$link/galaxy.yml" ]; then
  mkdir -p "$(dirname "$link")" && ln -sfn ../../.. "$link"
fi

for venv in "${tool_venvs[@]}"; do
  read -r dir lock <<<"$venv"
  bash scripts/venv.sh "$dir" "$PY" "$lock"
done

bash scripts/llama-cpp.sh
engines="$(podman --version)"
if [ "$docker" -eq 1 ]; then
  bash scripts/docker.sh install
  engines+=", docker $(/usr/bin/docker --version | cut -d" " -f3 | tr -d ,) with compose $(docker compose version --short)"
fi
# (read all of ansible's output: `| head -1` would close the pipe early and ansible prints a BrokenPipeError)
ansible_version="$(ansible --version)"
profile="the demo and deploys"
[ "$docker" -eq 0 ] || profile+=", docker"
[ "$tests" -eq 0 ] || profile+=", the tests"
echo "setup: ready for $profile (${ansible_version%%$'\n'*}, $engines)"
