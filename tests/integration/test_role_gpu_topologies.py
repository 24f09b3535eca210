"""The llm_server role on GPU hosts, in check mode: playbooks/deploy.yml --check --diff on localhost with the
nvidia-smi test double (tests/doubles) first on PATH, fed the real-format fixtures of tests/data/nvidia_smi.

This machine has no GPU, so a real deploy with CDI devices cannot run here; check mode shows what the role would
write (the .env and compose diffs, the plan) and must touch nothing: no file, no container.
One RTX A5500 with room for the whole model and a split over an RTX A5500 and an RTX A4000 are the molecule scenario
``gpu_topologies`` (extensions/molecule).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import dotenv
import pytest
import yaml

from tests.helpers.cdi import cdi_spec
from tests.helpers.cuda_image import image_requiring
from tests.helpers.llama_server import free_port
from tests.helpers.llm_deploy import cpu_image, playbook_env, result
from tools.gguf_models import write_demo_model, write_nemotron_h, write_nemotron_nano_30b

ROOT = Path(__file__).resolve().parents[2]
A5500_UUID, A4000_UUID = "GPU-8d4f3c2a-61b7-4e0a-9f35-2c7e1d9a4b60", "GPU-c05e7d29-4a18-3b6f-90d2-18e4a7f65c0b"
DOUBLES = ROOT / "tests" / "doubles"
FIXTURES = ROOT / "tests" / "data" / "nvidia_smi"
ROLE = "ai_llm.moe_offload.llm_server : "
# The CUDA context a plan takes off each card's free memory before the margin: neither the RTX A5500 nor the RTX A4000
# has a published figure (plugins/module_utils/_cuda_context.py), so the plan assumes 555 MiB on each, the largest
# published one (the RTX PRO 6000 Blackwell's primary context, llama.cpp PR #23604).
CONTEXT = 555


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The demo model (small), a sparse one-shard Nemotron-3-Nano-30B-A3B Q4_K_M header (small vocab) and the same
    with 32 routed experts per MoE block instead of 128 (``nano32``).

    The plan checks the host's MemAvailable at the time of the run: the real Nano on the busy A5500 moves 20,708 MiB
    of experts to host memory, more than a test machine may have free while the other tests run; ``nano32`` moves
    3,485 MiB."""
    root = tmp_path_factory.mktemp("models")
    demo = write_demo_model(root / "demo.gguf")
    nano = write_nemotron_nano_30b(root / "nano", shards=1, vocab_size=1024, n_merges=1000)[0]
    nano32 = write_nemotron_nano_30b(root / "nano32", shards=1, vocab_size=1024, n_merges=1000, n_expert=32)[0]
    return {"demo": str(demo), "nano": str(nano), "nano32": str(nano32), "dir": str(root)}


# The role's template of each file it writes (the template module's diff names the template).
TEMPLATES = {".env": "env.j2", "docker-compose.prod.yml": "docker-compose.prod.yml.j2"}


