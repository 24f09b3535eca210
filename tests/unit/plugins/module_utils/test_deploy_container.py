"""The container reads of plugins/module_utils/_deploy_container.py that need no running container (the real
podman-compose and podman where their own answers count, llama.cpp's own log lines). The running-container paths are
in tests/integration/test_role_container.py; /health and the API key probe on a real llama-server in
tests/integration/test_container_http.py."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _deploy_container
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_container import (
    COMPOSE_CANDIDATES,
    COMPOSE_INSTALL,
    DOCKER_CDI_FORMAT,
    podman_compose_provider,
    docker_server,
    gpu_access_check,
    server_engine,
    compose_config_check,
    container_state,
    docker_gpu_access,
    ended_run,
    engine_gpu_access,
    engine_of,
    exit_cause,
    find_compose,
    log_tail,
    major_version,
    wait_healthy,
)
from tests.helpers.llm_deploy import start_docker

PODMAN = shutil.which("podman")
podman = pytest.mark.skipif(PODMAN is None, reason="needs podman")
PODMAN_COMPOSE = shutil.which("podman-compose", path=os.path.dirname(sys.executable)) or shutil.which("podman-compose")
compose = pytest.mark.skipif(PODMAN_COMPOSE is None, reason="needs podman-compose (requirements/dev.txt)")


def run(argv):
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize("argv, engine", [
    (["podman", "compose"], "podman"), (["/usr/bin/podman-compose"], "podman"),
    (["/opt/venv/bin/podman-compose", "--podman-path", "/usr/bin/podman"], "podman"), (["docker", "compose"], "docker"),
    (["/usr/local/bin/docker-compose"], "docker"),
    (["/opt/podman/bin/docker-compose"], "docker"),  # the program's name counts, not its folder
])
def test_the_engine_is_podman_only_for_podman_s_compose_programs(argv, engine):
    assert engine_of(argv) == engine


def recording_run(failing=()):
    """A ``run(argv)`` for the version probes of the compose tools (compose v2): rc 1 for the programs in ``failing``."""
    calls = []

    def probe(argv):
        calls.append(list(argv))
        return (1, "", "unknown command") if argv[0] in failing else (0, "2.40.3\n", "")
    return probe, calls


ALL = {"podman": "/usr/bin/podman", "podman-compose": "/usr/bin/podman-compose", "docker": "/usr/bin/docker",
       "docker-compose": "/usr/bin/docker-compose"}
NO_PODMAN_COMPOSE = {"podman": "/usr/bin/podman", "docker": "/usr/bin/docker", "docker-compose": "/usr/bin/dc"}


@pytest.mark.parametrize("found, failing, given, command, probed", [
    (ALL, (), None, ["podman", "compose"], ["/usr/bin/podman"]),  # asked by the path `which` found
    (ALL, ("/usr/bin/podman",), None, ["podman-compose"], ["/usr/bin/podman"]),
    # a compose subcommand that fails its version probe is passed over; podman-compose is not probed
    (NO_PODMAN_COMPOSE, ("/usr/bin/podman",), None, ["docker", "compose"], ["/usr/bin/podman", "/usr/bin/docker"]),
    (NO_PODMAN_COMPOSE, ("/usr/bin/podman", "/usr/bin/docker"), None, ["docker-compose"],
     ["/usr/bin/podman", "/usr/bin/docker", "/usr/bin/dc"]),
    ({"podman-compose": "/venv/bin/podman-compose"}, (), None, ["podman-compose"], []),
    ({"docker-compose": "/usr/bin/docker-compose"}, (), None, ["docker-compose"], ["/usr/bin/docker-compose"]),
    ({}, (), None, None, []),
    ({"docker-compose": "/usr/bin/docker-compose"}, ("/usr/bin/docker-compose",), None, None, ["/usr/bin/docker-compose"]),
    ({}, (), ["podman-compose", "--verbose"], ["podman-compose", "--verbose"], []),
    ({}, (), [], None, []),  # an empty command is no command
])
def test_the_compose_tools_are_tried_in_the_documented_order(found, failing, given, command, probed):
    assert COMPOSE_CANDIDATES == (("podman", "compose"), ("podman-compose",), ("docker", "compose"),
                                  ("docker-compose",))
    probe, calls = recording_run(failing)
    assert find_compose(probe, found.get, given=given)[0] == command
    assert [argv[0] for argv in calls] == probed


DOUBLES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "doubles")
DOCKER = shutil.which("docker")


def only(name, path):
    """A ``which`` that finds ``name`` at ``path`` and nothing else."""
    return lambda program: path if program == name else None


@pytest.mark.parametrize("text, major", [
    ("1.29.2\n", 1), ("docker-compose version 1.29.2, build unknown", 1), ("v2.40.3", 2),
    ("Docker Compose version v2.40.3", 2), ("podman-compose version 1.6.0", 1), ("", None), ("unknown command", None),
])
def test_the_major_version_is_read_from_what_compose_tools_print(text, major):
    assert major_version(text) == major


@pytest.mark.parametrize("info, access", [
    ('25.0.3 ["/etc/cdi","/var/run/cdi"]', "cdi"), ('28.5.1 ["/etc/cdi"]', "cdi"),
    ("25.0.3 []", "reservations"), ("25.0.3 null", "reservations"),  # CDI off
    ('24.0.7 ["/etc/cdi"]', "reservations"), ("", "reservations"),  # before 25; the template failed
])
def test_docker_gets_cdi_names_from_25_on_with_cdi_enabled(info, access):
    assert docker_gpu_access(info) == access


def test_podman_names_cdi_devices_and_this_docker_20_10_reserves_them():
    assert engine_gpu_access(None, "podman") == "cdi"
    why = start_docker()
    if why:
        pytest.skip(why)
    version = run(["docker", "version", "--format", "{{.Server.Version}}"])[1]
    assert version.startswith("20.10."), version
    assert run(["docker", "info", "--format", DOCKER_CDI_FORMAT])[0] != 0  # no CDISpecDirs before 25
    assert engine_gpu_access(run, "docker") == "reservations"


def test_compose_v1_is_refused_with_the_reason_and_what_to_install():
    double = os.path.abspath(os.path.join(DOUBLES, "docker-compose"))  # prints compose v1's version (not installed)
    command, problem = find_compose(run, only("docker-compose", double))
    assert command is None
    assert problem.startswith("docker-compose 1.29.2 is compose v1, which is not supported; ")
    assert problem.endswith(COMPOSE_INSTALL)


def test_a_host_without_compose_gets_one_message_that_says_what_to_install():
    assert find_compose(run, lambda program: None) == (None, COMPOSE_INSTALL)
    assert "podman-compose" in COMPOSE_INSTALL and "compose v2" in COMPOSE_INSTALL


@pytest.mark.skipif(DOCKER is None or run([DOCKER, "compose", "version"])[0] != 0,
                    reason="needs docker with the compose v2 plugin (bash scripts/setup.sh)")
def test_the_real_docker_compose_v2_is_chosen():
    assert find_compose(run, only("docker", DOCKER)) == (["docker", "compose"], None)


COMPOSE = """services:
  ai-llm:
    image: localhost/ai-llm:cpu
    environment:
      CTX_SIZE: ${CTX_SIZE:?CTX_SIZE must be set in .env}
