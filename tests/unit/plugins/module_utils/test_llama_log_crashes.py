"""Crashes and errors seen for what they are, and a parser that stays bounded on any input.

The crash lines are written with the printf formats of llama.cpp's own source:

* ggml/src/ggml.c ``ggml_abort``: ``"%s:%d: "`` (file, line) then the message, then ``ggml_print_backtrace``:
  gdb's ``bt`` output, or glibc ``backtrace_symbols_fd`` lines ``path(symbol+0xoff)[0xaddr]``;
* ggml/include/ggml.h ``GGML_ASSERT(x)``: ``GGML_ABORT("GGML_ASSERT(%s) failed", #x)``;
* ggml/src/ggml-rpc/ggml-rpc.cpp ``RPC_STATUS_ASSERT``: ``GGML_ABORT("Remote RPC server crashed or returned
  malformed response")``, with the ``send failed``/``recv failed`` lines of the RPC client around it;
* ggml/src/ggml.cpp ``ggml_uncaught_exception``: the backtrace, then libstdc++'s ``terminate called after throwing
  an instance of '...'`` and ``  what():  ...``.

``b10435_rpc_server_killed_lv4.log`` is the real stderr of llama-server b10435 (``-lv 4``, the tiny nemotron_h_moe
model on an RPC device) whose ``ggml-rpc-server`` was killed before a completion: the GGML_ABORT of
ggml-rpc.cpp, gdb's backtrace, exit code 134 (the build and library paths replaced by /build and /opt).
``b10434_sigill_amx_default_verbosity.log`` is the real stderr of the PyPI llama-server b10434 on a CPU without
AVX-VNNI (``llama-server -m tiny.gguf -c 512 -ot '\\.ffn_.*_exps\\.weight=CPU' -fit off``), which died by SIGILL
(exit code 132) at the default verbosity.
"""
from __future__ import annotations