class Run:
    """One ansible-playbook run: what it printed, its llm_server_result and its diffs."""

    def __init__(self, proc, project, args_log):
        self.proc = proc
        self.project = project
        self.args_log = args_log
        self.chunks = {}
        for chunk in re.split(r"^(?:TASK|RUNNING HANDLER) \[", proc.stdout, flags=re.MULTILINE)[1:]:
            name = chunk.split("]", 1)[0]
            self.chunks[name[len(ROLE):] if name.startswith(ROLE) else name] = chunk

    def __str__(self):
        return self.proc.stdout[-6000:] + self.proc.stderr[-3000:]

    __repr__ = __str__  # (what pytest shows of an assertion's message object: the end of the run's output)

    @property
    def result(self):
        """llm_server_result, as the role shows it at the end (also after a refusal)."""
        published = result(self.proc.stdout)
        assert published is not None, "no llm_server_result shown:\n%s" % self
        return published

    def diff_lines(self, name, sign="+"):
        """The added (or removed) lines of the diff of the file called ``name``, without the sign: the template
        module's diff names the file before (``--- before: <path>``, or nothing for a new file) and its template
        after (``+++ after: .../<template>``)."""
        template = TEMPLATES.get(name, name)
        sections = re.split(r"^--- before", self.proc.stdout, flags=re.MULTILINE)[1:]
        for section in sections:
            header = section.split("\n@@", 1)[0]
            if header.split("\n", 1)[0].endswith("/" + name) or header.rstrip().endswith("/" + template):
                body = section.split("\n@@", 1)[1] if "\n@@" in section else ""
                return [line[1:] for line in body.splitlines()
                        if line.startswith(sign) and not line.startswith(sign * 3)]
        raise AssertionError("no diff of %s:\n%s" % (name, self))

    def env_added(self):
        """The role's .env keys as the new .env sets them (read with python-dotenv, as podman-compose reads them)."""
        lines = [line for line in self.diff_lines(".env") if line.startswith("LLM_")]
        return dict(dotenv.dotenv_values(stream=io.StringIO("\n".join(lines))))

    def compose_after(self):
        """The compose file the role would write (a new file: the diff holds all of it)."""
        return yaml.safe_load("\n".join(self.diff_lines("docker-compose.prod.yml")))


@pytest.fixture
def deploy(tmp_path):
    """deploy(fixture, model, ok=True, doubles=DOUBLES, **role_vars) -> Run, with its own inventory: the run's exit
    code is 0 (``ok``) or not, and check mode left the project directory and the container as it found them."""
    name = "ai-llm-gputopo-" + uuid.uuid4().hex[:8]
    project = tmp_path / "ai-llm"

    def run(fixture, model, ok=True, doubles=DOUBLES, cdi=True, **role_vars):
        args_log = tmp_path / "nvidia-smi-args.log"
        host_vars = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "llm_server_project_dir": str(project),
            "llm_server_compose_project": name,
            "llm_server_container_name": name,
            "llm_server_image": cpu_image(),
            "llm_server_model_path": model,
            "llm_server_port": free_port(),
            "llm_server_ctx_size": 2048,
            "llm_server_parallel": 1,
            "llm_server_health_timeout": 10,
        }
        host_vars.update(role_vars)
        inventory = tmp_path / "inventory.yml"
        inventory.write_text(json.dumps({"llm_servers": {"hosts": {"localhost": host_vars}}}))
        env = playbook_env(PATH=str(doubles) + os.pathsep + os.environ["PATH"], NVIDIA_SMI_FIXTURE=fixture,
                           NVIDIA_SMI_ARGS_LOG=str(args_log))
        cmd = [str(Path(sys.executable).parent / "ansible-playbook"), str(ROOT / "playbooks" / "deploy.yml"),
               "-v", "-i", str(inventory), "--check", "--diff"]
        before_files, before_container = files_state(project), containers(name)
        # the GPUs' CDI names, which the role checks podman resolves before it changes anything (also in check mode)
        fixture_file = FIXTURES / (fixture + ".txt")
        uuids = sorted(set(re.findall(r"GPU-[0-9a-f-]{36}", fixture_file.read_text()))) if fixture_file.exists() else []
        uuids = uuids if cdi else []
        with cdi_spec(uuids):
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300,
                                  check=False)
        done = Run(proc, project, args_log)
        assert (proc.returncode == 0) == ok, done
        assert files_state(project) == before_files, "check mode changed the project directory"
        assert containers(name) == before_container, "check mode changed the container"
        return done

    run.name = name
    run.project = project
    return run


