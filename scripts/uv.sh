#!/usr/bin/env bash
# uv, the tool that writes the locks (scripts/lock.sh) and installs each environment from its lock (scripts/venv.sh),
# installed once from its own lock, requirements/uv.txt, by pip with the lock's hashes checked, into .cache/venvs/uv;
# made again when the lock or the Python changes. Prints the path of the uv executable.
#   bash scripts/uv.sh [PYTHON]        (default: $PYTHON, else python3)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
py="${1:-${PYTHON:-python3}}"
dir="$ROOT/.cache/venvs/uv"
lock="$ROOT/requirements/uv.txt"
want="$({ "$py" -c 'import sys; print(sys.version)'; cat "$lock"; } | sha256sum | cut -d' ' -f1)"
if [ ! -x "$dir/bin/uv" ] || [ "$(cat "$dir/.inputs.sha256" 2>/dev/null)" != "$want" ]; then
  echo "uv: installing $(sed -n 's/^\(uv==[^ ]*\).*/\1/p' "$lock") into ${dir#"$ROOT"/} (requirements/uv.txt)" >&2
  rm -rf "$dir"
  "$py" -m venv "$dir"
  # (pip.conf on some machines names local mirror folders that may not exist: drop pip's notes about them)
  "$dir/bin/pip" install -q --disable-pip-version-check --require-hashes --no-deps -r "$lock" \
    2> >(grep -v "^WARNING: Location 'file://.*' is ignored" >&2) >&2
  echo "$want" > "$dir/.inputs.sha256"
fi
echo "$dir/bin/uv"
