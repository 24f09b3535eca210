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
# verification.json,.rollback/}. Stop it: bash scripts/demo.sh [--engine docker] --down
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
start_sha="$(sha256sum images/ai-llm/start-llama-server | cut -c1-12)"
image="$(AI_LLM_IMAGE="$(bash images/ai-llm/build.sh --print-tag)-start-$start_sha" bash images/ai-llm/build.sh)"
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

if ! serving; then
  echo "demo: nothing serves on 127.0.0.1:$port yet: baseline deploy without offload (what the parity check compares with)"
  ansible-playbook playbooks/deploy.yml -e llm_server_moe_offload_mode=none "$@"
fi

echo "demo: deploy with the routed experts on CPU"
ansible-playbook playbooks/deploy.yml "$@"

python - "$project_dir" "$engine" <<'PY'
import json, os, sys
project = sys.argv[1]
path = os.path.join(project, "verification.json")
if not os.path.exists(path):
    print("demo: no verification yet (check mode?)")
    sys.exit(0)
v = json.load(open(path))
print()
print("=== ai-llm on %s, %s (%s evidence from llama-server's log)" % (v["host"], v["status"], v.get("evidence", "?")))
print("why:      %s" % v["message"])
print("image:    %s" % v["image"])
print("model:    %s" % v["model"])
print("pattern:  --override-tensor '%s=CPU' (from the %s)" % (v["pattern"], v["pattern_source"]))
print("moved to CPU (%d tensors): %s" % (len(v["tensors_moved"]), ", ".join(v["tensors_moved"]) or "none"))
for kind in ("model", "kv", "rs", "compute"):
    bufs = v["buffers"].get(kind) or {}
    print("%-16s %s" % (kind + " buffers:", ", ".join("%s %.2f MiB" % (k, m) for k, m in bufs.items()) or "-"))
ol = v.get("offloaded_layers")
if ol:
    print("offloaded layers: %s/%s" % (ol["offloaded"], ol["total"]))
print("VRAM:     %s" % (v["vram"] or "not measured (no GPU)"))
print("parity:   %s" % v["parity"])
speed = v.get("speed")
if speed:
    before = speed.get("previous") or {}
    for kind in ("decode", "prompt"):
        was = before.get(kind + "_tokens_per_second")
        print("%-9s %.1f tokens/s%s (median of %d /completion runs)" % (
            kind + ":", speed[kind + "_tokens_per_second"], " (before %.1f)" % was if was else "", speed["runs"]))
else:
    print("speed:    not measured")
print("config:   %s" % v["config_hash"])
print("files:    %s" % ", ".join("%s=%s" % kv for kv in v["files"].items()))
print("stop it:  bash scripts/demo.sh %s--down" % ("" if sys.argv[2] == "podman" else "--engine %s " % sys.argv[2]))
PY
