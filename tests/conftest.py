"""Shared pytest set-up.

Makes ``ansible_collections.ai_llm.moe_offload`` importable from this checkout (the
``.collections`` link made by ``scripts/setup.sh``) and offers fixtures that run modules
through Ansible itself.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
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


def run_ansible_module(module, args, check=False, extra_env=None):
    """Run ``ai_llm.moe_offload.<module>`` (or a FQCN) on localhost through ``ansible``.

    Returns the module's result dict (with ``failed``/``msg`` on failure).
    """
    fqcn = module if "." in module else "ai_llm.moe_offload." + module
    env = dict(os.environ)
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


@pytest.fixture
def ansible_module():
    """The ``run_ansible_module`` function, as a fixture."""
    return run_ansible_module
