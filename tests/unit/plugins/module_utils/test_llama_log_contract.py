"""The exact contract of the log parser's verdicts: the crash causes in plain words, the DEBUG level seen on lines
that hold no keyword, ``parse_command_log`` on a real command, and every result ``verify_placement`` returns.

The lines are written with the formats of llama.cpp's source:

* common/log.cpp: ``"%d.%02d.%03d.%03d "`` (the timestamp) then ``"I "``, ``"W "``, ``"E "`` or ``"D "`` (the level
  letter; ``--no-log-timestamps`` drops the timestamp and keeps the letter);
* tools/server/server-queue.cpp ``QUE_DBG`` (``"que  %12.*s: "``, DEBUG: ``processing task, id = %d``) and
  tools/server/server.cpp ``SRV_INF`` (``model loaded``);
* src/llama-vocab.cpp and src/llama-model.cpp ``print_info`` (``"%s: PAD token             = %d '%s'"``,
  ``"%s: general.name          = %s"``), src/llama-model.cpp ``load_tensors`` (``"%s: %12s model buffer size =
  %8.2f MiB"``, ``"%s: offloaded %d/%d layers to GPU"``), src/llama-kv-cache.cpp (``KV buffer size``),
  src/llama-memory-recurrent.cpp (``RS buffer size``), src/llama-context.cpp (``compute buffer size``) and
  src/llama-model-loader.cpp ``create_tensor`` (``"tensor %s (%zu MiB %s) buffer type overridden to %s"``);
* ggml/src/ggml.c ``ggml_abort`` (``"%s:%d: "`` then the message), ggml/include/ggml.h ``GGML_ASSERT``,
  ggml/src/ggml-cuda/ggml-cuda.cu ``ggml_cuda_error`` (``GGML_CUDA_NAME " error: %s"``, ``CUDA``, ``ROCm`` or
  ``MUSA``, then ``GGML_ABORT(GGML_CUDA_NAME " error")``), ggml/src/ggml-sycl/common.hpp (``"SYCL error: %s: %s"``),
  ggml/src/ggml-rpc/ggml-rpc.cpp (``Remote RPC server crashed or returned malformed response``) and libstdc++'s
  ``terminate called ...``; the shell prints ``Segmentation fault (core dumped)`` and the like for a signal.
"""
from __future__ import annotations

