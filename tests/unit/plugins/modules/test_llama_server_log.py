"""The llama_server_log module run through real Ansible (the ``ansible_module`` fixture)."""
from __future__ import annotations

import re
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.helpers import llama_logs
from tests.helpers.llama_logs import LAYER, NEMOTRON_EXPERTS, SIGSEGV_WORDS, model_buf, override, text
from tools.gguf_models import write_tiny_nemotron_h_moe

LV4 = str(llama_logs.LV4)
DEFAULT = str(llama_logs.DEFAULT)
SHEXP1 = "blk.1.ffn_up_shexp.weight"
MISMATCH = {"path": LV4, "expect_tensors": NEMOTRON_EXPERTS[2:] + [SHEXP1]}
FALLBACK = {"path": DEFAULT, "expect_tensors": NEMOTRON_EXPERTS, "expect_gpu_model_mib": 1369.0}
BROKEN_ERROR = "llama_model_loader: failed to load model from /models/broken.gguf"
BROKEN = ("0.00.005.352 E llama_model_load: error loading model: %s\n"
          "0.00.005.832 E srv  llama_server: exiting due to model loading error\n" % BROKEN_ERROR)
BUFFERS = {"path": DEFAULT, "expect_tensors": NEMOTRON_EXPERTS, "expect_model_buffers": {"CUDA0": 1369.43},
           "expect_kv_buffers": {"CUDA0": 768.0}, "expect_rs_buffers": {"CUDA0": 47.62},
           "expect_compute_buffers": {"CUDA0": 1100}, "expect_offloaded_layers": 53, "require_ready": True}
# the last line of LV4
SEGV = "exit code 139 (SIGSEGV) after the line: main: server is listening on http://0.0.0.0:8080 - starting the " \
       "main loop"
WITHOUT_READY = {"expect_gpu_model_mib": 1369.0, "content": "\n".join(
    x for x in Path(DEFAULT).read_text().splitlines()
    if not any(r in x for r in ("model loaded", "listening", "slots are idle")))}


def tiny_log(buffers):
    """A -lv 5 log of the tiny nemotron_h_moe model (the integration test holds b10434's real capture): the routed
    experts of blocks 1 and 4 overridden to the buffer given for their block."""
    return text(LAYER, *[override("blk.%d.ffn_%s_exps.weight" % (b, k), buffer, 0, "f32")
                         for b, buffer in zip((1, 4), buffers) for k in ("up", "down")], model_buf("CPU_Mapped", 0.75))


