#!/usr/bin/env bash
# Every test of the project, on a fresh machine: set-up (scripts/setup.sh --tests), lint, ansible-test sanity, the
# supported ansible-core releases and Pythons (compat), pytest (unit + integration: real GGUF files, real
# llama-server, real podman, the role's cases on a local host and on a fleet of fake hosts, the collection
# tarball), the role's molecule scenarios (extensions/molecule), the mutation score of the changed utils.
# Usage: bash scripts/test.sh [stage ...]
#   stages: lint sanity compat pytest molecule mutation-fast (default: all of these)
#   mutation: the mutation score of every util (benchmarks/mutation.py; long, so on demand only)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
# everything the tests need: the demo's set-up, docker, the test fleet's packages, chromium, debootstrap and
# the shellcheck program, the galaxy-importer and execution-environment venvs
bash scripts/setup.sh --tests

stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(lint sanity compat pytest molecule mutation-fast)
declare -A took cpu
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
      # four workers (pytest-xdist) on two cores, each test file on one worker in order (a module's fixtures, such as
      # the test fleet, are made once): the integration tests mostly wait on servers, containers and ssh. The longest files
      # start first, in the order given (--no-loadscope-reorder: xdist's own order is by number of tests, which
      # would start the fleet, 13 tests and the longest file, near the end and make it the stage's tail); the
      # many short files then fill the workers around them. --durations names the slowest tests. A test (with its
      # fixtures' set-up) that runs past --timeout fails with the stacks of its threads, and the stage goes on; a
      # stage past 60 minutes is interrupted (SIGINT), and pytest still prints what passed and failed.
      # (files, not the folder: pytest collects a folder's files in its own order, the named ones with them)
      longest=(tests/integration/test_fleet_rollout.py tests/integration/test_collection_tarball.py
               tests/integration/test_role_scenarios.py tests/integration/test_role_hostile.py
               tests/integration/test_role_converge.py)
      files=("${longest[@]}")
      for f in tests/integration/test_*.py; do
        [[ " ${longest[*]} " == *" $f "* ]] || files+=("$f")
      done
      timeout -s INT 3600 python -m pytest -q -p no:cacheprovider -n 4 --dist loadfile --no-loadscope-reorder --durations=20 --timeout=900 \
        --junitxml="$results/pytest.xml" "${files[@]}" tests/unit \
        || rc=1 ;;
    molecule)
      # extensions/molecule: each scenario as users run it, `molecule test -s NAME`, one after the other, each one's
      # output in $results/molecule-NAME.log (its end printed when it fails). ANSIBLE_HOME: molecule installs the
      # collection it builds into $ANSIBLE_HOME/collections, this checkout's own here rather than the user's
      # ~/.ansible. gpu_topologies writes a CDI spec for the fixtures' GPUs, which the tests' specs name too: it runs
      # under their lock (tests/helpers/cdi.py).
      local scenario start passed=0 failed=0 lock
      for scenario in default rollback gpu_topologies; do
        start=$SECONDS
        lock=()
        [ "$scenario" != gpu_topologies ] || lock=(flock /tmp/ai-llm-cdi.lock)
        if ANSIBLE_HOME="$ROOT/.cache/molecule" NO_COLOR=1 "${lock[@]}" molecule test -s "$scenario" \
             >"$results/molecule-$scenario.log" 2>&1; then
          passed=$((passed + 1))
          echo "molecule $scenario: passed in $((SECONDS - start))s"
        else
          failed=$((failed + 1)) rc=1
          tail -n 150 "$results/molecule-$scenario.log"
          echo "molecule $scenario: FAILED in $((SECONDS - start))s (all of it: $results/molecule-$scenario.log)"
        fi
      done
      echo "molecule: $passed passed, $failed failed" | tee "$results/molecule.summary" ;;
    mutation-fast)
      # the utils changed since the last release tag (a fixed sample without one): >= min_score % killed
      python benchmarks/mutation.py --fast || rc=1 ;;
    mutation)
      python benchmarks/mutation.py || rc=1 ;;
  esac
  return $rc
}

