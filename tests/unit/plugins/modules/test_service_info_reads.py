"""llm_server_service_info reads the GPUs, the host memory and the model's header in the same call as the service
(what the llm_server role reads of a host): the same results as gpu_info, host_info and gguf_info give, and the
same message when one of them fails. Through real Ansible, with the nvidia-smi test double."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.helpers.cuda_image import REQUIRE_12_8_1, image_requiring
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


@pytest.fixture(name="cuda_image")
def cuda_image_fixture():
    """A FROM-scratch image whose only content is the CUDA image's requirement, built with real podman."""
    with image_requiring() as tag:
        yield tag


@pytest.mark.parametrize("fixture, brand, cuda", [("rtx_a5500", "Unknown", "12.4"), ("rtx_4090", "GeForce", "12.6")])
def test_the_image_requirement_and_each_gpu_s_facts_are_read(ansible_module, tmp_path, cuda_image, fixture, brand, cuda):
    # (gpu_access reservations: no CDI check, which the doubles' GPUs would fail without a spec of their own; the
    # access checks are tests/integration/test_gpu_access.py's)
    args = {"project_dir": str(tmp_path / "ai-llm"), "container_name": "ai-llm-absent-" + tmp_path.name[-8:],
            "compose_command": ["podman-compose"], "gpus": True, "image": cuda_image, "gpu_access": "reservations"}
    result = ansible_module("llm_server_service_info", args, extra_env=dict(GPU_ENV, NVIDIA_SMI_FIXTURE=fixture))
    found = result["cuda_requirement"]
    assert result["failed"] is False and found["found"] is True and found["require"] == REQUIRE_12_8_1
    assert [(g["index"], g["brand"], g["cuda"]) for g in found["gpus"]] == [(0, brand, cuda)]
    absent = ansible_module("llm_server_service_info", dict(args, image=cuda_image + "-absent"),
                            extra_env=dict(GPU_ENV, NVIDIA_SMI_FIXTURE=fixture))
    assert absent["cuda_requirement"]["found"] is False and "gpus" not in absent["cuda_requirement"]
    cpu = ansible_module("llm_server_service_info", args, extra_env={"PATH": os.environ["PATH"]})
    assert "cuda_requirement" not in cpu  # a host without GPU: nothing to check