def containers(name):
    """The container of that name: 'id status started-at restarts', or '' when there is none."""
    proc = subprocess.run(["podman", "inspect", "--type", "container", "--format",
                           "{{.Id}} {{.State.Status}} {{.State.StartedAt}} {{.RestartCount}}", name],
                          capture_output=True, text=True, check=False, timeout=60)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def files_state(path):
    """{relative path: (sha256, mtime_ns, mode)} of everything under path, None when it does not exist."""
    if not path.exists():
        return None
    state = {}
    for item in sorted(path.rglob("*")):
        st = item.lstat()
        digest = hashlib.sha256(item.read_bytes()).hexdigest() if item.is_file() else None
        state[str(item.relative_to(path))] = (digest, st.st_mtime_ns, st.st_mode)
    st = path.stat()
    state["."] = (None, st.st_mtime_ns, st.st_mode)
    return state


def seed_project(project, pattern=r"\.ffn_.*_exps\.weight"):
    """A project dir as an earlier deploy leaves it: a managed .env block, a foreign key, a compose file."""
    project.mkdir(parents=True)
    marker = "# {} ai_llm.moe_offload.llm_server: managed keys (edit the inventory, not these lines)"
    (project / ".env").write_text("\n".join([
        "OPERATOR_KEY=stays", marker.format("BEGIN"), "LLM_MOE_OFFLOAD_PATTERN='%s'" % pattern,
        "LLM_CTX_SIZE=4096", "LLM_PARALLEL=1", "LLM_N_GPU_LAYERS=99", "LLM_MODEL_PATH='/models/old.gguf'",
        "LLM_BIND_ADDRESS=127.0.0.1", "LLM_PORT=8080", "LLM_GPU_DEVICES=0", "LLM_TENSOR_SPLIT=",
        marker.format("END"), ""]))
    (project / ".env").chmod(0o600)
    (project / "docker-compose.prod.yml").write_text("services:\n  ai-llm:\n    image: localhost/ai-llm:old\n")
    (project / ".rollback").mkdir()
    shutil.copy(project / ".env", project / ".rollback" / ".env")


def plan_of(run):
    """The plan part of llm_server_result, with the pattern and whether anything moves."""
    published = run.result
    return dict(published["plan"], pattern=published["pattern"], offload=bool(published["pattern"]))


NANO = {"llm_server_ctx_size": 32768, "llm_server_parallel": 2}  # the Nano's settings in (b), (c), (d)


# --- (b) a busy A5500 and a sparse Nemotron-3-Nano with 32 experts per block: experts of some blocks move ---


def test_busy_a5500_nemotron_nano_partial_offload(deploy, models, ansible_module):
    seed_project(deploy.project)
    run = deploy("rtx_a5500_busy", models["nano32"], **NANO)
    plan = plan_of(run)
    assert plan["fits"] is True and plan["gpus"][0]["free_mib"] == 5276 - CONTEXT
    blocks = plan["cpu_expert_layers"]
    info = ansible_module("gguf_info", {"path": models["nano32"], "tensors": "none"})
    moe_blocks = info["layer_kinds"]["moe"]
    assert 0 < len(blocks) < len(moe_blocks), "the busy card must force a partial offload: %s" % blocks
    pattern = run.env_added()["LLM_MOE_OFFLOAD_PATTERN"]
    assert pattern == plan["pattern"] and pattern.startswith("blk\\.")
    assert run.result["pattern_source"] == "plan"
    # The old block's pattern shows as removed: the diff is against the seeded .env.
    assert "LLM_MOE_OFFLOAD_PATTERN='\\.ffn_.*_exps\\.weight'" in run.diff_lines(".env", "-")
    check = ansible_module("gguf_info", {"path": models["nano32"], "tensors": "none", "pattern": pattern})
    expected = sorted(t for t in info["expert_tensors"] if int(t.split(".")[1]) in blocks)
    assert sorted(check["pattern_check"]["matched"]) == expected
    assert check["pattern_check"]["non_expert"] == []
    assert sorted(check["pattern_check"]["missed"]) == sorted(set(info["expert_tensors"]) - set(expected))


