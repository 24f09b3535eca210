"""What an operator sees of playbooks/deploy.yml on one local host (podman, the CPU image, the real llama-server),
at the default verbosity and with the YAML results of ansible.cfg: a changed run and a run that changes nothing
each print one line per host that says what happened, and not the whole result (that is for -v); a misspelt
variable is warned about once with the closest name, and refused before anything changes with
llm_server_strict_variables; while ai-llm starts, the wait says every few seconds how long it has waited and where
the start is (a start slowed by 20 s in front of the image's own start command: the server is real).

Run under the podman lock: ``flock /tmp/ai-llm-podman.lock python -m pytest tests/integration/test_role_output.py``.
"""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.helpers.llm_deploy import cpu_image, local_deploy, recap

pytestmark = pytest.mark.skipif(not shutil.which("podman") or not shutil.which("podman-compose"),
                                reason="needs podman and podman-compose")

# the line the role says of each host (the status, then what was done or why not)
SAID = re.compile(r"^localhost: (?:changed|unchanged|failed|rolled_back|checked)\b.*$", re.MULTILINE)
TYPO = ("[WARNING]: llm_server_ctxsize: no variable of the llm_server role or of the collection's playbooks has this "
        "name; did you mean llm_server_ctx_size?")


def run(deploy, *args, **role_vars):
    """deploy.yml at the default verbosity as the demo shows it (ansible.cfg's YAML results, skipped tasks hidden):
    the output, its recap and the per-host line."""
    cmd, env = deploy.command("deploy", *args, verbosity=0, **role_vars)
    env.update(ANSIBLE_CALLBACK_RESULT_FORMAT="yaml", ANSIBLE_DISPLAY_SKIPPED_HOSTS="false")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(deploy.root), timeout=600,
                          check=False)
    said = SAID.findall(proc.stdout)
    assert len(said) <= 1, said  # one line per host
    return {"rc": proc.returncode, "out": proc.stdout + proc.stderr, "recap": recap(proc.stdout),
            "line": said[0] if said else None}


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    with local_deploy(tmp_path_factory.mktemp("output"), "ai-llm-output") as deploy:
        yield deploy


def test_a_changed_run_and_a_run_that_changes_nothing_say_one_line_and_show_no_result(local):
    first = run(local)
    assert first["rc"] == 0, first["out"][-4000:]
    assert re.fullmatch(r"localhost: changed, --override-tensor \\\.ffn_\.\*_exps\\\.weight=CPU \(plan\), "
                        r"4 tensors in host memory, no GPU, decode \d+\.\d, prompt \d+\.\d tokens/s, \d+\.\d s", first["line"]), first["line"]
    again = run(local)
    assert again["rc"] == 0 and again["recap"]["changed"] == 0, again["out"][-4000:]
    assert re.fullmatch(r"localhost: unchanged, --override-tensor \\\.ffn_\.\*_exps\\\.weight=CPU \(plan\), "
                        r"4 tensors in host memory, no GPU, decode \d+\.\d, prompt \d+\.\d tokens/s, \d+\.\d s", again["line"]), again["line"]
    for output in (first["out"], again["out"]):
        assert "tensors_moved" not in output and "config_hash" not in output  # (keys of the whole result)
    # less than one screen: the plays, four tasks of two or three lines, the recap and the closing table
    assert len(again["out"].splitlines()) <= 30, again["out"]


def test_a_misspelt_variable_is_warned_once_and_refused_with_the_strict_switch_before_any_change(local):
    before = (local.project / ".env").read_text(), local.container()
    warned = run(local, "-e", "llm_server_ctxsize=4096")
    assert warned["rc"] == 0 and warned["recap"]["changed"] == 0, warned["out"][-4000:]
    assert warned["out"].count(TYPO) == 1
    refused = run(local, "-e", "llm_server_ctxsize=4096", "-e", "llm_server_strict_variables=true")
    assert refused["rc"] != 0 and refused["recap"]["changed"] == 0
    assert refused["line"] == ("localhost: failed: this value cannot be deployed on localhost: llm_server_ctxsize: no "
                               "variable of the llm_server role or of the collection's playbooks has this name; did "
                               "you mean llm_server_ctx_size?. Nothing was changed.")
    assert "argument_spec" not in refused["out"]
    assert ((local.project / ".env").read_text(), local.container()) == before
    # a value of the wrong type: the role's one line, not ansible-core's dump of the argument spec
    wrong = run(local, "-e", "llm_server_ctx_size=abc")
    assert wrong["rc"] != 0 and "argument_spec" not in wrong["out"]
    assert wrong["line"] == ('localhost: failed: this value cannot be deployed on localhost: llm_server_ctx_size: '
                             '"abc" is not an integer from 1 to 2147483647. Nothing was changed.')


def slow_image(root):
    """The CPU image whose start waits 20 s before the image's own start command (a slow model load, as the wait
    sees it); built from a Containerfile without RUN, in about a second."""
    base = cpu_image()
    tag = "localhost/ai-llm-slow-start:" + base.rsplit(":", 1)[-1]
    (root / "Containerfile").write_text(
        "FROM %s\nENTRYPOINT [\"/bin/sh\", \"-c\", \"sleep 20; exec /usr/local/bin/start-llama-server \\\"$@\\\"\", "
        "\"start\"]\n" % base)
    subprocess.run(["podman", "build", "-q", "-t", tag, str(root)], check=True, capture_output=True, timeout=300)
    return tag


def test_the_wait_says_how_long_it_has_waited_while_ai_llm_starts(local, tmp_path):
    slow = run(local, llm_server_image=slow_image(tmp_path))
    assert slow["rc"] == 0, slow["out"][-4000:]
    # one line per piece of 5 s; on a loaded machine a later piece may already see llama-server loading
    lines = re.findall(r"^localhost: waiting for /health, (\d+) s of 60 s: (.+)$", slow["out"], re.MULTILINE)
    waited = [int(s) for s, _stage in lines]
    assert len(waited) >= 2 and waited == sorted(waited) and waited[0] >= 5, slow["out"][-4000:]
    assert lines[0][1] == "starting", lines
    assert slow["line"].startswith("localhost: changed, ")