TINY = "the tiny model"
ON_CPU = {"content": tiny_log(("CPU", "CPU")), "expect_pattern": r"\.ffn_.*_exps\.weight", "gguf": TINY}
ITEMS = [r"blk\.1\.ffn_.*_exps\.weight=CUDA1", r"\.ffn_.*_exps\.weight=CPU"]
PINNED = {"content": tiny_log(("CUDA1", "CPU")), "expect_override_patterns": ITEMS, "gguf": TINY}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model = str(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    write_tiny_nemotron_h_moe(model)
    return model


@pytest.mark.parametrize("args, fields, words", [
    ({"path": LV4, "expect_tensors": NEMOTRON_EXPERTS}, {
        "failed": False, "changed": False, "verified": True, "evidence": "per_tensor", "expected_count": 46,
        "overridden": 46, "build": "b7500-1a2b3c4", "offloaded_layers": {"offloaded": 53, "total": 53},
        "gpu_model_mib": 1369.43}, []),
    # without expectation nothing fails
    ({"path": LV4}, {"failed": False, "verified": False, "evidence": "none", "expected_count": None,
                     "overridden": 46}, ["no expectation"]),
    # a mismatch fails naming the missing and the unexpected tensors, or is only returned
    (MISMATCH, {"failed": True, "verified": False, "missing": [SHEXP1], "unexpected": NEMOTRON_EXPERTS[:2]}, []),
    (dict(MISMATCH, fail_on_mismatch=False), {"failed": False, "verified": False, "missing": [SHEXP1]}, []),
    # hidden per-tensor lines fall back on the GPU model buffer; the default tolerances: the larger of 1 MiB and
    # 1 % of the expected figure
    (FALLBACK, {"failed": False, "verified": True, "evidence": "buffers", "gpu_model_tolerance_mib": 13.69},
     ["verbosity hides the per-tensor"]),
    (dict(FALLBACK, expect_gpu_model_mib=1300.0, gpu_model_tolerance_mib=70.0, gpu_model_tolerance_pct=0.0),
     {"failed": False, "gpu_model_tolerance_mib": 70.0}, []),
    # expect_pattern with gguf: a pattern that matches no tensor of the model expects no override: this log has four
    (dict(ON_CPU, expect_pattern=r"nothing_like_this"), {"failed": True, "expected_count": 0, "unexpected": 4},
     ["matches no tensor of the model", "blk.4.ffn_up_exps.weight"]),
    (dict(ON_CPU, expect_pattern=r"blk\.(1"), {"failed": True}, ["not a valid regular expression"]),
    # expect_override_patterns with gguf
    (PINNED, {"failed": False, "verified": True, "expected_count": 4}, []),
    (dict(PINNED, expect_override_patterns=["exps"]), {"failed": True},
     ["expect_override_patterns: override 'exps' is not PATTERN=BUFFER"]),
    # a load error or an exit code fails
    ({"content": BROKEN}, {"failed": True, "load_error": BROKEN_ERROR}, ["failed to load", "broken.gguf"]),
    ({"content": BROKEN, "fail_on_mismatch": False}, {"failed": False, "verified": False, "load_error": BROKEN_ERROR},
     []),
    ({"path": LV4, "expect_tensors": NEMOTRON_EXPERTS, "exit_code": 139}, {
        "failed": True, "verified": False, "exit_code": 139, "crash": SEGV, "crash_cause": SIGSEGV_WORDS,
        "failure": f"llama-server died: {SEGV} ({SIGSEGV_WORDS})"}, ["SIGSEGV"]),
    # per-device buffers and the other buffers
    (BUFFERS, {"failed": False, "verified": True, "evidence": "device_buffers", "checks": 5}, []),
    (dict(BUFFERS, expect_model_buffers={"CUDA0": 1369.0}), {"failed": True},
     ["model buffer CUDA0: 1369.43 MiB, expected 1369.00 +/- 0.01 MiB"]),
    (dict(BUFFERS, expect_model_buffers={"CUDA0": "lots"}), {"failed": True},
     ["expect_model_buffers must map buffer names to MiB"]),
    # an excerpt without the ready line: not required by default
    (WITHOUT_READY, {"verified": True}, []),
    (dict(WITHOUT_READY, require_ready=True), {"failed": True}, ["does not show the server ready"]),
    # argument errors
    ({"path": LV4, "content": "x"}, {"failed": True}, ["mutually exclusive"]),
    ({"expect_tensors": ["a"]}, {"failed": True}, ["one of the following is required"]),
    ({"content": "x", "expect_pattern": "exps"}, {"failed": True}, ["gguf"]),
    ({"content": PINNED["content"], "expect_override_patterns": ITEMS}, {"failed": True}, ["gguf"]),
    ({"path": "/nonexistent/nope.log"}, {"failed": True}, ["nope.log"]),
])
def test_the_parsed_log_and_the_verdict_come_back(ansible_module, tiny, args, fields, words):
    """A number stands for the length of a list field; TINY for the path of the tiny model."""
    r = ansible_module("llama_server_log", {k: tiny if v is TINY else v for k, v in args.items()})
    got = {k: len(r[k]) if isinstance(v, int) and isinstance(r[k], list) else r[k] for k, v in fields.items()}
    assert got == fields
    assert all(w in r["msg"] for w in words), r["msg"]


def test_expect_pattern_with_gguf_in_check_mode(ansible_module, tiny):
    r = ansible_module("llama_server_log", dict(ON_CPU, gguf=tiny), check=True)
    assert not r["failed"] and r["verified"] is True and r["expected_count"] == 4


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
