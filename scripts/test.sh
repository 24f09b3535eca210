#!/usr/bin/env bash
# Every test of the project, on a fresh machine: set-up, lint, ansible-test sanity, the supported ansible-core
# releases and Pythons (compat), pytest (unit + integration: real GGUF files, real llama-server, real podman,
# the role's scenarios on a local host and on a fleet of fake hosts, the collection tarball), the mutation score
# of the changed utils.
# Usage: bash scripts/test.sh [stage ...]
#   stages: lint sanity compat pytest mutation-fast (default: all of these)
#   mutation: the mutation score of every util (benchmarks/mutation.py; long, so on demand only)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
bash scripts/setup.sh

stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(lint sanity compat pytest mutation-fast)
declare -A took
status=0
results="$ROOT/.cache/test-results"
rm -rf "$results" && mkdir -p "$results"
# run_stage STAGE: one stage in the foreground; its exit status is the stage's
run_stage() {
  local stage="$1" rc=0
  case "$stage" in
    lint)
      ansible-lint --offline --profile production || rc=1 ;;
    sanity)
      bash scripts/sanity.sh || rc=1 ;;
    compat)
      # requirements/compat.txt: each ansible-core release in its own venv under .cache/compat
      python scripts/compat.py 2>&1 | tee "$results/compat.log" || rc=1 ;;
    pytest)
      # three workers (pytest-xdist), each test file on one worker in order (a module's fixtures, such as the test
      # fleet, are made once): the integration tests mostly wait on servers, containers and ssh. The longest files
      # start first, in the order given (--no-loadscope-reorder: xdist's own order is by number of tests, which
      # would start the fleet, 13 tests and the longest file, near the end and make it the stage's tail); the
      # many short files then fill the workers around them. --durations names the slowest tests.
      # (files, not the folder: pytest collects a folder's files in its own order, the named ones with them)
      longest=(tests/integration/test_fleet_rollout.py tests/integration/test_collection_tarball.py
               tests/integration/test_role_scenarios.py tests/integration/test_role_hostile.py
               tests/integration/test_role_converge.py)
      files=("${longest[@]}")
      for f in tests/integration/test_*.py; do
        [[ " ${longest[*]} " == *" $f "* ]] || files+=("$f")
      done
      python -m pytest -q -p no:cacheprovider -n 3 --dist loadfile --no-loadscope-reorder --durations=20 \
        --junitxml="$results/pytest.xml" "${files[@]}" tests/unit \
        || rc=1 ;;
    mutation-fast)
      # the utils changed since the last release tag (a fixed sample without one): >= min_score % killed
      python benchmarks/mutation.py --fast || rc=1 ;;
    mutation)
      python benchmarks/mutation.py || rc=1 ;;
  esac
  return $rc
}

# lint, sanity and compat run side by side: each is mostly one core at a time (pylint alone outlasts the other
# sanity tests; compat's two releases at a time wait on their playbooks), so together they fill both cores.
# Their output is buffered and printed in stage order when they end; pytest and mutation-fast, which use every
# core, then run one after the other.
side_by_side=(lint sanity compat)
declare -A pid
for stage in "${stages[@]}"; do
  case "$stage" in
    lint|sanity|compat|pytest|mutation-fast|mutation) ;;
    *) echo "unknown stage: $stage" >&2; exit 2 ;;
  esac
done
# timed_stage STAGE: run_stage, then "<seconds> <exit status>" in $results/STAGE.took
timed_stage() {
  local start=$SECONDS rc=0
  run_stage "$1" || rc=$?
  echo "$((SECONDS - start)) $rc" >"$results/$1.took"
}
for stage in "${stages[@]}"; do
  [[ " ${side_by_side[*]} " == *" $stage "* ]] || continue
  timed_stage "$stage" >"$results/$stage.out" 2>&1 &
  pid[$stage]=$!
done
for stage in "${stages[@]}"; do
  if [[ -n "${pid[$stage]:-}" ]]; then
    wait "${pid[$stage]}" || true
    echo "=== test stage: $stage"
    cat "$results/$stage.out"
  else
    echo "=== test stage: $stage"
    timed_stage "$stage"
  fi
  read -r took[$stage] rc <"$results/$stage.took"
  [ "$rc" -eq 0 ] || status=1
done
for stage in "${stages[@]}"; do echo "stage $stage: ${took[$stage]}s"; done
# One closing line over pytest's test cases and the compat checks.
python - "$results" "${stages[@]}" <<'PY'
import re, sys, xml.etree.ElementTree as ET
from pathlib import Path
results, stages = Path(sys.argv[1]), sys.argv[2:]
passed = failed = skipped = 0
if "pytest" in stages and (results / "pytest.xml").exists():
    suite = ET.parse(results / "pytest.xml").getroot().find("testsuite")
    total, bad = int(suite.get("tests")), int(suite.get("failures")) + int(suite.get("errors"))
    skipped += int(suite.get("skipped"))
    passed, failed = total - bad - int(suite.get("skipped")), bad
if "compat" in stages and (results / "compat.log").exists():
    m = re.search(r"^compat: (\d+) passed, (\d+) failed$", (results / "compat.log").read_text(), re.MULTILINE)
    passed, failed = (passed + int(m.group(1)), failed + int(m.group(2))) if m else (passed, failed + 1)
print("tests: %d passed, %d failed, %d skipped" % (passed, failed, skipped))
PY
exit $status
