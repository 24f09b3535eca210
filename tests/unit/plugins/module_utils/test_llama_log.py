"""The llama-server log parser (``_llama_log``). Line formats and log sources: in tests/helpers/llama_logs.py; the
installed build's real logs: tests/integration/test_llama_log_real_server.py."""
from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _llama_log, _log_chunks
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_crash import SIGNALS
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_log import (
    MAX_MESSAGE, LogParser, parse_command_log, parse_log, parse_runs)
from tests.helpers.gguf_files import memory_below
from tests.helpers.llama_logs import (
    BUF_CUDA0, BUILD, CONTEXT_ERROR, CRASHES, DATA, FIT, GOOD_LOAD, IK_CPU, ILLEGAL_WORDS, LAYER, LOADING, LV4, META, MMAP,
    NAME_WITH_D, NEMOTRON_EXPERTS, OOM, PAD_TOKEN, PUBLIC_LOGS, QUEUE_DEBUG, QWEN3_EXPERTS, READY, RPC_LINE, RPC_WORDS,
    SIGNAL_EXITS, SYSTEM_INFO, TENSORS, UP1, VERBOSITY, VK_CONTEXT, VK_LIMIT, kv_buf, load_lines, model_buf, override,
    read, tensors,
)

RPC_ABORT = "/app/ggml/src/ggml-rpc/ggml-rpc.cpp:%d: Remote RPC server crashed or returned malformed response"


def parse(lines, exit_code=None, end="\n"):
    """parse_log of the lines, checked to equal the line-by-line parse."""
    text = "\n".join(lines) + end
    by_line = LogParser()
    for raw in text.split("\n"):
        by_line.feed(raw)
    result = parse_log(text, exit_code)
    assert result == by_line.result(exit_code)
    return result


def pick(result, *keys):
    """The fields ``keys`` of a result; ``tensors`` is the sorted names of the overridden tensors."""
    return {k: tensors(result) if k == "tensors" else result[k] for k in keys}


SIGILL = "exit code 132 (SIGILL) after the line: AMX is not ready to be used!"
OLDER_LOGS = [
    ("b7500_nemotron_cuda_lv4_overridden_cuda_host.log", {
        "build": "b7500-1a2b3c4", "build_number": 7500, "tensors": NEMOTRON_EXPERTS, "load_error": None,
        "offloaded_layers": {"offloaded": 53, "total": 53}, "kv_buffers": {"CUDA0": 768.0},
        "model_buffers": {"CUDA0": 1369.43, "CUDA_Host": 21772.21, "CPU_Mapped": 231.0}, "rs_buffers": {"CUDA0": 47.62},
        "compute_buffers": {"CUDA0": 1078.13, "CUDA_Host": 268.02}, "per_tensor_lines_visible": True,
        "mmap_override_warning": False}),  # the WARN exists only since PR #20978
    ("b7500_nemotron_cuda_default_verbosity.log", {
        "overridden": [], "per_tensor_lines_visible": False,
        "model_buffers": {"CUDA0": 1369.43, "CUDA_Host": 21772.21, "CPU_Mapped": 231.0}}),
    ("b5200_load_tensors_overriden_nosize_qwen3moe.log", {
        "build": "b5200-9a8b7c6", "tensors": QWEN3_EXPERTS, "kv_buffers": {"CUDA0": 3072.0},  # the "init:" KV prefix
        "compute_buffers": {"CUDA0": 2144.0, "CUDA_Host": 68.01}, "offloaded_layers": {"offloaded": 49, "total": 49},
        "model_buffers": {"CUDA0": 1166.26, "CPU_Mapped": 17221.87}}),
    # "llm_load_tensors: CUDA0 buffer size" (no "model"), llama_kv_cache_init:, llama_new_context_with_model:
    ("ik_llama_llm_load_tensors_Tensor_overriden_qwen3moe.log", {
        "build": "b3701-5e6f7a8", "tensors": QWEN3_EXPERTS, "kv_buffers": {"CUDA0": 3072.0},
        "model_buffers": {"CPU": 15936.0, "CUDA_Host": 243.1, "CUDA0": 1045.73},
        "compute_buffers": {"CUDA0": 2144.0, "CUDA_Host": 68.01}}),
    # the real SIGILL of the PyPI build: the log alone does not say it died, the exit code does
    ("b10434_sigill_amx_default_verbosity.log", {"crash": None, "server_ready": False}),
    ("b10434_sigill_amx_default_verbosity.log", {"exit_code": 132, "crash": SIGILL, "crash_cause": ILLEGAL_WORDS,
                                                 "failure": f"llama-server died: {SIGILL} ({ILLEGAL_WORDS})"}),
    # the real abort of a killed RPC server, after the server served
    ("b10435_rpc_server_killed_lv4.log", {
        "exit_code": 134, "crash": "/build/llama.cpp/ggml/src/ggml-rpc/ggml-rpc.cpp:644: Remote RPC server crashed or "
        "returned malformed response", "crash_cause": RPC_WORDS + " (SIGABRT, exit code 134)", "backtrace": True,
        "server_ready": True, "model_buffers": {"CPU_Mapped": 0.59, "RPC0[127.0.0.1:18850]": 0.37}}),
]


