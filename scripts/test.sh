#!/usr/bin/env bash
# Every test of the project, on a fresh machine: set-up, lint, ansible-test sanity, pytest
# (unit + integration: real GGUF files, real llama-server, real podman), molecule scenarios.
# Usage: bash scripts/test.sh [stage ...]   stages: lint sanity pytest molecule (default: all)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
bash scripts/setup.sh

stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(lint sanity pytest molecule)
declare -A took
status=0
for stage in "${stages[@]}"; do
  start=$(date +%s)
  echo "=== test stage: $stage"
  case "$stage" in
    lint)
      ansible-lint --offline --profile production || status=1 ;;
    sanity)
      bash scripts/sanity.sh || status=1 ;;
    pytest)
      python -m pytest -q -p no:cacheprovider tests/unit tests/integration || status=1 ;;
    molecule)
      if compgen -G "extensions/molecule/*/molecule.yml" >/dev/null; then
        # from the collection root: molecule sees galaxy.yml, takes the scenarios from extensions/molecule/
        # and builds + installs the collection (galaxy.yml build_ignore) before each scenario
        molecule test --all || status=1
      else
        echo "no molecule scenarios yet"
      fi ;;
    *) echo "unknown stage: $stage" >&2; exit 2 ;;
  esac
  took[$stage]=$(( $(date +%s) - start ))
done
for stage in "${stages[@]}"; do echo "stage $stage: ${took[$stage]}s"; done
exit $status
