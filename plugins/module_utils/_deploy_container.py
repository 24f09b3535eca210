# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the ai-llm container is doing: the compose tool, the container's state and label, its processes,
``/health``, the API key in force, and its last log lines with the cause of an exit.

Standard library only (runs on target hosts). Commands run through a ``run(argv) -> (rc, out, err)``
callable (``AnsibleModule.run_command`` in the modules), so that everything here is tested on real output.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import tempfile
import time
import urllib.parse

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_render import HASH_LABEL
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_log import parse_log, parse_runs
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_stages import load_stage

# The order the role looks for a compose tool in.
COMPOSE_CANDIDATES = (("podman", "compose"), ("podman-compose",), ("docker", "compose"), ("docker-compose",))
COMPOSE_INSTALL = ("no compose tool works on this host: install podman-compose (or podman 4.7 or newer for "
                   "'podman compose'), or docker with compose v2 ('docker compose'), or set llm_server_compose_command")
# docker info's server version and CDI spec directories (docker 25 or newer)
DOCKER_CDI_FORMAT = "{{.ServerVersion}} {{json .CDISpecDirs}}"
_VERSION_RE = re.compile(r"(?<![\w.])v?(\d+)\.(\d+)")
_PROVIDER_RE = re.compile(r'Executing external compose provider "([^"]+)"')
CDI_KIND = "nvidia.com/gpu"
# docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/cdi-support.html
CDI_GENERATE = "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"
DOCKER_COMPOSE_CDI = (2, 30)
# What serves the docker CLI's endpoint (DOCKER_HOST or the current context), which docker's compose tools use too:
# docker version's server part. podman's docker API names its first component "Podman Engine" (containers/podman,
# pkg/api/handlers/compat/version.go, VersionHandler); dockerd names its own "Engine".
DOCKER_SERVER_FORMAT = "{{json .Server}}"
PODMAN_COMPONENT = "Podman Engine"
# llama-server answers every path but these without the API key with 401 (tools/server/server-http.cpp,
# middleware_validate_api_key); /props needs the key and is cheap.
AUTH_PROBE_PATH = "/props"
# How many times ``log_lines`` the wait reads of a restarted container's log to find the end of the run that ended
# (llama-server prints about a hundred lines while it loads a model).
RESTART_TAIL = 25
# Log lines read for the stage of a start: all of one load, the per-tensor lines of -lv 5 included (two per tensor
# of a model of some thousand tensors).
STAGE_TAIL = 20000
# (tools/server/server-http.cpp: "couldn't bind HTTP server socket, ..." / "couldn't start HTTP listener on ...")
_ERROR_RE = re.compile(r"(?i)error|failed|abort|unknown|exception|terminate|segmentation|illegal|couldn't")
# "exiting due to ..." repeats the cause; print_info and the loader's key/value lines only describe the model
# ("rope_finetuned = unknown", "tokenizer.ggml.unknown_token_id")
_NOT_A_CAUSE_RE = re.compile(r"(?i)exiting due to|print_info:|llama_model_loader: - ")


def engine_of(compose_argv):
    """``podman`` when the compose command is podman's (by the program's basename), else ``docker``."""
    return "podman" if os.path.basename(compose_argv[0]).startswith("podman") else "docker"


def engine_gpu_access(run, engine):
    """How the engine gives the container its GPUs when ``llm_server_gpu_access`` is ``auto``: ``cdi`` (CDI device
    names) with podman, else what ``docker_gpu_access`` reads from ``docker info``."""
    if engine == "podman":
        return "cdi"
    rc, out, _err = run(["docker", "info", "--format", DOCKER_CDI_FORMAT])
    return docker_gpu_access(out if rc == 0 else "")


def docker_gpu_access(info):
    """``cdi`` for docker 25 or newer whose daemon has CDI enabled (``docker info`` lists its CDI spec directories
    only then: docs.docker.com/reference/cli/dockerd/#enable-cdi-devices), else ``reservations`` (compose's device
    reservations, which the NVIDIA container toolkit's runtime serves). ``info`` is what ``DOCKER_CDI_FORMAT``
    printed: ``25.0.3 ["/etc/cdi","/var/run/cdi"]``; empty when the template failed (docker before 25 has no
    ``CDISpecDirs``)."""
    version, _sep, dirs = info.strip().partition(" ")
    major = major_version(version)
    try:
        dirs = json.loads(dirs)
    except ValueError:
        dirs = None
    return "cdi" if major is not None and major >= 25 and dirs else "reservations"