def test_the_override_lines_and_reserves_of_the_older_builds_logs():
    p = parse_log(LV4.read_text())
    assert p["overridden"][0] == {"tensor": "blk.1.ffn_up_exps.weight", "mib": 418, "type": "q5_0",
                                  "buffer": "CUDA_Host"}
    assert {o["type"] for o in p["overridden"]} == {"q5_0", "q8_0"}
    p = parse_log(read("b5200_load_tensors_overriden_nosize_qwen3moe.log"))
    assert all(o["mib"] is None and o["type"] is None and o["buffer"] == "CPU" for o in p["overridden"])
    # a second reserve logs the compute buffers it now holds
    lines = read("b10435_rpc_server_killed_lv4.log").splitlines()
    start = next(i for i, x in enumerate(lines) if "sched_reserve: reserving" in x)
    end = next(i for i, x in enumerate(lines) if "sched_reserve: reserve took" in x)
    again = [x.replace("1.66 MiB", "3.25 MiB").replace("1.15 MiB", "0.50 MiB") for x in lines[start:end + 1]]
    assert parse(lines[:end + 1])["compute_buffers"] == {"RPC0[127.0.0.1:18850]": 1.66, "CPU": 1.15}
    assert parse(lines[:end + 1] + again)["compute_buffers"] == {"RPC0[127.0.0.1:18850]": 3.25, "CPU": 0.5}


def _override(line, tensor, mib, kind, buffer):
    return line, {"overridden": [{"tensor": tensor, "mib": mib, "type": kind, "buffer": buffer}],
                  "per_tensor_lines_visible": True}


def _build(build, number):
    return {"build": build, "build_number": number, "runs": 1, "loads": 0}


ONE_LINE = [
    _override("tensor blk.1.ffn_up_exps.weight (418 MiB q5_0) buffer type overridden to CPU", UP1, 418, "q5_0", "CPU"),
    _override("0.00.011.842 D tensor blk.1.ffn_down_exps.weight (0 MiB f32) buffer type overridden to CPU_REPACK",
              "blk.1.ffn_down_exps.weight", 0, "f32", "CPU_REPACK"),
    _override("tensor blk.3.ffn_gate_exps.weight buffer type overriden to AMX", "blk.3.ffn_gate_exps.weight", None,
              None, "AMX"),
    _override("Tensor blk.7.ffn_up_exps.weight buffer type overriden to CUDA_Host", "blk.7.ffn_up_exps.weight", None,
              None, "CUDA_Host"),
    _override("\x1b[32m0.01.002.000 D tensor blk.0.ffn_up_exps.weight (12 MiB mxfp4) buffer type overridden to CPU"
              "\x1b[0m", "blk.0.ffn_up_exps.weight", 12, "mxfp4", "CPU"),
    *[("%s: %10s KV buffer size = %8.2f MiB" % (prefix, "CUDA1", 96.0), {"kv_buffers": {"CUDA1": 96.0}})
      for prefix in ("llama_kv_cache_init", "init", "llama_kv_cache_unified", "llama_kv_cache")],
    *[("%s: %10s compute buffer size = %8.2f MiB" % (prefix, "Vulkan0", 300.5), {"compute_buffers": {"Vulkan0": 300.5}})
      for prefix in ("llama_new_context_with_model", "llama_init_from_model", "llama_context", "sched_reserve")],
    *[(x, {"model_buffers": {"CUDA0": 1000.0}}) for x in (
        "llm_load_tensors:      CUDA0 buffer size =  1000.00 MiB",
        "llm_load_tensors:      CUDA0 model buffer size =  1000.00 MiB",
        "load_tensors:        CUDA0 model buffer size =  1000.00 MiB",
        "0.00.012.476 I load_tensors:        CUDA0 model buffer size =  1000.00 MiB")],
    *[(MMAP + x, {"mmap_override_warning": True}) for x in ("--no-mmap for better performance", "--load-mode none")],
    ("load_tensors: offloaded 6/6 layers to GPU", {"mmap_override_warning": False}),
    ("common_params_print_info: build 1 (7e4c0a9) with GNU 11.4.0 for Linux x86_64", _build("b1-7e4c0a9", 1)),
    (BUILD, _build("b10435-9e40df63b", 10435)),
    ("build: 5200 (9a8b7c6) with cc (GCC) 11.4.0 for x86_64-linux-gnu", _build("b5200-9a8b7c6", 5200)),
    ("main: build = 4500 (abc1234)", _build("b4500-abc1234", 4500)),
    ("version: 4500 (abc1234)", _build("b4500-abc1234", 4500)),
    (["version: 5200 (9a8b7c6)", "built with cc for x86_64"], _build("b5200-9a8b7c6", 5200)),
    ("version: 0.2.0-dev (build 10586, commit b21e4de74)", _build("b10586-b21e4de74", 10586)),
    ("version: 0.1.0-dev (build 1, commit 7e4c0a9)", _build("b1-7e4c0a9", 1)),
    ("build_info: b4500-abc1234", _build("b4500-abc1234", 4500)),
    ('INFO [                    main] build info | tid="139812345678912" timestamp=1747000000 build=3701 '
     'commit="5e6f7a8"', _build("b3701-5e6f7a8", 3701)),
    # the memory breakdown table is not a service prefix
    ("common_memory_breakdown_print: | memory breakdown [MiB] |", {"runs": 1}),
    *[(x, {"server_ready": True}) for x in (
        "0.00.753.000 I srv  llama_server: model loaded", "srv  update_slots: all slots are idle",
        "0.00.753.008 I srv  llama_server: listening on http://127.0.0.1:18791",  # b10435
        "main: server is listening on http://0.0.0.0:8080 - starting the main loop")],
    ("main: HTTP server is listening, hostname: 0.0.0.0, port: 8080, http threads: 31", {"server_ready": False}),
    ("0.00.019.329 I srv    load_model: loading model 'tiny.gguf'", {"server_ready": False}),
    (META, {"loads": 1}), (TENSORS, {"loads": 1}), ([META, TENSORS], {"loads": 1}),
    ("llm_load_tensors: loading model tensors, this can take a while... (mmap = true)", {"loads": 1}),
    # the loader's DEBUG line shows the per-tensor lines by itself (--no-log-prefix prints no level letter)
    ("create_tensor: loading tensor blk.0.attn_q.weight", {"per_tensor_lines_visible": True}),
    # the load errors: the most specific message, cut where the message ends
    ("0.00.005.832 E srv  llama_server: exiting due to model loading error",
     {"load_error": "exiting due to model loading error"}),
    ("0.00.100.000 E srv    load_model: failed to load model, 'm.gguf'", {"load_error": "failed to load model, 'm.gguf'"}),
    ('{"function":"load_model","level":"ERR","line":681,"model":"m.gguf","msg":"unable to load model",'
     '"tid":"140046","timestamp":1716000000}',
     {"load_error": "unable to load model", "failure": "the model failed to load: unable to load model"}),
    ('ERR [              load_model] unable to load model | tid="140" timestamp=1718 model="m.gguf"',
     {"load_error": "unable to load model"}),
    # -fit's own trial load can fail: the server then loads with the parameters it was given
    ([VERBOSITY, FIT], {"load_error": None, "failure": None}),
    # read from the middle of the log (podman logs --tail 3): the Vulkan limit is the first allocation failure
    ([VK_LIMIT] + VK_CONTEXT, {"load_error": f"{CONTEXT_ERROR} (Requested buffer size exceeds device buffer size "
                                             "limit: ErrorOutOfDeviceMemory)"}),
    (["ggml_vulkan: Device memory allocation of size 2166360064 failed.", VK_LIMIT] + VK_CONTEXT,
     {"load_error": f"{CONTEXT_ERROR} (Device memory allocation of size 2166360064 failed.)"}),
    # llama.cpp retries a compute buffer without pipeline parallelism: the failed allocation alone ends nothing
    ([VK_LIMIT, READY], {"load_error": None, "crash": None, "failure": None, "server_ready": True}),
    # gdb's "No such file or directory" line and a frame without an address prove nothing
    ([READY, "503\t./nptl/pthread_cond_wait.c: No such file or directory.",
      "#4  ___pthread_cond_wait (cond=0x5598c09348d0, mutex=0x5598c09348a8) at ./nptl/pthread_cond_wait.c:618"],
     {"crash": None, "backtrace": False, "failure": None}),
]


