"""A real local deploy of the llm_server role for integration tests: podman + podman-compose (or docker + compose
v2, ``engine="docker"``), the CPU image of
images/ai-llm/build.sh, the demo model, its own project directory, compose project, container name and free
loopback port (host network); and the two broken copies of the demo model that the failure scenarios deploy."""
from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import yaml

from tests.helpers.llama_server import free_port
from tools.gguf_models import write_demo_model

ROOT = Path(__file__).resolve().parents[2]


def write_cut_model(model, path):
    """``model`` with its tensor data cut in half: a valid header whose tensors lie beyond the end of the file (the
    header reader refuses it, so the role refuses it before anything changes). Returns ``path``."""
    data = Path(model).read_bytes()
    Path(path).write_bytes(data[: len(data) // 2])
    return Path(path)


def playbook_env(**more):
    """The environment of an ansible-playbook run of this checkout (its ansible.cfg and collection, results as
    JSON), with ``more`` over it and no LLM_* variable (the environment would win over .env with podman-compose)."""
    env = dict(os.environ)
    env.update({
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": str(ROOT / ".collections"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default",
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
        "ANSIBLE_LOCALHOST_WARNING": "0",
    }, **more)
    for key in [k for k in env if k.startswith("LLM_")]:
        del env[key]
    return env


def cpu_image():
    """The tag of the local CPU image with this checkout's start command (``images/ai-llm/build.sh --checkout``:
    built when missing, about a second; the tag carries the start command's sha256)."""
    build = ROOT / "images" / "ai-llm" / "build.sh"
    proc = subprocess.run(["bash", str(build), "--checkout"], capture_output=True, text=True, check=True, timeout=600)
    return proc.stdout.split()[-1]


# The compose tool of each engine the tests drive
COMPOSE = {"podman": ["podman-compose"], "docker": ["docker", "compose"]}


# The owner of a dockerd these tests start (scripts/docker.sh start OWNER): the pytest session, which stops it at
# its end (tests/conftest.py); xdist's workers inherit it from the controller's environment.
DOCKER_OWNER_ENV = "AI_LLM_TEST_DOCKER_OWNER"


def docker_script(*args):
    return subprocess.run(["bash", str(ROOT / "scripts" / "docker.sh")] + list(args), capture_output=True,
                          text=True, check=False, timeout=120)


def start_docker():
    """Start the project's dockerd when none answers (scripts/docker.sh), as this pytest session's; None when
    docker serves, else why not."""
    proc = docker_script("start", os.environ.get(DOCKER_OWNER_ENV, "pytest"))
    if proc.returncode != 0:
        return "dockerd cannot start: %s" % (proc.stderr.strip() or proc.stdout.strip())[-500:]
    if subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode != 0:
        return "docker compose v2 is not installed (bash scripts/setup.sh --docker)"
    return None


def docker_image(tag):
    """``tag`` (a local podman image) in docker too, moved with ``podman save | docker load`` when missing."""
    if subprocess.run(["docker", "image", "inspect", tag], capture_output=True, check=False).returncode != 0:
        save = subprocess.Popen(["podman", "save", tag], stdout=subprocess.PIPE)
        subprocess.run(["docker", "load", "-q"], stdin=save.stdout, capture_output=True, check=True, timeout=600)
        assert save.wait(timeout=60) == 0
    return tag


class LocalDeploy:
    """deploy.yml / rollback.yml on localhost for one project under ``root``, with podman or docker. The playbooks
    run in ``root``, where deploy.yml's report (llm_rollout_report_dir, relative) goes: not the checkout's."""

    def __init__(self, root, prefix, engine="podman"):
        self.engine = engine
        self.root = Path(root)
        self.name = "%s-%s" % (prefix, uuid.uuid4().hex[:8])
        self.project = self.root / "ai-llm"
        self.models = self.root / "models"
        self.models.mkdir(parents=True, exist_ok=True)
        self.model = write_demo_model(self.models / "demo.gguf")
        self.port = free_port()
        self.base_vars = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "llm_server_project_dir": str(self.project),
            "llm_server_compose_project": self.name,
            "llm_server_container_name": self.name,
            "llm_server_image": cpu_image() if engine == "podman" else docker_image(cpu_image()),
            "llm_server_model_path": str(self.model),
            "llm_server_network_mode": "host",
            "llm_server_bind_address": "127.0.0.1",
            "llm_server_port": self.port,
            "llm_server_ctx_size": 512,
            "llm_server_parallel": 1,
            "llm_server_health_timeout": 60,
            # the speed check sized to add little to each run: 8 prompt tokens, 4 generated, one run
            "llm_server_speed_prompt_tokens": 8,
            "llm_server_speed_predict_tokens": 4,
            "llm_server_speed_runs": 1,
            "llm_server_moe_offload_mode": "all",
            # the per-tensor override lines prove the placement on a host without GPU
            "llm_server_log_verbosity": 5,
        }
        if engine != "podman":  # podman's is the one the role finds (podman-compose)
            self.base_vars["llm_server_compose_command"] = COMPOSE[engine]

    def inventory(self, **role_vars):
        """Write the inventory (the base vars updated by role_vars); returns its path."""
        inventory = self.root / ("inventory-%s.yml" % uuid.uuid4().hex[:8])
        inventory.write_text(json.dumps({"llm_servers": {"hosts": {"localhost": dict(self.base_vars, **role_vars)}}}))
        return inventory

    def command(self, name, *args, **role_vars):
        """The ansible-playbook argv and environment of playbooks/<name>.yml with these vars, with ``verbosity``
        times -v (default 1: the role shows the whole llm_server_result from -v on; 0 is the default output)."""
        env = playbook_env()
        verbosity = role_vars.pop("verbosity", 1)
        cmd = [str(Path(sys.executable).parent / "ansible-playbook"), str(ROOT / "playbooks" / (name + ".yml")),
               "-i", str(self.inventory(**role_vars))] + ["-v"] * verbosity + list(args)
        return cmd, env

    def playbook(self, name, *args, **role_vars):
        """Run playbooks/<name>.yml with the base vars updated by role_vars; returns the CompletedProcess."""
        cmd, env = self.command(name, *args, **role_vars)
        return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(self.root), timeout=600,
                              check=False)

    def succeed(self, name, *args, **role_vars):
        """playbook(), which must exit with 0; returns the CompletedProcess."""
        run = self.playbook(name, *args, **role_vars)
        assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-2000:]
        return run

    def start(self, name, *args, **role_vars):
        """Start playbooks/<name>.yml in the background (its own process group); returns the Popen."""
        cmd, env = self.command(name, *args, **role_vars)
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                cwd=str(self.root), start_new_session=True)

    def verification(self):
        """verification.json (llm_server_result of the last run that recreated, verified or rolled back)."""
        path = self.project / "verification.json"
        return json.loads(path.read_text()) if path.exists() else None

    def label(self):
        """The configuration hash the container carries (its label), None without a container."""
        proc = subprocess.run([self.engine, "container", "inspect", self.name], capture_output=True, text=True,
                              check=False, timeout=60)
        if proc.returncode != 0:
            return None
        return (json.loads(proc.stdout)[0]["Config"]["Labels"] or {}).get("ai_llm.moe_offload.config_hash")

    def compose(self, *args):
        return subprocess.run(COMPOSE[self.engine] + ["-p", self.name, "-f", str(self.project / "docker-compose.prod.yml")]
                              + list(args), capture_output=True, text=True, cwd=str(self.project), timeout=300,
                              check=False)

    def down(self):
        if (self.project / "docker-compose.prod.yml").exists():
            self.compose("down")
        subprocess.run([self.engine, "rm", "--force", self.name], capture_output=True, check=False, timeout=120)

    def env_value(self, key):
        """The value of KEY in .env, quotes removed (the last line that sets it)."""
        values = re.findall(r"^%s=(.*)$" % re.escape(key), (self.project / ".env").read_text(), re.MULTILINE)
        return values[-1].strip("'") if values else None

    def set_env(self, key, value):
        """Edit .env by hand, as an operator would."""
        path = self.project / ".env"
        path.write_text(re.sub(r"^%s=.*$" % re.escape(key), "%s=%s" % (key, value), path.read_text(),
                               flags=re.MULTILINE))

    def container(self):
        """{id, status, restarts} of the container, or None."""
        proc = subprocess.run([self.engine, "inspect", "--type", "container", "--format",
                               "{{.Id}} {{.State.Status}} {{.RestartCount}}", self.name],
                              capture_output=True, text=True, check=False, timeout=60)
        if proc.returncode != 0:
            return None
        cid, status, restarts = proc.stdout.split()
        return {"id": cid, "status": status, "restarts": int(restarts)}

    def health(self):
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/health" % self.port, timeout=5) as answer:
                return answer.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return None

    def status(self, path, key=None):
        """The HTTP status of GET ``path`` on the deploy's port, with ``key`` as the bearer token when given."""
        headers = {"Authorization": "Bearer " + key} if key is not None else {}
        request = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path), headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status
        except urllib.error.HTTPError as exc:
            return exc.code


