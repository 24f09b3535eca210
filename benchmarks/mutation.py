"""Mutation score of plugins/module_utils and plugins/plugin_utils: how many of mutmut's mutants the unit tests
kill, per file.

A file is named by its name alone (``_ggml.py``, ``_rollout_report.py``), a package's file by its path in the
folder (``gguf/header.py``): the names are unique across the two folders (host code in module_utils, controller
code in plugin_utils), and "util" below means a file of either.

mutmut (pinned in requirements/dev.txt) makes small changes to the code of every function of a util (a
``<`` for a ``<=``, a number plus one, ``and`` for ``or``, a string changed, an argument dropped, ...), one at a
time, and runs the unit tests that call that function (fastest first, stopping at the first failure). A mutant
that no test fails on "survives": a bug of that shape would go unnoticed.

How the mutated code reaches the tests: the tests import the collection as
``ansible_collections.ai_llm.moe_offload...`` and mutmut names each mutant by the module path of its file, so
the checkout (tracked and untracked-but-not-ignored files) is copied to a real
``ansible_collections/ai_llm/moe_offload/`` path under ``.cache/mutation/`` and mutmut runs there; the copy's
``.collections`` link points at the mutated tree. mutmut first checks that a forced failure of every mutated
function fails the tests, so a mutant that no test could see is reported as "no tests", never as killed.

Which tests: for each file, the unit test files that import it or a util that (transitively) imports it,
plus those named in benchmarks/mutation.toml; tests that run a module through ``ansible`` in a subprocess (the
``ansible_module`` fixture) are left out: they are slow and run the module from a build that mutmut does not
switch. Hypothesis runs derandomized and without deadlines, so that a score does not depend on the draw.

The hand-written mutants of benchmarks/mutation.toml (``[[hand]]``: bugs of shapes mutmut does not make) are then
applied one at a time to another copy and run against the file's unit tests; they count like mutmut's.

Score of a file = killed / (mutants - equivalent); timeouts and crashes count as killed (a timeout: more CPU
time than the config's timeout_multiplier and timeout_constant allow for the tests of the mutated function). The
equivalent mutants (changes that cannot alter behaviour) are listed in benchmarks/mutation.toml with the reason.

Usage:
  python benchmarks/mutation.py                  every util of both folders
  python benchmarks/mutation.py _ggml.py ...     these files (of either folder)
  python benchmarks/mutation.py --fast           the CI subset: files changed since the last release tag, or
                                                 the sample of benchmarks/mutation.toml without a tag; of
                                                 their mutants, those named by the config's [fast] mutants
  --sample        of the files given (or all), only the mutants named by the config's [fast] mutants (about one
                  in five): an estimate of the score in a fifth of the time, to find where tests are blind
  --mutants PATTERN  only the mutants whose names match PATTERN (fnmatch, repeatable): a sample of another size,
                  e.g. --mutants '*__mutmut_1' --mutants '*__mutmut_*0' (about one in ten)
  --min-score P   exit 1 when a file scores below P % (default: the config's min_score with --fast, else none)
  --jobs N        mutants tested at a time (default 2); mutmut runs under nice -n 10
"""
from __future__ import annotations

import argparse
import ast
import difflib
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "benchmarks" / "mutation.toml"
FOLDERS = ("plugins/module_utils", "plugins/plugin_utils")  # host code, controller code
STAGE = ROOT / ".cache" / "mutation"
COLLECTION = "ansible_collections/ai_llm/moe_offload"

# mutmut's exit codes (mutmut/stats.py status_by_exit_code), grouped for the score.
KILLED = {"killed", "timeout", "segfault", "caught by type check"}

# A pytest plugin for the copy: no ansible subprocess tests, reproducible Hypothesis runs.
STAGE_CONFTEST = '''"""Written by benchmarks/mutation.py for its mutmut run."""
from hypothesis import settings

settings.register_profile("mutation", derandomize=True, deadline=None, database=None, print_blob=False)
settings.load_profile("mutation")


def pytest_collection_modifyitems(config, items):
    """Leave out the tests that run a module through ansible in a subprocess."""
    subprocess_tests = [item for item in items if "ansible_module" in getattr(item, "fixturenames", ())]
    if subprocess_tests:
        config.hook.pytest_deselected(items=subprocess_tests)
        items[:] = [item for item in items if item not in subprocess_tests]
'''


@dataclass
class Mutant:
    """One mutant: where it is, what it changes and what the tests did about it."""

    name: str
    file: str
    function: str
    line: int
    original: str
    mutated: str
    status: str
    equivalent: str = ""

    @property
    def killed(self):
        return self.status in KILLED


