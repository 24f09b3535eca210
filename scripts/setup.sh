#!/usr/bin/env bash
# One-time (and idempotent) set-up of a fresh Debian 12 machine for this project:
# system packages (requirements/debian.txt), a Python virtual environment in .venv installed from its lock
# (requirements/dev.txt), llama.cpp's llama-server and ggml-rpc-server (scripts/llama-cpp.sh: built once, then
# cached in ~/.cache/ai-llm-moe-offload/llama.cpp/) and the collection link .collections/ansible_collections/ai_llm/moe_offload -> ../../..
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"

# requirements/debian.txt: one package a line, '#' starts a comment
mapfile -t APT_PACKAGES < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' requirements/debian.txt | tr -d ' \t')
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

# galaxy-importer (Galaxy's checks of a collection tarball) needs a venv of its own: it pins older packages
bash scripts/venv.sh .cache/venvs/galaxy-importer "$PY" requirements/galaxy-importer.txt
# ansible-builder and ansible-runner (the execution environment and the AWX job engine) in a venv of their own
bash scripts/venv.sh .cache/venvs/ee "$PY" requirements/ee.txt

bash scripts/llama-cpp.sh
bash scripts/docker.sh install
# (read all of ansible's output: `| head -1` would close the pipe early and ansible prints a BrokenPipeError)
ansible_version="$(ansible --version)"
echo "setup: ready (${ansible_version%%$'\n'*}, $(podman --version), docker $(/usr/bin/docker --version | cut -d" " -f3 | tr -d ,) with compose $(docker compose version --short))"
