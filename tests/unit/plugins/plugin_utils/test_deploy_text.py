"""The texts of the llm_server role's result (plugins/plugin_utils/_deploy_text.py): the cause of a failed task and
the parity line."""
from __future__ import annotations

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_text import failure_cause, parity_text


def test_a_failed_command_is_told_by_its_last_three_printed_lines():
    result = {"msg": "non-zero return code", "rc": 2, "cmd": "podman pull x", "stdout": "a\n\n  b  \nc\nd\n"}
    assert failure_cause(result) == "podman pull x failed (rc=2): b | c | d"


def test_stderr_comes_before_module_stderr_and_stdout():
    result = {"msg": "non-zero return code 125", "rc": 125, "cmd": ["podman", "run"], "stderr": "Error: e",
              "module_stderr": "m", "stdout": "o"}
    assert failure_cause(result) == "podman run failed (rc=125): Error: e"
    assert failure_cause(dict(result, stderr="")) == "podman run failed (rc=125): m"
    assert failure_cause(dict(result, stderr="", module_stderr=None)) == "podman run failed (rc=125): o"


def test_a_module_failure_is_named_by_the_task_or_as_a_command():
    result = {"msg": "MODULE FAILURE", "rc": 1, "module_stderr": "Traceback\nKeyError: 'x'\n"}
    assert failure_cause(result, {"name": "Read the host"}) == "Read the host failed (rc=1): Traceback | KeyError: 'x'"
    assert failure_cause(result) == "a command failed (rc=1): Traceback | KeyError: 'x'"
    assert failure_cause(dict(result, cmd="podman ps"), {"name": "Read"}) == (
        "podman ps failed (rc=1): Traceback | KeyError: 'x'")


def test_a_command_is_shown_up_to_120_characters():
    exact = ["p" * 59, "q" * 60]
    assert failure_cause({"rc": 1, "cmd": exact, "stderr": "boom"}) == "%s failed (rc=1): boom" % " ".join(exact)
    longer = "r" * 121
    assert failure_cause({"rc": 1, "cmd": longer, "stderr": "boom"}) == "%s... failed (rc=1): boom" % ("r" * 117)


def test_a_message_is_the_cause_without_the_roles_prefix():
    assert failure_cause({"msg": "  llm_server: refused x  ", "stderr": "ignored"}) == "refused x"
    assert failure_cause({"msg": "Could not find image", "stderr": "e", "rc": 1}) == "Could not find image"
    assert failure_cause({"msg": "say llm_server: x"}) == "say llm_server: x"


def test_a_cause_given_by_the_module_comes_first():
    assert failure_cause({"msg": "llm_server: x", "cause": "llama-server exited: boom"}) == "llama-server exited: boom"
    assert failure_cause({"msg": "non-zero return code", "stderr": "e", "cause": 7}) == "7"


def test_without_message_or_output_the_task_is_named():
    assert failure_cause({"msg": "non-zero return code", "rc": 1, "stderr": " \n"}) == "non-zero return code"
    assert failure_cause({}, {"name": "Write"}) == "the task Write failed"
    assert failure_cause(None) == "the task ? failed"
    assert failure_cause({"msg": "  "}, {}) == "the task ? failed"


# parity_text


def test_the_parity_line_is_off_unless_asked_for():
    after = {"after": {"tokens": [1], "content": "x"}}
    assert parity_text({}, after) == "off"
    assert parity_text({"parity_check": False}, after) == "off"


def test_the_parity_line_counts_the_tokens_and_shows_the_text():
    parity = {"before": {"tokens": [1, 2, 3]}, "after": {"tokens": [1, 2, 3], "content": "Hi \"you\""}}
    assert parity_text({"parity_check": True}, parity) == 'identical: 3 tokens "Hi \\"you\\""'
    assert parity_text({"parity_check": True}, {"after": {"tokens": None, "content": None, "x": 1}}) == (
        'identical: 0 tokens ""')


def test_without_an_answer_after_the_parity_line_says_why():
    assert parity_text({"parity_check": True}, None) == "no baseline (nothing served before this deploy)"
    assert parity_text({"parity_check": True}, {"before": {"tokens": [1]}}) == (
        "no baseline (nothing served before this deploy)")
    assert parity_text({"parity_check": True}, {}, "the server did not answer") == "the server did not answer"
