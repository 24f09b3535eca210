"""What the role reads of the ai-llm container (plugins/module_utils/_deploy_container.py), on real podman
containers of the CPU image: state, label, processes, pause, exit, removal, and the wait for /health that stops at
once with the cause when the container exits (the cause line and the compose tool choice alone:
tests/unit/plugins/module_utils/test_deploy_container.py).

Run under the podman lock: ``flock /tmp/ai-llm-podman.lock python -m pytest tests/integration/test_role_container.py``.
"""
from __future__ import annotations

import shlex
import shutil
import subprocess
import time
import uuid

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_container import (
    container_state,
    log_tail,
    wait_healthy,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._host_memory import process_tree
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_render import HASH_LABEL
from tests.helpers.llama_server import SERVER, free_port, llama_server
from tests.helpers.llm_deploy import cpu_image
from tools.gguf_models import write_tiny_nemotron_h_moe

podman = pytest.mark.skipif(not shutil.which("podman"), reason="needs podman")
# llama.cpp's own words: src/llama-model-loader.cpp check_tensor_dims ("%s: tensor '%s' has wrong shape; expected
# %s, got %s"), the loader's "error loading model" and tools/server/server.cpp's "exiting due to model loading error".
LOAD_FAILURE = [
    "load_tensors: loading model tensors, this can take a while... (mmap = true)",
    "llama_model_load: error loading model: check_tensor_dims: tensor 'token_embd.weight' has wrong shape; "
    "expected   128,   512, got   256,   512,     1,     1",
    "llama_model_load_from_file_impl: failed to load model",
    "srv    load_model: failed to load model, '/models/wrong-shape.gguf'",
    "srv   operator(): operator(): cleaning up before exit...",
    "main: exiting due to model loading error",
]


def run(argv):
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture
def container():
    """Start a container of the CPU image with a shell command; removed afterwards."""
    names = []

    def start(script, label="h" * 64, options=()):
        name = "ai-llm-container-" + uuid.uuid4().hex[:8]
        names.append(name)
        subprocess.run(["podman", "run", "-d", "--init", "--name", name, "--label", "%s=%s" % (HASH_LABEL, label)]
                       + list(options) + ["--entrypoint", "/bin/sh", cpu_image(), "-c", script], check=True,
                       capture_output=True, timeout=120)
        return name
    yield start
    for name in names:
        subprocess.run(["podman", "rm", "--force", name], capture_output=True, check=False, timeout=120)


@podman
def test_state_label_processes_pause_and_removal(container):
    name = container("sleep 600 & sleep 600")
    state = container_state(run, "podman", name)
    assert state["exists"] and state["status"] == "running" and state["running"]
    assert state["config_hash"] == "h" * 64 and state["restarts"] == 0
    assert state["image"] == cpu_image() and state["started_at"] and state["exit_code"] == 0
    pids = process_tree(state["pid"])
    assert pids[0] == state["pid"] and len(pids) >= 3  # the init, the shell and its sleeps
    subprocess.run(["podman", "pause", name], check=True, capture_output=True, timeout=60)
    assert container_state(run, "podman", name)["status"] == "paused"
    subprocess.run(["podman", "unpause", name], check=True, capture_output=True, timeout=60)
    subprocess.run(["podman", "stop", "-t", "1", name], check=True, capture_output=True, timeout=60)
    stopped = container_state(run, "podman", name)
    assert stopped["exists"] and not stopped["running"] and stopped["status"] in ("exited", "stopped")
    subprocess.run(["podman", "rm", name], check=True, capture_output=True, timeout=60)
    assert container_state(run, "podman", name) == {"exists": False, "status": "missing"}


@podman
def test_the_wait_stops_at_once_with_the_cause_when_the_container_exits(container):
    name = container("sleep 1; printf '%%s\\n' %s >&2; exit 1" % " ".join(shlex.quote(line) for line in LOAD_FAILURE))
    start = time.monotonic()
    answer = wait_healthy(run, "podman", name, "http://127.0.0.1:%d/health" % free_port(), timeout=120)
    assert time.monotonic() - start < 60
    assert not answer["healthy"] and answer["container"]["status"] in ("exited", "stopped")
    assert answer["cause"] == "llama-server exited: " + LOAD_FAILURE[1]
    assert LOAD_FAILURE[-1] in answer["log_tail"]


@podman
def test_the_wait_times_out_with_the_last_answer_and_the_log(container):
    """The wait ends when ``timeout`` seconds have passed (>=), with the container's log lines and the time in
    milliseconds: on the real clock, then on a given clock and pause (the container and the dead port are real)."""
    name = container("echo 'E first words' >&2; sleep 600")
    deadline = time.monotonic() + 60
    while not log_tail(run, "podman", name) and time.monotonic() < deadline:
        time.sleep(0.2)
    cause = "ai-llm did not answer /health with 200 within 2 s (last answer: no answer)"
    answer = wait_healthy(run, "podman", name, "http://127.0.0.1:%d/health" % free_port(), timeout=2)
    assert answer == {"healthy": False, "seconds": answer["seconds"], "status": -1, "container": answer["container"],
                      "log_tail": ["E first words"], "cause": cause, "waiting": False}
    assert 2 <= answer["seconds"] < 30 and answer["container"]["running"]
    ticks = iter([0.0, 2.0, 2.12345, 5.0, 6.0, 7.0])
    pauses = []
    answer = wait_healthy(run, "podman", name, "http://127.0.0.1:%d/health" % free_port(), timeout=2,
                          clock=lambda: next(ticks), sleep=pauses.append)
    assert pauses == [] and answer["seconds"] == 2.123 and answer["log_tail"] == ["E first words"]
    assert answer["cause"] == cause


@podman
def test_a_wait_in_pieces_says_where_the_start_is_and_counts_every_piece(container):
    """A piece returns after ``for_at_most`` seconds while ai-llm starts, with the stage its log shows (the line
    tools/server/server-context.cpp load_model prints first); the next piece carries on from the seconds waited and
    the restart count, and the last one ends at ``timeout`` counted over all of them."""
    name = container("echo \"srv    load_model: loading model '/models/x.gguf'\" >&2; sleep 600")
    deadline = time.monotonic() + 60
    while not log_tail(run, "podman", name) and time.monotonic() < deadline:
        time.sleep(0.2)
    url = "http://127.0.0.1:%d/health" % free_port()
    piece = wait_healthy(run, "podman", name, url, timeout=30, for_at_most=1)
    assert piece["waiting"] and not piece["healthy"] and piece["cause"] is None
    assert piece["stage"] == "reading the model's header" and 1 <= piece["seconds"] < 30
    last = wait_healthy(run, "podman", name, url, timeout=3, for_at_most=10, waited=piece["seconds"],
                        restarts=piece["container"]["restarts"])
    assert not last["waiting"] and last["cause"] == "ai-llm did not answer /health with 200 within 3 s (last answer: no answer)"
    assert 3 <= last["seconds"] < 30


@podman
def test_the_wait_names_the_exit_code_when_the_container_says_nothing(container):
    name = container("sleep 1; exit 3")
    start = time.monotonic()
    answer = wait_healthy(run, "podman", name, "http://127.0.0.1:%d/health" % free_port(), timeout=120)
    elapsed = time.monotonic() - start
    assert isinstance(answer["seconds"], float) and -0.001 <= elapsed - answer["seconds"] < 0.5
    assert not answer["healthy"] and answer["log_tail"] == [] and answer["container"]["exit_code"] == 3
    assert answer["cause"] == "the container %s is %s (exit code 3)" % (name, answer["container"]["status"])


@podman
def test_the_wait_stops_when_the_container_restarts_though_it_runs_again(container):
    """podman restarts a container of ``--restart=always`` at once: read after the restart, it runs again and only
    its RestartCount tells; the wait stops there instead of waiting for the timeout. (The pause between the reads
    lasts until podman shows the restart, so that no read falls in the instant the container is stopped.)"""
    name = container("if [ -e /tmp/ran ]; then sleep 600; fi; touch /tmp/ran; sleep 3; exit 5",
                     options=["--restart=always"])
    pauses = []

    def until_restarted(seconds):
        pauses.append(seconds)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = container_state(run, "podman", name)
            if state["restarts"] and state["running"]:
                return
            time.sleep(0.1)

    answer = wait_healthy(run, "podman", name, "http://127.0.0.1:%d/health" % free_port(), timeout=20,
                          sleep=until_restarted)
    assert pauses == [0.5], answer
    assert not answer["healthy"] and answer["status"] == -1 and answer["log_tail"] == []
    assert answer["container"]["restarts"] == 1 and answer["container"]["running"]
    assert answer["cause"] == "the container %s restarted 1 time(s) and wrote no log line" % name


@podman
def test_a_restarted_container_is_named_by_the_load_error_of_the_run_that_ended(container):
    """The restart policy starts llama-server again after its load error; by the time the wait reads the log, the
    new run has printed more lines than the tail it keeps: the cause and the lines are those of the run that ended.
    (llama.cpp's lines: common's ``system_info: n_threads = ...``, the server's ``load_model: loading model '...'``
    that start a run, and the model description of ``print_info``.)"""
    starting = ["system_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : SSE3 = 1 | AVX2 = 1 |",
                "srv    load_model: loading model '/models/wrong-shape.gguf'"]
    describing = ["print_info: n_embd           = %d" % n for n in range(60)]
    script = ("if [ -e /tmp/ran ]; then printf '%%s\\n' %s >&2; sleep 600; fi; touch /tmp/ran; sleep 3; "
              "printf '%%s\\n' %s >&2; exit 1") % (
        " ".join(shlex.quote(line) for line in starting + describing),
        " ".join(shlex.quote(line) for line in starting + LOAD_FAILURE))
    name = container(script, options=["--restart=always"])

    def until_the_new_run_printed(_seconds):  # the first read saw the first run (3 s before its error)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and log_tail(run, "podman", name, 1) != [describing[-1]]:
            time.sleep(0.1)

    answer = wait_healthy(run, "podman", name, "http://127.0.0.1:%d/health" % free_port(), timeout=20,
                          sleep=until_the_new_run_printed)
    assert answer["container"]["restarts"] == 1 and answer["container"]["running"], answer
    assert answer["cause"] == "llama-server exited: " + LOAD_FAILURE[1]
    assert answer["log_tail"] == starting + LOAD_FAILURE


@podman
@pytest.mark.skipif(SERVER is None, reason="llama-server is not on PATH (bash scripts/setup.sh; source scripts/env.sh)")
def test_the_wait_ends_at_the_first_200_while_the_container_runs(container, tmp_path):
    """The wait asks the container's state, then /health: a running container and a real llama-server's 200."""
    name = container("sleep 600")
    model = write_tiny_nemotron_h_moe(str(tmp_path / "tiny.gguf"))
    with llama_server(["-m", model, "-c", "256", "--no-webui"], timeout=120) as server:
        assert server.healthy, server.stderr
        answer = wait_healthy(run, "podman", name, server.url + "/health", timeout=60)
    assert answer == {"healthy": True, "seconds": answer["seconds"], "status": 200, "container": answer["container"],
                      "cause": None, "log_tail": [], "waiting": False}
    assert 0 <= answer["seconds"] < 60 and isinstance(answer["seconds"], float)
    assert answer["container"]["running"] and answer["container"]["config_hash"] == "h" * 64
