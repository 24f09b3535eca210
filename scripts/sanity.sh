#!/usr/bin/env bash
# ansible-test sanity needs the collection at a real .../ansible_collections/ai_llm/moe_offload path:
# copy the tracked and untracked-but-not-ignored files there and run it in its own venvs.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
dest="$ROOT/.cache/sanity/ansible_collections/ai_llm/moe_offload"
rm -rf "$dest" && mkdir -p "$dest"
git ls-files -z --cached --others --exclude-standard | rsync -a --from0 --files-from=- ./ "$dest/"
cd "$dest"
ansible-test sanity --venv --python "$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])')" \
  --skip-test shebang --exclude tools/ --exclude benchmarks/ --exclude scripts/ --exclude .ci/ "$@"
