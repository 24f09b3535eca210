# Sourced by the other scripts: the environment every command of this project runs in.
# shellcheck shell=bash
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export ROOT
export PATH="$ROOT/.venv/bin:$PATH"
export ANSIBLE_CONFIG="$ROOT/ansible.cfg"
# Podman settings this kind of machine needs (no CAP_SYS_RESOURCE, hybrid cgroups, no bridge).
export CONTAINERS_CONF="$ROOT/scripts/containers.conf"
export PYTHONDONTWRITEBYTECODE=1
