"""The GPU access of the compose file (plugins/module_utils/_deploy_render.py) and its checks before a deploy
(_deploy_container.gpu_access_check) on the real engines, without a GPU: a CDI spec of the test's own for
``nvidia.com/gpu`` whose only edit is an environment variable per device, read by podman 4.3.1 through
podman-compose; docker 20.10 (no CDI), whose ``docker compose create`` carries the device reservations as device
requests; docker's healthcheck on the service's own port; and the CPU deploy's ``NVIDIA_VISIBLE_DEVICES=void``.

Run the podman tests under ``flock /tmp/ai-llm-podman.lock`` and the docker ones under the docker lock.
"""
from __future__ import annotations

import contextlib
import json
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_container import gpu_access_check
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_render import (
    compose_values,
    config_hash,
    env_values,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._nvidia_smi import parse_gpus
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_placement import place
from tests.helpers.cdi import cdi_spec
from tests.helpers.deploy_settings import settings as checked_settings
from tests.helpers.deploy_templates import render_compose, render_env, template_sources
from tests.helpers.llama_server import free_port
from tests.helpers.llm_deploy import cpu_image, docker_image, start_docker
from tools.gguf_models import write_demo_model

ROOT = Path(__file__).resolve().parents[2]
# A dual host whose faster card (the RTX 4090) sits at the higher PCI address: nvidia-smi index 1
DUAL = {"topology": "dual", "gpus": parse_gpus((ROOT / "tests/data/nvidia_smi/dual_a5500_4090.txt").read_text())[0]}
A5500, RTX4090 = DUAL["gpus"][0]["uuid"], DUAL["gpus"][1]["uuid"]


def run(argv, timeout=300):
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def placement(settings, gpu_info):
    """The placement of the role's own code for the demo model on ``gpu_info`` (no plan: the chosen GPUs)."""
    model = {"offload_pattern": "", "offload_pattern_matches": [], "expert_tensors": []}
    return place(settings, model, None, gpu_info)


def write_project(tmp_path, engine, gpu_info, **values):
    """``.env`` and the compose file of a deploy of the demo model in ``tmp_path``; ``(directory, settings, name)``."""
    name = "ai-llm-gpu-%s" % uuid.uuid4().hex[:8]
    models = tmp_path / "models"
    models.mkdir()
    model = write_demo_model(str(models / "demo.gguf"))
    project = tmp_path / "ai-llm"
    settings = checked_settings(model, llm_server_project_dir=str(project), llm_server_compose_project=name,
                                llm_server_container_name=name, llm_server_network_mode="host",
                                llm_server_port=free_port(), llm_server_moe_offload_mode="none", **values)
    (project / "secrets").mkdir(parents=True)
    placed = placement(settings, gpu_info)
    env = env_values(settings, placed)
    compose = render_compose(settings, placed, engine)
    digest = config_hash(env, compose_values(settings, placed, engine), template_sources())
    (project / ".env").write_text(render_env(env, digest))
    (project / "docker-compose.prod.yml").write_text(compose)
    return project, settings, name


@contextlib.contextmanager
def compose_project(command, project, name):
    """``command -p name -f <file>``, and ``down`` whatever happens."""
    argv = list(command) + ["-p", name, "-f", str(project / "docker-compose.prod.yml")]
    try:
        yield argv
    finally:
        run(argv + ["down"])


def inspect(engine, name):
    rc, out, err = run([engine, "container", "inspect", name])
    assert rc == 0, err
    data = json.loads(out)
    return data[0] if isinstance(data, list) else data


def cdi_variables(env):
    return sorted(e for e in env if e.startswith("AI_LLM_CDI_"))


def test_podman_compose_gives_the_container_exactly_the_planned_cdi_devices(tmp_path):
    image = cpu_image()
    with cdi_spec([A5500, RTX4090]):
        # the check before a deploy: the engine resolves the planned names, and refuses a name no spec lists
        assert gpu_access_check(run, ["podman-compose"], "podman", "auto", image, [RTX4090]) == ("cdi", None)
        unknown = "GPU-00000000-0000-4000-8000-000000000000"
        access, problem = gpu_access_check(run, ["podman-compose"], "podman", "auto", image, [RTX4090, unknown])
        assert access == "cdi" and "unresolvable CDI devices" in problem and unknown in problem
        assert "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml" in problem and "Nothing was changed" in problem
        assert not [line for line in run(["podman", "ps", "-a", "--format", "{{.Names}}"])[1].split()
                    if line.startswith("ai-llm-cdi-check-")]  # the check's containers are gone

        # the planned GPU alone (the 4090, index 1), by UUID, through podman-compose
        project, _settings, name = write_project(tmp_path, "podman", DUAL, llm_server_image=image,
                                                 llm_server_gpu_access="cdi", llm_server_gpu_devices=[1])
        with compose_project(["podman-compose"], project, name) as compose:
            rc, out, err = run(compose + ["up", "-d"])
            assert rc == 0, out + err
            data = inspect("podman", name)
            # the environment of the container's first process (podman exec's own does not carry CDI's edits)
            rc, out, err = run(["podman", "exec", name, "cat", "/proc/1/environ"])
            assert rc == 0, err
            env = out.split("\0")
        assert cdi_variables(env) == ["AI_LLM_CDI_1=%s" % RTX4090]  # the spec's edit of that device, and no other
        assert "NVIDIA_VISIBLE_DEVICES=%s" % RTX4090 in env and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in env
        assert "label=disable" in (data["HostConfig"].get("SecurityOpt") or [])


@pytest.fixture(scope="module")
def docker():
    why = start_docker()
    if why:
        pytest.skip(why)
    return docker_image(cpu_image())


def test_docker_compose_reserves_the_planned_gpus_by_uuid_in_their_order(tmp_path, docker):
    """docker 20.10 has no CDI: the reservations become device requests, the UUIDs in the plan's order."""
    project, _settings, name = write_project(tmp_path, "docker", DUAL, llm_server_image=docker,
                                             llm_server_gpu_access="reservations", llm_server_gpu_devices=[1, 0])
    with compose_project(["docker", "compose"], project, name) as compose:
        rc, out, err = run(compose + ["create"])
        assert rc == 0, out + err
        data = inspect("docker", name)
    requests = data["HostConfig"]["DeviceRequests"]
    assert [(r["Driver"], r["DeviceIDs"], r["Capabilities"]) for r in requests] == [
        ("nvidia", [RTX4090, A5500], [["gpu"]])]
    assert "NVIDIA_VISIBLE_DEVICES=%s,%s" % (RTX4090, A5500) in data["Config"]["Env"]


def test_docker_reports_a_cpu_deploy_healthy_on_its_own_port_with_no_gpu(tmp_path, docker):
    project, settings, name = write_project(tmp_path, "docker", {"topology": "cpu"}, llm_server_image=docker,
                                            llm_server_health_timeout=120)
    assert settings["port"] != 8080  # the image's own healthcheck would ask 8080
    with compose_project(["docker", "compose"], project, name) as compose:
        rc, out, err = run(compose + ["up", "-d"])
        assert rc == 0, out + err
        deadline = time.monotonic() + 180
        health = {}
        while time.monotonic() < deadline:
            health = inspect("docker", name)["State"].get("Health") or {}
            if health.get("Status") not in (None, "starting"):
                break
            time.sleep(1)
        data = inspect("docker", name)
    assert health.get("Status") == "healthy", health
    assert data["Config"]["Healthcheck"]["StartPeriod"] == 120 * 10 ** 9
    assert "NVIDIA_VISIBLE_DEVICES=void" in data["Config"]["Env"]
    assert not data["HostConfig"].get("DeviceRequests")
    modes = sorted((m["Destination"], m.get("Mode", ""), m["RW"]) for m in data["Mounts"])
    assert modes == [("/models", "ro,z", False), ("/run/secrets/ai-llm", "ro,Z", False)], modes


def test_the_probe_fails_where_nothing_answers(docker):
    """The healthcheck's probe exits non-zero when llama-server does not answer on LLAMA_HOST:LLAMA_PORT."""
    port = str(free_port())
    rc, out, err = run(["docker", "run", "--rm", "--network", "host", "-e", "LLAMA_PORT=" + port,
                        "--entrypoint", "/usr/local/bin/start-llama-server", docker, "--health"])
    assert rc != 0, out + err