def load_config():
    with open(CONFIG, "rb") as handle:
        return tomllib.load(handle)


def util_folders():
    """``{file name: folder}`` of the utils of both folders; a name in both is an error (names the file alone)."""
    found = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).glob("_*.py")) + sorted((ROOT / folder).glob("[a-z]*/[a-z]*.py")):
            name = path.relative_to(ROOT / folder).as_posix()  # a package's file: "gguf/header.py"
            if name in found:
                raise SystemExit("%s is in both %s and %s: a file is named by its name alone" % (
                    name, found[name], folder))
            found[name] = folder
    return found


def util_files():
    return sorted(util_folders())


def util_path(name):
    """The file ``name`` relative to the repository root, in whichever folder holds it."""
    return "%s/%s" % (util_folders()[name], name)


def package(name):
    """The dotted module path mutmut names the mutants of ``name`` by, with the trailing dot."""
    return ("%s/%s" % (COLLECTION, util_path(name)[:-3])).replace("/", ".") + "."


def _imported_utils(text, names):
    """The utils a Python source imports (``module_utils._x``, ``plugin_utils._x``, ``from . import _x`` or
    ``from ._x``)."""
    found = set()
    for name in names:
        package, _slash, stem = name[:-3].rpartition("/")
        utils = r"(?:module|plugin)_utils" + (r"\." + package if package else "")
        if re.search(r"%s(\.|\s+import\s+(\(\s*)?(\w+\s*,\s*)*)%s\b" % (utils, re.escape(stem)), text) or \
                re.search(r"from \.%s import|from \. import .*\b%s\b" % (re.escape(stem), re.escape(stem)), text):
            found.add(name)
    return found


def dependents(files):
    """``files`` and every util that imports one of them, directly or through another."""
    names = util_files()
    imports = dict((n, _imported_utils((ROOT / util_path(n)).read_text(), names) - {n}) for n in names)
    closure = set(files)
    grew = True
    while grew:
        grew = False
        for name, used in imports.items():
            if name not in closure and used & closure:
                closure.add(name)
                grew = True
    return closure


