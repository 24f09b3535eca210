#!/usr/bin/env bash
# uv, the tool that writes the locks (scripts/lock.sh) and installs each environment from its lock (scripts/venv.sh),
# installed once from its own lock, requirements/uv.txt, by pip with the lock's hashes checked, into .cache/venvs/uv;
# made again when that lock changes. uv is one program: the Python that pip runs on ($PYTHON, else python3) only
# installs it, and any Python's environment is then made with it. One install at a time (the compat stage makes
# several environments side by side). Prints the path of the uv executable.
#   bash scripts/uv.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
py="${PYTHON:-python3}"
dir="$ROOT/.cache/venvs/uv"
lock="$ROOT/requirements/uv.txt"
want="$(sha256sum "$lock" | cut -d' ' -f1)"
mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock 9
if ! "$dir/bin/uv" --version >/dev/null 2>&1 || [ "$(cat "$dir/.inputs.sha256" 2>/dev/null)" != "$want" ]; then
  echo "uv: installing $(sed -n 's/^\(uv==[^ ]*\).*/\1/p' "$lock") into ${dir#"$ROOT"/} (requirements/uv.txt)" >&2
  rm -rf "$dir"
  "$py" -m venv "$dir"
  # (pip.conf on some machines names local mirror folders that may not exist: drop pip's notes about them)
  "$dir/bin/pip" install -q --disable-pip-version-check --require-hashes --no-deps -r "$lock" \
    2> >(grep -v "^WARNING: Location 'file://.*' is ignored" >&2) >&2
  echo "$want" > "$dir/.inputs.sha256"
fi
echo "$dir/bin/uv"