def result(output):
    """llm_server_result as the role publishes it at -v (the default callback, YAML or JSON): the facts of the last
    task result that sets it (the publish step, or the first step of a run that changes nothing)."""
    for chunk in reversed(re.split(r"^TASK \[", output, flags=re.MULTILINE)):
        match = re.search(r"^(?:ok|changed): \[localhost\] => ", chunk, re.MULTILINE)
        if not match or "llm_server_result" not in chunk[match.end():]:
            continue
        text = chunk[match.end():].lstrip()
        shown = json.JSONDecoder().raw_decode(text)[0] if text.startswith("{") else yaml.safe_load(
            text.split("\n\n", 1)[0])
        facts = shown.get("ansible_facts") or {}
        if "llm_server_result" in facts:
            return facts["llm_server_result"]
    return None


def recap(output):
    """The PLAY RECAP numbers of localhost: {ok, changed, unreachable, failed, skipped, rescued, ignored}."""
    found = re.findall(r"^localhost\s+:\s+(.*)$", output, re.MULTILINE)
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", found[-1])} if found else {}


@contextlib.contextmanager
def local_deploy(root, prefix, engine="podman"):
    """A LocalDeploy whose compose project is always taken down afterwards."""
    deploy = LocalDeploy(root, prefix, engine)
    try:
        yield deploy
    finally:
        deploy.down()


def write_api_key(ansible_module, settings, key):
    """The API key file as the role writes it (ansible.builtin.copy, mode 0600, in secrets/ of mode 0700); returns
    the copy's result."""
    for path, mode in ((settings["project_dir"], "0750"), (settings["paths"]["secrets"], "0700")):
        made = ansible_module("ansible.builtin.file", {"path": path, "state": "directory", "mode": mode})
        assert not made["failed"], made
    return ansible_module("ansible.builtin.copy", {"content": key + "\n", "dest": settings["paths"]["api_key"],
                                                   "mode": "0600"})
