"""The compat stage of scripts/test.sh: the claims of meta/runtime.yml and tests/config.yml, tested.

For every ansible-core release of requirements/compat.txt, in its own venv under .cache/compat/ (made by
scripts/venv.sh from the release's lock, requirements/compat/ansible-core-X.Y.txt; uv's cache makes it cheap):
  - ansible-doc of every module, the filter and the role;
  - ansible-playbook --syntax-check of every playbook, by its FQCN;
  - tests/integration/compat/modules.yml: every module and the filter run, with the release's target Python;
  - a check-mode deploy of the role on localhost with the demo's settings (tests/helpers/collection_run.py);
  - a real deploy with podman and the demo model, then a restart that fails (a model llama-server cannot load): the
    handler's failure reaches the role's rescue with its own cause, the role rolls back and the first configuration
    serves again (check mode cannot show this; how a release hands a handler's failure to a rescue differs:
    ansible/ansible#81532, #85682).
The release of .venv (requirements/dev.txt, the one every other stage runs) with .venv's Python gets modules.yml
only: its ansible-doc, syntax checks and check-mode deploy are those tests/integration/test_collection_tarball.py
runs on the built tarball, its failing restart the rollback scenarios of the pytest and molecule stages.
Then every plugins/module_utils file is imported, and the demo model read, on every Python that tests/config.yml
claims (python_requires) and this machine has.

    python scripts/compat.py            (scripts/test.sh compat does the set-up first)
Two releases run at a time. Prints one line per release and Python and a closing "compat: N passed, N failed"
line; exits 1 on a failure. A release or Python that this machine lacks is listed as not run.
"""
from __future__ import annotations

import concurrent.futures
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers.collection_run import ansible_env, check_deploy, check_deploy_problems  # noqa: E402
from tests.helpers.llm_deploy import local_deploy, result  # noqa: E402
from tools.gguf_models import write_demo_model, write_wrong_shape  # noqa: E402

CACHE = ROOT / ".cache" / "compat"
COLLECTION = "ai_llm.moe_offload"
LOG = ROOT / "tests" / "data" / "llama_logs" / "b7500_nemotron_cuda_lv4_overridden_cuda_host.log"
NEWEST_MINOR = 14  # the newest Python 3 minor release the claims are checked against


def releases(path=ROOT / "requirements" / "compat.txt"):
    """[(pip requirement, [controller Pythons], target Python)] of requirements/compat.txt."""
    found = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"(ansible-core==[0-9.]+)\s+python=([0-9.,]+)\s+target=([0-9.]+)", line)
        if not match:
            raise SystemExit("%s:%d: want 'ansible-core==X.Y.Z python=3.A,3.B target=3.C', got %r" % (path, number, line))
        found.append((match.group(1), match.group(2).split(","), match.group(3)))
    return found


def claimed_pythons(path=ROOT / "tests" / "config.yml"):
    """The Python 3 minor versions that tests/config.yml's modules.python_requires ('>=3.N') claims."""
    match = re.search(r"python_requires:\s*['\"]>=3\.(\d+)['\"]", path.read_text())
    if not match:
        raise SystemExit("%s: want modules.python_requires: '>=3.N'" % path)
    return ["3.%d" % minor for minor in range(int(match.group(1)), NEWEST_MINOR + 1)]


def find_python(version):
    """An interpreter of Python ``version`` ('3.12'): pythonX.Y on PATH when it runs, else pyenv's; or None."""
    candidates = [shutil.which("python" + version)]
    if shutil.which("pyenv"):
        latest = subprocess.run(["pyenv", "latest", version], capture_output=True, text=True, check=False)
        root = subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=False).stdout.strip()
        if latest.returncode == 0 and latest.stdout.strip():
            candidates.append(os.path.join(root, "versions", latest.stdout.strip(), "bin", "python" + version))
    for candidate in filter(None, candidates):
        probe = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                               capture_output=True, text=True, check=False)
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return candidate
    return None


def run(cmd, env, cwd=ROOT):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=str(cwd),
                          timeout=900, check=False)


def venv_env(venv, **extra):
    return ansible_env(venv / "bin", ROOT / "ansible.cfg", ROOT / ".collections", **extra)


def failed(what, proc):
    return "%s: exit %d\n%s\n%s" % (what, proc.returncode, proc.stdout[-3000:], proc.stderr[-2000:])