def _ov(*names):
    return [{"tensor": t, "mib": 1, "type": "f16", "buffer": "CPU"} for t in names]


OLD_LAYER = "llm_load_tensors: layer   0 assigned to device CUDA0"
NEW_RUN = {"runs": 2, "loads": 0, "model_buffers": {}, "load_error": None, "crash": None, "failure": None}
RUN1 = ["build: 7500 (1a2b3c4) with cc for x86_64"] + load_lines(["blk.0.a"], 10.0)
BAD_RUN = ["build: 7500 (1a2b3c4) with cc for x86_64",
           "llama_model_load: error loading model: tensor 'blk.0.x' data is not within the file bounds",
           "llama_model_load_from_file_impl: failed to load model", "srv    load_model: failed to load model, '/m.gguf'",
           "srv  llama_server: exiting due to model loading error"]
HIDDEN_BUILD = [VERBOSITY.replace("= 4", "= 3"), "0.00.006.076 I srv    load_model: loading model 'm.gguf'",
                MMAP + "--no-mmap for better performance"]
RPC0 = model_buf("RPC0[127.0.0.1:50052]", 1.5)
ARCH = ["0.00.011.000 I llama_model_loader: - kv   0:                       general.architecture str      = foo",
        "0.00.011.100 I llama_model_loader: - kv  19:            tokenizer.ggml.unknown_token_id u32      = 0",
        "0.00.011.300 E llama_model_load: error loading model: error loading model architecture: unknown model "
        "architecture: 'foo'", "0.00.011.310 E llama_model_load_from_file_impl: failed to load model",
        "0.00.011.400 E srv    load_model: failed to load model, 'm.gguf'",
        "0.00.011.500 E srv  llama_server: exiting due to model loading error"]
ARCH_ERROR = "error loading model architecture: unknown model architecture: 'foo'"


