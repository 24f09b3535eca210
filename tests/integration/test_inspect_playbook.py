"""playbooks/inspect.yml, run with ansible-playbook on localhost against real GGUF files and real podman containers:
busybox ones with the model in their arguments or environment, the ai-llm container the llm_server role deploys,
and the ai-llm image started the ways llama.cpp's own server image is."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.helpers.llama_server import free_port
from tests.helpers.llm_deploy import cpu_image, local_deploy, playbook_env
from tools.gguf_models import write_nemotron_nano_30b, write_tiny_nemotron_h_moe

ROOT = Path(__file__).resolve().parents[2]
NANO_PATTERN_LINE = r"LLM_MOE_OFFLOAD_PATTERN=\.ffn_.*_exps\.weight"


def run_playbook(*extra_vars, result_format="json"):
    env = playbook_env(ANSIBLE_CALLBACK_RESULT_FORMAT=result_format)
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), str(ROOT / "playbooks" / "inspect.yml"),
           "-v", "-i", "localhost,", "-c", "local", "-e", "ansible_python_interpreter=" + sys.executable]
    for var in extra_vars:
        cmd += ["-e", var]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=300, check=False)


def task_results(proc):
    """{task name: localhost result} from the default callback's JSON results (skipped tasks left out)."""
    results = {}
    for chunk in re.split(r"^TASK \[", proc.stdout, flags=re.MULTILINE)[1:]:
        name = chunk.split("]", 1)[0]
        match = re.search(r"^(ok|fatal): \[localhost\](: FAILED!)? => ", chunk, re.MULTILINE)
        if match:
            results[name] = json.JSONDecoder().raw_decode(chunk[match.end():].lstrip())[0]
    return results


def inspected(*extra_vars):
    """{task name: result} of an inspect.yml run that succeeded."""
    proc = run_playbook(*extra_vars)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return task_results(proc)


@pytest.fixture(scope="module")
def nano(tmp_path_factory):
    return write_nemotron_nano_30b(tmp_path_factory.mktemp("nano"), shards=6)


def test_summary_of_the_six_shard_nemotron_nano(nano):
    tasks = inspected("model=" + nano[2])
    summary = tasks["Summary"]["msg"]
    assert summary[0].startswith("model (6 files, 22.83 GiB): ") and summary[0].endswith("-00001-of-00006.gguf")
    assert summary[-1] == NANO_PATTERN_LINE
    tensors = tasks["Tensors"]["msg"]
    assert len(tensors) == 46 and all("routed_experts" in line for line in tensors)
    assert tensors[0].startswith("blk.1.ffn_up_exps.weight  q5_0  2688x1856x128  ")


def test_show_all_and_a_pattern_check(nano):
    tasks = inspected("model=" + nano[0], "show=all", "pattern=exp")
    assert len(tasks["Tensors"]["msg"]) == 401
    assert any(line.startswith("your pattern exp: wrong: also moves 69 non-expert tensor(s)")
               for line in tasks["Summary"]["msg"])


def test_default_output_shows_the_env_line_verbatim(nano):
    proc = run_playbook("model=" + nano[0], "show=none", result_format="yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "    - " + NANO_PATTERN_LINE in proc.stdout.splitlines()
    assert "TASK [Tensors]" in proc.stdout and "skipping: [localhost]" in proc.stdout


def test_without_model_or_container_it_says_what_to_give():
    proc = run_playbook(result_format="yaml")
    assert proc.returncode != 0
    assert "Give -e model=/path/to/model.gguf (any shard) or -e container=NAME" in proc.stdout


def test_a_broken_model_fails_cleanly(tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 16)
    proc = run_playbook("model=%s" % broken)
    assert proc.returncode != 0
    result = task_results(proc)["Read the model header"]
    assert result["msg"].startswith("%s: at byte " % broken), result
    assert "Traceback" not in proc.stdout


# ---- -e container=NAME: a real podman container (busybox) that mounts the model ----

@pytest.fixture(scope="module")
def busybox_image(tmp_path_factory):
    podman, busybox = shutil.which("podman"), shutil.which("busybox")
    if not podman or not busybox:
        pytest.fail("podman and busybox are installed by scripts/setup.sh")
    root = tmp_path_factory.mktemp("rootfs")
    (root / "bin").mkdir()
    shutil.copy(busybox, root / "bin" / "busybox")
    for applet in ("sh", "sleep"):
        (root / "bin" / applet).symlink_to("busybox")
    tar = tmp_path_factory.mktemp("image") / "rootfs.tar"
    with tarfile.open(tar, "w") as archive:
        archive.add(str(root), arcname=".")
    image = "localhost/ai-llm-inspect-test:%d" % os.getpid()
    subprocess.run([podman, "import", "-q", str(tar), image], check=True, capture_output=True, timeout=120)
    yield image
    subprocess.run([podman, "rmi", "-f", image], capture_output=True, timeout=120, check=False)


@pytest.fixture
def container(busybox_image):
    started = []

    def start(*args):
        name = "ai-llm-inspect-test-%d-%d" % (os.getpid(), len(started))
        subprocess.run(["podman", "run", "-d", "--rm", "--name", name] + list(args[:-1]) +
                       [busybox_image, "/bin/sh", "-c", "exec sleep 300", "llama-server"] + args[-1],
                       check=True, capture_output=True, timeout=120)
        started.append(name)
        return name
    yield start
    for name in started:
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True, timeout=120, check=False)


