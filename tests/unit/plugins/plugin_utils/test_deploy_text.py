"""The texts of the llm_server role's result (plugins/plugin_utils/_deploy_text.py): the cause of a failed task and
the parity line."""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_text import failure_cause, parity_text

PRINTED = {"msg": "non-zero return code 125", "rc": 125, "cmd": ["podman", "run"], "stderr": "Error: e",
           "module_stderr": "m", "stdout": "o"}
MODULE_FAILURE = {"msg": "MODULE FAILURE", "rc": 1, "module_stderr": "Traceback\nKeyError: 'x'\n"}


@pytest.mark.parametrize("result, task, cause", [
    # a failed command is told by its last three printed lines: stderr, else module_stderr, else stdout
    ({"msg": "non-zero return code", "rc": 2, "cmd": "podman pull x", "stdout": "a\n\n  b  \nc\nd\n"}, None,
     "podman pull x failed (rc=2): b | c | d"),
    (PRINTED, None, "podman run failed (rc=125): Error: e"),
    (dict(PRINTED, stderr=""), None, "podman run failed (rc=125): m"),
    (dict(PRINTED, stderr="", module_stderr=None), None, "podman run failed (rc=125): o"),
    # a module failure is named by its command, else the task, else as a command
    (MODULE_FAILURE, {"name": "Read the host"}, "Read the host failed (rc=1): Traceback | KeyError: 'x'"),
    (MODULE_FAILURE, None, "a command failed (rc=1): Traceback | KeyError: 'x'"),
    (dict(MODULE_FAILURE, cmd="podman ps"), {"name": "Read"}, "podman ps failed (rc=1): Traceback | KeyError: 'x'"),
    # a command is shown up to 120 characters
    ({"rc": 1, "cmd": ["p" * 59, "q" * 60], "stderr": "boom"}, None, "%s %s failed (rc=1): boom" % ("p" * 59, "q" * 60)),
    ({"rc": 1, "cmd": "r" * 121, "stderr": "boom"}, None, "%s... failed (rc=1): boom" % ("r" * 117)),
    # a message is the cause, without the role's prefix
    ({"msg": "  llm_server: refused x  ", "stderr": "ignored"}, None, "refused x"),
    ({"msg": "Could not find image", "stderr": "e", "rc": 1}, None, "Could not find image"),
    ({"msg": "say llm_server: x"}, None, "say llm_server: x"),
    # a cause given by the module comes first
    ({"msg": "llm_server: x", "cause": "llama-server exited: boom"}, None, "llama-server exited: boom"),
    ({"msg": "non-zero return code", "stderr": "e", "cause": 7}, None, "7"),
    # without message or output, the task is named
    ({"msg": "non-zero return code", "rc": 1, "stderr": " \n"}, None, "non-zero return code"),
    ({}, {"name": "Write"}, "the task Write failed"),
    (None, None, "the task ? failed"),
    ({"msg": "  "}, {}, "the task ? failed"),
])
def test_failure_cause(result, task, cause):
    assert (failure_cause(result) if task is None else failure_cause(result, task)) == cause      # None: the default


NO_BASELINE = "no baseline (nothing served before this deploy)"
ON = {"parity_check": True}


@pytest.mark.parametrize("settings, parity, note, line", [
    # off unless asked for
    ({}, {"after": {"tokens": [1], "content": "x"}}, None, "off"),
    ({"parity_check": False}, {"after": {"tokens": [1], "content": "x"}}, None, "off"),
    # the tokens counted and the text shown
    (ON, {"before": {"tokens": [1, 2, 3]}, "after": {"tokens": [1, 2, 3], "content": "Hi \"you\""}}, None,
     'identical: 3 tokens "Hi \\"you\\""'),
    (ON, {"after": {"tokens": None, "content": None, "x": 1}}, None, 'identical: 0 tokens ""'),
    # without an answer after, why
    (ON, None, None, NO_BASELINE),
    (ON, {"before": {"tokens": [1]}}, None, NO_BASELINE),
    (ON, {}, "the server did not answer", "the server did not answer"),
])
def test_parity_text(settings, parity, note, line):
    assert (parity_text(settings, parity) if note is None else parity_text(settings, parity, note)) == line