@pytest.mark.parametrize("lines, fields", ONE_LINE + [
    (["build: 4500 (aaaa111) with cc (GCC) 11.4.0 for x86_64-linux-gnu", OLD_LAYER,
      "tensor blk.0.ffn_up_exps.weight buffer type overriden to CPU",
      "llm_load_tensors: offloaded 2/2 layers to GPU", "llm_load_tensors:        CPU buffer size =   100.00 MiB",
      "llm_load_tensors:      CUDA0 buffer size =    50.00 MiB"],
     {"build": "b4500-aaaa111", "model_buffers": {"CPU": 100.0, "CUDA0": 50.0}, "overridden": [
         {"tensor": "blk.0.ffn_up_exps.weight", "mib": None, "type": None, "buffer": "CPU"}]}),
    # -fit on: the whole load block is printed twice; only the second load counts (not 55 + the dry run's 0)
    *[(load_lines(["blk.0.a"], 0.0, marker) + ["common_fit_params: successfully fit params"]
       + load_lines(["blk.0.b", "blk.1.b"], 55.0, marker),
       {"loads": 2, "model_buffers": {"CUDA0": 55.0}, "kv_buffers": {"CUDA0": 1.0}, "overridden": _ov("blk.0.b", "blk.1.b")})
      for marker in (True, False)],
    ([META, TENSORS, model_buf("CUDA0", 100), kv_buf("CUDA0", 8), META, TENSORS, model_buf("CUDA0", 200)],
     {"loads": 2, "model_buffers": {"CUDA0": 200.0}, "kv_buffers": {}}),
    # the DEBUG layer line opens a load, shows the per-tensor lines, and after a model buffer opens the next load
    *[(x, {"loads": 1, "per_tensor_lines_visible": True}) for x in (LAYER, OLD_LAYER)],
    *[([x, model_buf("CUDA0", 100), x, model_buf("CUDA0", 200)], {"loads": 2, "model_buffers": {"CUDA0": 200.0}})
      for x in (LAYER, OLD_LAYER)],
    # a restarted container: the last run counts, also when its build line is hidden (not the previous run's build)
    (RUN1 + ["srv  operator(): cleaning up before exit...", "build: 7600 (5d6e7f8) with cc for x86_64"]
     + load_lines(["blk.9.z"], 20.0),
     {"runs": 2, "build": "b7600-5d6e7f8", "model_buffers": {"CUDA0": 20.0}, "overridden": _ov("blk.9.z")}),
    (RUN1 + HIDDEN_BUILD, {"runs": 2, "build": None, "overridden": [], "model_buffers": {},
                           "mmap_override_warning": True, "per_tensor_lines_visible": False}),
    (BAD_RUN + RUN1, {"load_error": None, "overridden": _ov("blk.0.a")}),
    (RUN1 + BAD_RUN, {"load_error": "tensor 'blk.0.x' data is not within the file bounds", "overridden": [],
                      "model_buffers": {}}),
    # the verbosity, loading-model and system_info lines each start a run (the first run's ready line is not the
    # second one's); whatever the first run printed, the next start inherits none of it
    *[([x, model_buf("CUDA0", 100), READY, x, model_buf("CUDA0", 200)], {
        "runs": 2, "loads": 1, "model_buffers": {"CUDA0": 200.0}, "server_ready": False, "build": None})
      for x in (VERBOSITY, LOADING, SYSTEM_INFO)],
    *[([VERBOSITY, x, VERBOSITY], NEW_RUN)
      for x in (model_buf("CUDA0", 100), "Segmentation fault (core dumped)", "llama_model_load: error loading model: unable",
                META)],
    # the lines that open one start make one run; a later build line starts a run with that build
    ([BUILD, VERBOSITY, SYSTEM_INFO, LOADING, model_buf("CUDA0", 1369.43)], {
        "runs": 1, "loads": 1, "build": "b10435-9e40df63b", "build_number": 10435, "model_buffers": {"CUDA0": 1369.43}}),
    (["build: 5200 (9a8b7c6) with cc (GCC) 11.4.0 for x86_64-linux-gnu", model_buf("CUDA0", 100), BUILD,
      model_buf("CUDA0", 200)], {"runs": 2, "build": "b10435-9e40df63b", "build_number": 10435,
                                 "model_buffers": {"CUDA0": 200.0}}),
    # -v sets the verbosity to INT_MAX
    ([VERBOSITY.replace("= 4", "= 2147483647"), TENSORS, model_buf("CUDA0", 1.0),
      VERBOSITY.replace("= 4", "= 2147483647"), TENSORS, model_buf("CUDA0", 2.0)],
     {"runs": 2, "model_buffers": {"CUDA0": 2.0}}),
    # src/llama-model-loader.cpp prints every key, then src/llama.cpp llama_model_load: "error loading model: %s"
    (ARCH, {"exit_code": 1, "load_error": ARCH_ERROR, "crash": None, "failure": "the model failed to load: " + ARCH_ERROR}),
    # the first fatal line is the crash: what follows does not replace it
    (GOOD_LOAD + ["E CUDA error: out of memory", "/src/ggml-cuda.cu:88: CUDA error"], {"crash": "CUDA error: out of memory"}),
    # every abort line of a chunk is read (a line with no keyword, only "file:line: "): the last run's counts
    ([BUILD, RPC0, RPC_ABORT % 644, BUILD, RPC0, RPC_ABORT % 519], {"runs": 2, "crash": RPC_ABORT % 519,
                                                                    "crash_cause": RPC_WORDS}),
    # an exit code of 128 + a signal is added to the cause of the crash line
    ([BUF_CUDA0, READY, "Segmentation fault (core dumped)"],
     {"exit_code": 139, "crash_cause": SIGNALS[11][1] + " (SIGSEGV, exit code 139)"}),
    # a log with text is one run, a blank log none
    ([], {"runs": 0, "failure": None}), (["  ", "\t", "", ""], {"runs": 0}), (["0.00.001.000 I main: hello"], {"runs": 1}),
    (GOOD_LOAD[:5], {"exit_code": 1, "crash": None, "server_ready": False,
                     "failure": "llama-server exited with code 1 before it was ready"}),
])
def test_lines_of_every_era(lines, fields):
    p = parse([lines] if isinstance(lines, str) else lines, fields.get("exit_code"))
    assert pick(p, *fields) == fields


def test_run_starts_are_the_lines_where_parse_log_counts_a_new_run():
    """A run starts at its first start line; the start lines that follow it before any other line belong to the same
    run; lines before the first start are a run whose start was cut off. The result beside them is parse_log's."""
    lines = ["print_info: n_embd = 64", BUILD, VERBOSITY, LOADING, META, "llama_model_load: error loading model: boom",
             SYSTEM_INFO, LOADING, TENSORS, BUILD, "", VERBOSITY, META]
    assert parse_runs(lines)[1] == [1, 6, 9] and parse_log("\n".join(lines))["runs"] == 3
    assert parse_runs(lines, 1)[0] == parse_log("\n".join(lines), 1)
    assert parse_runs(lines[:6])[0] == parse_log("\n".join(lines[:6]))
    long = lines[:5] + ["llama_model_load: error loading model: " + "x" * _log_chunks.MAX_LINE]  # parsed in pieces, as parse_log
    assert parse_runs(long)[0] == parse_log("\n".join(long))
    assert parse_runs([META, TENSORS])[1] == [] and parse_runs([])[1] == [] and parse_runs([LOADING, META])[1] == [0]


@pytest.mark.parametrize("lines, crash, cause, backtrace", CRASHES)
@pytest.mark.parametrize("head", [GOOD_LOAD, GOOD_LOAD[:4]], ids=["after the load", "during the load"])
def test_every_crash_form_is_a_crash_with_its_own_cause(lines, crash, cause, backtrace, head):
    p = parse(head + lines)
    assert pick(p, "crash", "crash_cause", "backtrace", "failure") == {
        "crash": crash, "crash_cause": cause, "backtrace": backtrace,
        "failure": f"llama-server died: {crash} ({cause})"}