def runs_elsewhere(requirement, python):
    """True for .venv's own ansible-core on .venv's Python: test_collection_tarball.py runs its ansible-doc, syntax
    checks and check-mode deploy (on the tarball), so this stage runs only modules.yml with it."""
    here = "ansible-core==%s" % importlib.metadata.version("ansible-core")
    return requirement == here and python[1] == "%d.%d" % sys.version_info[:2]


def check_docs_and_playbooks(bin_, env):
    """ansible-doc of every module, the filter and the role, and the syntax check of every playbook by its FQCN."""
    problems = []
    modules = sorted(p.stem for p in (ROOT / "plugins" / "modules").glob("*.py"))
    filters = sorted(p.stem for p in (ROOT / "plugins" / "filter").glob("*.py"))
    roles = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "meta" / "argument_specs.yml").exists())
    for kind, names in (("module", modules), ("filter", filters), ("role", roles)):
        proc = run([bin_ / "ansible-doc", "-t", kind] + ["%s.%s" % (COLLECTION, n) for n in names], env)
        # (ansible-core 2.20+ warns about a collection of its own that has no MANIFEST.json: not ours)
        noise = [line for line in proc.stderr.splitlines()
                 if line.strip() and "/ansible/_internal/ansible_collections/" not in line]
        if proc.returncode != 0 or noise:
            problems.append(failed("ansible-doc -t %s" % kind, proc))
    playbooks = sorted(p.stem for p in (ROOT / "playbooks").glob("*.yml"))
    proc = run([bin_ / "ansible-playbook", "--syntax-check", "-i", "localhost,"]
               + ["%s.%s" % (COLLECTION, p) for p in playbooks], env)
    if proc.returncode != 0:
        problems.append(failed("ansible-playbook --syntax-check", proc))
    return problems


def release_lock(requirement):
    """The lock of ``requirement`` ('ansible-core==2.19.14'): requirements/compat/ansible-core-2.19.txt, which must pin
    that very release; else SystemExit naming the lock, what it pins and the command that writes it again."""
    version = requirement.split("==", 1)[1]
    lock = ROOT / "requirements" / "compat" / ("ansible-core-%s.txt" % version.rsplit(".", 1)[0])
    pinned = re.findall(r"^ansible-core==(\S+)", lock.read_text(), re.MULTILINE) if lock.exists() else []
    if pinned != [version]:
        raise SystemExit("%s: pins %s, requirements/compat.txt asks for %s: run bash scripts/lock.sh" % (
            lock.relative_to(ROOT), "ansible-core " + pinned[0] if pinned else "no ansible-core", requirement))
    return lock


def check_release(requirement, python, target, model, work):
    """The problems of one ansible-core release ([] when none)."""
    venv = CACHE / ("%s-py%s" % (requirement.replace("==", "-"), python[1]))
    lock = release_lock(requirement)
    made = subprocess.run(["bash", str(ROOT / "scripts" / "venv.sh"), str(venv), python[0], str(lock)],
                          capture_output=True, text=True, check=False)
    if made.returncode != 0:
        return ["install %s from %s: %s" % (requirement, lock.relative_to(ROOT), made.stderr[-2000:])]
    env = venv_env(venv)
    bin_ = venv / "bin"
    problems = []
    if not runs_elsewhere(requirement, python):
        problems += check_docs_and_playbooks(bin_, env)
    target_python = find_python(target) or str(bin_ / "python")
    proc = run([bin_ / "ansible-playbook", "-i", "localhost,", "-c", "local",
                ROOT / "tests" / "integration" / "compat" / "modules.yml",
                "-e", "compat_target_python=" + target_python, "-e", "compat_model=%s" % model,
                "-e", "compat_log=%s" % LOG],
               venv_env(venv, PATH=str(ROOT / "tests" / "doubles") + os.pathsep + env["PATH"],
                        NVIDIA_SMI_FIXTURE="rtx_a5500"))
    if proc.returncode != 0:
        problems.append(failed("modules.yml (target %s)" % target_python, proc))
    if runs_elsewhere(requirement, python):
        return problems
    deploy_root = Path(tempfile.mkdtemp(dir=work))
    proc, project = check_deploy(bin_ / "ansible-playbook", deploy_root, model, env, deploy_root)
    if check_deploy_problems(proc, project):
        problems.append(failed("deploy --check: %s" % "; ".join(check_deploy_problems(proc, project)), proc))
    if shutil.which("podman") and shutil.which("podman-compose"):
        problems += check_failing_restart(bin_, Path(tempfile.mkdtemp(dir=work)), env)
    return problems


