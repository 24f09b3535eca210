#!/usr/bin/env bash
# A Python environment installed from a lock that scripts/lock.sh wrote, made again only when the lock or the Python
# changes:
#   bash scripts/venv.sh DIR PYTHON LOCK     e.g. .cache/venvs/ee python3 requirements/ee.txt
# uv (scripts/uv.sh) makes the venv on PYTHON's base interpreter and syncs it to the lock: exactly the locked
# packages at the locked versions, each checked against the lock's hashes, and nothing else (uv pip sync removes
# whatever the lock does not name), with every module compiled to bytecode as pip would (scripts/env.sh sets
# PYTHONDONTWRITEBYTECODE: without it each ansible-playbook would compile ansible from source, about 0.4 CPU seconds
# a run). DIR/.inputs.sha256 records the Python's version, the lock and the install's options.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
dir="$1" py="$2" lock="$3"
[ -f "$lock" ] || { echo "venv.sh: no lock $lock (bash scripts/lock.sh writes the locks)" >&2; exit 2; }
# the base interpreter, found before anything is removed: PYTHON may be the venv that is made again (.venv/bin is
# first on PATH)
base="$("$py" -c 'import os, sys; print(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))')"
sync=(pip sync --quiet --require-hashes --compile-bytecode)
want="$({ "$base" -c 'import sys; print(sys.version)'; echo "${sync[*]}"; cat "$lock"; } | sha256sum | cut -d' ' -f1)"
if [ -x "$dir/bin/python" ] && [ "$(cat "$dir/.inputs.sha256" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
uv="$(bash "$ROOT/scripts/uv.sh")"
echo "venv: making $dir from $lock"
rm -rf "$dir"
"$uv" venv --quiet --python "$base" "$dir"
"$uv" "${sync[@]}" --python "$dir/bin/python" "$lock"
echo "$want" > "$dir/.inputs.sha256"
