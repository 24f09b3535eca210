"""Running the collection with a given ansible-core and collections path, for the tarball test and the compat stage
(scripts/compat.py).

``build_tarball()`` is ``ansible-galaxy collection build`` of this checkout, ``install_tarball()`` its install into a
collections path of its own (``ansible-galaxy collection install --offline``).

``ansible_env()`` is the environment: that ansible-core first on PATH, one collections path and config file, nothing
of the caller's ANSIBLE_* or LLM_* variables.

``check_deploy()`` is a check-mode deploy (``ansible-playbook ai_llm.moe_offload.deploy --check --diff``) on
localhost with the demo's settings (inventory/local: the demo model, the routed experts on CPU, host network), in a
folder of its own. The compose command is set to
``[docker, compose]``: check mode only reads the container's state, and with docker as the engine it never asks
podman (``docker inspect`` of a name no daemon knows is an absent container), so it needs no podman lock.
"""
from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Where a collection installed into a collections path lives, below that path.
INSTALLED = Path("ansible_collections") / "ai_llm" / "moe_offload"

# tools/gguf_models.py write_demo_model: nemotron_h_moe whose MoE blocks 1 and 4 hold routed up/down experts
DEMO_PATTERN = r"\.ffn_.*_exps\.weight"


def ansible_env(bin_dir, config, collections, **extra):
    """The environment for the ansible commands in ``bin_dir`` with one config file and collections path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "LLM_"))}
    env.update({
        "PATH": str(bin_dir) + os.pathsep + env["PATH"],
        "ANSIBLE_CONFIG": str(config),
        "ANSIBLE_COLLECTIONS_PATH": str(collections),
        "ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "false",
        "ANSIBLE_LOCALHOST_WARNING": "0",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default",
    })
    env.update(extra)
    return env


def build_tarball(bin_dir, out):
    """Build the collection (this checkout, galaxy.yml's build_ignore) into the folder ``out``; its tarball's path."""
    proc = subprocess.run([str(Path(bin_dir) / "ansible-galaxy"), "collection", "build", "--output-path", str(out),
                           str(ROOT)], capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = Path(out).glob("ai_llm-moe_offload-*.tar.gz")
    return path


def install_tarball(bin_dir, tarball, home):
    """Install ``tarball`` (offline) into ``home``/collections, an empty collections path, with an empty
    ``home``/ansible.cfg: (the environment of ``ansible_env()`` for them, the installed collection's folder)."""
    home = Path(home)
    (home / "ansible.cfg").write_text("[defaults]\n")
    env = ansible_env(bin_dir, home / "ansible.cfg", home / "collections")
    proc = subprocess.run([str(Path(bin_dir) / "ansible-galaxy"), "collection", "install", "--offline", "-p",
                           str(home / "collections"), str(tarball)],
                          capture_output=True, text=True, env=env, cwd=home, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    installed = home / "collections" / INSTALLED
    assert (installed / "MANIFEST.json").is_file()
    return env, installed


def check_deploy(ansible_playbook, root, model, env, cwd):
    """Run the deploy playbook in check mode with the inventory written under ``root``.

    Returns (CompletedProcess, project directory). ``env``: from ``ansible_env()`` (no LLM_* variable: with
    podman-compose the environment would win over .env).
    """
    root = Path(root)
    name = "ai-llm-check-" + uuid.uuid4().hex[:8]
    project = root / "ai-llm"
    host_vars = {
        "ansible_connection": "local",
        "ansible_python_interpreter": "{{ ansible_playbook_python }}",
        "llm_server_project_dir": str(project),
        "llm_server_compose_project": name,
        "llm_server_container_name": name,
        "llm_server_compose_command": ["docker", "compose"],
        "llm_server_image": "localhost/ai-llm:cpu-b10435",
        "llm_server_model_path": str(model),
        "llm_server_network_mode": "host",
        "llm_server_port": 18080,
        "llm_server_ctx_size": 2048,
        "llm_server_parallel": 1,
        "llm_server_moe_offload_mode": "all",
        "llm_server_parity_check": True,
        "llm_server_health_timeout": 60,
    }
    inventory = root / "inventory.yml"
    inventory.write_text(json.dumps({"llm_servers": {"hosts": {"localhost": host_vars}}}))
    proc = subprocess.run([str(ansible_playbook), "ai_llm.moe_offload.deploy", "-i", str(inventory), "--check",
                           "--diff"], capture_output=True, text=True, env=env, cwd=str(cwd), timeout=600, check=False)
    return proc, project


def check_deploy_problems(proc, project):
    """What is wrong with a check-mode deploy's outcome ([] when nothing is)."""
    problems = []
    if proc.returncode != 0:
        problems.append("exit code %d" % proc.returncode)
    recap = [line for line in proc.stdout.splitlines() if line.startswith("localhost ") and "failed=" in line]
    if not recap or "failed=0" not in recap[-1] or "changed=0" in recap[-1]:
        problems.append("recap %r: want failed=0 and changes to show" % (recap[-1] if recap else None))
    if "+LLM_MOE_OFFLOAD_PATTERN='%s'" % DEMO_PATTERN not in proc.stdout:
        problems.append("the .env diff does not set LLM_MOE_OFFLOAD_PATTERN='%s'" % DEMO_PATTERN)
    if project.exists():
        problems.append("check mode wrote %s" % project)
    return problems
