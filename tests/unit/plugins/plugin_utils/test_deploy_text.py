"""The texts of the llm_server role's result (plugins/plugin_utils/_deploy_text.py): the cause of a failed task, the
parity line and the one line per host of the default verbosity."""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_text import failure_cause, parity_text, result_line

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


# llm_server_result as the demo's deploy published it (verification.json of scripts/demo.sh), the keys the line reads
DEMO = {"host": "localhost", "status": "changed", "pattern": "\\.ffn_.*_exps\\.weight", "pattern_source": "plan",
        "tensors_moved": ["blk.1.ffn_down_exps.weight", "blk.1.ffn_up_exps.weight", "blk.4.ffn_down_exps.weight",
                          "blk.4.ffn_up_exps.weight"],
        "plan": {"gpus": [], "host": {"available_mib": 23507.13, "experts_mib": 8.44}},
        "timings": {"health": 0.03, "lock_wait": 0.3, "recreate": 0.431, "total": 4.776},
        "message": "the configuration changed"}
GPU_PLAN = {"gpus": [{"index": 0}], "host": {"experts_mib": 16864.25}}
SPEED = {"decode_tokens_per_second": 41.25, "prompt_tokens_per_second": 812.0}


@pytest.mark.parametrize("result, line", [
    (DEMO, "localhost: changed, --override-tensor \\.ffn_.*_exps\\.weight=CPU (plan), 4 tensors in host memory, "
           "no GPU, 4.8 s"),
    # on a GPU host the routed experts' MiB are the VRAM the pattern frees; a measured speed is shown
    (dict(DEMO, plan=GPU_PLAN, speed=SPEED, status="unchanged"),
     "localhost: unchanged, --override-tensor \\.ffn_.*_exps\\.weight=CPU (plan), 4 tensors in host memory, "
     "16,864.2 MiB of VRAM freed, decode 41.2, prompt 812.0 tokens/s, 4.8 s"),
    (dict(DEMO, plan=dict(GPU_PLAN, host={}), speed={"decode_tokens_per_second": 3.0, "prompt_tokens_per_second": None}),
     "localhost: changed, --override-tensor \\.ffn_.*_exps\\.weight=CPU (plan), 4 tensors in host memory, "
     "0.0 MiB of VRAM freed, decode 3.0, prompt 0.0 tokens/s, 4.8 s"),
    # no pattern, no plan (check mode of a refusal has none), no time
    ({"host": "h", "status": "checked", "pattern": "", "tensors_moved": None, "plan": None, "timings": {}},
     "h: checked, no offload pattern, 0 tensors in host memory"),
    # a failure or a rollback says why, cut at 400 characters
    (dict(DEMO, status="failed", message="llama-server exited: boom"), "localhost: failed: llama-server exited: boom, 4.8 s"),
    (dict(DEMO, status="rolled_back", message="m" * 401, timings=None),
     "localhost: rolled_back: " + "m" * 397 + "..."),
    ({}, "?: ?, no offload pattern, 0 tensors in host memory"),
    # a model this run fetched: its MiB and seconds; none fetched says nothing
    (dict(DEMO, model_fetch={"bytes": 3 * 2 ** 20 + 2 ** 19, "seconds": 12.34}),
     "localhost: changed, --override-tensor \\.ffn_.*_exps\\.weight=CPU (plan), 4 tensors in host memory, "
     "no GPU, model fetched: 3.5 MiB in 12.3 s, 4.8 s"),
    (dict(DEMO, model_fetch={"bytes": 0, "seconds": 0.2}),
     "localhost: changed, --override-tensor \\.ffn_.*_exps\\.weight=CPU (plan), 4 tensors in host memory, "
     "no GPU, 4.8 s"),
])
def test_result_line(result, line):
    assert result_line(result) == line
