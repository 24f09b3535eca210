"""What the module tests assert of a run through Ansible (the ``ansible_module`` fixture of tests/conftest.py): a
failure that is a clear message, never a traceback; the warnings Ansible shows for a run."""
from __future__ import annotations

import json
import re


def assert_clean_failure(result, *words):
    """``result`` failed with a message that holds every one of ``words``, with no traceback anywhere."""
    assert result["failed"] is True, result
    text = json.dumps(result)
    assert "Traceback" not in text and "module_stderr" not in result and "exception" not in result
    assert "Module failed" not in result["msg"]
    for word in words:
        assert word in result["msg"], result["msg"]


def run_with_warnings(ansible_module, log_path, module, args):
    """``ansible_module(module, args)`` and the ``[WARNING]`` lines Ansible shows for it (read from its log file,
    ``log_path``: the callback takes the warnings out of the result it prints)."""
    result = ansible_module(module, args, extra_env={"ANSIBLE_LOG_PATH": str(log_path)})
    with open(log_path, encoding="utf-8") as handle:
        return result, re.findall(r"\[WARNING\]: (.*)", handle.read())