def check_failing_restart(bin_, root, env):
    """A real deploy of the demo model, then one of a model llama-server cannot load (``check_tensor_dims``): the
    run fails with llama-server's own cause, rolls back, and the first configuration serves again, unchanged."""
    with local_deploy(root, "ai-llm-compat") as local:
        wrong = write_wrong_shape(local.model, local.models / "wrong-shape.gguf")

        def play(**role_vars):
            cmd, _env = local.command("deploy", **role_vars)
            cmd[0] = str(bin_ / "ansible-playbook")
            return run(cmd, dict(env, ANSIBLE_CALLBACK_RESULT_FORMAT="json"), cwd=local.root)

        first = play()
        if first.returncode != 0:
            return [failed("deploy of the demo model", first)]
        label = local.label()
        second = play(llm_server_model_path=str(wrong))
        shown = result(second.stdout) or {}
        problems = []
        if second.returncode == 0 or shown.get("status") != "rolled_back":
            problems.append("want the failed restart rolled back, got status %r" % shown.get("status"))
        if "check_tensor_dims" not in str(shown.get("message")):
            problems.append("want llama-server's cause (check_tensor_dims) in the message, got %r" % shown.get("message"))
        if local.label() != label or local.health() != 200:
            problems.append("want the first configuration serving again (label %s, /health 200), got label %s, /health %s"
                            % (label, local.label(), local.health()))
        return [failed("failing restart: " + "; ".join(problems), second)] if problems else []


def check_module_utils(python, model):
    """Import every plugins/module_utils file with ``python`` and read the demo model's report."""
    folder = ROOT / "plugins" / "module_utils"
    names = sorted(".".join(p.relative_to(folder).with_suffix("").parts) for p in folder.rglob("*.py") if p.stem != "__init__")
    code = (
        "import importlib, sys\n"
        "prefix = 'ansible_collections.ai_llm.moe_offload.plugins.module_utils.'\n"
        "mods = {n: importlib.import_module(prefix + n) for n in sys.argv[2:]}\n"
        "report, warnings = mods['_model_inspection'].describe(mods['gguf.model'].read_model(sys.argv[1]))\n"
        "assert report['architecture'] == 'nemotron_h_moe', report['architecture']\n"
        "assert report['offload_pattern'] == r'\\.ffn_.*_exps\\.weight', report['offload_pattern']\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT / ".collections"), PYTHONDONTWRITEBYTECODE="1")
    proc = run([python, "-c", code, model] + names, env)
    return [] if proc.returncode == 0 else [failed("module_utils", proc)]


def main():
    CACHE.mkdir(parents=True, exist_ok=True)
    model = CACHE / "demo.gguf"
    if not model.exists():
        write_demo_model(model)
    passed = failures = 0
    for release in releases():
        release_lock(release[0])   # a stale lock stops the stage before any venv is made

    def one(release):
        requirement, pythons, target = release
        found = [(p, v) for v in pythons for p in [find_python(v)] if p]
        if not found:
            return "%-22s not run: no Python %s here (pyenv install %s)" % (
                requirement, " or ".join(pythons), pythons[0]), None
        start = time.monotonic()
        problems = check_release(requirement, found[0], target, model, work)
        shown_target = target if find_python(target) else "%s (no %s here)" % (found[0][1], target)
        only = " (modules.yml; the rest: test_collection_tarball.py)" if runs_elsewhere(requirement, found[0]) else ""
        return "%-22s controller Python %s, target Python %s: %s%s (%.0f s)" % (
            requirement, found[0][1], shown_target, "FAILED" if problems else "ok", only,
            time.monotonic() - start), problems

    with tempfile.TemporaryDirectory(dir=CACHE) as work, \
            concurrent.futures.ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        for line, problems in pool.map(one, releases()):
            print("compat: " + line, flush=True)
            for problem in problems or []:
                print("    " + problem.replace("\n", "\n    "))
            if problems is not None:
                passed, failures = (passed, failures + 1) if problems else (passed + 1, failures)
    for version in claimed_pythons():
        python = find_python(version)
        if not python:
            print("compat: module_utils on Python %s: not run (not on this machine)" % version)
            continue
        problems = check_module_utils(python, model)
        print("compat: module_utils on Python %s: %s" % (version, "FAILED" if problems else "ok"))
        for problem in problems:
            print("    " + problem.replace("\n", "\n    "))
        passed, failures = (passed, failures + 1) if problems else (passed + 1, failures)
    print("compat: %d passed, %d failed" % (passed, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
