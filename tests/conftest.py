"""Shared pytest set-up.

Makes ``ansible_collections.ai_llm.moe_offload`` importable from this checkout (the
``.collections`` link made by ``scripts/setup.sh``) and offers a fixture that runs a module in a
process of its own and returns its result, and ``tarball``: the collection as ``ansible-galaxy collection build``
makes it, once per test module.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COLLECTIONS = ROOT / ".collections"
if not (COLLECTIONS / "ansible_collections" / "ai_llm" / "moe_offload").exists():
    raise RuntimeError("run scripts/setup.sh first: .collections/ansible_collections/ai_llm/moe_offload is missing")
if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # for tools.gguf_models

from tests.helpers.collection_run import build_tarball  # noqa: E402  (needs the paths above)
from tests.helpers.llm_deploy import DOCKER_OWNER_ENV, docker_script  # noqa: E402


def pytest_configure(config):
    """The session's name for a dockerd its tests start, set once by the controller (xdist's workers inherit it)."""
    if not hasattr(config, "workerinput"):
        os.environ.setdefault(DOCKER_OWNER_ENV, "pytest-%d" % os.getpid())


def pytest_unconfigure(config):
    """Stop the dockerd this session started (scripts/docker.sh stop OWNER), none other."""
    if not hasattr(config, "workerinput"):
        docker_script("stop", os.environ[DOCKER_OWNER_ENV])


def run_ansible_module(module, args, check=False, extra_env=None):
    """Run ``ai_llm.moe_offload.<module>`` (or another FQCN) on localhost; returns its result dict (``failed`` and
    ``msg`` on a failure).

    A module of this collection without an action plugin runs as Ansible's developer guide runs a module by hand:
    ``python -m <module> <args file>``, a process of its own that reads ``ANSIBLE_MODULE_ARGS`` and prints its JSON
    result (a traceback prints no result: an AssertionError here). A module with an action plugin, or one of
    another collection, runs through ``ansible`` itself, where the action runs on the controller.
    """
    fqcn = module if "." in module else "ai_llm.moe_offload." + module
    env = dict(os.environ)
    name = fqcn.rpartition(".")[2]
    if fqcn.startswith("ai_llm.moe_offload.") and not (ROOT / "plugins" / "action" / (name + ".py")).exists():
        return _run_module_process(name, args, check, dict(env, **(extra_env or {})))
    env.update({
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS),
        "ANSIBLE_LOCALHOST_WARNING": "0",
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.minimal",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0",
    })
    env.update(extra_env or {})
    cmd = [str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local",
           "-i", "localhost,", "-e", "ansible_python_interpreter=" + sys.executable,
           "-m", fqcn]
    if args:  # "-a '{}'" reads as raw params, which most modules refuse
        cmd += ["-a", json.dumps(args)]
    if check:
        cmd.append("--check")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=300, check=False)
    # The minimal callback prints "localhost | SUCCESS => {...json...}" (or FAILED!, CHANGED).
    match = re.search(r"^localhost \| ([A-Z]+!?) => ", proc.stdout, re.MULTILINE)
    if match:
        result = json.JSONDecoder().raw_decode(proc.stdout[match.end():].lstrip())[0]
        result.setdefault("failed", match.group(1).endswith("!"))
        return result
    raise AssertionError("ansible printed no result (rc=%s):\n%s\n%s" % (proc.returncode, proc.stdout, proc.stderr))


def _run_module_process(name, args, check, env):
    """``python -m`` the collection's module ``name`` with an arguments file, as Ansible's executor hands them."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump({"ANSIBLE_MODULE_ARGS": dict(args or {}, _ansible_check_mode=bool(check))}, handle)
    try:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(COLLECTIONS), env.get("PYTHONPATH")]))
        proc = subprocess.run([sys.executable, "-m", "ansible_collections.ai_llm.moe_offload.plugins.modules." + name,
                               handle.name], capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=300,
                              check=False)
    finally:
        os.unlink(handle.name)
    start = proc.stdout.find("{")
    if start < 0:
        raise AssertionError("%s printed no result (rc=%s):\n%s\n%s" % (name, proc.returncode, proc.stdout, proc.stderr))
    result = json.JSONDecoder().raw_decode(proc.stdout[start:])[0]
    result.setdefault("failed", False)
    return result


@pytest.fixture
def ansible_module():
    """The ``run_ansible_module`` function, as a fixture."""
    return run_ansible_module


@pytest.fixture(scope="module")
def tarball(tmp_path_factory):
    """The collection's tarball (``ansible-galaxy collection build`` of this checkout), built in a temporary folder."""
    return build_tarball(Path(sys.executable).parent, tmp_path_factory.mktemp("build"))
