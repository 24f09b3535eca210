"""Logs of the real llama-server (llama.cpp b10435, CPU + RPC, scripts/llama-cpp.sh), captured at test time and parsed.

Each test writes a tiny nemotron_h_moe GGUF, starts the server on a free loopback port, waits for ``/health``
(or for the process to exit), stops it and parses what it wrote to stderr. The formats of this build cover two
eras of llama-server's log: ``-lv 5 --no-log-prefix --no-log-timestamps`` (per-tensor lines, no prefix) and the
prefixed, timestamped lines at ``-lv 4`` (the INFO buffer lines only, like the b7217..b9208 default) and at the
default ``-lv 3`` (neither).
"""
from __future__ import annotations

import contextlib
import http.client
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_log import parse_log
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._placement_proof import (
    expected_from_pattern, gpu_model_mib, verify_placement,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.model import read_model
from tests.helpers.llama_server import SERVER, listening, llama_server, on_a_free_port, run_until_healthy
from tools.gguf_models import write_tiny_nemotron_h_moe

pytestmark = pytest.mark.skipif(SERVER is None,
                                reason="llama-server is not on PATH (bash scripts/setup.sh; source scripts/env.sh)")

EXPERTS = r"\.ffn_.*_exps\.weight"
VERIFIABLE = ["-lv", "5", "--no-log-prefix", "--no-log-timestamps"]


def capture(model, *args, timeout=90):
    """Run the server until /health is 200 (or it exits); return (returncode or None, healthy, stderr)."""
    return run_until_healthy(["-m", model, "-c", "512", "-ngl", "99", "--no-webui"] + list(args), timeout)


def served(model, *args, pattern=EXPERTS):
    """The stderr of a capture() with ``-ot PATTERN=CPU`` that became healthy."""
    exited, healthy, err = capture(model, "-ot", pattern + "=CPU", *args)
    assert healthy and exited is None, err[-3000:]
    return err


def capture_failed_load(model, *args, tries=3):
    """capture() of a model that llama-server fails to load, started again when the log lost its end.

    llama.cpp's logger is asynchronous and never flushed at exit (common/log.cpp common_log_main,
    ggml-org/llama.cpp#22142). A run can lose the end of its log: mostly the last line, "exiting due to model
    loading error", and once in 180 runs on two busy cores everything from the load on, the loader's reason too.
    A run whose log lacks the server's own "failed to load model" line has nothing to parse.
    """
    for _attempt in range(tries):
        exited, healthy, err = capture(model, *args)
        if healthy or "load_model: failed to load model" in err:
            break
    return exited, healthy, err


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "tiny-nemotron.gguf"
    write_tiny_nemotron_h_moe(str(path))
    return path


@pytest.fixture(scope="module")
def names(model):
    return [t.name for t in read_model(str(model)).tensors]


@pytest.fixture(scope="module")
def expected(names):
    """The experts of the tiny model: blocks MEM*E, the E blocks 1 and 4, up and down."""
    found = expected_from_pattern(EXPERTS, names)
    assert len(found) == 4
    return found


@pytest.fixture(scope="module")
def lv5_log(model):
    return served(model, "-fit", "off", *VERIFIABLE)


def test_lv5_no_prefix_per_tensor_lines(lv5_log, expected):
    p = parse_log(lv5_log)
    assert sorted(o["tensor"] for o in p["overridden"]) == sorted(expected)
    assert all(o["buffer"] == "CPU" and o["type"] == "f32" and isinstance(o["mib"], int) for o in p["overridden"])
    assert p["build"] == "b10435-9e40df63b" and p["build_number"] == 10435
    assert p["per_tensor_lines_visible"] is True and p["mmap_override_warning"] is True
    assert p["runs"] == 1 and p["loads"] == 1 and p["load_error"] is None
    assert set(p["model_buffers"]) == {"CPU_Mapped"} and p["model_buffers"]["CPU_Mapped"] > 0
    assert set(p["kv_buffers"]) == {"CPU"} and set(p["rs_buffers"]) == {"CPU"} and set(p["compute_buffers"]) == {"CPU"}
    assert p["offloaded_layers"]["offloaded"] == p["offloaded_layers"]["total"] == 6  # 5 blocks + output
    v = verify_placement(p, expected)
    assert v["verified"] and v["evidence"] == "per_tensor"
    # one expert too few expected: the extra one is named
    v = verify_placement(p, expected[1:])
    assert not v["verified"] and v["unexpected"] == [expected[0]]


def test_version_matches_the_log_build():
    out = subprocess.run([SERVER, "--version"], capture_output=True, text=True, timeout=30, check=False)
    assert parse_log(out.stdout + out.stderr)["build"] == "b10435-9e40df63b"


def test_prefixed_lv4_hides_per_tensor_lines_and_falls_back_to_buffers(model, expected):
    err = served(model, "-fit", "off", "-lv", "4")
    assert "0." in err.splitlines()[0] and " I " in err  # the timestamp + level prefix
    p = parse_log(err)
    assert p["overridden"] == [] and p["per_tensor_lines_visible"] is False
    assert p["build"] == "b10435-9e40df63b" and p["mmap_override_warning"] is True
    assert "CPU_Mapped" in p["model_buffers"] and "CPU" in p["kv_buffers"] and "CPU" in p["rs_buffers"]
    v = verify_placement(p, expected)
    assert not v["verified"] and v["evidence"] == "none" and "verbosity" in v["msg"]
    # a CPU build has no device model buffer: 0 MiB on the "GPU"
    assert gpu_model_mib(p) == 0.0
    v = verify_placement(p, expected, expect_gpu_model_mib=0.0)
    assert v["verified"] and v["evidence"] == "buffers"
    v = verify_placement(p, expected, expect_gpu_model_mib=50.0)
    assert not v["verified"] and v["evidence"] == "buffers"


def test_default_lv3_has_no_evidence_at_all(model, expected):
    p = parse_log(served(model, "-fit", "off"))
    assert p["overridden"] == [] and p["model_buffers"] == {} and p["per_tensor_lines_visible"] is False
    assert p["mmap_override_warning"] is True  # the only trace of the override at -lv 3
    for kw in ({}, {"expect_gpu_model_mib": 0.0}):
        v = verify_placement(p, expected, **kw)
        assert v["verified"] is False and v["evidence"] == "none"


def test_fit_on_prints_the_load_twice_and_the_last_one_counts(model, expected):
    err = served(model, "-fit", "on", *VERIFIABLE)
    assert err.count("buffer type overridden to CPU") == 8  # dry run + real load
    p = parse_log(err)
    assert p["loads"] == 2
    assert sorted(o["tensor"] for o in p["overridden"]) == sorted(expected)
    # the dry run's model buffer is a dummy "CPU ... 0.00 MiB"; the real load maps the file
    assert set(p["model_buffers"]) == {"CPU_Mapped"} and p["model_buffers"]["CPU_Mapped"] > 0
    assert verify_placement(p, expected)["verified"]


def test_pattern_that_matches_nothing(model, names, expected):
    pattern = r"\.ffn_gate_exps\."  # nemotron_h_moe has no gate experts
    assert expected_from_pattern(pattern, names) == []
    p = parse_log(served(model, "-fit", "off", *VERIFIABLE, pattern=pattern))
    assert p["overridden"] == [] and p["per_tensor_lines_visible"] is True
    assert p["mmap_override_warning"] is False
    # what the operator meant (the experts) is not proven, and every one of them is named
    v = verify_placement(p, expected)
    assert not v["verified"] and v["missing"] == sorted(expected) and "no overridden tensor" in v["msg"]


def test_broken_model_gives_the_load_error(tmp_path, model):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(model.read_bytes()[:4096])  # a valid header, tensor data cut off
    exited, healthy, err = capture_failed_load(broken, "-ot", EXPERTS + "=CPU", *VERIFIABLE)
    assert not healthy and exited not in (None, 0)
    p = parse_log(err)
    assert "llama_model_loader: failed to load model from" in p["load_error"]  # the loader's own reason is kept
    # the last line, "exiting due to model loading error", is lost in some runs (capture_failed_load): the reason
    # is read the same without it
    without_last = "\n".join(line for line in err.splitlines() if "exiting due to model loading error" not in line)
    assert parse_log(without_last)["load_error"] == p["load_error"]
    v = verify_placement(p, ["blk.1.ffn_up_exps.weight"], expect_gpu_model_mib=0.0)
    assert not v["verified"] and p["load_error"] in v["msg"]


def test_restarted_server_log_takes_the_last_run(model, lv5_log):
    second = served(model, "-fit", "off", *VERIFIABLE, pattern=r"blk\.4\.ffn_up_exps")
    p = parse_log(lv5_log + second)
    assert p["runs"] == 2
    assert [o["tensor"] for o in p["overridden"]] == ["blk.4.ffn_up_exps.weight"]
    # and a good run after a failed one is not reported as failed
    bad = "srv    load_model: loading model 'x.gguf'\nllama_model_load: error loading model: boom\n" \
          "srv  llama_server: exiting due to model loading error\n"
    assert parse_log(bad + lv5_log)["load_error"] is None
    assert parse_log(lv5_log + bad)["load_error"] == "boom"


def test_module_on_the_real_log(ansible_module, tmp_path, model, lv5_log):
    log = tmp_path / "server.log"
    log.write_text(lv5_log)
    r = ansible_module("llama_server_log", {"path": str(log), "expect_pattern": EXPERTS, "gguf": str(model)})
    assert not r["failed"] and r["verified"] is True and r["evidence"] == "per_tensor", json.dumps(r)[:2000]
    r = ansible_module("llama_server_log", {"path": str(log), "expect_pattern": r"\.ffn_(up|down)_",
                                            "gguf": str(model)})
    assert r["failed"] and r["missing"] and all(n in r["msg"] for n in r["missing"])


# ---------------------------------------------------------------- crashes and errors of the real server

RPC_SERVER = shutil.which("ggml-rpc-server") or shutil.which("ggml-rpc-server-vulkan")


def test_unknown_architecture_is_the_load_error(tmp_path, model):
    """The real loader's reason, not the tokenizer.ggml.unknown_token_id line that also says "unknown"."""
    odd = tmp_path / "odd-arch.gguf"
    odd.write_bytes(model.read_bytes().replace(b"nemotron_h_moe", b"unknownarch_xy"))  # same length: still valid
    exited, healthy, err = capture_failed_load(odd, "-lv", "5")
    assert not healthy and exited not in (None, 0), err[-3000:]
    p = parse_log(err, exit_code=exited)
    assert "unknown model architecture: 'unknownarch_xy'" in p["load_error"], p["load_error"]
    assert p["crash"] is None and p["failure"] == "the model failed to load: " + p["load_error"]


@contextlib.contextmanager
def rpc_server():
    """``ggml-rpc-server`` on a free loopback port: yields (endpoint, process); always stopped."""

    def start(port):
        proc = subprocess.Popen([RPC_SERVER, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None and not listening(proc.pid, port):
            time.sleep(0.2)
        return port, proc

    # a server that exited could not bind its port
    port, proc = on_a_free_port(start, lambda started, _port: started[1].poll() is not None)
    try:
        yield f"127.0.0.1:{port}", proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.mark.skipif(RPC_SERVER is None, reason="ggml-rpc-server is not on PATH")
def test_a_killed_rpc_server_aborts_llama_server_and_that_is_a_crash(model, expected):
    """GGML_ABORT for real: the RPC device dies under a running llama-server, which aborts on the next request."""
    args = ["-m", model, "-c", "512", "-ngl", "99", "--no-webui", "-fit", "off", "-ot", EXPERTS + "=CPU"]
    with rpc_server() as (endpoint, rpc):
        with llama_server(args + ["--rpc", endpoint], 120) as server:
            assert server.healthy, "llama-server did not become ready"
            rpc.kill()
            rpc.wait()
            body = json.dumps({"prompt": "Hello", "n_predict": 8}).encode()
            try:
                urllib.request.urlopen(urllib.request.Request(server.url + "/completion", body), timeout=60).read()
            except (urllib.error.URLError, OSError, http.client.HTTPException):
                pass  # the server died while answering
            try:
                exit_code = server.proc.wait(60)
            except subprocess.TimeoutExpired:
                exit_code = None
    stderr = server.stderr
    assert exit_code is not None and exit_code < 0, "llama-server did not die"
    p = parse_log(stderr, exit_code=exit_code)
    assert "Remote RPC server crashed or returned malformed response" in p["crash"], stderr[-3000:]
    assert "RPC server" in p["crash_cause"] and p["failure"].startswith("llama-server died: ")
    # the load before it was fine, and proved at the default verbosity by the per-device buffers: not any more
    assert not verify_placement(p, expected)["verified"]


@pytest.mark.skipif(RPC_SERVER is None, reason="ggml-rpc-server is not on PATH")
def test_per_device_buffers_of_a_real_rpc_device(model):
    """At -lv 4 the buffers of a real device (RPC0, named RPC0[host:port] in the log) prove the placement the way
    a GPU's do; at the default verbosity (-lv 3) this build prints no buffer line, and nothing is proved."""
    with rpc_server() as (endpoint, _rpc):
        lv4 = served(model, "--rpc", endpoint, "-fit", "off", "-lv", "4")
        default = served(model, "--rpc", endpoint, "-fit", "off")
    p = parse_log(lv4)
    devices = {k: v for k, v in p["model_buffers"].items() if k.startswith("RPC0")}
    assert list(devices) == [f"RPC0[{endpoint}]"] and set(p["kv_buffers"]) >= set(devices)
    plan = {"RPC0": devices[f"RPC0[{endpoint}]"]}
    v = verify_placement(p, expect_model_buffers=plan, expect_offloaded_layers=6, require_ready=True)
    assert v["verified"] and v["evidence"] == "device_buffers", v["msg"]
    v = verify_placement(p, expect_model_buffers={"RPC0": plan["RPC0"] + 0.02})
    assert not v["verified"] and v["evidence"] == "device_buffers"
    p = parse_log(default)
    assert p["model_buffers"] == {} and p["server_ready"] is True
    v = verify_placement(p, expect_model_buffers=plan, require_ready=True)
    assert not v["verified"] and v["evidence"] == "none" and "no model buffer lines" in v["msg"]
