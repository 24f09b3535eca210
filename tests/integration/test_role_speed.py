"""The role's speed check on one local host (podman, podman-compose, the CPU image, the real llama-server), one
deploy, steps in order:

- the first deploy measures the speed through llama-server's /completion: positive figures, the prompt and the
  generated tokens as the server counted them, no previous speed and so no ratios, and the host's calibration
  solved from them, recorded in verification.json; its plan was not calibrated;
- the same run again changes nothing and measures nothing: the result republishes the recorded speed, and its
  plan, made with the recorded calibration, says it is calibrated;
- a changed configuration measured with a one-token prompt and ``llm_server_min_prompt_ratio`` 0.5 fails the
  verification and is rolled back, the message naming the speed, its share and the variable; the result keeps
  the speed recorded for the configuration put back.

Run under the podman lock: ``flock /tmp/ai-llm-podman.lock python -m pytest tests/integration/test_role_speed.py``.
"""
from __future__ import annotations

import re
import shutil

import pytest

from tests.helpers.llm_deploy import local_deploy, recap, result

pytestmark = pytest.mark.skipif(not shutil.which("podman") or not shutil.which("podman-compose"),
                                reason="needs podman and podman-compose")

FIRST_PROMPT = 256


def deploy_run(deploy, **role_vars):
    proc = deploy.playbook("deploy", **role_vars)
    output = proc.stdout + "\n" + proc.stderr
    assert recap(proc.stdout), output[-5000:]
    return {"rc": proc.returncode, "output": output, "result": result(proc.stdout) or {}}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The demo model deployed once, its speed measured with a prompt of FIRST_PROMPT tokens."""
    with local_deploy(tmp_path_factory.mktemp("speed"), "ai-llm-speed") as deploy:
        deploy.first = deploy_run(deploy, llm_server_speed_prompt_tokens=FIRST_PROMPT)
        yield deploy


def test_the_first_deploy_measures_the_speed_without_a_previous_one(served):
    run = served.first
    assert run["rc"] == 0, run["output"][-5000:]
    speed = run["result"]["speed"]
    assert (speed["runs"], speed["prompt_tokens"], speed["predicted_tokens"]) == (1, FIRST_PROMPT, 4)
    for key in ("decode_tokens_per_second", "prompt_tokens_per_second"):
        assert isinstance(speed[key], float) and speed[key] > 0, speed
    assert (speed["previous"], speed["decode_ratio"], speed["prompt_ratio"]) == (None, None, None)
    assert speed["calibration"]["host_bytes_per_second"] > 0, speed
    assert speed["calibration"]["measured"]["decode_tokens_per_second"] == speed["decode_tokens_per_second"]
    assert run["result"]["plan"]["speed"]["calibrated"] is False
    assert served.verification()["speed"] == speed


def test_a_run_that_changes_nothing_republishes_the_recorded_speed(served):
    run = deploy_run(served, llm_server_speed_prompt_tokens=FIRST_PROMPT)
    assert run["rc"] == 0 and run["result"]["status"] == "unchanged", run["output"][-5000:]
    assert run["result"]["speed"] == served.first["result"]["speed"]
    assert run["result"]["plan"]["speed"]["calibrated"] is True


def test_a_change_below_the_minimum_prompt_ratio_is_rolled_back_naming_the_speed(served):
    """The gate's decision from real figures set up to differ: llama-server decodes a prompt in batches (n_batch
    tokens at a time, tools/server/server-context.cpp), so a prompt of one token pays the whole per-batch cost for one
    token while FIRST_PROMPT tokens share it; on the demo model the one-token prompt runs at a small fraction of
    the first deploy's prompt tokens/s (about 0.13 measured), far below 0.5 whatever the machine's load. The
    changed context size makes it a new configuration, recreated and verified."""
    previous = served.first["result"]["speed"]
    run = deploy_run(served, llm_server_ctx_size=384, llm_server_speed_prompt_tokens=1,
                     llm_server_min_prompt_ratio=0.5)
    got = run["result"]
    assert run["rc"] != 0 and got["status"] == "rolled_back", run["output"][-5000:]
    match = re.search(r"prompt (\d+\.\d) tokens/s is (\d\.\d\d) of the previous (\d+\.\d), below "
                      r"llm_server_min_prompt_ratio 0\.5", got["message"])
    assert match, got["message"]
    now, share, before = (float(g) for g in match.groups())
    assert before == round(previous["prompt_tokens_per_second"], 1)
    assert share < 0.5 and share == pytest.approx(now / before, abs=0.01)
    assert got["config_hash"] == served.first["result"]["config_hash"]
    # what serves again is the first configuration: its recorded speed, the previous one of the next change
    assert got["speed"] == previous and served.verification()["speed"] == previous
