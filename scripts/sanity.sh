#!/usr/bin/env bash
# ansible-test sanity needs the collection at a real .../ansible_collections/ai_llm/moe_offload path:
# copy the tracked and untracked-but-not-ignored files there and run it in its own venvs.
#   bash scripts/sanity.sh                 every sanity test: pylint in one copy and every other test in another,
#                                          side by side (pylint alone takes about as long as all the others, each
#                                          runs on one core); each part's output is printed when it ends
#   bash scripts/sanity.sh --test pep8     ansible-test sanity with these arguments, in one copy
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
# ansible-test downloads a pip bootstrap script from a host that is not reachable here: give it ours.
pip_version="$(sed -n "s/^ *pip='\([0-9.]*\)',$/\1/p" "$(python -c 'import ansible_test, os; print(os.path.dirname(ansible_test.__file__))')/_internal/python_requirements.py")"
mkdir -p ~/.ansible/test/cache
cp scripts/get_pip_bootstrap.py ~/.ansible/test/cache/get_pip_"${pip_version//./_}".py
python_version="$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

# copy NAME: the collection at .cache/NAME/ansible_collections/ai_llm/moe_offload, a git repository of its own
# (ansible-test lists the files through git); prints its path
copy() {
  local dest="$ROOT/.cache/$1/ansible_collections/ai_llm/moe_offload"
  rm -rf "$dest" && mkdir -p "$dest"
  # (not the .collections link: there the copy is itself at a real ansible_collections/ path)
  git ls-files -z --cached --others --exclude-standard -- . ':!.collections' | rsync -a --from0 --files-from=- ./ "$dest/"
  (cd "$dest" && git init -q && git add -A)
  echo "$dest"
}

if [ $# -gt 0 ]; then
  cd "$(copy sanity)"
  exec ansible-test sanity --venv --python "$python_version" "$@"
fi

pylint_dir="$(copy sanity)"
other_dir="$(copy sanity-other)"
logs="$ROOT/.cache/sanity-logs"
rm -rf "$logs" && mkdir -p "$logs"
# part NAME DIR ARGS...: ansible-test sanity ARGS in DIR, its output and its time in $logs/NAME.log
part() {
  local name="$1" dir="$2" start=$SECONDS rc=0
  shift 2
  (cd "$dir" && ansible-test sanity --venv --python "$python_version" "$@") >"$logs/$name.log" 2>&1 || rc=$?
  echo "sanity ($name): $((SECONDS - start))s, exit $rc" >>"$logs/$name.log"
  return $rc
}
part pylint "$pylint_dir" --test pylint &
pylint_pid=$!
part other "$other_dir" --skip-test pylint &
other_pid=$!
status=0
wait "$other_pid" || status=1
echo "--- sanity: every test but pylint"; cat "$logs/other.log"
wait "$pylint_pid" || status=1
echo "--- sanity: pylint"; cat "$logs/pylint.log"
exit $status
