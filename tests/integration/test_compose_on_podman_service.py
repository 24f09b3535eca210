"""Docker's compose v2 driving podman through its docker API (``podman system service`` on a socket of the test's
own, ``DOCKER_HOST=unix://<socket>``): the route ``podman compose`` takes when it runs docker-compose, and the one a
docker CLI pointed at podman takes. Compose creates and starts the container, and the GPU devices of the compose file,
CDI names or reservations, never reach it (github.com/containers/podman/issues/19338, /28436). The role's read of the
host (llm_server_service_info) refuses that route for a GPU deploy before anything changes, also in check mode.

Real podman 4.3.1, the compose v2 plugin of scripts/docker.sh and the docker 20.10 CLI; the GPU is a CDI spec of the
test's own (tests/helpers/cdi.py) and the nvidia-smi test double. Run under ``flock /tmp/ai-llm-podman.lock``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_container import (
    docker_server,
    gpu_access_check,
)
from tests.helpers.cdi import cdi_spec
from tests.helpers.llm_deploy import cpu_image

ROOT = Path(__file__).resolve().parents[2]
DOUBLES = ROOT / "tests" / "doubles"
# The RTX A5500 of tests/data/nvidia_smi/rtx_a5500.txt
A5500 = "GPU-8d4f3c2a-61b7-4e0a-9f35-2c7e1d9a4b60"

pytestmark = pytest.mark.skipif(
    not shutil.which("podman") or not shutil.which("docker"), reason="needs podman and the docker CLI")

# The two GPU forms the role's compose template renders (plugins/module_utils/_deploy_render.py, compose_values), on a container that
# only sleeps.
SERVICE = """services:
  ai-llm:
    image: "{image}"
    container_name: "{name}"
    network_mode: none
    entrypoint: ["sleep", "600"]
"""
FORMS = {
    "cdi": '    devices:\n      - "nvidia.com/gpu={uuid}"\n',
    "reservations": ('    deploy:\n      resources:\n        reservations:\n          devices:\n'
                     '            - driver: "nvidia"\n              device_ids: ["{uuid}"]\n'
                     '              capabilities: ["gpu"]\n'),
}


def run(argv, env=None, timeout=300):
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout, env=env)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def service():
    """``podman system service`` on a socket of this module's own: the environment that points the docker CLI and
    compose at it (DOCKER_HOST); stopped, and its socket removed, after."""
    if run(["docker", "compose", "version"])[0] != 0:
        pytest.skip("docker compose v2 is not installed (bash scripts/setup.sh --docker)")
    socket = "/tmp/ai-llm-podman-service-%s.sock" % uuid.uuid4().hex[:12]
    proc = subprocess.Popen(["podman", "system", "service", "--time=0", "unix://" + socket],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    env = dict(os.environ, DOCKER_HOST="unix://" + socket)
    try:
        deadline = time.monotonic() + 60
        while run(["docker", "version"], env)[0] != 0:
            assert proc.poll() is None, proc.stderr.read().decode(errors="replace")
            assert time.monotonic() < deadline, "podman system service did not answer on %s" % socket
            time.sleep(0.2)
        yield env
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        if os.path.exists(socket):
            os.unlink(socket)


def environ(name, engine="podman"):
    """The environment of the container's first process (podman exec's own does not carry CDI's edits)."""
    rc, out, err = run([engine, "exec", name, "cat", "/proc/1/environ"])
    assert rc == 0, err
    return [e for e in out.split("\0") if e]


def cdi_variables(env):
    return sorted(e for e in env if e.startswith("AI_LLM_CDI_"))


@pytest.mark.parametrize("form", sorted(FORMS))
def test_compose_on_podman_s_docker_api_starts_the_container_without_its_gpu(tmp_path, service, form):
    image = cpu_image()
    name = "ai-llm-podsvc-%s" % uuid.uuid4().hex[:8]
    compose = tmp_path / "compose.yml"
    compose.write_text(SERVICE.format(image=image, name=name) + FORMS[form].format(uuid=A5500))
    argv = ["docker", "compose", "-p", name, "-f", str(compose)]
    with cdi_spec([A5500]):
        # the spec holds: podman itself gives a container the device's edit
        rc, out, err = run(["podman", "run", "--rm", "--network", "none", "--device", "nvidia.com/gpu=" + A5500,
                            "--entrypoint", "cat", image, "/proc/1/environ"])
        assert rc == 0, err
        assert cdi_variables(out.split("\0")) == ["AI_LLM_CDI_0=%s" % A5500]
        try:
            rc, out, err = run(argv + ["up", "-d"], service)
            assert rc == 0, out + err  # no error and no warning stops it
            rc, out, err = run(["docker", "container", "inspect", name], service)
            assert rc == 0, err
            host = json.loads(out)[0]["HostConfig"]
            state = json.loads(out)[0]["State"]
            env = environ(name)
        finally:
            run(argv + ["down"], service)
    assert state["Running"] is True
    assert cdi_variables(env) == []  # the spec's edit never reached the container
    assert not host.get("Devices") and not host.get("DeviceRequests")
    # what the role's check reads of this route, and its refusal
    assert docker_server(lambda a: run(a, service), ["docker", "compose"])[0] == "podman"
    access, problem = gpu_access_check(lambda a: run(a, service), ["docker", "compose"], "docker", "auto", image, [A5500])
    assert access == "cdi" and "is served by podman 4.3.1" in problem and "podman-compose" in problem


def test_the_check_leaves_the_running_container_alone_and_refuses_the_route(tmp_path, service, ansible_module):
    """llm_server_service_info in check mode with ``docker compose`` on podman's socket and an RTX A5500: it fails
    with the reason and what to use, and the container that runs stays as it was."""
    image = cpu_image()
    name = "ai-llm-podsvc-%s" % uuid.uuid4().hex[:8]
    rc, out, err = run(["podman", "run", "-d", "--name", name, "--network", "none", "--entrypoint", "sleep",
                        image, "600"])
    assert rc == 0, err
    inspect = ["podman", "inspect", "--type", "container", "--format",
               "{{.Id}} {{.State.Status}} {{.State.StartedAt}} {{.RestartCount}}", name]
    try:
        before = run(inspect)[1]
        assert " running " in before
        args = {"project_dir": str(tmp_path / "ai-llm"), "container_name": name,
                "compose_command": ["docker", "compose"], "gpus": True, "image": image, "gpu_access": "auto"}
        env = {"DOCKER_HOST": service["DOCKER_HOST"], "NVIDIA_SMI_FIXTURE": "rtx_a5500",
               "PATH": "%s:%s" % (DOUBLES, os.environ["PATH"])}
        with cdi_spec([A5500]):
            result = ansible_module("llm_server_service_info", args, check=True, extra_env=env)
        after = run(inspect)[1]
        checks = [n for n in run(["podman", "ps", "-a", "--format", "{{.Names}}"])[1].split()
                  if n.startswith("ai-llm-cdi-check-")]
    finally:
        run(["podman", "rm", "--force", name])
    assert result["failed"] is True, result
    assert result["msg"].startswith("llm_server: GPU access: 'docker compose' is served by podman 4.3.1 "), result["msg"]
    assert "llm_server_compose_command to [podman-compose]" in result["msg"]
    assert result["engine"] == "docker" and result["container"]["running"] is True  # read through podman's API
    assert after == before
    assert checks == []
