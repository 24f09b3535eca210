"""Hostile values from the inventory to llama-server's argv, byte for byte, with the real tools: the role's tasks
(run through Ansible: its templates) write the API key file, .env and the compose file; real podman-compose 1.6.0 reads them;
real podman runs the image's start command (printing the argv it would exec) and shows what `podman inspect`
sees. Nothing here needs llama-server itself to run.

Run under the podman lock: ``flock /tmp/ai-llm-podman.lock python -m pytest tests/integration/test_role_encoding.py``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_render import (
    HASH_LABEL,
    RenderError,
    env_values,
    parse_env,
)
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._role_variables import check_settings
from tests.helpers.role_vars import role_values
from tests.helpers.llm_deploy import cpu_image
from tests.helpers.role_files import write_files
from tools.gguf_models import write_demo_model

pytestmark = pytest.mark.skipif(not shutil.which("podman") or not shutil.which("podman-compose"),
                                reason="needs podman and podman-compose")

PATTERN = r"blk\.(1|4)\.ffn_(up|down)_exps\.weight$"
OVERRIDES = [r"blk\.9\.ffn_.*_exps=CUDA1"]
EXTRA = ["--alias", "a$b${HOME}`id`'\" x", "--api-prefix", "$$"]
KEY = "sk-RT'0002 ${HOME} \\ \"q\" $(id)"


@pytest.fixture
def project(tmp_path):
    name = "ai-llm-encoding-" + uuid.uuid4().hex[:8]
    models = tmp_path / "mo dels$"
    models.mkdir()
    model = write_demo_model(str(models / "demo.gguf"))
    values = {
        "llm_server_project_dir": str(tmp_path / "ai-llm"),
        "llm_server_compose_project": name,
        "llm_server_container_name": name,
        "llm_server_image": cpu_image(),
        "llm_server_model_path": model,
        "llm_server_network_mode": "host",
        "llm_server_bind_address": "0.0.0.0",
        "llm_server_port": 18299,
        "llm_server_ctx_size": 512,
        "llm_server_log_verbosity": 5,
        "llm_server_extra_args": EXTRA,
        "llm_server_restart_policy": "no",
    }
    settings = check_settings(role_values(values), api_key=KEY).as_dict()
    yield settings
    subprocess.run(["podman", "rm", "--force", name], capture_output=True, check=False, timeout=120)


def compose(settings, *args):
    return subprocess.run(["podman-compose", "-p", settings["compose_project"], "-f", settings["paths"]["compose"]]
                          + list(args), capture_output=True, text=True, check=False, timeout=300)


def write(settings):
    placement = {"pattern": PATTERN, "device_overrides": OVERRIDES, "topology": "cpu"}
    proc, given = write_files(settings, placement, api_key=KEY)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "changed=" in proc.stdout and KEY not in proc.stdout
    return given["config"]


def test_hostile_values_reach_llama_server_byte_for_byte(project):
    config = write(project)
    run = compose(project, "run", "--rm", "-T", "-e", "START_LLAMA_SERVER_PRINT_ARGV=1", project["service_name"])
    assert run.returncode == 0, run.stderr
    argv = [line[1:-1] for line in run.stdout.splitlines() if line.startswith("[") and line.endswith("]")]
    assert argv[argv.index("--override-tensor") + 1] == OVERRIDES[0] + "," + PATTERN + "=CPU"
    assert argv[argv.index("--model") + 1] == "/models/demo.gguf"
    assert argv[argv.index("-lv") + 1] == "5"
    assert argv[argv.index("--api-key-file") + 1] == "/run/secrets/ai-llm/api-key"
    assert argv[-len(EXTRA):] == EXTRA
    # The key file as llama-server reads it (one line per key, common/arg.cpp --api-key-file): the key, whole.
    cat = compose(project, "run", "--rm", "-T", "--entrypoint", "/bin/cat", project["service_name"],
                  "/run/secrets/ai-llm/api-key")
    assert cat.returncode == 0, cat.stderr
    assert cat.stdout.split("\n")[0] == KEY and cat.stdout.count("\n") == 1
    # Nothing of the key in .env, the compose file or the container's configuration (podman inspect).
    for path in (project["paths"]["env"], project["paths"]["compose"]):
        assert "sk-RT" not in open(path, encoding="utf-8").read()
    up = compose(project, "up", "-d", project["service_name"])
    assert up.returncode == 0, up.stderr
    inspect = subprocess.run(["podman", "container", "inspect", project["container_name"]], capture_output=True,
                             text=True, check=True, timeout=60).stdout
    assert "sk-RT" not in inspect
    labels = json.loads(inspect)[0]["Config"]["Labels"]
    assert labels[HASH_LABEL] == config["config_hash"]
    assert parse_env(open(project["paths"]["env"], encoding="utf-8").read())["LLM_CONFIG_HASH"] == config["config_hash"]


def test_a_value_compose_cannot_read_back_is_not_written(project):
    """The placement's pattern goes through the same encoder: one that .env would change is refused whole, by the
    prepare step, before any file is written."""
    with pytest.raises(RenderError) as refused:
        env_values(project, {"pattern": "blk${HOME}", "topology": "cpu"})
    assert "LLM_MOE_OFFLOAD_PATTERN" in str(refused.value) and "'${'" in str(refused.value)
    assert not os.path.exists(project["paths"]["env"])