def docker_server(run, compose_command):
    """The engine that serves the docker CLI that docker's compose tool ``compose_command`` talks to (the same
    ``DOCKER_HOST`` or context): ``(engine, version)``, ``engine`` being ``podman`` (``podman system service``
    behind a docker socket) or ``docker``; ``(None, None)`` when no server answers."""
    program = compose_command[0] if os.path.basename(compose_command[0]) == "docker" else "docker"
    rc, out, _err = run([program, "version", "--format", DOCKER_SERVER_FORMAT])
    return server_engine(out) if rc == 0 else (None, None)


def server_engine(text):
    """``(engine, version)`` of what ``docker version --format '{{json .Server}}'`` printed: ``podman`` when a
    component is the ``Podman Engine``, else ``docker``; ``(None, None)`` when it is no server (``null``: none
    answered)."""
    try:
        server = json.loads(text or "")
    except ValueError:
        return None, None
    if not isinstance(server, dict):
        return None, None
    for component in server.get("Components") or []:
        if isinstance(component, dict) and component.get("Name") == PODMAN_COMPONENT:
            return "podman", str(component.get("Version") or "")
    return "docker", str(server.get("Version") or "")


def podman_compose_provider(run, program):
    """The program ``podman compose`` hands its work to (podman 4.7 and newer run an external provider: the
    ``compose_providers`` of containers.conf or ``PODMAN_COMPOSE_PROVIDER``, else docker-compose before podman-compose;
    docs.podman.io/en/latest/markdown/podman-compose.1.html): ``docker-compose`` or ``podman-compose``, read from the
    banner podman prints on stderr (``>>>> Executing external compose provider "/usr/bin/docker-compose"``) or, where
    ``compose_warning_logs`` hides it, from the provider's own version line; ``None`` when ``podman compose`` fails."""
    rc, out, err = run([program, "compose", "version"])
    if rc != 0:
        return None
    banner = _PROVIDER_RE.search(err or "")
    if banner:
        return "podman-compose" if "podman-compose" in os.path.basename(banner.group(1)) else "docker-compose"
    return "docker-compose" if "docker compose" in (out or "").lower() else "podman-compose"


def compose_version(run, compose_command):
    """``(major, minor)`` of docker's compose (``docker compose version --short``: ``2.40.3``), or ``None``."""
    rc, out, _err = run(list(compose_command) + ["version", "--short"])
    return version_of(out) if rc == 0 else None


def cdi_devices_problem(run, engine, image, names):
    """Whether the engine resolves the CDI devices ``nvidia.com/gpu=<name>`` of ``names``: a container of ``image``
    with those devices is created and removed, never started; podman resolves CDI devices when it prepares the
    container's runtime spec, so it is also initialised (``podman init``: the runtime creates it, its process does not
    run). The engine's refusal in one line, or ``None``."""
    name = "ai-llm-cdi-check-%d-%s" % (os.getpid(), os.urandom(4).hex())
    argv = [engine, "create", "--name", name, "--network", "none"]
    for device in names:
        argv += ["--device", CDI_KIND + "=" + device]
    rc, out, err = run(argv + [image])
    try:
        if rc == 0 and engine == "podman":
            rc, out, err = run([engine, "init", name])
    finally:
        run([engine, "rm", "--force", name])
    if rc != 0:
        lines = [line.strip() for line in (err or out or "").splitlines() if line.strip()]
        return lines[-1] if lines else "%s create failed (rc=%d)" % (engine, rc)
    return None