def unit_test_files(files, config):
    """The unit test files of ``files``: those importing them (or their dependents), plus the configured extras."""
    names = util_files()
    wanted = dependents(files)
    tests = set()
    for path in sorted((ROOT / "tests" / "unit").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if _imported_utils(path.read_text(), names) & wanted:
            tests.add(rel)
    extra = config.get("tests", {})
    for name in files:
        for pattern in extra.get(name, []):
            tests.update(p.relative_to(ROOT).as_posix() for p in ROOT.glob(pattern))
    return sorted(t for t in tests if Path(t).name.startswith("test_"))


def last_release_tag():
    proc = subprocess.run(["git", "describe", "--tags", "--abbrev=0"], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


def fast_subset(config):
    """The CI subset and why: the files changed since the last release tag, or the configured sample."""
    fast = config.get("fast", {})
    limit = int(fast.get("max_files", 3))
    tag = last_release_tag()
    if tag:
        proc = subprocess.run(["git", "diff", "--numstat", tag, "--"] + list(FOLDERS), cwd=ROOT,
                              capture_output=True, text=True, check=True)
        changed = []
        names = util_files()
        for line in proc.stdout.splitlines():
            added, removed, path = line.split("\t")
            name = path.split("/", 2)[2]  # (FOLDERS are two levels deep)
            if name in names:
                changed.append((-(int(added) + int(removed)) if added != "-" else 0, name))
        picked = [name for _n, name in sorted(changed)[:limit]]
        return picked, "changed since %s (%d files, the %d most changed)" % (tag, len(changed), len(picked))
    return list(fast.get("sample", [])), "no release tag yet: the sample of %s" % CONFIG.relative_to(ROOT)


def toml_list(items):
    return "[%s]" % ", ".join(json.dumps(i) for i in items)


def make_stage(files, tests, config):
    """A copy of the checkout at a real ansible_collections/ path, and mutmut's configuration for it."""
    shutil.rmtree(STAGE, ignore_errors=True)
    copy = STAGE / COLLECTION
    copy.mkdir(parents=True)
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in listed:
        if not rel or rel.startswith(".collections/") or not (ROOT / rel).is_file():
            continue
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, copy / rel)
    (STAGE / "conftest.py").write_text(STAGE_CONFTEST)
    top = sorted(set(rel.split("/")[0] for rel in listed if rel and not rel.startswith(".collections/")))
    (STAGE / "pyproject.toml").write_text("\n".join([
        "[tool.mutmut]",
        "source_paths = %s" % toml_list(["%s/%s" % (COLLECTION, folder) for folder in FOLDERS]),
        "only_mutate = %s" % toml_list(["%s/%s" % (COLLECTION, util_path(f)) for f in files]),
        "also_copy = %s" % toml_list(["conftest.py"] + ["%s/%s" % (COLLECTION, t) for t in top]),
        "pytest_add_cli_args_test_selection = %s" % toml_list(["%s/%s" % (COLLECTION, t) for t in tests]),
        # (each run removes its tmp_path folders: a campaign runs the tests thousands of times, and some write
        # GGUF files of a GiB)
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-o", "tmp_path_retention_policy=none"]',
        "use_git_change_detection = false",
        "timeout_multiplier = %s" % float(config.get("timeout_multiplier", 15.0)),
        "timeout_constant = %s" % float(config.get("timeout_constant", 1.0)),
        "",
    ]))
    # The tests put <root>/.collections on sys.path (tests/conftest.py): in mutmut's tree it must lead to the
    # mutated files, as the tracked link does in a checkout.
    link = STAGE / "mutants" / COLLECTION / ".collections" / "ansible_collections" / "ai_llm" / "moe_offload"
    link.parent.mkdir(parents=True)
    link.symlink_to("../../..")


def run_mutmut(jobs, niceness, patterns=()):
    """Run mutmut in the stage (only the mutants whose names match ``patterns``, when given); its progress display
    goes to .cache/mutation/mutmut.log."""
    mutmut = Path(sys.executable).parent / "mutmut"
    log = STAGE / "mutmut.log"
    # The tests' temporary files go under the stage, which the next campaign removes: a test run that mutmut
    # stops (a timeout) cannot clean up after itself.
    tmp = STAGE / "tmp"
    tmp.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", TMPDIR=str(tmp))
    with open(log, "wb") as out:
        command = ["nice", "-n", str(niceness), str(mutmut), "run", "--max-children", str(jobs)] + list(patterns)
        proc = subprocess.Popen(command, cwd=STAGE, stdout=out, stderr=subprocess.STDOUT, env=env)
        last = ""
        while proc.poll() is None:
            time.sleep(2)
            progress = _progress(log)
            if progress and progress != last and sys.stdout.isatty():
                print("\r  " + progress, end="", flush=True)
            last = progress
        if sys.stdout.isatty():
            print()
    if proc.returncode != 0:
        tail = log.read_bytes()[-4000:].decode("utf-8", "replace")
        raise SystemExit("mutmut failed (rc=%d); the end of %s:\n%s" % (proc.returncode, log, tail))


def _progress(log):
    try:
        with open(log, "rb") as handle:
            handle.seek(max(0, os.path.getsize(log) - 300))
            tail = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    found = re.findall(r"(\d+/\d+)\s+\S+ (\d+) \S+ (\d+)\s+\S+ (\d+)\s+\S+ (\d+)\s+\S+ (\d+)", tail)
    if not found:
        return ""
    done, killed, no_tests, timeout, suspicious, survived = found[-1]
    return "%s mutants tested: %s killed, %s timeout, %s survived, %s without tests, %s suspicious" % (
        done, killed, timeout, survived, no_tests, suspicious)


def run_hand_mutants(files, config, niceness):
    """The hand-written mutants of ``files`` (benchmarks/mutation.toml ``[[hand]]``): changes mutmut does not make,
    each applied alone to a copy of the checkout and run against the file's unit tests."""
    entries = [e for e in config.get("hand", []) if e["file"] in files]
    if not entries:
        return []
    copy = STAGE / "hand" / COLLECTION
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in listed:
        if rel and not rel.startswith(".collections/") and (ROOT / rel).is_file():
            (copy / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, copy / rel)
    link = copy / ".collections" / "ansible_collections" / "ai_llm" / "moe_offload"
    link.parent.mkdir(parents=True)
    link.symlink_to("../../..")
    (copy / "conftest.py").write_text(STAGE_CONFTEST)
    results = []
    for entry in entries:
        target = copy / util_path(entry["file"])
        source = target.read_text()
        original, mutated = entry["original"], entry["mutant"]
        line = source[:source.find(original)].count("\n") + 1
        record = Mutant("hand: " + entry["what"], entry["file"], "(hand)", line, original.strip(), mutated.strip(),
                        "killed")
        if source.count(original) != 1:
            record.status = "stale: the original text occurs %d times" % source.count(original)
            results.append(record)
            continue
        target.write_text(source.replace(original, mutated))
        tests = [t for t in unit_test_files([entry["file"]], config) if (copy / t).is_file()]
        tests.sort(key=lambda t: Path(entry["file"]).stem.lstrip("_") not in t)  # the file's own tests first: -x stops early
        proc = subprocess.run(["nice", "-n", str(niceness), sys.executable, "-m", "pytest", "-x", "-q",
                               "-p", "no:cacheprovider", "--rootdir", str(copy)] + tests,
                              cwd=copy, capture_output=True, text=True, check=False)
        target.write_text(source)
        record.status = {0: "survived", 1: "killed"}.get(proc.returncode, "suspicious")
        if record.status == "suspicious":
            record.status += " (pytest rc=%d)" % proc.returncode
        results.append(record)
    return results


def _functions(tree):
    """``{name: FunctionDef}`` of top-level functions (``x_name``) and methods (``xǁClassǁname``)."""
    found = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found["x_" + node.name] = node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found["x\u01c1%s\u01c1%s" % (node.name, item.name)] = item
    return found


_SUFFIX = re.compile(r"__mutmut_(?:orig|\d+)\(")


def _lines(source_lines, node):
    return source_lines[node.lineno - 1:node.end_lineno]


def read_results(files, config, sampled=False):
    """Every mutant of ``files`` with its place, its change and its status (from mutmut's .meta files)."""
    sys.path.insert(0, str(STAGE))
    from mutmut.stats import status_by_exit_code  # pylint: disable=import-outside-toplevel

    equivalents = config.get("equivalent", [])
    mutants = []
    for name in files:
        source = (ROOT / util_path(name)).read_text()
        source_lines = source.splitlines()
        originals = _functions(ast.parse(source))
        mutated_path = STAGE / "mutants" / COLLECTION / util_path(name)
        meta_path = Path(str(mutated_path) + ".meta")
        if not meta_path.exists():
            continue
        exit_codes = json.loads(meta_path.read_text())["exit_code_by_key"]
        mutated_source = mutated_path.read_text()
        mutated_lines = mutated_source.splitlines()
        defs = dict((n.name, n) for n in ast.walk(ast.parse(mutated_source))
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
        for key, code in exit_codes.items():
            local = key[len(package(name)):]  # x_func__mutmut_3 / xǁClassǁmethod__mutmut_3
            mangled, _sep, _number = local.partition("__mutmut_")
            orig_copy, mutant = defs[mangled + "__mutmut_orig"], defs[local]
            # (the copies differ in their names: the def lines are compared without them)
            before, after = [[_SUFFIX.sub("(", line, count=1) if n == 0 else line for n, line in enumerate(lines)]
                             for lines in (_lines(mutated_lines, orig_copy), _lines(mutated_lines, mutant))]
            opcodes = [op for op in difflib.SequenceMatcher(a=before, b=after, autojunk=False).get_opcodes()
                       if op[0] != "equal"]
            tag, i1, i2, j1, j2 = opcodes[0] if opcodes else ("equal", 0, 0, 0, 0)
            original = " / ".join(line.strip() for line in before[i1:i2])
            changed = " / ".join(line.strip() for line in after[j1:j2])
            function = mangled[2:].replace("\u01c1", ".") if mangled.startswith("x_") else \
                mangled[1:].strip("\u01c1").replace("\u01c1", ".")
            line = originals[mangled].lineno + i1 if mangled in originals else 0
            if code is None and sampled:
                continue  # not in the sample
            record = Mutant(key, name, function, line, original, changed, status_by_exit_code[code])
            for entry in equivalents:
                if entry["file"] == name and entry["function"] == function and \
                        entry["original"].strip() == original and entry["mutant"].strip() == changed:
                    record.equivalent = entry["reason"]
                    entry["_used"] = True
            mutants.append(record)
    return mutants


def report(files, mutants, min_score, config, seconds, sampled=False):
    """Print the table per file and the survivors; return the files below ``min_score``."""
    print()
    print("%-22s %8s %8s %8s %8s %10s %8s" % ("file", "mutants", "equiv.", "killed", "survived", "no tests", "score"))
    below = []
    totals = [0, 0, 0, 0, 0]
    stale_hand = [m for m in mutants if m.status.startswith("stale")]
    mutants = [m for m in mutants if not m.status.startswith("stale")]
    for name in files:
        mine = [m for m in mutants if m.file == name]
        counted = [m for m in mine if not m.equivalent]
        killed = sum(m.killed for m in counted)
        no_tests = sum(m.status == "no tests" for m in counted)
        survived = len(counted) - killed - no_tests
        score = 100.0 * killed / len(counted) if counted else 100.0
        for i, value in enumerate((len(mine), len(mine) - len(counted), killed, survived, no_tests)):
            totals[i] += value
        print("%-22s %8d %8d %8d %8d %10d %7.1f%%" % (
            name, len(mine), len(mine) - len(counted), killed, survived, no_tests, score))
        if min_score is not None and score < min_score:
            below.append((name, score))
    scored = totals[0] - totals[1]
    print("%-22s %8d %8d %8d %8d %10d %7.1f%%" % (
        "all", totals[0], totals[1], totals[2], totals[3], totals[4], 100.0 * totals[2] / scored if scored else 100.0))
    print("%d mutants in %.0f s (%.1f per second)" % (totals[0], seconds, totals[0] / seconds if seconds else 0))
    survivors = sorted((m for m in mutants if not m.killed and not m.equivalent), key=lambda m: (m.file, m.line))
    if survivors:
        print()
        print("survivors (<folder>/<file>:<line> <function>: - original  + mutant):")
        for m in survivors:
            print("  %s:%d %s [%s]\n      - %s\n      + %s" % (
                util_path(m.file), m.line, m.function, m.status, m.original, m.mutated))
    for m in stale_hand:
        print("note: the hand mutant %s: %s (%s) is not counted" % (m.file, m.name, m.status))
    stale = [e for e in config.get("equivalent", []) if e["file"] in files and not e.get("_used") and not sampled]
    for entry in stale:
        print("note: no mutant matches the equivalent entry %s %s: %r -> %r" % (
            entry["file"], entry["function"], entry["original"], entry["mutant"]))
    if below:
        print()
        print("below %.0f %%: %s" % (min_score, ", ".join("%s (%.1f %%)" % b for b in below)))
    return below


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("files", nargs="*", help="file names of module_utils or plugin_utils (default: all; globs "
                                                 "allowed)")
    parser.add_argument("--fast", action="store_true", help="the CI subset")
    parser.add_argument("--sample", action="store_true", help="only the sampled mutants of the files")
    parser.add_argument("--mutants", metavar="PATTERN", action="append", default=[],
                        help="only the mutants whose mutmut names match PATTERN (fnmatch; repeatable), e.g. "
                             "'*__mutmut_1' '*__mutmut_*0' for about one in ten")
    parser.add_argument("--min-score", type=float, default=None, help="fail below this score (per cent)")
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested at a time")
    parser.add_argument("--nice", type=int, default=10, help="niceness of the mutmut run")
    parser.add_argument("--json", metavar="PATH", help="also write every mutant as JSON to PATH")
    args = parser.parse_args()
    config = load_config()
    names = util_files()
    if args.fast:
        files, why = fast_subset(config)
        min_score = args.min_score if args.min_score is not None else config.get("min_score")
    else:
        files = sorted(set(n for pattern in args.files or ["*"] for n in fnmatch.filter(names, pattern)))
        why = ("given" if args.files else "every util") + (
            ", the mutants %s" % " ".join(args.mutants) if args.mutants else ", sampled mutants" if args.sample else "")
        min_score = args.min_score
    unknown = sorted(set(files) - set(names))
    if unknown or not files:
        raise SystemExit("no such file in %s: %s" % (" or ".join(FOLDERS), ", ".join(unknown or args.files)))
    tests = unit_test_files(files, config)
    print("mutation: %s: %s" % (why, ", ".join(files)))
    print("tests: %s" % ", ".join(Path(t).name for t in tests))
    start = time.monotonic()
    make_stage(files, tests, config)
    patterns = args.mutants or (config.get("fast", {}).get("mutants", []) if args.fast or args.sample else [])
    run_mutmut(args.jobs, args.nice, patterns)
    mutants = read_results(files, config, sampled=bool(patterns)) + run_hand_mutants(files, config, args.nice)
    seconds = time.monotonic() - start
    if args.json:
        Path(args.json).write_text(json.dumps([m.__dict__ for m in mutants], indent=1) + "\n")
    below = report(files, mutants, min_score, config, seconds, sampled=bool(patterns))
    print("stage kept in %s (mutmut show <name> there)" % STAGE.relative_to(ROOT))
    return 1 if below else 0


if __name__ == "__main__":
    sys.exit(main())
