"""llm_server_service_info reads the GPUs, the host memory and the model's header in the same call as the service
(what the llm_server role reads of a host): the same results as gpu_info, host_info and gguf_info give, and the
same message when one of them fails. Through real Ansible, with the nvidia-smi test double."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tools import gguf_models

pytestmark = pytest.mark.skipif(not shutil.which("podman"), reason="needs podman (the compose tool's engine)")

DOUBLES = Path(__file__).resolve().parents[3] / "doubles"
GPU_ENV = {"PATH": "%s:%s" % (DOUBLES, os.environ["PATH"]), "NVIDIA_SMI_FIXTURE": "dual_a5500_a4000"}


def read(ansible_module, tmp_path, model, env=None):
    args = {"project_dir": str(tmp_path / "ai-llm"), "container_name": "ai-llm-absent-" + tmp_path.name[-8:],
            "compose_command": ["podman-compose"], "gpus": True, "host_memory": True, "model_path": model,
            "model_dir": os.path.dirname(model), "lock_path": str(tmp_path / "ai-llm" / ".llm_server.lock")}
    return ansible_module("llm_server_service_info", args, extra_env=GPU_ENV if env is None else env)


def test_one_call_reads_what_the_three_modules_read(ansible_module, tmp_path):
    model = gguf_models.write_nemotron_nano_30b(tmp_path)[0]
    result = read(ansible_module, tmp_path, model)
    assert result["failed"] is False and result["container"] == {"exists": False, "status": "missing"}
    gpus = ansible_module("gpu_info", {}, extra_env=GPU_ENV)
    assert result["gpu_info"]["gpus"] == gpus["gpus"] and result["gpu_info"]["topology"] == "dual"
    info = ansible_module("gguf_info", {"path": model, "tensors": "none"})
    for key in ("architecture", "offload_pattern", "expert_tensors", "bytes", "layer_kinds", "model", "files"):
        assert result["model_info"][key] == info[key], key
    host = result["host_info"]
    assert 0 < host["memory_available_mib"] <= host["memory_total_mib"]
    assert result["disk"]["lock_file"] is False and result["disk"]["model_outside_dir"] is None


def test_a_failed_read_fails_with_its_own_message(ansible_module, tmp_path):
    missing = str(tmp_path / "models" / "gone.gguf")
    result = read(ansible_module, tmp_path, missing)
    alone = ansible_module("gguf_info", {"path": missing, "tensors": "none"})
    assert result["failed"] is True and result["msg"] == alone["msg"] == missing + ": no such file"
    assert result["container"]["exists"] is False and "gpu_info" in result  # what was read before is returned
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF\x03\x00\x00\x00")
    result = read(ansible_module, tmp_path, str(broken))
    alone = ansible_module("gguf_info", {"path": str(broken), "tensors": "none"})
    assert result["failed"] is True and result["msg"] == alone["msg"] and result["offset"] == alone["offset"]
    env = dict(GPU_ENV, NVIDIA_SMI_FIXTURE="driver_mismatch")
    result = read(ansible_module, tmp_path, gguf_models.write_nemotron_nano_30b(tmp_path)[0], env=env)
    alone = ansible_module("gpu_info", {}, extra_env=env)
    assert result["failed"] is True and alone["failed"] is True and result["msg"] == alone["msg"]
    assert "model_info" not in result  # the reads stop at the first failure, in the role's order
