"""The llama_server_log module run through real Ansible (the ``ansible_module`` fixture)."""
from __future__ import annotations

import re
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.helpers import llama_logs
from tests.helpers.llama_logs import LAYER, NEMOTRON_EXPERTS, PUBLIC, model_buf, override, text
from tools.gguf_models import write_tiny_nemotron_h_moe

LV4 = str(llama_logs.LV4)
DEFAULT = str(llama_logs.DEFAULT)


def test_the_parsed_log_and_the_verdict_come_back_and_without_expectation_nothing_fails(ansible_module):
    r = ansible_module("llama_server_log", {"path": LV4, "expect_tensors": NEMOTRON_EXPERTS})
    assert not r["failed"] and r["changed"] is False
    assert r["verified"] is True and r["evidence"] == "per_tensor"
    assert r["expected_count"] == 46 and len(r["overridden"]) == 46
    assert r["build"] == "b7500-1a2b3c4" and r["offloaded_layers"] == {"offloaded": 53, "total": 53}
    assert r["gpu_model_mib"] == 1369.43
    r = ansible_module("llama_server_log", {"path": LV4})
    assert not r["failed"] and r["verified"] is False and r["evidence"] == "none" and r["expected_count"] is None
    assert "no expectation" in r["msg"] and len(r["overridden"]) == 46


def test_mismatch_fails_naming_missing_and_unexpected(ansible_module):
    expected = NEMOTRON_EXPERTS[2:] + ["blk.1.ffn_up_shexp.weight"]
    r = ansible_module("llama_server_log", {"path": LV4, "expect_tensors": expected})
    assert r["failed"] and r["verified"] is False
    assert r["missing"] == ["blk.1.ffn_up_shexp.weight"]
    assert r["unexpected"] == NEMOTRON_EXPERTS[:2]
    # the same, returned only
    r = ansible_module("llama_server_log", {"path": LV4, "expect_tensors": expected, "fail_on_mismatch": False})
    assert not r["failed"] and r["verified"] is False and r["missing"] == ["blk.1.ffn_up_shexp.weight"]


def test_hidden_per_tensor_lines_fall_back_on_the_gpu_model_buffer_with_its_tolerances(ansible_module):
    args = {"path": DEFAULT, "expect_tensors": NEMOTRON_EXPERTS, "expect_gpu_model_mib": 1369.0}
    r = ansible_module("llama_server_log", args)
    assert not r["failed"] and r["verified"] is True and r["evidence"] == "buffers"
    # the default tolerances: the larger of 1 MiB and 1 % of the expected figure
    assert "verbosity hides the per-tensor" in r["msg"] and r["gpu_model_tolerance_mib"] == 13.69
    args.update(expect_gpu_model_mib=1300.0, gpu_model_tolerance_mib=70.0, gpu_model_tolerance_pct=0.0)
    r = ansible_module("llama_server_log", args)
    assert not r["failed"] and r["gpu_model_tolerance_mib"] == 70.0