def test_busy_a5500_dense_model_goal_speed_keeps_fewer_layers_on_the_gpu(deploy, models):
    """A dense hybrid of 6450 MiB does not fit the busy card's 5276 MiB and has no expert to move: goal speed keeps
    the most layers that fit, and .env gets the plan's -ngl instead of the inventory's 99."""
    dense = write_nemotron_h(Path(models["dir"]) / "dense.gguf", n_blocks=40, n_embd=4096, n_ff=16384)
    run = deploy("rtx_a5500_busy", dense, llm_server_moe_offload_goal="speed")
    plan = plan_of(run)
    layers = plan["n_gpu_layers"]
    assert plan["fits"] is True and plan["offload"] is False and 0 < layers < 41
    assert plan["reason"].startswith("With -ngl %d the weights, KV cache and recurrent state of blocks 0-%d stay in "
                                     "host memory" % (layers, 40 - layers))
    assert run.env_added()["LLM_N_GPU_LAYERS"] == str(layers)
    assert run.result["status"] == "checked"


# --- (c) two GPUs: one chosen card ----------------------------------------------------------------------


def test_dual_gpu_one_chosen_card_is_planned_alone(deploy, models):
    run = deploy("dual_a5500_a4000", models["nano"], llm_server_gpu_devices=[1], **NANO)
    plan = plan_of(run)
    # Only the A4000's free memory counts: the plan cannot split onto the card the container does not get.
    assert [g["index"] for g in plan["gpus"]] == [1]
    assert plan["gpus"][0]["free_mib"] == 15746 - CONTEXT
    assert plan["placement"] == "single" and plan["gpu_devices"] == [1]
    assert plan["offload"] is True and plan["cpu_expert_layers"]
    env = run.env_added()
    assert env["LLM_GPU_DEVICES"] == "1" and env["LLM_TENSOR_SPLIT"] == ""
    assert env["LLM_MOE_OFFLOAD_PATTERN"] == plan["pattern"]
    assert run.compose_after()["services"]["ai-llm"]["devices"] == ["nvidia.com/gpu=" + A4000_UUID]


def test_a_chosen_gpu_the_host_lacks_is_refused_before_anything_changes(deploy, models):
    run = deploy("dual_a5500_a4000", models["nano"], ok=False, llm_server_gpu_devices=[2])
    msg = run.result["message"]
    assert run.result["status"] == "failed"
    assert "llm_server_gpu_devices [2]" in msg and "[0, 1]" in msg
    # the planner did not run
    prepared = run.chunks["Check the variables, fetch the model if missing, read the host, plan and decide"]
    failed = re.search(r"^fatal: \[localhost\]: FAILED! => ", prepared, re.MULTILINE)
    assert json.JSONDecoder().raw_decode(prepared[failed.end():].lstrip())[0]["plan"]["skipped"] is True
    assert run.result["plan"]["fits"] is None


def test_gpus_podman_cannot_resolve_are_refused_in_check_mode_naming_the_spec_to_generate(deploy, models):
    run = deploy("rtx_a5500", models["demo"], ok=False, cdi=False)
    assert "does not resolve the CDI devices nvidia.com/gpu=%s" % A5500_UUID in run.proc.stdout, run
    assert "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml" in run.proc.stdout


def test_a_gpu_the_image_s_driver_requirement_refuses_is_refused_in_check_mode(deploy, models):
    """An image with the CUDA 12.8.1 image's NVIDIA_REQUIRE_CUDA: the RTX A5500 on driver 550 (brand "NVIDIA RTX",
    which libnvidia-container compares as "unknown", listed for branch 550) is planned; the RTX 4090 on 560 (brand
    "GeForce", not listed; its driver's CUDA 12.6 is below 12.8) is refused before anything changes."""
    with image_requiring(base=cpu_image()) as image:
        allowed = deploy("rtx_a5500", models["demo"], llm_server_image=image)
        assert allowed.result["status"] == "checked"
        refused = deploy("rtx_4090", models["demo"], ok=False, llm_server_image=image)
    msg = refused.result["message"]
    assert refused.result["status"] == "failed" and "Nothing was changed" in msg
    assert ("GPU 0 (NVIDIA GeForce RTX 4090) (driver 560.35.03, CUDA 12.6, brand GeForce) does not meet the image's "
            "NVIDIA_REQUIRE_CUDA") in msg and "a driver of CUDA 12.8 or newer" in msg