for stage in "${stages[@]}"; do
  case "$stage" in
    lint|sanity|compat|pytest|molecule|mutation-fast|mutation) ;;
    *) echo "unknown stage: $stage" >&2; exit 2 ;;
  esac
done
# timed_stage STAGE: run_stage in a subshell, then "<seconds> <exit status> <CPU seconds>" in $results/STAGE.took
# (CPU: user + system of the stage's processes, as the subshell's `times` counts them; containers started by
# podman are not its children and are not counted). With a second argument, the stage runs at that niceness.
timed_stage() {
  local start=$SECONDS
  (
    rc=0
    [ -z "${2:-}" ] || renice -n "$2" -p "$BASHPID" >/dev/null
    run_stage "$1" || rc=$?
    times >"$results/$1.times"   # (not in a pipe: a pipe's subshell has no children of its own)
    awk -v took="$((SECONDS - start))" -v rc="$rc" 'NR == 2 {
      split($1 " " $2, t, "[ms ]+"); printf "%d %d %d\n", took, rc, t[1] * 60 + t[2] + t[3] * 60 + t[4] }' \
      "$results/$1.times" >"$results/$1.took"
    exit "$rc"
  ) || true
}

# The stages run side by side, each with its output in $results/STAGE.out, printed whole when the stage ends.
# pytest is the longest and spends much of its time waiting (servers loading, containers, ssh), so it starts
# first and keeps the normal priority; molecule (which waits on its deploys as much), lint, sanity and compat (each
# mostly one core at a time) fill the cores around it at a lower priority, and the mutation stage, which keeps both
# cores busy, starts when they have ended.
declare -A pid stage_of
start_stage() {
  timed_stage "$1" "${2:-}" >"$results/$1.out" 2>&1 &
  pid[$1]=$!
  stage_of[$!]=$1
  echo "test stage started: $1"
}
want() { [[ " ${stages[*]} " == *" $1 "* ]]; }
want pytest && start_stage pytest
for stage in molecule lint sanity compat; do
  if want "$stage"; then start_stage "$stage" 10; fi
done
running() { local s; for s in "$@"; do [[ -n "${pid[$s]:-}" && -z "${took[$s]:-}" ]] && return 0; done; return 1; }
while :; do
  if ! running molecule lint sanity compat; then
    for stage in mutation-fast mutation; do
      if want "$stage" && [[ -z "${pid[$stage]:-}" ]]; then start_stage "$stage"; fi
    done
  fi
  live=()
  for stage in "${!pid[@]}"; do running "$stage" && live+=("${pid[$stage]}"); done
  ((${#live[@]})) || break
  wait -n -p ended "${live[@]}" || true
  stage="${stage_of[$ended]}"
  echo "=== test stage: $stage"
  cat "$results/$stage.out"
  read -r "took[$stage]" rc "cpu[$stage]" <"$results/$stage.took"
  echo "(stage $stage: ${took[$stage]}s)"
  [ "$rc" -eq 0 ] || status=1
done
for stage in "${stages[@]}"; do echo "stage $stage: ${took[$stage]}s (CPU ${cpu[$stage]}s)"; done
# One closing line over pytest's test cases, the compat checks and the molecule scenarios.
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
for stage, found in (("compat", "compat.log"), ("molecule", "molecule.summary")):
    if stage in stages and (results / found).exists():
        m = re.search(r"^%s: (\d+) passed, (\d+) failed$" % stage, (results / found).read_text(), re.MULTILINE)
        passed, failed = (passed + int(m.group(1)), failed + int(m.group(2))) if m else (passed, failed + 1)
print("tests: %d passed, %d failed, %d skipped" % (passed, failed, skipped))
PY
exit $status
