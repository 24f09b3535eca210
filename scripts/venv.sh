#!/usr/bin/env bash
# A pinned virtual environment for one tool, made again only when its inputs change:
#   bash scripts/venv.sh DIR PYTHON PIP-ARGUMENT...   e.g. .cache/venvs/galaxy-importer python3 -r requirements/galaxy-importer.txt
# DIR/.inputs.sha256 records the Python's version and the pip arguments (and the files they name).
set -euo pipefail
dir="$1" py="$2"; shift 2
inputs="$("$py" -c 'import sys; print(sys.version)'; printf '%s\n' "$@"; for a in "$@"; do [ -f "$a" ] && cat "$a"; done; true)"
want="$(printf '%s' "$inputs" | sha256sum | cut -d' ' -f1)"
if [ -x "$dir/bin/python" ] && [ "$(cat "$dir/.inputs.sha256" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
echo "venv: making $dir ($*)"
rm -rf "$dir"
"$py" -m venv "$dir"
# (pip.conf on some machines names local mirror folders that may not exist: drop pip's notes about them)
"$dir/bin/pip" install -q --disable-pip-version-check "$@" 2> >(grep -v "^WARNING: Location 'file://.*' is ignored" >&2)
echo "$want" > "$dir/.inputs.sha256"