# --- (d) docker: device reservations instead of CDI devices ---------------------------------------------


def test_docker_compose_renders_device_reservations(deploy, models):
    run = deploy("dual_a5500_a4000", models["nano"], llm_server_compose_command=["docker", "compose"], **NANO)
    service = run.compose_after()["services"]["ai-llm"]
    assert "devices" not in service
    assert service["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "device_ids": [A5500_UUID, A4000_UUID], "capabilities": ["gpu"]}]
    assert run.env_added()["LLM_GPU_DEVICES"] == "0,1"


# --- (e) a plan that does not fit even with every expert on the CPU -----------------------------------


def test_a_plan_that_cannot_fit_is_refused_before_anything_is_written(deploy, models):
    seed_project(deploy.project)
    run = deploy("rtx_a5500_busy", models["nano"], ok=False, llm_server_ctx_size=1048576)
    msg = run.result["message"]
    missing = re.search(r"with the experts of (\d+) block\(s\) on CPU the plan needs (\d+) MiB and (\d+) MiB are "
                        r"missing", msg)
    assert missing, msg
    # needs - missing = the fixture's free memory less the card's context
    assert int(missing.group(2)) - int(missing.group(3)) == 5276 - CONTEXT
    assert not any(t.startswith(("Create the project", "Write ")) for t in run.chunks)


# --- the GPU memory the running ai-llm holds counts as free for the plan ---------------------------------


@pytest.fixture
def running_stand_in(deploy):
    """A running container with the role's container name (busybox sleep under an init, from the CPU image)."""
    subprocess.run(["podman", "run", "-d", "--init", "--name", deploy.name, "--entrypoint", "/bin/sleep", cpu_image(),
                    "600"], check=True, capture_output=True, timeout=60)
    try:
        yield deploy.name
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", deploy.name], check=False, capture_output=True, timeout=60)


def test_memory_of_the_running_ai_llm_counts_as_free(deploy, models, running_stand_in, tmp_path):
    pid = subprocess.run(["podman", "inspect", "--format", "{{.State.Pid}}", running_stand_in],
                         capture_output=True, text=True, check=True).stdout.strip()
    child = Path("/proc/%s/task/%s/children" % (pid, pid)).read_text().split()[0]
    # A copy of the double whose process list names the container's process (nvidia-smi prints host PIDs).
    doubles = tmp_path / "doubles"
    data = tmp_path / "data" / "nvidia_smi"
    doubles.mkdir()
    data.mkdir(parents=True)
    shutil.copy(DOUBLES / "nvidia-smi", doubles / "nvidia-smi")
    shutil.copy(FIXTURES / "rtx_a5500_busy.txt", data / "rtx_a5500_busy.txt")
    apps = (FIXTURES / "rtx_a5500_busy.apps.txt").read_text()
    assert ", 48213, " in apps
    (data / "rtx_a5500_busy.apps.txt").write_text(apps.replace(", 48213, ", ", %s, " % child))
    assert " running " in containers(running_stand_in)
    run = deploy("rtx_a5500_busy", models["nano32"], doubles=doubles, **NANO)
    assert "--query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader,nounits" in \
        run.args_log.read_text().splitlines()
    plan = plan_of(run)
    # 5276 MiB free + the 18342 MiB ai-llm holds (the other process's 512 MiB stay taken), less the context the new
    # server creates.
    assert plan["gpus"][0]["free_mib"] == 5276 + 18342 - CONTEXT
    busy_only = deploy("rtx_a5500_busy", models["nano32"], **NANO)
    assert len(plan["cpu_expert_layers"]) < len(plan_of(busy_only)["cpu_expert_layers"])
