#!/usr/bin/env bash
# Writes the lock of every Python environment the scripts make: the exact version of every package, transitive ones
# included, with the sha256 of each of its files, resolved with uv pip compile for every platform (--universal) and
# every Python from the environment's oldest, under requirements/constraints.in. Commit what it writes: updating a
# dependency is a reviewed diff of a lock.
#   bash scripts/lock.sh                           lock again, keeping every version a lock already has
#   bash scripts/lock.sh --upgrade-package NAME    ... except NAME, at its newest allowed version (repeatable)
#   bash scripts/lock.sh --upgrade                 every package at its newest allowed version
# The locks (input -> lock, the oldest Python):
#   requirements/uv.in              -> requirements/uv.txt               3.11  uv itself (scripts/uv.sh)
#   requirements/dev.in             -> requirements/dev.txt              3.11  .venv (scripts/setup.sh)
#   requirements/galaxy-importer.in -> requirements/galaxy-importer.txt  3.11  .cache/venvs/galaxy-importer
#   requirements/ee.in              -> requirements/ee.txt               3.11  .cache/venvs/ee
#   requirements/mitogen.in         -> requirements/mitogen.txt          3.11  .cache/mitogen (benchmarks/controller_cost.py)
#   requirements/cuda-build.in      -> requirements/cuda-build.txt       3.11  the cuBLAS wheel of benchmarks/cuda_build.sh
#   each line of requirements/compat.txt -> requirements/compat/ansible-core-X.Y.txt, for the oldest of its python=
# scripts/venv.sh installs an environment from its lock (uv pip sync) and makes it again when the lock changes.
# A new environment: its .in here, a line above, and scripts/venv.sh DIR PYTHON LOCK where it is made.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
uv="$(bash scripts/uv.sh)"

args=("$@")   # --upgrade, --upgrade-package NAME

# compile LOCK PYTHON INPUT: INPUT (a file, or - for standard input) resolved into LOCK
compile() {
  echo "lock: $1 (Python $2 and newer)"
  "$uv" pip compile --quiet --universal --python-version "$2" --generate-hashes \
    --constraint requirements/constraints.in --custom-compile-command "bash scripts/lock.sh" \
    --output-file "$1" "${args[@]}" "$3"
}

compile requirements/uv.txt 3.11 requirements/uv.in
compile requirements/dev.txt 3.11 requirements/dev.in
compile requirements/galaxy-importer.txt 3.11 requirements/galaxy-importer.in
compile requirements/ee.txt 3.11 requirements/ee.in
compile requirements/mitogen.txt 3.11 requirements/mitogen.in
compile requirements/cuda-build.txt 3.11 requirements/cuda-build.in
# requirements/compat.txt: "ansible-core==X.Y.Z   python=3.A,3.B   target=3.C"
mkdir -p requirements/compat
sed -e 's/#.*//' -e '/^[[:space:]]*$/d' requirements/compat.txt | while read -r requirement pythons _; do
  release="${requirement#ansible-core==}"
  oldest="$(tr ',' '\n' <<<"${pythons#python=}" | sort -V | head -1)"
  printf '%s\n' "$requirement" | compile "requirements/compat/ansible-core-${release%.*}.txt" "$oldest" -
done