@pytest.mark.parametrize("mount, options, args", [
    ("/models", [], ["--port", "8080", "-m", "/models/tiny.gguf", "-c", "512"]),
    ("/srv/llm/models", ["-e", "MODEL=/srv/llm/models/tiny.gguf"], ["--model", "$MODEL"]),
], ids=["argument", "environment"])
def test_container_mode_maps_the_model_through_the_mount(container, tmp_path, mount, options, args):
    """The model named by llama-server's argument, or by the variable its argument names, read on the host."""
    models = tmp_path / "models"
    models.mkdir()
    model = write_tiny_nemotron_h_moe(models / "tiny.gguf")
    tasks = inspected("container=" + container("-v", "%s:%s:ro" % (models, mount), *options, args))
    assert tasks["Read the model header"]["files"] == [model]
    assert tasks["Summary"]["msg"][-1] == NANO_PATTERN_LINE


def test_container_mode_model_not_on_a_mount(container):
    name = container(["-m", "/inside/the/image.gguf"])
    proc = run_playbook("container=" + name)
    assert proc.returncode != 0
    msg = task_results(proc)["Require a model path that comes from a mount of the host"]["msg"]
    assert msg == "container %s: the model /inside/the/image.gguf is not on a mount of the host (it is inside the image)" % name


def test_container_mode_unknown_container(busybox_image):
    proc = run_playbook("container=ai-llm-inspect-no-such-container")
    assert proc.returncode != 0
    msg = task_results(proc)["Require a container that podman or docker knows"]["msg"]
    assert msg.startswith("container ai-llm-inspect-no-such-container: ") and "no such container" in msg


# ---- -e container=NAME on the containers llama-server really runs in: the ai-llm image of images/ai-llm ----

def test_container_mode_on_the_container_the_role_deploys(tmp_path):
    """deploy.yml with the llm_server role (its image passes MODEL_PATH, not -m), then inspect.yml on it."""
    with local_deploy(tmp_path, "ai-llm-inspect-role") as deploy:
        deploy.succeed("deploy")
        tasks = inspected("container=" + deploy.name)
        assert tasks["Read the model header"]["files"] == [deploy.model]
        assert tasks["Summary"]["msg"][-1] == NANO_PATTERN_LINE


@pytest.fixture
def upstream_container(tmp_path):
    """run(env, entrypoint, *args): a container of the ai-llm image started the way llama.cpp's server image
    starts (ENTRYPOINT llama-server, the arguments as command), with the model folder mounted at /models."""
    models = tmp_path / "models"
    models.mkdir()
    model = write_tiny_nemotron_h_moe(models / "tiny.gguf")
    started = []

    def run(env, entrypoint, *args):
        name = "ai-llm-inspect-upstream-%d-%d" % (os.getpid(), len(started))
        cmd = ["podman", "run", "-d", "--name", name, "-v", "%s:/models:ro" % models, "--entrypoint", entrypoint]
        for item in env:
            cmd += ["-e", item]
        subprocess.run(cmd + [cpu_image()] + list(args), check=True, capture_output=True, timeout=120)
        started.append(name)
        return name, model
    yield run
    for name in started:
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True, timeout=120, check=False)


LLAMA_SERVER = "/opt/llama/bin/llama-server"


@pytest.mark.parametrize("env, entrypoint, args", [
    ([], LLAMA_SERVER, ["-m", "/models/tiny.gguf", "--host", "127.0.0.1", "--port", "{port}"]),
    (["LLAMA_ARG_MODEL=/models/tiny.gguf"], LLAMA_SERVER, ["--host", "127.0.0.1", "--port", "{port}"]),
    (["MODEL=/models/tiny.gguf"], "/bin/sh", ["-c", 'exec %s -m "$MODEL" --port {port}' % LLAMA_SERVER]),
], ids=["-m", "LLAMA_ARG_MODEL", "MODEL"])
def test_container_mode_on_the_upstream_image_forms(upstream_container, env, entrypoint, args):
    port = str(free_port())
    name, model = upstream_container(env, entrypoint, *[a.replace("{port}", port) for a in args])
    tasks = inspected("container=" + name)
    assert tasks["Read the model header"]["files"] == [model]
    assert tasks["Summary"]["msg"][-1] == NANO_PATTERN_LINE
