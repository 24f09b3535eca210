#!/usr/bin/env bash
# ansible-test sanity needs the collection at a real .../ansible_collections/ai_llm/moe_offload path:
# copy the tracked and untracked-but-not-ignored files there and run it in its own venvs.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
dest="$ROOT/.cache/sanity/ansible_collections/ai_llm/moe_offload"
rm -rf "$dest" && mkdir -p "$dest"
# (not the .collections link: there the copy is itself at a real ansible_collections/ path)
git ls-files -z --cached --others --exclude-standard -- . ':!.collections' | rsync -a --from0 --files-from=- ./ "$dest/"
# ansible-test downloads a pip bootstrap script from a host that is not reachable here: give it ours.
pip_version="$(sed -n "s/^ *pip='\([0-9.]*\)',$/\1/p" "$(python -c 'import ansible_test, os; print(os.path.dirname(ansible_test.__file__))')/_internal/python_requirements.py")"
mkdir -p ~/.ansible/test/cache
cp scripts/get_pip_bootstrap.py ~/.ansible/test/cache/get_pip_"${pip_version//./_}".py
cd "$dest"
# ansible-test lists the files through git.
git init -q && git add -A
ansible-test sanity --venv --python "$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])')" "$@"