import io
import tracemalloc
from pathlib import Path

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _llama_log
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_log import (
    parse_log,
    signal_of_exit_code,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._placement_proof import (
    verify_placement,
)

DATA = Path(__file__).resolve().parents[3] / "data" / "llama_logs"
GOOD_LOAD = [
    "0.00.089.974 I srv         start: binding port with default address family",
    "0.00.090.813 I srv    load_model: loading model 'm.gguf'",
    "0.00.120.000 D tensor blk.1.ffn_up_exps.weight (0 MiB f32) buffer type overridden to CPU",
    "0.00.120.100 I load_tensors: offloaded 6/6 layers to GPU",
    "0.00.120.200 I load_tensors:        RPC0 model buffer size =     0.75 MiB",
    "0.00.150.000 I srv  llama_server: model loaded",
    "0.00.150.100 I srv  llama_server: server is listening on http://127.0.0.1:8080",
]
EXPECTED = ["blk.1.ffn_up_exps.weight"]


def _good():
    p = parse_log("\n".join(GOOD_LOAD))
    assert verify_placement(p, EXPECTED)["verified"], "the good load alone verifies"
    return p


RPC_ABORT = [
    "/home/runner/work/llama.cpp/llama.cpp/ggml/src/ggml-rpc/ggml-rpc.cpp:519: Remote RPC server crashed or "
    "returned malformed response",
    "/app/libggml-base.so(+0x16bcb)[0x7f5c6e2b0bcb]",
    "/app/libggml-base.so(ggml_print_backtrace+0x21f)[0x7f5c6e2b100f]",
    "/app/libggml-base.so(ggml_abort+0x152)[0x7f5c6e2b11e2]",
    "/app/libggml-rpc.so(+0x7c1a)[0x7f5c6e1d5c1a]",
    "/app/llama-server(+0x9e3a1)[0x55d6b2e3f3a1]",
]


@pytest.mark.parametrize("lines, crash, cause", [
    (RPC_ABORT, RPC_ABORT[0], "an RPC server (rpc-server) that llama-server uses as a device died"),
    (["E send failed (bytes_sent=0, size_to_send=8)",
      "ggml-rpc.cpp:509: Remote RPC server crashed or returned malformed response"],
     "ggml-rpc.cpp:509: Remote RPC server crashed or returned malformed response", "RPC server"),
    (["/src/llama.cpp/ggml/src/ggml-cpu/ops.cpp:4321: GGML_ASSERT(ne00 % 32 == 0) failed",
      "[New LWP 1234]", "[Thread debugging using libthread_db enabled]",
      "0x00007f8d3c0ea42f in __GI___wait4 (pid=1235, stat_loc=0x0, options=0, usage=0x0) at wait4.c:30",
      "#0  0x00007f8d3c0ea42f in __GI___wait4 (pid=1235) at ../sysdeps/unix/sysv/linux/wait4.c:30",
      "#1  0x00007f8d3c5a1b6b in ggml_print_backtrace () from /app/libggml-base.so",
      "[Inferior 1 (process 1) detached]"],
     "/src/llama.cpp/ggml/src/ggml-cpu/ops.cpp:4321: GGML_ASSERT(ne00 % 32 == 0) failed", "GGML_ASSERT"),
    (["/app/ggml/src/ggml.c:1651: fatal error"], "/app/ggml/src/ggml.c:1651: fatal error", "GGML_ABORT"),
    (["terminate called after throwing an instance of 'std::runtime_error'",
      "  what():  tensor 'blk.0.attn_q.weight' has wrong shape"],
     "terminate called after throwing an instance of 'std::runtime_error'",
     "an uncaught C++ exception ended llama-server: tensor 'blk.0.attn_q.weight' has wrong shape"),
    (["#0  0x00007f8d3c0ea42f in __GI___wait4 (pid=1235) at ../sysdeps/unix/sysv/linux/wait4.c:30"],
     "#0  0x00007f8d3c0ea42f in __GI___wait4 (pid=1235) at ../sysdeps/unix/sysv/linux/wait4.c:30", "backtrace"),
    (["/app/libggml-base.so(ggml_abort+0x152)[0x7f5c6e2b11e2]"],
     "/app/libggml-base.so(ggml_abort+0x152)[0x7f5c6e2b11e2]", "backtrace"),
    (["E CUDA error: an illegal memory access was encountered",
      "E   current device: 0, in function ggml_backend_cuda_synchronize at ggml-cuda.cu:2628",
      "/src/ggml/src/ggml-cuda/ggml-cuda.cu:88: CUDA error"],
     "CUDA error: an illegal memory access was encountered", "GPU backend failed"),
    (["Segmentation fault (core dumped)"], "Segmentation fault (core dumped)", "segmentation fault"),
    (["Illegal instruction (core dumped)"], "Illegal instruction (core dumped)", "instruction this CPU does not have"),
    (["Killed"], "Killed", "out-of-memory killer"),
])
@pytest.mark.parametrize("where", ["after the load", "during the load"])
def test_every_crash_form_is_a_crash_and_never_verifies(lines, crash, cause, where):
    head = GOOD_LOAD if where == "after the load" else GOOD_LOAD[:4]
    p = parse_log("\n".join(head + lines))
    assert p["crash"] == crash
    assert cause in p["crash_cause"]
    assert p["failure"].startswith("llama-server died: " + crash)
    assert p["backtrace"] is any(line.startswith(("/app/lib", "#", "[Inferior")) for line in lines)
    v = verify_placement(p, EXPECTED, expect_model_buffers={"RPC0": 0.75})
    assert not v["verified"] and v["msg"].startswith("llama-server died: " + crash) and cause in v["msg"]


def test_the_first_fatal_line_is_the_crash_and_the_abort_that_follows_does_not_replace_it():
    p = parse_log("\n".join(GOOD_LOAD + ["E CUDA error: out of memory", "/src/ggml-cuda.cu:88: CUDA error"]))
    assert p["crash"] == "CUDA error: out of memory"


@pytest.mark.parametrize("code, name, words", [
    (132, "SIGILL", "instruction this CPU does not have"), (134, "SIGABRT", "aborted itself"),
    (139, "SIGSEGV", "segmentation fault"), (137, "SIGKILL", "out-of-memory killer"), (-11, "SIGSEGV", "stack"),
    (135, "SIGBUS", "memory-mapped"), (136, "SIGFPE", "arithmetic"),
])
def test_a_signal_exit_code_is_a_crash_even_after_a_good_log(code, name, words):
    p = parse_log("\n".join(GOOD_LOAD), exit_code=code)
    assert p["crash"] == f"exit code {code} ({name}) after the line: {GOOD_LOAD[-1].split(' srv  ')[1]}"
    assert words in p["crash_cause"] and p["exit_code"] == code
    v = verify_placement(p, EXPECTED)
    assert not v["verified"] and name in v["msg"]


def test_the_real_sigill_of_the_pypi_build_on_a_cpu_without_avx_vnni():
    text = (DATA / "b10434_sigill_amx_default_verbosity.log").read_text()
    p = parse_log(text)
    assert p["crash"] is None and p["server_ready"] is False  # the log alone does not say it died...
    p = parse_log(text, exit_code=132)  # ...the exit code does
    assert p["crash"] == "exit code 132 (SIGILL) after the line: AMX is not ready to be used!"
    assert "instruction this CPU does not have" in p["crash_cause"]
    assert p["failure"] == f"llama-server died: {p['crash']} ({p['crash_cause']})"
    assert not verify_placement(p, [], expect_gpu_model_mib=0.0)["verified"]


def test_the_real_abort_of_a_killed_rpc_server():
    text = (DATA / "b10435_rpc_server_killed_lv4.log").read_text()
    p = parse_log(text, exit_code=134)
    assert p["crash"] == ("/build/llama.cpp/ggml/src/ggml-rpc/ggml-rpc.cpp:644: Remote RPC server crashed or returned "
                          "malformed response")
    assert p["crash_cause"].startswith("an RPC server (rpc-server) that llama-server uses as a device died")
    assert "SIGABRT, exit code 134" in p["crash_cause"] and p["backtrace"] is True
    assert p["server_ready"] is True  # it served before the RPC server died
    # the load itself was right, and the per-device proof (RPC0 without its endpoint) would have held...
    assert p["model_buffers"] == {"CPU_Mapped": 0.59, "RPC0[127.0.0.1:18850]": 0.37}
    alive = parse_log(text[:text.index("/build/llama.cpp/ggml/src/ggml-rpc")])
    assert alive["crash"] is None
    assert verify_placement(alive, expect_model_buffers={"RPC0": 0.37}, expect_kv_buffers={"RPC0": 0.06},
                            require_ready=True)["verified"]
    # ...but not after the crash
    v = verify_placement(p, expect_model_buffers={"RPC0": 0.37})
    assert not v["verified"] and "Remote RPC server crashed" in v["msg"]


def test_a_crash_line_keeps_its_own_cause_and_names_the_signal():
    p = parse_log("\n".join(GOOD_LOAD + RPC_ABORT), exit_code=134)
    assert p["crash"] == RPC_ABORT[0]
    assert "RPC server" in p["crash_cause"] and "SIGABRT, exit code 134" in p["crash_cause"]


@pytest.mark.parametrize("code", [0, 1, 2, 127, 128, 160, 255, None])
def test_normal_exit_codes_are_no_signal(code):
    assert signal_of_exit_code(code) is None


@pytest.mark.parametrize("code, signal", [(129, 1), (134, 6), (137, 9), (139, 11), (159, 31), (-9, 9), (-1, 1)])
def test_a_shell_s_128_plus_n_and_python_s_minus_n_name_signal_n(code, signal):
    """A shell (and podman) reports a process killed by signal N as 128 + N; Python's subprocess as -N."""
    assert signal_of_exit_code(code) == signal


def test_an_exit_before_the_server_was_ready_never_verifies():
    lines = GOOD_LOAD[:5]
    p = parse_log("\n".join(lines), exit_code=1)
    assert p["crash"] is None and p["server_ready"] is False
    assert p["failure"] == "llama-server exited with code 1 before it was ready"
    v = verify_placement(p, EXPECTED, expect_model_buffers={"RPC0": 0.75})
    assert not v["verified"] and "exited with code 1 before" in v["msg"]
    # the same log without the exit code: the per-tensor proof holds, unless the ready line is required
    p = parse_log("\n".join(lines))
    assert verify_placement(p, EXPECTED)["verified"]
    v = verify_placement(p, EXPECTED, require_ready=True)
    assert not v["verified"] and "does not show the server ready" in v["msg"]
    assert verify_placement(_good(), EXPECTED, require_ready=True)["verified"]


# ---------------------------------------------------------------- the load error is the real one

UNKNOWN_ARCH = [
    # src/llama-model-loader.cpp prints every key (print_info / the loader's "- kv" lines), then
    # src/llama.cpp llama_model_load: "error loading model: %s" with llm_load_arch's exception text
    "0.00.011.000 I llama_model_loader: - kv   0:                       general.architecture str              = foo",
    "0.00.011.100 I llama_model_loader: - kv  19:            tokenizer.ggml.unknown_token_id u32              = 0",
    "0.00.011.200 I llama_model_loader: - kv  20:               tokenizer.ggml.padding_token_id u32              = 0",
    "0.00.011.300 E llama_model_load: error loading model: error loading model architecture: unknown model "
    "architecture: 'foo'",
    "0.00.011.310 E llama_model_load_from_file_impl: failed to load model",
    "0.00.011.400 E srv    load_model: failed to load model, 'm.gguf'",
    "0.00.011.500 E srv  llama_server: exiting due to model loading error",
]


def test_the_unknown_architecture_is_the_load_error_not_the_unknown_token_line():
    p = parse_log("\n".join(UNKNOWN_ARCH), exit_code=1)
    assert p["load_error"] == "error loading model architecture: unknown model architecture: 'foo'"
    assert p["crash"] is None
    assert p["failure"] == "the model failed to load: " + p["load_error"]


# ---------------------------------------------------------------- malformed numbers never raise

@pytest.mark.parametrize("line", [
    "load_tensors: CPU model buffer size = 1.2.3 MiB",
    "load_tensors:        CUDA0 model buffer size = 1e400 MiB",
    "llama_kv_cache:        CUDA0 KV buffer size = .. MiB",
    "sched_reserve:      CUDA0 compute buffer size = 99999999999999999999999999999.5 MiB",
    "load_tensors: offloaded 99999999999999999999999/3 layers to GPU",
    "build: " + "9" * 5000 + " (abc1234) with cc",
    "version: " + "1" * 5000 + " (abc)",
    "tensor blk.0.x (" + "7" * 5000 + " MiB f32) buffer type overridden to CPU",
    "Tensor blk.0.x (size = 1.2.3 MiB) buffer type overriden to CPU",
    "allocating " + "9" * 5000 + " MiB on device 0: cudaMalloc failed: out of memory",
])
def test_malformed_numbers_never_raise(line):
    p = parse_log(line + "\n")
    assert all(isinstance(v, float) and v < 1e16 for v in p["model_buffers"].values())
    assert p["offloaded_layers"] is None and p["build_number"] is None
    for o in p["overridden"]:
        assert o["mib"] is None or o["mib"] < 10 ** 13


# ---------------------------------------------------------------- bytes that are not UTF-8, and streaming

def test_invalid_utf8_is_replaced_from_bytes_files_and_iterables(tmp_path):
    raw = ("\n".join(GOOD_LOAD[:3]) + "\n").encode() + b"junk \xff\xfe\xc3 line\n" + \
        ("\n".join(GOOD_LOAD[3:]) + "\n").encode()
    path = tmp_path / "bad.log"
    path.write_bytes(raw)
    expected = parse_log("\n".join(GOOD_LOAD))
    for source in (raw, io.BytesIO(raw), raw.splitlines(keepends=True)):
        assert parse_log(source) == expected
    with open(path, "rb") as f:
        assert parse_log(f) == expected
    # a tensor name with a bad byte is kept, replaced: the result is always valid text, also from text that holds
    # undecodable bytes as surrogates (Python's surrogateescape)
    line = b"tensor blk.1.ffn_\xff_exps.weight (0 MiB f32) buffer type overridden to CPU\n"
    for source in (line, line.decode("utf-8", "surrogateescape"), [line.decode("utf-8", "surrogateescape")]):
        assert parse_log(source)["overridden"][0]["tensor"] == "blk.1.ffn_\ufffd_exps.weight"


@pytest.mark.parametrize("line", [
    "a" * 2_000_000,
    ". " * 1_000_000,
    "a | " * 500_000,
    "[1] " * 500_000,
    "2025-08-20T11:41:20Z " * 100_000,
    "error loading model: " + " " * 2_000_000 + "x",
    "CUDA error: " + " " * 2_000_000 + "x",
    "GGML_ASSERT(" * 200_000,
    "build info " * 200_000,
    "tensor " * 300_000 + " buffer type overridden to CPU",
    "x.cpp:1: " * 200_000,
    "\x1b[" + "1;" * 1_000_000,
    "0x" + "(+0x1)[0x1]" * 200_000,
])
def test_pathological_long_lines_parse_in_linear_time_and_bounded_memory(line):
    """Each of these lines took seconds to minutes per MB when the stripping and the regular expressions were
    quadratic; a line longer than MAX_LINE is read in pieces, so memory stays bounded."""
    tracemalloc.start()
    try:
        p = parse_log(io.BytesIO(line.encode() + b"\n"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert p["runs"] == 1
    assert peak < 32 << 20


def test_a_big_log_streams_in_bounded_memory(tmp_path):
    """40 MB of log (restarts, loads, debug noise) read from a file: memory does not follow its size."""
    chunk = "\n".join(["build: 7500 (1a2b3c4) with cc"] + GOOD_LOAD
                      + ["0.00.200.000 D slot update_slots: id  0 | task 1 | n_past = %d" % i for i in range(400)])
    path = tmp_path / "big.log"
    with open(path, "w") as f:
        while f.tell() < 40 << 20:
            f.write(chunk + "\n")
    tracemalloc.start()
    try:
        with open(path, "rb") as f:
            p = parse_log(f)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert p["runs"] > 1000 and p["server_ready"] and verify_placement(p, EXPECTED)["verified"]
    assert peak < 32 << 20


def test_what_is_kept_is_bounded(monkeypatch):
    monkeypatch.setattr(_llama_log, "MAX_OVERRIDES", 10)
    lines = ["tensor blk.%d.ffn_up_exps.weight (1 MiB f32) buffer type overridden to CPU" % i for i in range(25)]
    lines += ["load_tensors:   DEV%d model buffer size = 1.00 MiB" % i for i in range(200)]
    p = parse_log("\n".join(lines))
    assert len(p["overridden"]) == 10 and p["overridden_dropped"] == 15
    assert len(p["model_buffers"]) == _llama_log.MAX_BUFFER_NAMES
    v = verify_placement(p, ["blk.%d.ffn_up_exps.weight" % i for i in range(25)])
    assert not v["verified"] and "15 not kept" in v["msg"]
    p = parse_log("llama_model_load: error loading model: " + "x" * 100_000)
    assert len(p["load_error"]) == _llama_log.MAX_MESSAGE + 3


ALL_LOGS = sorted(str(p.relative_to(DATA)) for p in DATA.rglob("*.log"))


@pytest.mark.parametrize("name", ALL_LOGS)
@pytest.mark.parametrize("chunk", [_llama_log.CHUNK, 97])
def test_reading_in_chunks_and_skipping_lines_without_a_keyword_changes_nothing(monkeypatch, name, chunk):
    """Every line fed one by one gives the same result as the chunked reader, which parses only the lines that
    hold a keyword, whatever the chunk boundaries."""
    text = (DATA / name).read_text(encoding="utf-8")
    parser = _llama_log.LogParser()
    for line in text.splitlines():
        parser.feed(line)
    monkeypatch.setattr(_llama_log, "CHUNK", chunk)
    for exit_code in (None, 139):
        assert parse_log(text, exit_code) == parser.result(exit_code), name


@pytest.mark.parametrize("line, ready", [
    ("0.00.753.000 I srv  llama_server: model loaded", True),
    ("0.00.753.008 I srv  llama_server: listening on http://127.0.0.1:18791", True),  # b10435
    ("main: server is listening on http://0.0.0.0:8080 - starting the main loop", True),
    ("srv  update_slots: all slots are idle", True),
    ("main: HTTP server is listening, hostname: 0.0.0.0, port: 8080, http threads: 31", False),  # before the load
    ("0.00.019.329 I srv    load_model: loading model 'tiny.gguf'", False),
])
def test_the_ready_lines(line, ready):
    assert parse_log(line + "\n")["server_ready"] is ready