"""


@compose
def test_compose_reads_the_env_file_next_to_the_compose_file(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where mkdtemp puts the copies, for this test alone
    assert compose_config_check(run, [PODMAN_COMPOSE], "docker-compose.prod.yml", "CTX_SIZE=4096\n", COMPOSE) is None
    problem = compose_config_check(run, [PODMAN_COMPOSE], "docker-compose.prod.yml", "PARALLEL=1\n", COMPOSE)
    assert problem.startswith("%s config refused it (rc=" % PODMAN_COMPOSE), problem
    assert "CTX_SIZE must be set in .env" in problem
    assert "\n" not in problem
    assert os.listdir(tmp_path) == []  # the temporary copies are removed


@podman
def test_a_missing_container_as_podman_reports_it_and_another_engine_error_is_unknown():
    name = "ai-llm-never-created-0f3c"
    assert container_state(run, "podman", name) == {"exists": False, "status": "missing"}
    assert log_tail(run, "podman", name) == []
    answer = wait_healthy(run, "podman", name, "http://127.0.0.1:9/health", timeout=30)
    assert answer == {"healthy": False, "seconds": answer["seconds"], "status": None,
                      "container": {"exists": False, "status": "missing"},
                      "cause": "the container %s is gone (removed)" % name, "log_tail": [], "waiting": False}
    assert 0 <= answer["seconds"] < 30  # no wait for a container that is not there
    _rc, out, err = run([PODMAN, "container", "inspect", "--no-such-option-here"])
    state = container_state(run, PODMAN, "--no-such-option-here")
    assert state == {"exists": False, "status": "unknown", "error": (err or out).strip().splitlines()[-1]}


def replying(rc, out, err=""):
    def answer(_argv):
        return rc, out, err
    return answer


def test_inspect_without_json_is_unknown_not_missing_and_paused_or_restarting_wins_over_the_status():
    """docker reports a paused container with State.Status "paused" and Paused true, a restarting one with
    Restarting true; either flag decides, and a container without a status is "unknown"."""
    assert container_state(replying(0, "not json"), "podman", "ai-llm") == {
        "exists": False, "status": "unknown", "error": "podman inspect printed no JSON"}
    assert container_state(replying(0, "[]"), "docker", "ai-llm") == {
        "exists": False, "status": "unknown", "error": "docker inspect printed no JSON"}
    assert container_state(replying(1, "", ""), "podman", "ai-llm") == {"exists": False, "status": "missing"}
    assert container_state(replying(1, "", "Error: permission denied\nreading the container"), "podman",
                           "ai-llm") == {"exists": False, "status": "unknown", "error": "reading the container"}
    inspect = ('[{"Id": "abc", "State": {"Status": "Running", "Paused": true, "Pid": 7, "ExitCode": 0}, '
               '"Config": {"Labels": {"ai_llm.moe_offload.config_hash": "h"}, "Image": "img"}, "RestartCount": 2}]')
    state = container_state(replying(0, inspect), "docker", "ai-llm")
    assert state["status"] == "paused" and state["running"] is False
    assert (state["id"], state["pid"], state["exit_code"], state["restarts"], state["image"]) == ("abc", 7, 0, 2, "img")
    restarting = inspect.replace('"Paused": true', '"Restarting": true')
    assert container_state(replying(0, restarting), "docker", "ai-llm")["status"] == "restarting"
    running = inspect.replace('"Paused": true', '"Paused": false')
    assert container_state(replying(0, running), "docker", "ai-llm")["running"] is True
    bare = container_state(replying(0, '{"Id": "x"}'), "docker", "ai-llm")
    assert bare == {"exists": True, "id": "x", "status": "unknown", "running": False, "pid": 0, "exit_code": None,
                    "restarts": 0, "started_at": None, "image": None, "config_hash": None}


def test_the_log_tail_keeps_stderr_then_stdout_without_blank_lines_and_only_the_last_lines():
    calls = []

    def logs(argv):
        calls.append(argv)
        return 0, "out 1\n\nout 2\n", "err 1\n   \nerr 2"
    assert log_tail(logs, "docker", "ai-llm", lines=3) == ["err 2", "out 1", "out 2"]
    assert calls == [["docker", "logs", "--tail", "3", "ai-llm"]]
    assert log_tail(replying(0, b"a\xff\n".decode("latin-1"), ""), "podman", "x") == ["a\xff"]
    assert log_tail(replying(0, "only stdout\n", None), "podman", "x") == ["only stdout"]
    assert log_tail(replying(0, "", "only stderr"), "podman", "x") == ["only stderr"]
    assert len(log_tail(replying(0, "\n".join(str(i) for i in range(100))), "podman", "x")) == 40


@pytest.mark.parametrize("lines, cause", [
    # ggml.c ggml_abort prints ``<file>:<line>: GGML_ASSERT(x) failed``; an earlier line with "error" in it (a
    # failed request) is not why the server died
    (["srv  log_server_r: request: POST /completion 127.0.0.1 500 error",
      "/src/llama.cpp/ggml/src/ggml-cpu/ops.cpp:4321: GGML_ASSERT(ne00 % 32 == 0) failed",
      "#0  0x00007f in ggml_print_backtrace () from libggml-base.so"],
     "/src/llama.cpp/ggml/src/ggml-cpu/ops.cpp:4321: GGML_ASSERT(ne00 % 32 == 0) failed"),
    # model descriptions are not causes
    (["print_info: rope type = unknown", "llama_model_loader: - kv  12: general.unknown_key str = x", "bye"], "bye"),
    # llama-server b10435 at -lv 4 describes the model before it fails to load it: "unknown" in print_info and the
    # loader's key/value lines is not the cause (llama-model-loader.cpp check_tensor_dims is)
    (["print_info: rope_finetuned        = unknown",
      "llama_model_loader: - kv  27: tokenizer.ggml.unknown_token_id u32 = 0",
      "llama_model_load: error loading model: check_tensor_dims: tensor 'token_embd.weight' has wrong shape;"
      " expected   128,    64, got    64,    64,     1,     1",
      "llama_model_load_from_file_impl: failed to load model",
      "srv    load_model: failed to load model, '/models/m.gguf'"],
     "llama_model_load: error loading model: check_tensor_dims: tensor 'token_embd.weight' has wrong shape;"
     " expected   128,    64, got    64,    64,     1,     1"),
    (["  starting  ", "  Segmentation fault (core dumped)  ", "illegal hardware instruction"],
     "Segmentation fault (core dumped)"),
    # tools/server/server-http.cpp prints "couldn't bind HTTP server socket, hostname: %s, port: %d" and then
    # server.cpp "exiting due to HTTP server error": the first one is why
    (["srv    start: couldn't bind HTTP server socket, hostname: 0.0.0.0, port: 8080",
      "srv    operator(): cleaning up before exit...",
      "srv    main: exiting due to HTTP server error"],
     "srv    start: couldn't bind HTTP server socket, hostname: 0.0.0.0, port: 8080"),
    (["main: exiting due to HTTP server error", "bye"], "bye"),
    ([], ""),
])
def test_the_exit_cause_is_the_line_that_says_why_llama_server_stopped(lines, cause):
    assert exit_cause(lines) == cause


def test_the_run_that_ended_is_the_last_unless_the_last_is_still_loading():
    """A restarted container's log: the run that ended with its load error, then the new run, still loading
    (llama.cpp's lines: common's system_info, the server's load_model, the loader's error)."""
    first = ["system_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : SSE3 = 1 |",
             "srv    load_model: loading model '/models/m.gguf'",
             "llama_model_load: error loading model: check_tensor_dims: tensor 'token_embd.weight' has wrong shape",
             "main: exiting due to model loading error"]
    second = first[:2] + ["print_info: n_embd           = 64"]
    assert ended_run(first + second) == first
    assert ended_run(first + first + second) == first + first  # restarted twice: the second run ended last
    assert ended_run(["print_info: n_ctx_train = 4096"] + first + second) == ["print_info: n_ctx_train = 4096"] + first
    assert ended_run(second + first) == second + first  # the last run shows its error: it is the one that ended
    assert ended_run(second) == second  # only the new run: nothing before it to read
    assert ended_run(["print_info: n_embd = 64"]) == ["print_info: n_embd = 64"]
    crash = first[:2] + ["/app/ggml/src/ggml-cuda/ggml-cuda.cu:88: CUDA error"]
    assert ended_run(first + crash) == first + crash
    assert exit_cause(ended_run(first + second)) == first[2]


RUNNING = (0, json.dumps([{"Id": "c1", "State": {"Status": "running", "Pid": 7}, "RestartCount": 0}]), "")


def inspecting(*answers):
    """A runner whose ``container inspect`` answers come in turn, the last one again and again (``replying``
    gives one answer to every command); logs are empty."""
    answers = list(answers)

    def answer(argv):
        if argv[1:3] == ["container", "inspect"]:
            return answers.pop(0) if len(answers) > 1 else answers[0]
        return 0, "", ""
    return answer


def test_a_container_that_can_no_longer_be_read_is_gone_in_the_engine_s_words(monkeypatch):
    monkeypatch.setattr(_deploy_container, "http_get", lambda url, headers=None, timeout=5.0: (503, "loading"))
    answer = wait_healthy(inspecting(RUNNING, (125, "", "Error: permission denied\nreading the container")),
                          "podman", "ai-llm", "http://127.0.0.1:9/health", timeout=30, sleep=lambda _s: None)
    assert answer["healthy"] is False and answer["status"] == 503
    assert answer["cause"] == "the container ai-llm is gone (reading the container)"


@pytest.mark.parametrize("timeout, probe", [(0.2, 1.0), (3, 3), (300, 5.0)])
def test_one_health_probe_waits_one_to_five_seconds(monkeypatch, timeout, probe):
    """A probe that hangs holds the wait at most 5 s, so that a container that stopped is seen within 5 s; a
    short wait still gives its probe 1 s."""
    probes = []

    def http_get(url, headers=None, timeout=5.0):
        probes.append(timeout)
        return 200, "{\"status\":\"ok\"}"
    monkeypatch.setattr(_deploy_container, "http_get", http_get)
    answer = wait_healthy(replying(*RUNNING), "podman", "ai-llm", "http://127.0.0.1:9/health", timeout=timeout)
    assert answer["healthy"] is True and probes == [probe]


# What podman 4.7+ prints on stderr before it runs a compose provider (cmd/podman/compose.go), unless
# compose_warning_logs = false in containers.conf hides it; then only the provider's own version line tells.
BANNER = ('>>>> Executing external compose provider "%s". Please see podman-compose(1) for how to disable this '
          'message. <<<<\n\n')


@pytest.mark.parametrize("answer, provider", [
    ((0, "Docker Compose version v2.37.1\n", BANNER % "/usr/libexec/docker/cli-plugins/docker-compose"), "docker-compose"),
    ((0, "podman-compose version 1.6.0\npodman version 5.4.0\n", BANNER % "/usr/bin/podman-compose"), "podman-compose"),
    ((0, "Docker Compose version v2.37.1\n", ""), "docker-compose"),  # the banner hidden
    ((0, "podman-compose version 1.6.0\n", ""), "podman-compose"),
    ((125, "", 'Error: unrecognized command `podman compose`'), None),  # podman before 4.7
])
def test_the_provider_podman_compose_runs_is_read_from_its_banner_or_its_version(answer, provider):
    assert podman_compose_provider(lambda argv: answer, "/usr/bin/podman") == provider


def test_podman_compose_running_docker_compose_gives_way_to_podman_compose():
    docker_compose = (0, "Docker Compose version v2.37.1\n", BANNER % "/usr/local/bin/docker-compose")
    assert find_compose(lambda argv: docker_compose, ALL.get) == (["podman-compose"], None)
    # without podman-compose it stays (a GPU deploy is refused by gpu_access_check); with podman-compose behind it too
    assert find_compose(lambda argv: docker_compose, NO_PODMAN_COMPOSE.get) == (["podman", "compose"], None)
    own = (0, "podman-compose version 1.6.0\n", BANNER % "/usr/bin/podman-compose")
    assert find_compose(lambda argv: own, ALL.get) == (["podman", "compose"], None)


VERSIONS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "data", "docker_version")


def captured(name):
    with open(os.path.join(VERSIONS, name), encoding="utf-8") as f:
        return f.read()


@pytest.mark.parametrize("name, server", [
    ("podman_4.3.1_service.json", ("podman", "4.3.1")),  # its components: Podman Engine, Conmon, runc, Engine
    ("dockerd_20.10.24.json", ("docker", "20.10.24+dfsg1")),
    ("no_server.txt", (None, None)), ("empty.txt", (None, None)),
])
def test_the_server_behind_the_docker_cli_is_read_from_docker_version(name, server):
    text = captured(name) if name != "empty.txt" else ""
    assert server_engine(text) == server


def test_the_docker_cli_of_the_compose_command_is_asked_and_a_failed_answer_names_no_server():
    asked = []

    def answer(argv):
        asked.append(argv)
        return (0, captured("podman_4.3.1_service.json"), "") if argv[0] == "/opt/docker/bin/docker" else (1, "null", "")
    assert docker_server(answer, ["/opt/docker/bin/docker", "compose"]) == ("podman", "4.3.1")
    assert docker_server(answer, ["docker-compose"]) == (None, None)  # the docker on PATH, which answers nothing
    assert asked == [["/opt/docker/bin/docker", "version", "--format", "{{json .Server}}"],
                     ["docker", "version", "--format", "{{json .Server}}"]]


@pytest.mark.parametrize("access", ["auto", "cdi", "reservations"])
def test_docker_compose_served_by_podman_is_refused_for_a_gpu_deploy_before_any_other_check(access):
    asked = []

    def answer(argv):
        asked.append(argv)
        return 0, captured("podman_4.3.1_service.json"), ""
    chosen, problem = gpu_access_check(answer, ["docker", "compose"], "docker", access, "localhost/ai-llm:cpu", ["0"])
    assert chosen == ("cdi" if access == "auto" else access)
    assert problem.startswith("llm_server: GPU access: 'docker compose' is served by podman 4.3.1 ")
    assert "podman-compose" in problem and "github.com/containers/podman/issues/19338" in problem
    assert problem.endswith("Nothing was changed.")
    assert asked == [["docker", "version", "--format", "{{json .Server}}"]]  # nothing created, nothing else read