def tiny_log(buffers):
    """A -lv 5 log of the tiny nemotron_h_moe model (the integration test holds b10434's real capture): the routed
    experts of blocks 1 and 4 overridden to the buffer given for their block."""
    return text(LAYER, *[override("blk.%d.ffn_%s_exps.weight" % (b, k), buffer, 0, "f32")
                         for b, buffer in zip((1, 4), buffers) for k in ("up", "down")], model_buf("CPU_Mapped", 0.75))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model = str(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    write_tiny_nemotron_h_moe(model)
    return model


def test_expect_pattern_with_gguf_in_check_mode(ansible_module, tiny):
    args = {"content": tiny_log(("CPU", "CPU")), "expect_pattern": r"\.ffn_.*_exps\.weight", "gguf": tiny}
    r = ansible_module("llama_server_log", args, check=True)
    assert not r["failed"] and r["verified"] is True and r["expected_count"] == 4
    # a wider pattern expects the shared experts too, which the log does not show
    r = ansible_module("llama_server_log", dict(args, expect_pattern=r"\.ffn_(up|down)_"))
    assert r["failed"] and r["missing"] == ["blk.1.ffn_down_shexp.weight", "blk.1.ffn_up_shexp.weight",
                                            "blk.4.ffn_down_shexp.weight", "blk.4.ffn_up_shexp.weight"]
    # a pattern that matches no tensor of the model expects no override: this log has four
    r = ansible_module("llama_server_log", dict(args, expect_pattern=r"nothing_like_this"))
    assert r["failed"] and r["expected_count"] == 0 and len(r["unexpected"]) == 4
    assert "matches no tensor of the model" in r["msg"] and "blk.4.ffn_up_exps.weight" in r["msg"]
    r = ansible_module("llama_server_log", dict(args, expect_pattern=r"blk\.(1"))
    assert r["failed"] and "not a valid regular expression" in r["msg"]


def test_a_load_error_a_crash_or_an_exit_code_fails(ansible_module):
    r = ansible_module("llama_server_log", {"path": str(PUBLIC / "b10586_crash_after_load.log")})
    assert r["failed"] and r["crash"] == "CUDA error: an illegal memory access was encountered"
    assert r["server_ready"] is False and r["verified"] is False
    log = ("0.00.005.352 E llama_model_load: error loading model: llama_model_loader: failed to load model from "
           "/models/broken.gguf\n0.00.005.832 E srv  llama_server: exiting due to model loading error\n")
    r = ansible_module("llama_server_log", {"content": log})
    assert r["failed"] and r["load_error"] == "llama_model_loader: failed to load model from /models/broken.gguf"
    assert "failed to load" in r["msg"] and "broken.gguf" in r["msg"]
    r = ansible_module("llama_server_log", {"content": log, "fail_on_mismatch": False})
    assert not r["failed"] and r["verified"] is False and r["load_error"]
    r = ansible_module("llama_server_log", {"path": LV4, "expect_tensors": NEMOTRON_EXPERTS, "exit_code": 139})
    assert r["failed"] and r["verified"] is False and r["exit_code"] == 139
    assert r["crash"].startswith("exit code 139 (SIGSEGV) after the line: ") and "segmentation fault" in r["crash_cause"]
    assert r["failure"].startswith("llama-server died: exit code 139") and "SIGSEGV" in r["msg"]


def test_argument_errors(ansible_module, tmp_path):
    r = ansible_module("llama_server_log", {"path": LV4, "content": "x"})
    assert r["failed"] and "mutually exclusive" in r["msg"]
    r = ansible_module("llama_server_log", {"expect_tensors": ["a"]})
    assert r["failed"] and "one of the following is required" in r["msg"]
    r = ansible_module("llama_server_log", {"content": "x", "expect_pattern": "exps"})
    assert r["failed"] and "gguf" in r["msg"]
    r = ansible_module("llama_server_log", {"path": str(tmp_path / "nope.log")})
    assert r["failed"] and "nope.log" in r["msg"]


def _podman_works():
    if not shutil.which("podman"):
        return False
    return subprocess.run(["podman", "info"], capture_output=True, check=False).returncode == 0


@pytest.mark.skipif(not _podman_works(), reason="podman is not usable here")
def test_container_logs_through_podman(ansible_module, tmp_path):
    """A real container (busybox on scratch) prints a log to stderr and junk to stdout; the module reads it."""
    busybox = shutil.which("busybox")
    if not busybox:
        pytest.skip("no static busybox to build the test image")
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    shutil.copy(busybox, ctx / "busybox")
    shutil.copy(LV4, ctx / "server.log")
    (ctx / "Containerfile").write_text("FROM scratch\nCOPY busybox /bin/busybox\nCOPY server.log /server.log\n")
    image = "localhost/llama-server-log-test:%s" % uuid.uuid4().hex[:8]
    name = "llama-server-log-test-%s" % uuid.uuid4().hex[:8]
    subprocess.run(["podman", "build", "-q", "-t", image, str(ctx)], check=True, capture_output=True)
    try:
        # junk on stdout, some of it not UTF-8 (a module result with such bytes made Ansible refuse the result:
        # "Refusing to deserialize an invalid UTF8 string")
        subprocess.run(["podman", "run", "--name", name, "--network", "none", image, "/bin/busybox", "sh", "-c",
                        "echo '=== Starting differential analysis ==='; printf 'bad \\377\\376 bytes\\n';"
                        " /bin/busybox cat /server.log >&2"],
                       check=True, capture_output=True)
        r = ansible_module("llama_server_log", {"container": name, "container_engine": "podman",
                                                "expect_tensors": NEMOTRON_EXPERTS})
        assert not r["failed"] and r["verified"] is True and r["build"] == "b7500-1a2b3c4"
        r = ansible_module("llama_server_log", {"container": name + "-absent", "container_engine": "podman"})
        assert r["failed"] and re.search(r"podman logs .*-absent failed", r["msg"])
    finally:
        subprocess.run(["podman", "rm", "-f", name], capture_output=True, check=False)
        subprocess.run(["podman", "rmi", "-f", image], capture_output=True, check=False)


def test_invalid_utf8_in_a_log_file_is_replaced_not_fatal(ansible_module, tmp_path):
    path = tmp_path / "bad.log"
    path.write_bytes(Path(LV4).read_bytes().replace(b"load_tensors: loading model tensors",
                                                    b"\xff\xfe\xc3 load_tensors: loading model tensors"))
    r = ansible_module("llama_server_log", {"path": str(path), "expect_tensors": NEMOTRON_EXPERTS})
    assert not r["failed"] and r["verified"] is True and len(r["overridden"]) == 46


def test_per_device_buffers_and_the_other_buffers_through_the_module(ansible_module):
    args = {"path": DEFAULT, "expect_tensors": NEMOTRON_EXPERTS, "expect_model_buffers": {"CUDA0": 1369.43},
            "expect_kv_buffers": {"CUDA0": 768.0}, "expect_rs_buffers": {"CUDA0": 47.62},
            "expect_compute_buffers": {"CUDA0": 1100}, "expect_offloaded_layers": 53, "require_ready": True}
    r = ansible_module("llama_server_log", args)
    assert not r["failed"] and r["verified"] is True and r["evidence"] == "device_buffers", r["msg"]
    assert len(r["checks"]) == 5 and all(c["ok"] for c in r["checks"])
    r = ansible_module("llama_server_log", dict(args, expect_model_buffers={"CUDA0": 1369.0}))
    assert r["failed"] and "model buffer CUDA0: 1369.43 MiB, expected 1369.00 +/- 0.01 MiB" in r["msg"]
    r = ansible_module("llama_server_log", dict(args, expect_model_buffers={"CUDA0": "lots"}))
    assert r["failed"] and "expect_model_buffers must map buffer names to MiB" in r["msg"]


def test_expect_override_patterns_with_gguf(ansible_module, tiny):
    items = [r"blk\.1\.ffn_.*_exps\.weight=CUDA1", r"\.ffn_.*_exps\.weight=CPU"]
    args = {"content": tiny_log(("CUDA1", "CPU")), "expect_override_patterns": items, "gguf": tiny}
    r = ansible_module("llama_server_log", args)
    assert not r["failed"] and r["verified"] is True and r["expected_count"] == 4, r["msg"]
    r = ansible_module("llama_server_log", dict(args, expect_override_patterns=items[::-1]))
    assert r["failed"] and r["missing"] == ["blk.1.ffn_down_exps.weight", "blk.1.ffn_up_exps.weight"]
    r = ansible_module("llama_server_log", dict(args, expect_override_patterns=["exps"]))
    assert r["failed"] and "expect_override_patterns: override 'exps' is not PATTERN=BUFFER" in r["msg"]
    r = ansible_module("llama_server_log", {"content": args["content"], "expect_override_patterns": items})
    assert r["failed"] and "gguf" in r["msg"]


def test_require_ready(ansible_module):
    log = Path(DEFAULT).read_text()
    ready = ("model loaded", "listening", "slots are idle")
    without_ready = "\n".join(x for x in log.splitlines() if not any(r in x for r in ready))
    args = {"content": without_ready, "expect_gpu_model_mib": 1369.0}
    assert ansible_module("llama_server_log", args)["verified"] is True  # an excerpt: not required by default
    r = ansible_module("llama_server_log", dict(args, require_ready=True))
    assert r["failed"] and "does not show the server ready" in r["msg"]