@pytest.mark.parametrize("code, name, words", SIGNAL_EXITS)
@pytest.mark.parametrize("tail", ["", "\n", "\n   \n\t\n"])
def test_a_signal_exit_code_is_a_crash_after_a_good_log_named_by_its_last_line_that_is_not_blank(code, name, words,
                                                                                                 tail):
    p = parse(GOOD_LOAD[:-1] + [model_buf("CUDA0", 100), READY], code, end=tail)
    assert p["crash"] == f"exit code {code} ({name}) after the line: llama_server: model loaded"
    assert words in p["crash_cause"] and p["exit_code"] == code


SLOTS, HEALTH = ("srv  log_server_r: request: GET /%s 127.0.0.1 D 200" % x for x in ("slots", "health"))
XD = "srv  params_from_: xD 1"


@pytest.mark.parametrize("lines, visible", [
    ([QUEUE_DEBUG], True), ([QUEUE_DEBUG, BUF_CUDA0], True), ([BUF_CUDA0, QUEUE_DEBUG], True),  # first, after a line
    ([BUF_CUDA0, QUEUE_DEBUG[13:]], True), ([QUEUE_DEBUG[13:], BUF_CUDA0], True),  # --no-log-timestamps: "D " first
    ([BUF_CUDA0, PAD_TOKEN, QUEUE_DEBUG], True),            # "PAD token" holds "D " in a word
    ([BUF_CUDA0, NAME_WITH_D, QUEUE_DEBUG], True),          # a model name holds " D "
    ([BUF_CUDA0, NAME_WITH_D, PAD_TOKEN, READY, PAD_TOKEN, NAME_WITH_D, QUEUE_DEBUG], True),
    ([BUF_CUDA0, "ai-llm-1  | " + QUEUE_DEBUG], True), ([BUF_CUDA0, "[47161] " + QUEUE_DEBUG[13:]], True),  # compose, router
    ([PAD_TOKEN], False), ([NAME_WITH_D], False),
    ([BUF_CUDA0, NAME_WITH_D, PAD_TOKEN, READY], False), ([PAD_TOKEN, NAME_WITH_D, PAD_TOKEN], False),
    # lines that merely contain "D " (in a message, inside a word) neither hide a DEBUG line nor stand for one
    ([SLOTS, QUEUE_DEBUG[13:], HEALTH], True), ([XD, QUEUE_DEBUG[13:], HEALTH], True),
    ([SLOTS, HEALTH], False), ([XD, HEALTH], False),
    # common/log.cpp with colours writes the level as <yellow>"D " after the blue timestamp
    (["\x1b[34m0.00.120.100\x1b[0m \x1b[33mD que  process_new_: processing task, id = 0"], True),
    (["\x1b[34m0.00.120.100\x1b[0m \x1b[32mI que  process_new_: processing task, id = 0"], False),
    ([BUF_CUDA0, NAME_WITH_D, override(UP1, "CPU")], True),  # a later keyword line after a line that holds a D
])
def test_a_debug_line_without_a_keyword_shows_the_debug_level(lines, visible):
    p = parse(lines)
    assert p["per_tensor_lines_visible"] is visible
    if override(UP1, "CPU") in lines:
        assert tensors(p) == [UP1]
    else:
        assert p["overridden"] == [] and p["model_buffers"] == ({"CUDA0": 1369.43} if BUF_CUDA0 in lines else {})


def test_every_source_reads_alike_and_bytes_not_utf8_and_lone_surrogates_are_replaced(tmp_path):
    raw = ("\n".join(GOOD_LOAD[:3]) + "\n").encode() + b"junk \xff\xfe\xc3 line\n" + \
        ("\n".join(GOOD_LOAD[3:]) + "\n").encode()
    path = tmp_path / "bad.log"
    path.write_bytes(raw)
    expected = parse_log("\n".join(GOOD_LOAD))
    assert tensors(expected) == [UP1] and expected["server_ready"] is True
    # bytes, a binary stream, a file, lines with and without their newline
    with open(path, "rb") as f:
        for source in (raw, io.BytesIO(raw), f, raw.splitlines(keepends=True), iter(GOOD_LOAD)):
            assert parse_log(source) == expected
    # a tensor name with a bad byte is kept, replaced: the result is always valid text, also from text that holds
    # undecodable bytes as surrogates (Python's surrogateescape)
    line = b"tensor blk.1.ffn_\xff_exps.weight (0 MiB f32) buffer type overridden to CPU\n"
    for source in (line, line.decode("utf-8", "surrogateescape"), [line.decode("utf-8", "surrogateescape")]):
        assert parse_log(source)["overridden"][0]["tensor"] == "blk.1.ffn_\ufffd_exps.weight"
    # a high surrogate cannot be an undecodable byte: it is replaced all the same
    p = parse_log("CUDA error: unspecified launch failure \ud800\n")
    assert p["crash"].startswith("CUDA error: unspecified launch failure ")
    assert "\ud800" not in p["crash"] and "\ufffd" in p["crash"]
    p["crash"].encode("utf-8")
    # a chunk without its last newline reads as its lines
    chunked, by_lines = LogParser(), LogParser()
    chunked.feed_chunk(model_buf("CUDA0", 100) + "\nKilled")
    by_lines.feed(model_buf("CUDA0", 100))
    by_lines.feed("Killed")
    assert chunked.result() == by_lines.result()
    assert pick(chunked.result(), "crash", "crash_cause", "model_buffers") == {
        "crash": "Killed", "crash_cause": SIGNALS[9][1], "model_buffers": {"CUDA0": 100.0}}