def gpu_access_check(run, compose_command, engine, access, image, names):
    """How the container gets the GPUs ``names`` (UUIDs, else indices), checked on this host before anything stops:
    ``(access, problem)``. ``access`` is ``llm_server_gpu_access`` (``auto``, ``cdi`` or ``reservations``); ``auto``
    becomes ``cdi`` with podman, and with docker whose daemon has CDI enabled (``engine_gpu_access``). CDI is kept
    only when the compose tool passes CDI devices on and the engine resolves every name; on docker a CDI that does
    not hold falls back to compose's device reservations unless ``cdi`` was asked for; on podman it is refused.
    Docker's compose tool whose docker endpoint podman serves (``docker_server``) is refused whatever the access: it
    gives the container no GPU. ``problem`` is ``None`` or the refusal, naming what to do."""
    if engine == "docker":
        server, version = docker_server(run, compose_command)
        if server == "podman":
            # Compose v2 sends CDI names as device requests of driver "cdi" and reservations as requests of driver
            # "nvidia"; podman's docker API drops both and starts the container without them, with no error
            # (github.com/containers/podman/issues/19338, github.com/containers/podman/issues/22645; seen with
            # compose 2.40.3 on podman 4.3.1: tests/integration/test_compose_on_podman_service.py).
            return ("cdi" if access == "auto" else access), (
                "llm_server: GPU access: '%s' is served by podman %s (docker version names the %s), whose docker API "
                "drops compose's GPU devices, CDI names and reservations alike, and starts the container without GPUs "
                "(github.com/containers/podman/issues/19338): install podman-compose or set llm_server_compose_command "
                "to [podman-compose]. Nothing was changed." % (" ".join(compose_command), version, PODMAN_COMPONENT))
    chosen = engine_gpu_access(run, engine) if access == "auto" else access
    if chosen != "cdi":
        return chosen, None
    problem = None
    if engine == "podman" and engine_of(compose_command) == "podman" and list(compose_command[1:2]) == ["compose"]:
        if podman_compose_provider(run, compose_command[0]) == "docker-compose":
            # containers/podman#28436, #28309: through docker-compose, CDI device names are dropped or refused
            problem = ("'%s' runs docker-compose, which drops CDI devices (github.com/containers/podman/issues/28436): "
                       "install podman-compose or set llm_server_compose_command to [podman-compose]"
                       % " ".join(compose_command))
    elif engine == "docker":
        version = compose_version(run, compose_command)
        if version is None or version < DOCKER_COMPOSE_CDI:
            # compose turns CDI names under devices: into device requests from 2.30 (github.com/docker/compose/pull/12184)
            problem = "%s %s passes CDI devices on only from 2.30" % (
                " ".join(compose_command), "%d.%d" % version if version else "(version unknown)")
    if problem is None:
        refused = cdi_devices_problem(run, engine, image, names)
        if refused:
            problem = ("%s does not resolve the CDI devices %s (%s): generate NVIDIA's CDI spec with '%s'"
                       % (engine, ", ".join(CDI_KIND + "=" + n for n in names), refused, CDI_GENERATE))
    if problem is None:
        return "cdi", None
    if engine == "docker" and access == "auto":
        return "reservations", None
    return "cdi", "llm_server: GPU access through CDI: %s. Nothing was changed." % problem


