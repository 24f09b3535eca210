# Sourced by the other scripts: the environment every command of this project runs in.
# shellcheck shell=bash
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export ROOT
# Docker (scripts/docker.sh): Debian's client first on PATH, the compose v2 plugin, this project's own dockerd
export PATH="$ROOT/.venv/bin:$ROOT/.cache/docker/bin:$PATH"
export DOCKER_CONFIG="$ROOT/.cache/docker/config"
export AI_LLM_DOCKER_RUN="${AI_LLM_DOCKER_RUN:-/tmp/ai-llm-docker-$(id -u)}"
export DOCKER_HOST="${DOCKER_HOST:-unix://$AI_LLM_DOCKER_RUN/docker.sock}"
export ANSIBLE_CONFIG="$ROOT/ansible.cfg"
# Podman settings this kind of machine needs (no CAP_SYS_RESOURCE, hybrid cgroups, no bridge).
export CONTAINERS_CONF="$ROOT/scripts/containers.conf"
export PYTHONDONTWRITEBYTECODE=1
# uv (scripts/uv.sh): never download a Python of its own (the Pythons are the machine's), and copy files from its
# cache into an environment instead of linking them (a cache on another filesystem would warn on every install)
export UV_PYTHON_DOWNLOADS=never
export UV_LINK_MODE=copy