@pytest.mark.parametrize("line", [
    "a" * 2_000_000, ". " * 1_000_000, "a | " * 500_000, "[1] " * 500_000, "2025-08-20T11:41:20Z " * 100_000,
    "error loading model: " + " " * 2_000_000 + "x", "CUDA error: " + " " * 2_000_000 + "x", "GGML_ASSERT(" * 200_000,
    "build info " * 200_000, "tensor " * 300_000 + " buffer type overridden to CPU", "x.cpp:1: " * 200_000,
    "\x1b[" + "1;" * 1_000_000, "0x" + "(+0x1)[0x1]" * 200_000,
    # malformed numbers
    "load_tensors: CPU model buffer size = 1.2.3 MiB", "load_tensors:        CUDA0 model buffer size = 1e400 MiB",
    "llama_kv_cache:        CUDA0 KV buffer size = .. MiB", "load_tensors: offloaded 99999999999999999999999/3 layers",
    "sched_reserve:      CUDA0 compute buffer size = 99999999999999999999999999999.5 MiB",
    "build: " + "9" * 5000 + " (abc1234) with cc", "version: " + "1" * 5000 + " (abc)",
    "tensor blk.0.x (" + "7" * 5000 + " MiB f32) buffer type overridden to CPU",
    "Tensor blk.0.x (size = 1.2.3 MiB) buffer type overriden to CPU",
    "allocating " + "9" * 5000 + " MiB on device 0: cudaMalloc failed: out of memory",
])
def test_pathological_lines_and_malformed_numbers_parse_in_linear_time_and_bounded_memory_and_never_raise(line):
    """Each long line takes a stripping or a regular expression that is quadratic in the line seconds to minutes per
    MB; a line longer than _log_chunks.MAX_LINE is read in pieces, so memory stays bounded."""
    with memory_below(32 << 20):
        p = parse_log(io.BytesIO(line.encode() + b"\n"))
    assert p["runs"] == 1
    assert all(isinstance(v, float) and v < 1e16 for v in p["model_buffers"].values())
    assert p["offloaded_layers"] is None and p["build_number"] is None
    assert all(o["mib"] is None or o["mib"] < 10 ** 13 for o in p["overridden"])


def test_a_big_log_streams_in_bounded_memory_and_what_is_kept_is_bounded(tmp_path, monkeypatch):
    """40 MB of log (restarts, loads, debug noise) read from a file: memory does not follow its size."""
    chunk = "\n".join(["build: 7500 (1a2b3c4) with cc"] + GOOD_LOAD
                      + ["0.00.200.000 D slot update_slots: id  0 | task 1 | n_past = %d" % i for i in range(400)])
    path = tmp_path / "big.log"
    with open(path, "w") as f:
        while f.tell() < 40 << 20:
            f.write(chunk + "\n")
    with open(path, "rb") as f, memory_below(32 << 20):
        p = parse_log(f)
    assert p["runs"] > 1000 and p["server_ready"]
    assert tensors(p) == [UP1] and p["per_tensor_lines_visible"] and p["failure"] is None
    monkeypatch.setattr(_llama_log, "MAX_OVERRIDES", 10)
    lines = [override("blk.%d.ffn_up_exps.weight" % i, "CPU", 1, "f32") for i in range(25)]
    p = parse_log("\n".join(lines + [model_buf("DEV%d" % i, 1.0) for i in range(200)]))
    assert len(p["overridden"]) == 10 and p["overridden_dropped"] == 15
    assert len(p["model_buffers"]) == _llama_log.MAX_BUFFER_NAMES
    p = parse_log("llama_model_load: error loading model: " + "x" * 100_000)
    assert len(p["load_error"]) == _llama_log.MAX_MESSAGE + 3


def ov(parsed):
    return [(o["tensor"], o["mib"], o["type"], o["buffer"]) for o in parsed["overridden"]]


def test_every_public_log_has_a_source_and_the_per_tensor_lines_of_other_builds():
    sources = (DATA / "public" / "SOURCES.md").read_text(encoding="utf-8")
    assert PUBLIC_LOGS and all("`%s`" % name in sources for name in PUBLIC_LOGS)
    p = parse_log(read("public/ik_llama_sized_overriden_cuda_host.log"))
    assert ov(p) == [("blk.%d.ffn_%s_exps.weight" % (b, k), mib, None, "CUDA_Host") for b, k, mib in (
        (20, "gate", 272), (20, "down", 176), (21, "up", 272), (21, "gate", 272), (21, "down", 176), (22, "down", 210))]
    assert p["per_tensor_lines_visible"] is True
    p = parse_log(read("public/ik_llama_sized_overridden_adding_override.log"))
    assert ov(p) == [("blk.%d.ffn_%s_exps.weight" % (b, k), 1020, None, "CUDA_Host")
                     for b, k in ((2, "up"), (2, "gate"), (2, "down"), (3, "up"))]
    assert p["model_buffers"] == {}  # "ggml ctx size" is no buffer
    # override lines glued on one line all count
    assert ov(parse_log(read("public/ik_llama_glued_override_lines.log"))) == [
        ("blk.%d.ffn_%s_exps.weight" % (b, k), mib, None, "CPU")
        for b, k, mib in ((33, "gate", 1026), (33, "down", 1096), (34, "up", 1026), (34, "gate", 1026), (34, "down", 1096))]
    # overrides to another GPU keep their buffer
    p = parse_log(read("public/ik_llama_ot_cuda1_and_cpu.log"))
    assert sorted(o for o in ov(p) if o[3] == "CUDA1") == sorted((t, None, None, "CUDA1") for t in [
        "blk.57.ffn_norm.weight", "blk.57.ffn_gate_inp.weight", "blk.57.exp_probs_b.bias",
        "blk.57.ffn_gate_shexp.weight", "blk.57.ffn_down_shexp.weight", "blk.57.ffn_up_shexp.weight"])
    assert [o for o in ov(p) if o[3] == "CPU"] == [(t, None, None, "CPU") for t in IK_CPU]
    p = parse_log(read("public/b4xxx_overriden_rpc_and_cpu.log"))
    assert [o[0] for o in ov(p) if o[3] == "RPC[127.0.0.1:50053]"] == [
        "blk.59.ffn_gate_exps.weight", "blk.59.ffn_down_exps.weight", "blk.59.ffn_up_exps.weight"]
    assert len(p["overridden"]) == 9 and all(o[1] is None and o[2] is None for o in ov(p))