def version_of(text):
    """``(major, minor)`` of the first version in a tool's version output (``1.29.2``, ``v2.40.3``,
    ``docker-compose version 1.29.2, build unknown``, docker's ``25.0.3``), or ``None`` when it names none."""
    match = _VERSION_RE.search(text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def major_version(text):
    """The major version of ``version_of``, or ``None``."""
    found = version_of(text)
    return found[0] if found else None


def find_compose(run, which, given=None):
    """The compose tool as ``(argv, None)``: ``given`` when set, else the first of ``COMPOSE_CANDIDATES`` that
    works (``podman compose`` is asked for its version, and gives way to podman-compose when it runs docker-compose:
    ``podman_compose_provider``; docker's tools for theirs, which must be compose v2 or newer; podman-compose only
    needs to be on PATH). ``(None, why)`` when there is none, ``why`` saying what was
    refused and what to install."""
    if given:
        return list(given), None
    refused = []
    for candidate in COMPOSE_CANDIDATES:
        program = which(candidate[0])
        if not program:
            continue
        if candidate == ("podman-compose",):
            return [candidate[0]], None
        if candidate[0] == "podman":
            provider = podman_compose_provider(run, program)
            if provider == "docker-compose" and which("podman-compose"):
                return ["podman-compose"], None  # it passes CDI devices on; docker-compose under podman does not
            if provider:
                return list(candidate), None
            continue
        rc, out, _err = run([program] + list(candidate[1:]) + ["version", "--short"])
        major = major_version(out) if rc == 0 else None
        if major is not None and major >= 2:
            return list(candidate), None
        if major is not None:
            # docs.docker.com/compose/releases/migrate/: compose v1 has had no release since June 2023; it reads
            # .env and the compose file differently from v2
            refused.append("%s %s is compose v1, which is not supported" % (" ".join(candidate), out.strip()))
    return None, "; ".join(refused + [COMPOSE_INSTALL])


def compose_config_check(run, compose_command, compose_file, env_text, compose_text):
    """``<compose> -f <file> config`` on ``.env`` and the compose file in a temporary directory: the compose tool's
    own reading of both before they replace anything. The error in one line, or ``None``."""
    directory = tempfile.mkdtemp(prefix="llm_server-config-")
    try:
        for name, text in ((".env", env_text), (compose_file, compose_text)):
            path = os.path.join(directory, name)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(path, 0o600)
        rc, out, err = run(list(compose_command) + ["-f", os.path.join(directory, compose_file), "config"])
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if rc != 0:
        lines = [line.strip() for line in (err or out or "").splitlines() if line.strip()]
        return "%s config refused it (rc=%d): %s" % (" ".join(compose_command), rc, " | ".join(lines[-5:]))
    return None


def container_state(run, engine, name):
    """The container ``name``: ``{"exists": False}`` or its id, status, pid, restarts and config hash label."""
    rc, out, err = run([engine, "container", "inspect", name])
    if rc != 0:
        text = (err or out).strip()
        if re.search(r"(?i)no such (container|object)|no container with name", text) or not text:
            return {"exists": False, "status": "missing"}
        return {"exists": False, "status": "unknown", "error": text.splitlines()[-1] if text else ""}
    try:
        data = json.loads(out)
        data = data[0] if isinstance(data, list) else data
    except (ValueError, IndexError, KeyError):
        return {"exists": False, "status": "unknown", "error": "%s inspect printed no JSON" % engine}
    state = data.get("State") or {}
    labels = (data.get("Config") or {}).get("Labels") or {}
    status = str(state.get("Status") or "unknown").lower()
    if state.get("Paused"):
        status = "paused"
    elif state.get("Restarting"):
        status = "restarting"
    return {
        "exists": True,
        "id": data.get("Id"),
        "status": status,
        "running": status == "running",
        "pid": state.get("Pid") or 0,
        "exit_code": state.get("ExitCode"),
        "restarts": data.get("RestartCount") or 0,
        "started_at": state.get("StartedAt"),
        "image": data.get("ImageName") or (data.get("Config") or {}).get("Image"),
        "config_hash": labels.get(HASH_LABEL),
    }


def http_request(method, url, body=None, headers=None, timeout=5.0, limit=None):
    """``(status, text)`` of one HTTP request (``body``: bytes or text; the answer's first ``limit`` bytes, all when
    ``None``, invalid UTF-8 replaced); status -1 and the error's text when nothing answered (refused, reset, timed
    out)."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        connection.request(method, parts.path or "/", body=body, headers=headers or {})
        answer = connection.getresponse()
        return answer.status, (answer.read() if limit is None else answer.read(limit)).decode("utf-8", "replace")
    except (OSError, ValueError, http.client.HTTPException) as exc:
        return -1, str(exc)
    finally:
        connection.close()


def http_get(url, headers=None, timeout=5.0):
    """``(status, body)`` of a GET, its first 4 KiB (``/health``, ``/props``); status -1 when nothing answered."""
    return http_request("GET", url, headers=headers, timeout=timeout, limit=4096)


def auth_check(base_url, api_key, timeout=5.0):
    """Whether the API key is in force: ``/props`` answers 401 without it and 200 with it.

    Returns ``{"enforced", "checked", "without_key", "with_key"}`` (the statuses; the key is never returned).
    """
    without, _body = http_get(base_url + AUTH_PROBE_PATH, timeout=timeout)
    with_key, _body = http_get(base_url + AUTH_PROBE_PATH, {"Authorization": "Bearer " + api_key}, timeout=timeout)
    return {"enforced": without == 401 and with_key == 200, "checked": True, "without_key": without,
            "with_key": with_key}


def log_tail(run, engine, name, lines=40):
    """The container's last log lines (stderr and stdout; ``run`` gives text, invalid UTF-8 replaced)."""
    rc, out, err = run([engine, "logs", "--tail", str(lines), name])
    if rc != 0:
        return []
    text = (err or "") + ("\n" if err and out else "") + (out or "")
    return [line for line in text.splitlines() if line.strip()][-lines:]


def exit_cause(lines):
    """The line that says why llama-server stopped: the line of the load error or crash that llama_server_log's
    parser finds, else the first error line (later ones repeat it), else the last."""
    parsed = parse_log("\n".join(lines) + "\n")
    for found in (parsed.get("load_error"), parsed.get("crash")):
        if found:
            return next((line.strip() for line in lines if found in line), found)
    for line in lines:
        if _ERROR_RE.search(line) and not _NOT_A_CAUSE_RE.search(line):
            return line.strip()
    return lines[-1].strip() if lines else ""


def ended_run(lines):
    """The lines up to the end of the last run of llama-server that ended, for its exit cause: all of ``lines``
    when their last run shows its load error or crash, else the lines before that run's start (a container that
    its restart policy started again: its new run is still loading)."""
    parsed, starts = parse_runs(lines)
    if parsed["load_error"] or parsed["crash"]:
        return lines
    return lines[:starts[-1]] if starts and starts[-1] > 0 else lines


def wait_healthy(run, engine, name, url, timeout, interval=0.5, clock=time.monotonic, sleep=time.sleep,
                 log_lines=40, waited=0.0, for_at_most=None, restarts=None):
    """Wait up to ``timeout`` seconds for ``url`` (``/health``) to answer 200 while the container keeps running.

    Returns ``{"healthy", "seconds", "status", "container", "cause", "log_tail", "waiting"}``: when the container
    exits, restarts or disappears the wait stops at once, with the cause read from its last log lines (those of the
    run that ended, when the container runs again after a restart). A wait in pieces, which says between them where
    the start is: ``waited`` seconds were waited by the pieces before (they count against ``timeout``),
    ``restarts`` is the container's restart count when the first piece began, and a piece still waiting after
    ``for_at_most`` seconds returns ``waiting`` true with the ``stage`` of the start (``_llama_stages.load_stage``).
    ``seconds`` counts every piece.
    """
    start = clock()
    state = container_state(run, engine, name)
    if restarts is None or not state.get("exists"):
        restarts = state.get("restarts")  # None when the container is missing: then the wait stops at once
    last_status = None

    def answer(**parts):
        return dict({"healthy": False, "seconds": round(waited + clock() - start, 3), "status": last_status,
                     "container": state, "cause": None, "log_tail": [], "waiting": False}, **parts)

    while True:
        if not state.get("exists") or not state.get("running") or state["restarts"] > restarts:
            tail = []
            if state.get("running"):  # running again after a restart: the run that ended is further back
                tail = ended_run(log_tail(run, engine, name, log_lines * RESTART_TAIL))[-log_lines:]
            elif state.get("exists"):
                tail = log_tail(run, engine, name, log_lines)
            found = exit_cause(tail)
            if not state.get("exists"):
                cause = "the container %s is gone (%s)" % (name, state.get("error") or "removed")
            elif found:
                cause = "llama-server exited: %s" % found
            elif state["running"]:  # running again after a restart
                cause = "the container %s restarted %d time(s) and wrote no log line" % (
                    name, state["restarts"] - restarts)
            else:
                cause = "the container %s is %s (exit code %s)" % (name, state.get("status"), state.get("exit_code"))
            return answer(cause=cause, log_tail=tail)
        last_status, _body = http_get(url, timeout=min(5.0, max(1.0, timeout)))
        if last_status == 200:
            return answer(healthy=True)
        if waited + clock() - start >= timeout:
            return answer(log_tail=log_tail(run, engine, name, log_lines),
                          cause="ai-llm did not answer /health with 200 within %d s (last answer: %s)"
                                % (timeout, last_status if last_status != -1 else "no answer"))
        if for_at_most is not None and clock() - start >= for_at_most:
            return answer(waiting=True, stage=load_stage(log_tail(run, engine, name, STAGE_TAIL)))
        sleep(interval)
        state = container_state(run, engine, name)