import os
import sys

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_log import (
    MAX_MESSAGE,
    parse_command_log,
    parse_log,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._placement_proof import (
    verify_placement,
)

TS = "0.01.000.000 "
BUF_CUDA0 = TS + "I load_tensors:        CUDA0 model buffer size =  1369.43 MiB"
QUEUE_DEBUG = "0.00.300.000 D que  process_new_: processing task, id = 0"
PAD_TOKEN = "0.00.011.000 I print_info: PAD token             = 11 '<pad>'"
NAME_WITH_D = "0.00.011.100 I print_info: general.name          = Tiny Moe Rev D Test"
READY = TS + "I srv  llama_server: model loaded"
UP1, DOWN1, UP2 = "blk.1.ffn_up_exps.weight", "blk.1.ffn_down_exps.weight", "blk.2.ffn_up_exps.weight"
HIDDEN = "the log's verbosity hides the per-tensor override lines (use -lv 5 or -v); "
NO_BUFFER_LINES = "and the log has no model buffer lines either (verbosity too low?): not verified"


def line(fmt, *args):
    return TS + "I " + fmt % args


def model_buf(name, mib):
    return line("%s: %12s model buffer size = %8.2f MiB", "load_tensors", name, mib)


def kv_buf(name, mib):
    return line("%s: %10s KV buffer size = %8.2f MiB", "llama_kv_cache", name, mib)


def compute_buf(name, mib):
    return line("%s: %10s compute buffer size = %8.2f MiB", "sched_reserve", name, mib)


def override(tensor, buffer):
    return TS + "D tensor %s (%d MiB %s) buffer type overridden to %s" % (tensor, 100, "q8_0", buffer)


def log(*lines):
    return parse_log("\n".join(lines) + "\n")


def verdict(**changes):
    """The whole result of verify_placement: the fields a test does not name keep their default."""
    res = {"verified": False, "evidence": "none", "missing": [], "unexpected": [], "checks": [],
           "gpu_model_mib": None, "gpu_model_tolerance_mib": None, "msg": ""}
    res.update(changes)
    return res


def check(name, expected, logged, ok, note):
    return {"check": name, "expected": expected, "logged": logged, "ok": ok, "note": note}


# ---------------------------------------------------------------- crash causes, in plain words

SIGSEGV_WORDS = ("a segmentation fault: a bug, or a stack overflow (a very long --override-tensor pattern overflows "
                 "std::regex)")
GPU_WORDS = "the GPU backend failed (a GPU fault, a driver problem or out of GPU memory)"
RPC_LINE = "/src/ggml/src/ggml-rpc/ggml-rpc.cpp:519: Remote RPC server crashed or returned malformed response"
RPC_WORDS = "an RPC server (rpc-server) that llama-server uses as a device died or answered garbage"


@pytest.mark.parametrize("text, crash, cause", [
    ("0.00.500.000 E CUDA error: out of memory", "CUDA error: out of memory", GPU_WORDS),
    ("0.00.500.000 E ROCm error: invalid device function", "ROCm error: invalid device function", GPU_WORDS),
    ("0.00.500.000 E MUSA error: out of memory", "MUSA error: out of memory", GPU_WORDS),
    ("SYCL error: CHECK_TRY_ERROR(stream->wait()): Exception caught in this line of code.",
     "SYCL error: CHECK_TRY_ERROR(stream->wait()): Exception caught in this line of code.", GPU_WORDS),
    ("terminate called after throwing an instance of 'std::bad_alloc'",
     "terminate called after throwing an instance of 'std::bad_alloc'",
     "an uncaught C++ exception ended llama-server"),
    ("terminate called without an active exception", "terminate called without an active exception",
     "an uncaught C++ exception ended llama-server"),
    ("/src/ggml/src/ggml.c:1715: GGML_ASSERT(ggml_can_mul_mat(a, b)) failed",
     "/src/ggml/src/ggml.c:1715: GGML_ASSERT(ggml_can_mul_mat(a, b)) failed",
     "an internal check of llama.cpp failed (GGML_ASSERT): a bug, or input it does not handle"),
    (RPC_LINE, RPC_LINE, RPC_WORDS),
    # the abort of ggml_cuda_error alone (its "CUDA error: ..." line lost): the message holds no "error: "
    ("/src/ggml/src/ggml-cuda/ggml-cuda.cu:88: CUDA error", "/src/ggml/src/ggml-cuda/ggml-cuda.cu:88: CUDA error",
     "llama-server aborted (GGML_ABORT)"),
    ("Segmentation fault (core dumped)", "Segmentation fault (core dumped)", SIGSEGV_WORDS),
    ("Aborted (core dumped)", "Aborted (core dumped)",
     "llama-server aborted itself (GGML_ABORT, a failed GGML_ASSERT or an uncaught C++ exception)"),
    ("Illegal instruction (core dumped)", "Illegal instruction (core dumped)",
     "an instruction this CPU does not have: the CPU backend was built for a newer CPU (use a build with runtime "
     "CPU detection, or build for this CPU)"),
    ("Bus error (core dumped)", "Bus error (core dumped)",
     "a memory-mapped file went away or was truncated while in use (the model file?)"),
    ("Floating point exception (core dumped)", "Floating point exception (core dumped)",
     "an arithmetic error (division by zero)"),
    ("Killed", "Killed", "it was killed, most often by the kernel's or the container's out-of-memory killer"),
])
def test_each_crash_line_has_its_own_cause(text, crash, cause):
    p = log(BUF_CUDA0, READY, text)
    assert (p["crash"], p["crash_cause"]) == (crash, cause)
    assert p["failure"] == f"llama-server died: {crash} ({cause})"
    assert verify_placement(p, expect_model_buffers={"CUDA0": 1369.43}) == verdict(
        gpu_model_mib=1369.43, msg=f"llama-server died: {crash} ({cause})")


def test_a_signal_exit_code_is_added_to_the_cause_of_the_crash_line():
    p = parse_log("\n".join([BUF_CUDA0, READY, "Segmentation fault (core dumped)"]) + "\n", exit_code=139)
    assert p["crash_cause"] == SIGSEGV_WORDS + " (SIGSEGV, exit code 139)"
    p = parse_log("\n".join([BUF_CUDA0, READY, RPC_LINE]) + "\n", exit_code=134)
    assert p["crash_cause"] == RPC_WORDS + " (SIGABRT, exit code 134)"


# ---------------------------------------------------------------- the DEBUG level of lines without a keyword

@pytest.mark.parametrize("lines", [
    [QUEUE_DEBUG],                                  # the first line of the log
    [QUEUE_DEBUG, BUF_CUDA0],
    [BUF_CUDA0, QUEUE_DEBUG],                       # right after a parsed line
    [BUF_CUDA0, QUEUE_DEBUG[len(TS):]],             # --no-log-timestamps: the line starts with the letter
    [QUEUE_DEBUG[len(TS):], BUF_CUDA0],
    [BUF_CUDA0, PAD_TOKEN, QUEUE_DEBUG],            # "PAD token" holds "D " in a word
    [BUF_CUDA0, NAME_WITH_D, QUEUE_DEBUG],          # a model name holds " D "
    [BUF_CUDA0, NAME_WITH_D, PAD_TOKEN, READY, PAD_TOKEN, NAME_WITH_D, QUEUE_DEBUG],
    [BUF_CUDA0, "ai-llm-1  | " + QUEUE_DEBUG],      # docker compose logs
    [BUF_CUDA0, "[47161] " + QUEUE_DEBUG[len(TS):]],  # a router child's line
])
def test_a_debug_line_without_a_keyword_shows_the_debug_level(lines):
    p = log(*lines)
    assert p["per_tensor_lines_visible"] is True
    assert p["overridden"] == [] and p["model_buffers"] == ({"CUDA0": 1369.43} if BUF_CUDA0 in lines else {})


@pytest.mark.parametrize("lines", [
    [PAD_TOKEN],
    [NAME_WITH_D],
    [BUF_CUDA0, NAME_WITH_D, PAD_TOKEN, READY],
    [PAD_TOKEN, NAME_WITH_D, PAD_TOKEN],
])
def test_info_lines_that_hold_a_d_are_not_debug_lines(lines):
    assert log(*lines)["per_tensor_lines_visible"] is False


def test_the_debug_level_of_a_later_keyword_line_is_seen_after_a_line_that_holds_a_d():
    p = log(BUF_CUDA0, NAME_WITH_D, override(UP1, "CPU"))
    assert p["per_tensor_lines_visible"] is True
    assert [o["tensor"] for o in p["overridden"]] == [UP1]


def test_a_visible_debug_level_makes_an_empty_override_list_the_evidence():
    """At -lv 5 a pattern that matched nothing prints no override line: the queue's DEBUG lines prove that the
    override lines would have been printed."""
    p = log(PAD_TOKEN, BUF_CUDA0, QUEUE_DEBUG, READY)
    assert verify_placement(p, [UP1]) == verdict(
        evidence="per_tensor", missing=[UP1], gpu_model_mib=1369.43,
        msg=f"the log shows no overridden tensor (the pattern matched nothing?); 1 expected tensors not overridden "
            f"to host memory: {UP1}")
    hidden = log(PAD_TOKEN, BUF_CUDA0, READY)
    assert verify_placement(hidden, [UP1]) == verdict(
        gpu_model_mib=1369.43, msg=HIDDEN + "no expected GPU model buffer given to fall back on: not verified")


# ---------------------------------------------------------------- parse_command_log runs a real command

EMIT = "import sys; sys.stderr.write(sys.argv[2]); sys.stderr.flush(); sys.exit(int(sys.argv[1]))"
GOOD = [
    "0.00.090.813 I srv    load_model: loading model 'm.gguf'",
    "0.00.120.000 D tensor blk.1.ffn_up_exps.weight (0 MiB f32) buffer type overridden to CPU",
    "0.00.120.100 I load_tensors: offloaded 6/6 layers to GPU",
    "0.00.120.200 I load_tensors:        CUDA0 model buffer size =     0.75 MiB",
    "0.00.120.300 I llama_kv_cache:        CUDA0 KV buffer size =     0.06 MiB",
    "0.00.150.000 I srv  llama_server: model loaded",
    "0.00.150.100 I srv  llama_server: listening on http://127.0.0.1:8080",
]


def emit(text, rc=0):
    return [sys.executable, "-c", EMIT, str(rc), text]


def test_a_command_log_is_parsed_as_the_same_text_and_the_last_five_lines_are_kept():
    text = "\n".join(GOOD) + "\n"
    parsed, rc, tail = parse_command_log(emit(text))
    assert parsed == parse_log(text)
    assert parsed["server_ready"] is True and parsed["model_buffers"] == {"CUDA0": 0.75}
    assert [o["tensor"] for o in parsed["overridden"]] == [UP1]
    assert rc == 0
    assert tail == GOOD[-5:]


@pytest.mark.parametrize("keep, expected", [(1, GOOD[-1:]), (2, GOOD[-2:]), (7, GOOD), (10, GOOD)])
def test_keep_says_how_many_of_the_last_lines_come_back(keep, expected):
    assert parse_command_log(emit("\n".join(GOOD) + "\n"), keep=keep)[2] == expected


def test_blank_lines_are_not_kept_and_a_long_line_is_cut():
    long_line = "E " + "x" * 700
    text = "\n".join(GOOD[:-3] + ["", GOOD[-3], "   ", GOOD[-2], long_line]) + "\n"
    _parsed, _rc, tail = parse_command_log(emit(text))
    assert tail == GOOD[-5:-1] + [long_line[:MAX_MESSAGE] + "..."]


def test_blank_lines_at_the_end_do_not_push_the_last_words_out():
    """A command that ends with empty lines still says why it failed."""
    _parsed, _rc, tail = parse_command_log(emit("E CUDA error: out of memory\n" + "\n" * 6, rc=1))
    assert tail == ["E CUDA error: out of memory"]


def test_the_last_lines_are_whole_lines_when_they_are_long():
    """Five loader lines of about 110 characters each: the tail holds them whole."""
    kv = ["0.00.011.%03d I llama_model_loader: - kv  %2d:                       general.architecture str"
          "              = nemotron_h_moe" % (i, i) for i in range(8)]
    assert parse_command_log(emit("\n".join(kv) + "\n"))[2] == kv[-5:]


def test_the_return_code_is_returned_and_the_exit_code_is_what_the_caller_gives():
    text = "\n".join(GOOD + [RPC_LINE]) + "\n"
    parsed, rc, tail = parse_command_log(emit(text, 3))
    assert rc == 3 and parsed["exit_code"] is None
    assert (parsed["crash"], parsed["crash_cause"]) == (RPC_LINE, RPC_WORDS)
    assert tail == GOOD[-4:] + [RPC_LINE]
    parsed, rc, _tail = parse_command_log(emit(text), exit_code=134)
    assert rc == 0 and parsed["exit_code"] == 134
    assert parsed["crash_cause"] == RPC_WORDS + " (SIGABRT, exit code 134)"


def test_stdout_and_stderr_are_read_as_one_stream():
    script = ("import sys\n"
              "print(sys.argv[1], flush=True)\n"
              "sys.stderr.write(sys.argv[2] + '\\n'); sys.stderr.flush()\n")
    parsed, rc, tail = parse_command_log([sys.executable, "-c", script, GOOD[3], GOOD[5]])
    assert parsed["model_buffers"] == {"CUDA0": 0.75} and parsed["server_ready"] is True
    assert (rc, tail) == (0, [GOOD[3], GOOD[5]])


def test_bytes_that_are_not_utf8_are_replaced():
    script = ("import sys\n"
              "sys.stdout.buffer.write(b'0.00.120.000 D tensor blk.1.ffn_\\xff_exps.weight (0 MiB f32) buffer type "
              "overridden to CPU\\n')\n")
    parsed, _rc, tail = parse_command_log([sys.executable, "-c", script])
    assert parsed["overridden"][0]["tensor"] == "blk.1.ffn_\ufffd_exps.weight"
    assert tail == ["0.00.120.000 D tensor blk.1.ffn_\ufffd_exps.weight (0 MiB f32) buffer type overridden to CPU"]


def test_the_command_reads_nothing_from_the_caller():
    """stdin is /dev/null whatever the caller's stdin is: a log command never reads or waits on it."""
    script = "import os; print('stdin is /dev/null' if os.path.samestat(os.fstat(0), os.stat(os.devnull)) else 'open')"
    read_end, write_end = os.pipe()
    os.close(write_end)
    saved = os.dup(0)
    try:
        os.dup2(read_end, 0)
        tail = parse_command_log([sys.executable, "-c", script])[2]
    finally:
        os.dup2(saved, 0)
        os.close(saved)
        os.close(read_end)
    assert tail == ["stdin is /dev/null"]


def test_a_command_that_prints_nothing():
    parsed, rc, tail = parse_command_log(emit("", 1))
    assert (parsed["runs"], parsed["failure"], rc, tail) == (0, None, 1, [])


# ---------------------------------------------------------------- verify_placement: when nothing is verified

def test_a_load_error_comes_before_a_crash_and_an_exit_code():
    parsed = {"load_error": "unknown model architecture: 'foo'", "crash": "Killed", "crash_cause": "oom",
              "exit_code": 1, "model_buffers": {"CUDA0": 1.5, "CPU_Mapped": 8.0}}
    assert verify_placement(parsed, [UP1]) == verdict(
        gpu_model_mib=1.5, msg="the model failed to load: unknown model architecture: 'foo'")


def test_a_crash_comes_before_an_exit_code_and_its_cause_is_optional():
    assert verify_placement({"crash": "Killed", "exit_code": 137}, [UP1]) == verdict(msg="llama-server died: Killed")
    assert verify_placement({"crash": "Killed", "crash_cause": "the OOM killer"}, [UP1]) == verdict(
        msg="llama-server died: Killed (the OOM killer)")


@pytest.mark.parametrize("code", [0, 1, 2])
def test_an_exit_before_the_ready_line_is_not_verified_whatever_the_code(code):
    p = parse_log("\n".join([override(UP1, "CPU"), BUF_CUDA0]) + "\n", exit_code=code)
    assert verify_placement(p, [UP1]) == verdict(
        gpu_model_mib=1369.43, msg=f"llama-server exited with code {code} before the log shows it ready")


def test_an_exit_after_the_ready_line_or_no_exit_code_is_verified():
    p = parse_log("\n".join([override(UP1, "CPU"), BUF_CUDA0, READY]) + "\n", exit_code=0)
    assert verify_placement(p, [UP1])["verified"] is True
    p = log(override(UP1, "CPU"), BUF_CUDA0)
    assert verify_placement(p, [UP1])["verified"] is True


def test_without_any_expectation_nothing_is_verified_and_the_log_is_summed_up():
    p = log(override(UP1, "CPU"), override(DOWN1, "CPU"), BUF_CUDA0, model_buf("CUDA1", 10.5), READY)
    assert verify_placement(p) == verdict(
        gpu_model_mib=1379.93,
        msg="no expectation given, nothing verified: 2 tensors overridden, GPU model buffer 1379.93 MiB")
    assert verify_placement({})["msg"].startswith("no expectation given, nothing verified: 0 tensors overridden, ")


@pytest.mark.parametrize("kwargs", [
    {"expected": []}, {"expect_overrides": {}}, {"expect_gpu_model_mib": 0.0}, {"expect_model_buffers": {}},
    {"expect_kv_buffers": {}}, {"expect_rs_buffers": {}}, {"expect_compute_buffers": {}},
    {"expect_offloaded_layers": 0},
])
def test_an_empty_or_zero_expectation_is_still_an_expectation(kwargs):
    v = verify_placement(log(BUF_CUDA0, READY), **kwargs)
    assert not v["msg"].startswith("no expectation given")


def test_require_ready_needs_a_ready_line():
    p = log(override(UP1, "CPU"), BUF_CUDA0)
    assert verify_placement(p, [UP1], require_ready=True) == verdict(
        gpu_model_mib=1369.43,
        msg="the log does not show the server ready (no 'model loaded', 'listening on http' or 'all slots are idle' "
            "line): not verified")
    ready = log(override(UP1, "CPU"), BUF_CUDA0, READY)
    assert verify_placement(ready, [UP1], require_ready=True)["verified"] is True


# ---------------------------------------------------------------- buffer and layer checks

DEVICES_LOG = [
    line("%s: offloaded %d/%d layers to GPU", "load_tensors", 5, 5),
    model_buf("CUDA0", 1369.43),
    model_buf("CUDA1", 812.5),
    model_buf("CPU_Mapped", 10240.0),
    kv_buf("CUDA0", 96.0),
    kv_buf("CUDA1", 32.0),
    line("%s: %10s RS buffer size = %8.2f MiB", "llama_memory_recurrent", "CUDA0", 47.62),
    compute_buf("CUDA0", 300.5),
    compute_buf("CUDA_Host", 20.01),
    READY,
]


def test_every_check_states_what_was_expected_and_logged():
    p = log(*DEVICES_LOG)
    v = verify_placement(p, expect_model_buffers={"CUDA1": 812.5, "CUDA0": 1369.434}, expect_kv_buffers={"CUDA0": 96},
                         expect_rs_buffers={"CUDA0": 47.62}, expect_compute_buffers={"CUDA0": 310},
                         expect_offloaded_layers=5)
    assert v == verdict(
        verified=True, evidence="device_buffers", gpu_model_mib=2181.93,
        checks=[check("model buffer CUDA0", 1369.43, 1369.43, True, "1369.43 +/- 0.01"),
                check("model buffer CUDA1", 812.5, 812.5, True, "812.50 +/- 0.01"),
                check("KV buffer CUDA0", 96.0, 96.0, True, "96.00 +/- 0.01"),
                check("RS buffer CUDA0", 47.62, 47.62, True, "47.62 +/- 0.01"),
                check("compute buffer CUDA0", 310.0, 300.5, True, "at most 310.00"),
                check("offloaded layers", 5, 5, True, "5")],
        msg="the model buffers of 2 device(s) match the plan (per-device buffer evidence); 6 buffer and layer "
            "checks match")


def test_a_buffer_missing_from_the_log_and_a_device_the_plan_does_not_use_fail():
    p = log(*DEVICES_LOG)
    v = verify_placement(p, expect_model_buffers={"CUDA0": 1369.43, "CUDA2": 5.0})
    assert v["checks"] == [check("model buffer CUDA0", 1369.43, 1369.43, True, "1369.43 +/- 0.01"),
                           check("model buffer CUDA2", 5.0, None, False, "not in the log"),
                           check("model buffer CUDA1", None, 812.5, False,
                                 "no buffer (the plan puts nothing on this device):")]
    assert (v["verified"], v["evidence"]) == (False, "device_buffers")
    assert v["msg"].startswith("the per-device model buffers do not match the plan; model buffer CUDA2: not in the log, expected 5.00 MiB")
    assert v["msg"].endswith("; model buffer CUDA1: 812.50 MiB in the log, but the plan puts nothing there")


def test_a_host_buffer_the_plan_does_not_name_is_no_failure():
    v = verify_placement(log(*DEVICES_LOG), expect_model_buffers={"CUDA0": 1369.43, "CUDA1": 812.5})
    assert [c["check"] for c in v["checks"]] == ["model buffer CUDA0", "model buffer CUDA1"]
    assert v["verified"] is True


def test_the_tolerance_of_a_buffer_is_given_in_the_note():
    v = verify_placement(log(*DEVICES_LOG), expect_kv_buffers={"CUDA0": 95.5, "CUDA1": 31.4},
                         buffer_tolerance_mib=0.5)
    assert v["checks"] == [check("KV buffer CUDA0", 95.5, 96.0, True, "95.50 +/- 0.5"),
                           check("KV buffer CUDA1", 31.4, 32.0, False, "31.40 +/- 0.5")]
    assert v["msg"] == "KV buffer CUDA1: 32.00 MiB, expected 31.40 +/- 0.5 MiB"


@pytest.mark.parametrize("at_most, ok", [(300.5, True), (300.49, True), (300.48, False), (1000.0, True)])
def test_a_compute_buffer_may_be_up_to_the_tolerance_above_the_plan(at_most, ok):
    v = verify_placement(log(*DEVICES_LOG), expect_compute_buffers={"CUDA0": at_most})
    assert v["checks"] == [check("compute buffer CUDA0", at_most, 300.5, ok, f"at most {at_most:.2f}")]
    assert v["verified"] is ok
    assert v["msg"] == ("1 buffer and layer checks match" if ok else
                        f"compute buffer CUDA0: 300.50 MiB, expected at most {at_most:.2f} MiB")


def test_an_rpc_buffer_is_found_under_its_device_name_only_when_it_is_the_only_one():
    logged = {"RPC0[10.0.0.1:50052]": 10.5, "RPC1[10.0.0.2:50052]": 20.25, "CPU": 1.0}
    v = verify_placement({"kv_buffers": logged}, expect_kv_buffers={"RPC0": 10.5, "RPC1[10.0.0.2:50052]": 20.25})
    assert v["checks"] == [check("KV buffer RPC0", 10.5, 10.5, True, "10.50 +/- 0.01"),
                           check("KV buffer RPC1[10.0.0.2:50052]", 20.25, 20.25, True, "20.25 +/- 0.01")]
    two = {"RPC0[10.0.0.1:50052]": 10.5, "RPC0[10.0.0.1:50053]": 10.5}
    v = verify_placement({"kv_buffers": two}, expect_kv_buffers={"RPC0": 10.5})
    assert v["checks"] == [check("KV buffer RPC0", 10.5, None, False, "not in the log")]


def test_the_offloaded_layers_check():
    v = verify_placement(log(*DEVICES_LOG), expect_offloaded_layers=4)
    assert v == verdict(gpu_model_mib=2181.93, checks=[check("offloaded layers", 4, 5, False, "4")],
                        msg="offloaded layers: 5, expected 4")
    v = verify_placement(log(BUF_CUDA0, READY), expect_offloaded_layers=5)
    assert (v["verified"], v["checks"]) == (False, [check("offloaded layers", 5, None, False, "5")])
    v = verify_placement(log(*DEVICES_LOG), expect_offloaded_layers=5)
    assert v == verdict(verified=True, gpu_model_mib=2181.93, checks=[check("offloaded layers", 5, 5, True, "5")],
                        msg="1 buffer and layer checks match")


# ---------------------------------------------------------------- the placement proof without per-tensor lines

def test_a_model_buffer_mismatch_is_named_as_the_placement_failure():
    p = log(*DEVICES_LOG)
    v = verify_placement(p, expect_model_buffers={"CUDA0": 1400.0, "CUDA1": 812.5})
    assert (v["verified"], v["evidence"]) == (False, "device_buffers")
    assert v["msg"] == ("the per-device model buffers do not match the plan; model buffer CUDA0: 1369.43 MiB, "
                        "expected 1400.00 +/- 0.01 MiB")


def test_matching_model_buffers_with_another_buffer_off_keep_the_placement_and_name_the_buffer():
    p = log(*DEVICES_LOG)
    v = verify_placement(p, [UP1], expect_model_buffers={"CUDA0": 1369.43, "CUDA1": 812.5},
                         expect_kv_buffers={"CUDA0": 95.0})
    assert (v["verified"], v["evidence"]) == (False, "device_buffers")
    assert v["msg"] == (HIDDEN + "the model buffers of 2 device(s) match the plan (per-device buffer evidence); "
                        "KV buffer CUDA0: 96.00 MiB, expected 95.00 +/- 0.01 MiB")


def test_no_model_buffer_line_proves_nothing():
    p = log(kv_buf("CUDA0", 96.0), READY)
    v = verify_placement(p, [UP1], expect_model_buffers={"CUDA0": 1369.43})
    assert (v["verified"], v["evidence"]) == (False, "none")
    assert v["msg"].startswith(HIDDEN + NO_BUFFER_LINES + "; model buffer CUDA0: not in the log, expected 1369.43 MiB")
    assert verify_placement(p, [UP1], expect_gpu_model_mib=1369.43) == verdict(msg=HIDDEN + NO_BUFFER_LINES)
    v = verify_placement(p, expect_gpu_model_mib=1369.43)
    assert (v["verified"], v["evidence"]) == (False, "none") and v["msg"].endswith(NO_BUFFER_LINES)


@pytest.mark.parametrize("logged, ok", [(11.0, True), (9.0, True), (11.5, False), (8.99, False)])
def test_the_gpu_model_buffer_is_within_one_mib_by_default(logged, ok):
    """tolerance_mib=1.0 and tolerance_pct=1.0 by default: 1 % of 10 MiB is less than 1 MiB."""
    p = log(model_buf("CUDA0", logged), model_buf("CPU_Mapped", 500.0), READY)
    assert verify_placement(p, expect_gpu_model_mib=10.0) == verdict(
        verified=ok, evidence="buffers", gpu_model_mib=logged, gpu_model_tolerance_mib=1.0,
        msg=f"GPU model buffer {logged:.2f} MiB, expected 10.00 MiB +/- 1.00 MiB: {'match' if ok else 'MISMATCH'}")


@pytest.mark.parametrize("cuda1, ok", [(1010.0, True), (990.0, True), (1010.5, False), (989.5, False)])
def test_the_gpu_model_buffer_tolerance_grows_with_the_percentage(cuda1, ok):
    p = log(model_buf("CUDA0", 0.0), model_buf("CUDA1", cuda1), model_buf("CUDA_Host", 7.0), READY)
    v = verify_placement(p, [UP1], expect_gpu_model_mib=1000.0)
    assert v == verdict(
        verified=ok, evidence="buffers", gpu_model_mib=cuda1, gpu_model_tolerance_mib=10.0,
        msg=f"{HIDDEN}GPU model buffer {cuda1:.2f} MiB, expected 1000.00 MiB +/- 10.00 MiB: "
            f"{'match' if ok else 'MISMATCH'}")


def test_an_empty_model_buffer_plan_needs_model_buffer_lines_too():
    """A plan that puts no model buffer on any device is proved by the log's model buffer lines, not by their
    absence (a log at too low a verbosity)."""
    v = verify_placement(log(kv_buf("CPU", 0.25), READY), expect_model_buffers={})
    assert (v["verified"], v["evidence"], v["checks"]) == (False, "none", [])
    assert v["msg"].endswith(NO_BUFFER_LINES)
    v = verify_placement(log(model_buf("CPU_Mapped", 8.44), READY), expect_model_buffers={})
    assert (v["verified"], v["evidence"]) == (True, "device_buffers")
    assert v["msg"] == "the model buffers of 0 device(s) match the plan (per-device buffer evidence)"


def test_the_gpu_model_tolerance_is_given_to_two_decimals():
    v = verify_placement(log(model_buf("CUDA0", 1001.0), READY), expect_gpu_model_mib=1000.0, tolerance_mib=1.234,
                         tolerance_pct=0.0)
    assert (v["verified"], v["gpu_model_tolerance_mib"]) == (True, 1.23)
    assert v["msg"] == "GPU model buffer 1001.00 MiB, expected 1000.00 MiB +/- 1.23 MiB: match"


def test_the_given_tolerances_are_used():
    p = log(model_buf("CUDA0", 1005.0), READY)
    v = verify_placement(p, expect_gpu_model_mib=1000.0, tolerance_mib=2.0, tolerance_pct=0.5)
    assert (v["verified"], v["gpu_model_tolerance_mib"]) == (True, 5.0)
    v = verify_placement(p, expect_gpu_model_mib=1000.0, tolerance_mib=4.99, tolerance_pct=0.0)
    assert (v["verified"], v["gpu_model_tolerance_mib"]) == (False, 4.99)


def test_host_buffers_alone_prove_a_host_without_gpu():
    text = [model_buf("CPU_Mapped", 8.44), kv_buf("CPU", 0.25),
            line("%s: %10s RS buffer size = %8.2f MiB", "llama_memory_recurrent", "CPU", 0.04),
            compute_buf("CPU", 4.79), READY]
    v = verify_placement(log(*text), expect_kv_buffers={"CPU": 0.25}, expect_compute_buffers={"CPU": 5.0})
    assert v == verdict(
        verified=True, evidence="host_buffers",
        checks=[check("KV buffer CPU", 0.25, 0.25, True, "0.25 +/- 0.01"),
                check("compute buffer CPU", 5.0, 4.79, True, "at most 5.00")],
        gpu_model_mib=0.0,
        msg="no tensor or model buffer expected; the 2 buffer(s) given match the plan (host buffer evidence); "
            "2 buffer and layer checks match")
    v = verify_placement(log(*text), expect_rs_buffers={"CPU": 0.04})
    assert (v["verified"], v["evidence"]) == (True, "host_buffers")
    assert v["msg"] == ("no tensor or model buffer expected; the 1 buffer(s) given match the plan (host buffer "
                        "evidence); 1 buffer and layer checks match")


@pytest.mark.parametrize("kwargs", [
    {"expect_kv_buffers": {"CPU": 0.25, "CUDA0": 96.0}},
    {"expect_kv_buffers": {"CPU": 0.25}, "expect_offloaded_layers": 0},
])
def test_host_buffers_are_no_evidence_next_to_a_device_buffer_or_a_layer_check(kwargs):
    text = [line("%s: offloaded %d/%d layers to GPU", "load_tensors", 0, 5), model_buf("CPU_Mapped", 8.44),
            kv_buf("CPU", 0.25), kv_buf("CUDA0", 96.0), READY]
    v = verify_placement(log(*text), **kwargs)
    assert (v["verified"], v["evidence"], v["msg"]) == (True, "none", "2 buffer and layer checks match")


def test_no_check_at_all_is_no_host_buffer_evidence():
    v = verify_placement(log(kv_buf("CPU", 0.25), READY), expect_kv_buffers={})
    assert (v["evidence"], v["checks"], v["msg"]) == ("none", [], "")


# ---------------------------------------------------------------- the placement proof by per-tensor lines

PINNED_LOG = [override(UP1, "CPU"), override(DOWN1, "CPU"), override(UP2, "CUDA1"), model_buf("CUDA0", 100.0),
              model_buf("CUDA1", 50.0), READY]


def test_exactly_the_expected_host_tensors_with_device_pins_listed():
    v = verify_placement(log(*PINNED_LOG), [UP1, DOWN1])
    assert v == verdict(
        verified=True, evidence="per_tensor", gpu_model_mib=150.0,
        msg="the log shows exactly the 2 expected tensors overridden to host memory (and 1 tensors pinned to "
            "devices: CUDA1)")


def test_the_devices_that_tensors_are_pinned_to_are_listed_once_each():
    p = log(override(UP1, "CPU"), override(DOWN1, "CUDA2"), override(UP2, "CUDA1"),
            override("blk.2.ffn_down_exps.weight", "CUDA1"), READY)
    assert verify_placement(p, [UP1])["msg"] == (
        "the log shows exactly the 1 expected tensors overridden to host memory (and 3 tensors pinned to devices: "
        "CUDA1, CUDA2)")


def test_exactly_the_expected_tensors_per_buffer():
    v = verify_placement(log(*PINNED_LOG), expect_overrides={"CUDA1": [UP2], "CPU": [UP1, DOWN1]})
    assert v == verdict(
        verified=True, evidence="per_tensor", gpu_model_mib=150.0,
        msg="the log shows exactly the 2 expected tensors overridden to host memory and exactly the 1 expected "
            "tensors overridden to CUDA1")


def test_any_host_buffer_counts_as_host_memory():
    p = log(override(UP1, "CPU_REPACK"), override(DOWN1, "CUDA_Host"), override(UP2, "AMX"), READY)
    v = verify_placement(p, expect_overrides={"CUDA_Host": [UP1, DOWN1, UP2]})
    assert (v["verified"], v["msg"]) == (True, "the log shows exactly the 3 expected tensors overridden to host "
                                               "memory")


def test_no_named_buffer_means_no_host_override_is_expected():
    v = verify_placement(log(*PINNED_LOG), expect_overrides={})
    assert v == verdict(
        evidence="per_tensor", unexpected=[DOWN1, UP1], gpu_model_mib=150.0,
        msg=f"2 unexpected tensors overridden: {DOWN1}, {UP1}")
    only_pins = log(override(UP2, "CUDA1"), READY)
    assert verify_placement(only_pins, expect_overrides={}) == verdict(
        verified=True, evidence="per_tensor",
        msg="the log shows the expected overrides (and 1 tensors pinned to devices: CUDA1)")


def test_host_expected_but_only_device_overrides_logged():
    p = log(override(UP2, "CUDA1"), model_buf("CUDA1", 50.0), READY)
    v = verify_placement(p, [UP2])
    assert v == verdict(
        evidence="per_tensor", missing=[UP2], gpu_model_mib=50.0,
        msg=f"the log shows no tensor overridden to host memory, only to devices; 1 expected tensors not overridden "
            f"to host memory: {UP2} (to CUDA1)")


def test_a_host_tensor_missing_next_to_others_on_the_host():
    v = verify_placement(log(override(UP1, "CPU"), READY), [UP1, DOWN1])
    assert v == verdict(evidence="per_tensor", missing=[DOWN1],
                        msg=f"1 expected tensors not overridden to host memory: {DOWN1}")


def test_a_tensor_on_the_wrong_device_is_missing_there_and_unexpected_where_it_went():
    v = verify_placement(log(*PINNED_LOG), expect_overrides={"CPU": [UP1, UP2], "CUDA1": [DOWN1]})
    assert v == verdict(
        evidence="per_tensor", missing=[DOWN1, UP2], unexpected=[DOWN1, UP2], gpu_model_mib=150.0,
        msg=f"2 expected tensors not overridden to their expected buffers: {DOWN1} (to CPU), {UP2} (to CUDA1); "
            f"2 unexpected tensors overridden: {DOWN1}, {UP2}")


def test_too_many_override_lines_prove_nothing():
    parsed = {"overridden": [{"tensor": UP1, "mib": 1, "type": "f32", "buffer": "CPU"}], "overridden_dropped": 3,
              "per_tensor_lines_visible": True}
    assert verify_placement(parsed, [UP1]) == verdict(
        evidence="per_tensor", msg="the log holds more than 65536 override lines (3 not kept): not verified")


def test_a_coloured_debug_line_is_seen_as_a_debug_line():
    """common/log.cpp with colours writes the level as ``<yellow>D `` after the blue timestamp: the parser of a whole
    chunk sees the DEBUG level there as the line-by-line parser does."""
    line = "\x1b[34m0.00.120.100\x1b[0m \x1b[33mD que  process_new_: processing task, id = 0\n"
    assert parse_log(line)["per_tensor_lines_visible"] is True
    assert parse_log(line.replace("\x1b[33mD", "\x1b[32mI"))["per_tensor_lines_visible"] is False