@pytest.mark.parametrize("name, fields", OLDER_LOGS + [("public/" + n, f) for n, f in [
    # "cannot be used with preferred buffer type" is no override
    ("ollama_b6xxx_cuda0_cuda2_interleaved.log", {
        "overridden": [], "offloaded_layers": {"offloaded": 81, "total": 81}, "load_error": None, "crash": None,
        "model_buffers": {"CUDA0": 24277.75, "CUDA2": 46151.91, "CPU_Mapped": 1064.62}}),
    ("ollama_journald_2024_cuda0_cuda1.log", {"offloaded_layers": {"offloaded": 39, "total": 41},
                                              "model_buffers": {"CPU": 70752.49, "CUDA0": 45460.59, "CUDA1": 22730.3}}),
    # two CPU buffer lines are summed, the KV cache on the host kept apart
    ("ik_llama_two_cpu_buffers_kv_on_host.log", {
        "model_buffers": {"CPU": 19789.55, "CUDA0": 5028.23}, "kv_buffers": {"CUDA_Host": 37.03, "CUDA0": 37.03},
        "offloaded_layers": {"offloaded": 20, "total": 41}}),
    ("b9xxx_sycl_prefixed.log", {"model_buffers": {"SYCL1": 12867.08, "SYCL_Host": 20183.74}}),
    ("ollama_2024_sycl_json.log", {  # with JSON server lines; not the "output buffer"
        "offloaded_layers": {"offloaded": 33, "total": 33}, "model_buffers": {"SYCL0": 5115.49, "CPU": 344.44},
        "kv_buffers": {"SYCL0": 256.0}, "compute_buffers": {"SYCL0": 258.5, "SYCL_Host": 12.01}}),
    ("vulkan_b50xx_kv_compute.log", {"kv_buffers": {"Vulkan0": 19200.0}, "load_error": None,
                                     "compute_buffers": {"Vulkan0": 1174.0, "Vulkan_Host": 18.01}}),
    ("metal_mtp_mtl0_mapped.log", {"offloaded_layers": {"offloaded": 66, "total": 66},
                                   "model_buffers": {"CPU_Mapped": 644.14, "MTL0_Mapped": 14803.73}}),
    # the router child's port prefix; the DEBUG create_tensor lines are there
    ("router_b10xxx_port_prefix_recurrent.log", {"rs_buffers": {"Meta()": 149.62}, "per_tensor_lines_visible": True,
                                                 "overridden": []}),
    ("b8xxx_cuda_oom_model_load.log", {"load_error": "unable to allocate CUDA0 buffer " + OOM, "model_buffers": {},
                                       "overridden": []}),
    ("b59xx_context_oom_exit.log", {"load_error": CONTEXT_ERROR}),
    ("vulkan_b50xx_oom_ctk.log", {"load_error": CONTEXT_ERROR + " (Device memory allocation of size 2166360064 failed.)",
                                  "kv_buffers": {"Vulkan0": 13800.0}}),
    ("ollama_2024_rocm_context_oom.log", {"load_error": (
        "failed to create context with model '/root/.ollama/models/blobs/sha256-e9e56e8bb5f0fcd4860675e6837a8f6a94e659f5fa"
        "7dce6a1076279336320f2b' (allocating 826.00 MiB on device 0: cudaMalloc failed: out of memory)")}),
    ("lmstudio_b10xxx_tab_indented_context_error.log", {"load_error": (
        "failed to initialize the context: dflash requires ctx_other to be set (this warning is normal during memory "
        "fitting)")}),
    # an allocation that is retried or refused while serving is no load error
    ("b7xxx_kv_two_gpus_compute_retry.log", {"load_error": None, "crash": None,
                                             "kv_buffers": {"CUDA0": 12327.0, "CUDA1": 11153.0}}),
    ("compose_b45xx_runtime_cuda1_oom.log", {"load_error": None, "crash": None}),
    ("b10586_crash_after_load.log", {"build": "b10586-b21e4de74", "load_error": None, "server_ready": False,
                                     "crash": "CUDA error: an illegal memory access was encountered"}),
]])
def test_what_a_log_of_another_build_backend_or_wrapper_shows(name, fields):
    assert pick(parse_log(read(name), fields.get("exit_code")), *fields) == fields


def test_lines_glued_to_the_progress_dots_a_crash_after_a_good_load_and_a_restart_after_a_crash():
    """The loader's progress dots are printed without a newline: a line after them still counts."""
    q = parse_log(read("public/metal_mtp_mtl0_mapped.log").replace(
        "....srv    load_model: initializing slots, n_slots = 1", "....llama_kv_cache:       MTL0 KV buffer size =  4096.00 MiB"))
    assert q["kv_buffers"] == {"MTL0": 4096.0}
    good = read("public/ik_llama_sized_overriden_cuda_host.log")
    p = parse_log(good + "53.26.801.941 E CUDA error: an illegal memory access was encountered\n")
    assert len(p["overridden"]) == 6 and p["crash"]
    p = parse_log(read("public/b10586_crash_after_load.log") + "version: 0.2.0-dev (build 10586, commit b21e4de74)\n"
                  + good)
    assert p["runs"] == 2 and p["crash"] is None and len(p["overridden"]) == 6


def _each_line(fmt):
    return lambda text: "".join(fmt % x + "\n" for x in text.splitlines())


