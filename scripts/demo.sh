#!/usr/bin/env bash
# The main job, on this machine: set-up, a small generated nemotron_h_moe model, the local CPU image,
# then playbooks/deploy.yml on the local default inventory (inventory/local), and the proof.
#   bash scripts/demo.sh [--engine podman|docker] [extra ansible-playbook arguments, e.g. --check --diff or -e llm_server_ctx_size=4096]
# --engine docker: the same demo with docker and compose v2 (scripts/docker.sh starts a dockerd, which --down
# stops; the local image moved with `podman save | docker load`); podman (podman-compose) is the default.
# First run: a baseline deploy without offload (all weights where -ngl puts them), then the deploy with the
# routed experts on CPU, whose 16 greedy tokens must equal the baseline's (parity). Later runs: one deploy,
# which changes and restarts nothing when nothing changed.
# Files: demo/ (git-ignored): demo/models/demo.gguf, demo/ai-llm/{.env,docker-compose.prod.yml,
# verification.json,.rollback/}, demo/rollout-report/ (the run's report). Stop it: bash scripts/demo.sh [--engine docker] --down
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
export ANSIBLE_DISPLAY_SKIPPED_HOSTS="${ANSIBLE_DISPLAY_SKIPPED_HOSTS:-false}"

project_dir="$ROOT/demo/ai-llm"
model="$ROOT/demo/models/demo.gguf"
engine=podman
if [ "${1:-}" = "--engine" ]; then
  engine="${2:?--engine needs podman or docker}"
  shift 2
fi
case "$engine" in
  podman) compose_command=(podman-compose) ;;
  docker) compose_command=(docker compose) ;;
  *) echo "demo: --engine is podman or docker, not $engine" >&2; exit 2 ;;
esac
compose=("${compose_command[@]}" -p ai-llm-demo -f "$project_dir/docker-compose.prod.yml")

if [ "${1:-}" = "--down" ]; then
  if [ -f "$project_dir/docker-compose.prod.yml" ]; then
    if [ "$engine" = podman ] || bash scripts/docker.sh status; then "${compose[@]}" down; fi
  fi
  # the dockerd the demo started, if it did
  [ "$engine" = podman ] || bash scripts/docker.sh stop demo
  exit 0
fi

# the demo's set-up (podman, llama.cpp, .venv; docker with --engine docker), not what only the tests need
if [ "$engine" = docker ]; then
  bash scripts/setup.sh --docker
  bash scripts/docker.sh start demo
  set -- -e "{\"llm_server_compose_command\": [\"docker\", \"compose\"]}" "$@"
else
  bash scripts/setup.sh
fi

if [ ! -f "$model" ]; then
  mkdir -p "$(dirname "$model")"
  echo "demo: writing the demo model (tiny nemotron_h_moe, random weights) to $model"
  python tools/gguf_models.py demo "$model" >/dev/null
fi

# The image with this checkout's start command (its sha256 in the tag), tagged localhost/ai-llm:demo for the
# inventory (inventory/local).
image="$(bash images/ai-llm/build.sh --checkout)"
podman tag "$image" localhost/ai-llm:demo
if [ "$engine" = docker ] && ! docker image inspect "$image" >/dev/null 2>&1; then
  podman save "$image" | docker load -q
fi
[ "$engine" = docker ] && docker tag "$image" localhost/ai-llm:demo
echo "demo: image $image (localhost/ai-llm:demo)"

# AI_LLM_DEMO_PORT: another port than the inventory's, for a second demo on the same machine
if [ -n "${AI_LLM_DEMO_PORT:-}" ]; then
  port="$AI_LLM_DEMO_PORT"
  set -- -e "llm_server_port=$port" "$@"
else
  port="$(ansible-inventory --host localhost | python -c 'import json,sys; print(json.load(sys.stdin)["llm_server_port"])')"
fi
serving() {
  python - "$port" <<'PY'
import sys, urllib.request
try:
    sys.exit(0 if urllib.request.urlopen("http://127.0.0.1:%s/health" % sys.argv[1], timeout=3).status == 200 else 1)
except Exception:
    sys.exit(1)
PY
}

# The rollout report of each run (the callback ai_llm.moe_offload.rollout_report) in demo/rollout-report/: the
# block at the end is read from the last run's.
report_dir="$ROOT/demo/rollout-report"
set -- -e "llm_rollout_report_dir=$report_dir" "$@"

if ! serving; then
  echo "demo: nothing serves on 127.0.0.1:$port yet: baseline deploy without offload (what the parity check compares with)"
  ansible-playbook playbooks/deploy.yml -e llm_server_moe_offload_mode=none "$@"
fi

echo "demo: deploy with the routed experts on CPU"
rm -f "$report_dir/rollout.json"   # (a run that writes no report must not show the baseline's)
ansible-playbook playbooks/deploy.yml "$@"

# What this run did and the proof of what serves, from this run's report (verification.json would show the last
# run that changed something, also after a run that changed nothing)
python tools/demo_proof.py "$report_dir" --engine "$engine"
