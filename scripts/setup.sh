#!/usr/bin/env bash
# One-time (and idempotent) set-up of a fresh Debian 12 machine for this project:
# system packages (requirements/debian.txt), a pinned Python virtual environment in .venv
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
stamp=".venv/.requirements.sha256"
want="$(sha256sum requirements/dev.txt | cut -d' ' -f1)"
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: creating .venv with the pinned tools in requirements/dev.txt"
  "$PY" -m venv .venv
  # (this machine's pip.conf names local mirror folders that may not exist: drop pip's notes about them)
  quiet() { "$@" 2> >(grep -v "^WARNING: Location 'file://.*' is ignored" >&2); }
  quiet .venv/bin/pip install -q --disable-pip-version-check --upgrade pip
  quiet .venv/bin/pip install -q --disable-pip-version-check -r requirements/dev.txt
  echo "$want" > "$stamp"
fi

# The clone is the collection (ansible.cfg: collections_path = ./.collections): the link is tracked by git;
# make it again where a checkout lost it (a copy without symlinks).
link=.collections/ansible_collections/ai_llm/moe_offload
if [ ! -e "$link/galaxy.yml" ]; then
  mkdir -p "$(dirname "$link")" && ln -sfn ../../.. "$link"
fi

# galaxy-importer (Galaxy's checks of a collection tarball) needs a venv of its own: it pins older packages
bash scripts/venv.sh .cache/venvs/galaxy-importer "$PY" -r requirements/galaxy-importer.txt
# ansible-builder and ansible-runner (the execution environment and the AWX job engine) in a venv of their own
bash scripts/venv.sh .cache/venvs/ee "$PY" -r requirements/ee.txt

bash scripts/llama-cpp.sh
bash scripts/docker.sh install
# (read all of ansible's output: `| head -1` would close the pipe early and ansible prints a BrokenPipeError)
ansible_version="$(ansible --version)"
echo "setup: ready (${ansible_version%%$'\n'*}, $(podman --version), docker $(/usr/bin/docker --version | cut -d" " -f3 | tr -d ,) with compose $(docker compose version --short))"