WRAPPERS = {"crlf": lambda t: t.replace("\n", "\r\n"), "ansi": _each_line("\x1b[32m%s\x1b[0m"),
            "docker -t": _each_line("2025-08-20T11:41:20.014123456Z %s"),
            **{"compose " + p: _each_line(p + "%s") for p in ("ai-llm  | ", "ai-llm-1  | ", "ai-llm | ", "[ai-llm] | ")}}
WRAPPERS["all"] = lambda t: WRAPPERS["compose ai-llm  | "](WRAPPERS["docker -t"](WRAPPERS["crlf"](t)))


@pytest.mark.parametrize("name", sorted(str(p.relative_to(DATA)) for p in DATA.rglob("*.log")))
@pytest.mark.parametrize("how", [_log_chunks.CHUNK, 97, *WRAPPERS])
def test_chunks_lines_without_a_keyword_and_wrappers_change_nothing(monkeypatch, name, how):
    """Lines fed one by one give the result of the chunked reader, which parses only the lines that hold a keyword,
    whatever the chunk boundaries; runtimes, compose and terminals add prefixes, colours and CR LF."""
    text = read(name)
    if how in WRAPPERS:
        assert parse_log(WRAPPERS[how](text)) == parse_log(text)
        return
    parser = LogParser()
    for line in text.splitlines():
        parser.feed(line)
    monkeypatch.setattr(_log_chunks, "CHUNK", how)
    for exit_code in (None, 139):
        assert parse_log(text, exit_code) == parser.result(exit_code), name


# ---------------------------------------------------------------- parse_command_log runs a real command

EMIT = "import sys; sys.stderr.write(sys.argv[2]); sys.stderr.flush(); sys.exit(int(sys.argv[1]))"
GOOD = GOOD_LOAD[1:5] + ["0.00.120.300 I llama_kv_cache:        CUDA0 KV buffer size =     0.06 MiB"] + GOOD_LOAD[5:]


def emit(text, rc=0):
    return [sys.executable, "-c", EMIT, str(rc), text]


@pytest.mark.parametrize("keep, expected", [(1, GOOD[-1:]), (2, GOOD[-2:]), (5, GOOD[-5:]), (7, GOOD), (10, GOOD)])
def test_a_command_log_is_parsed_as_the_same_text_and_the_last_lines_are_kept(keep, expected):
    text = "\n".join(GOOD) + "\n"
    parsed, rc, tail = parse_command_log(emit(text), keep=keep)
    assert parsed == parse_log(text) and tensors(parsed) == [UP1] and parsed["server_ready"] is True
    assert (rc, tail) == (0, expected)


def test_the_tail_skips_blank_lines_cuts_long_ones_and_keeps_lines_whole_and_the_return_code_comes_back():
    long_line = "E " + "x" * 700
    text = "\n".join(GOOD[:-3] + ["", GOOD[-3], "   ", GOOD[-2], long_line]) + "\n"
    assert parse_command_log(emit(text))[2] == GOOD[-5:-1] + [long_line[:MAX_MESSAGE] + "..."]
    # a command that ends with empty lines still says why it failed
    assert parse_command_log(emit("E CUDA error: out of memory\n" + "\n" * 6, rc=1))[2] == ["E CUDA error: out of memory"]
    # five loader lines of about 110 characters each: the tail holds them whole
    kv = ["0.00.011.%03d I llama_model_loader: - kv  %2d:                       general.architecture str"
          "              = nemotron_h_moe" % (i, i) for i in range(8)]
    assert parse_command_log(emit("\n".join(kv) + "\n"))[2] == kv[-5:]
    assert parse_command_log(emit("", 1)) == (parse_log(""), 1, [])  # prints nothing
    # the return code is returned, and the exit code is what the caller gives
    text = "\n".join(GOOD + [RPC_LINE]) + "\n"
    parsed, rc, tail = parse_command_log(emit(text, 3))
    assert rc == 3 and parsed["exit_code"] is None and tail == GOOD[-4:] + [RPC_LINE]
    assert (parsed["crash"], parsed["crash_cause"]) == (RPC_LINE, RPC_WORDS)
    parsed, rc, _tail = parse_command_log(emit(text), exit_code=134)
    assert rc == 0 and parsed["exit_code"] == 134 and parsed["crash_cause"] == RPC_WORDS + " (SIGABRT, exit code 134)"


def test_stdout_and_stderr_are_one_stream_bytes_not_utf8_replaced_and_stdin_is_devnull():
    script = "import sys\nprint(sys.argv[1], flush=True)\nsys.stderr.write(sys.argv[2] + '\\n'); sys.stderr.flush()\n"
    parsed, rc, tail = parse_command_log([sys.executable, "-c", script, GOOD[3], GOOD[5]])
    assert parsed["model_buffers"] == {"RPC0": 0.75} and parsed["server_ready"] is True
    assert (rc, tail) == (0, [GOOD[3], GOOD[5]])
    line = "0.00.120.000 D tensor blk.1.ffn_%s_exps.weight (0 MiB f32) buffer type overridden to CPU"
    parsed, _rc, tail = parse_command_log([sys.executable, "-c", "import sys; sys.stdout.buffer.write(%r)"
                                           % (line % "\xff").encode("latin-1")])
    assert tensors(parsed) == ["blk.1.ffn_\ufffd_exps.weight"] and tail == [line % "\ufffd"]
    # stdin is /dev/null whatever the caller's stdin is (here a pipe): a log command never reads or waits on it
    check = "import os; print('stdin is /dev/null' if os.path.samestat(os.fstat(0), os.stat(os.devnull)) else 'open')"
    caller = f"from {_llama_log.__name__} import parse_command_log; import sys; print(parse_command_log(sys.argv[1:])[2])"
    out = subprocess.run([sys.executable, "-c", caller, sys.executable, "-c", check], input="", capture_output=True,
                         text=True, check=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert out.stdout == "['stdin is /dev/null']\n"
