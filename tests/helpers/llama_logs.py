"""llama-server log lines and logs for the tests of the log parser, the placement proof and the llama_server_log
module.

The lines are written with the printf formats of llama.cpp's source:

* common/log.cpp: ``"%d.%02d.%03d.%03d "`` (the timestamp) then ``"I "``, ``"W "``, ``"E "`` or ``"D "`` (the level
  letter; ``--no-log-timestamps`` drops the timestamp and keeps the letter);
* src/llama-model.cpp ``load_tensors``: ``"%s: %12s model buffer size = %8.2f MiB"`` and
  ``"%s: offloaded %d/%d layers to GPU"``; src/llama-kv-cache.cpp ``"%s: %10s KV buffer size = %8.2f MiB"``;
  src/llama-memory-recurrent.cpp (``RS buffer size``); src/llama-context.cpp
  ``"%s: %10s compute buffer size = %8.2f MiB"``;
* src/llama-model-loader.cpp ``create_tensor``: ``"tensor %s (%zu MiB %s) buffer type overridden to %s"`` (DEBUG);
* tools/server/server.cpp ``SRV_INF`` (``"srv  %12.*s: "``): ``model loaded``, ``listening on http://...``;
* common/common.cpp ``common_params_print_info``: ``"%s: build %d (%s) with %s for %s%s"`` and
  ``"%s: verbosity = %d (adjust with the `-lv N` CLI arg)"`` (``COM_INF``: ``"cmn  %12.*s: "``; common/arg.cpp: -v
  sets INT_MAX); ``"system_info: n_threads = ..."``; older builds: ``build: 5200 (9a8b7c6) with cc ...``,
  ``main: build = ...``, ik_llama.cpp's ``INFO [main] build info | ... build=3701 commit="5e6f7a8"``,
  ``version: 0.2.0-dev (build 10586, commit b21e4de74)``;
* tools/server/server-context.cpp ``load_model``: ``SRV_INF("loading model '%s'")``; tools/server/server-queue.cpp
  ``QUE_DBG`` (``"que  %12.*s: "``, DEBUG);
* src/llama-model-loader.cpp: ``"%s: loaded meta data with %d key-value pairs and %d tensors from %s (version %s)"``;
  src/llama-model.cpp ``load_tensors``: ``"%s: loading model tensors, this can take a while... (load_mode = %s)"``,
  ``LLAMA_LOG_DEBUG("load_tensors: layer %3d assigned to device %s, is_swa = %d")``; src/llama-vocab.cpp and
  src/llama-model.cpp ``print_info`` (``"%s: PAD token             = %d '%s'"``);
* common/fit.cpp ``common_fit_params``: ``"%s: encountered an error while trying to fit params to free device
  memory: %s"``; the 2024 server (tools/server/utils.hpp ``server_log``): ``LOG_ERROR("unable to load model", ...)``
  as one JSON object, or ``ERR [ load_model] ... | tid=...`` with ``--log-format text``;
* ggml/src/ggml-vulkan/ggml-vulkan-buffers.cpp: ``"ggml_vulkan: Device memory allocation of size N failed."`` and
  ``Requested buffer size exceeds device buffer size limit``; ggml/src/ggml-alloc.c ``"%s: failed to allocate %s
  buffer of size %zu"``; src/llama-context.cpp ``"%s: failed to initialize the context: %s"`` and ``sched_reserve``
  (a second reserve logs the buffer sizes it now holds: the last line counts).

``tests/data/llama_logs/`` holds logs of older builds; ``public/`` holds excerpts of real logs of other builds and
backends pasted in public issues (sources in ``public/SOURCES.md``). ``b10435_rpc_server_killed_lv4.log`` is the
real stderr of llama-server b10435 (``-lv 4``, the tiny nemotron_h_moe model on an RPC device) whose
``ggml-rpc-server`` was killed before a completion (exit code 134; build and library paths replaced by /build and
/opt); ``b10434_sigill_amx_default_verbosity.log`` the real stderr of the PyPI llama-server b10434 on a CPU without
AVX-VNNI, which died by SIGILL (exit code 132).
"""
from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "llama_logs"
PUBLIC = DATA / "public"
PUBLIC_LOGS = sorted(p.name for p in PUBLIC.glob("*.log"))

TS = "0.01.000.000 "
READY = TS + "I srv  llama_server: model loaded"
BUILD = "0.00.155.704 I cmn  common_param: common_params_print_info: build 10435 (9e40df63b) with GNU 12.2.0 for " \
        "Linux x86_64"
VERBOSITY = "0.00.155.720 I cmn  common_param: common_params_print_info: verbosity = 4 (adjust with the `-lv N` " \
            "CLI arg)"
LOADING = "0.00.168.311 I srv    load_model: loading model 'tiny.gguf'"
SYSTEM_INFO = "system_info: n_threads = 8 (n_threads_batch = 8) / 16 | CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 |"
META = "llama_model_loader: loaded meta data with 44 key-value pairs and 459 tensors from m.gguf (version GGUF V3 " \
       "(latest))"
TENSORS = "load_tensors: loading model tensors, this can take a while... (load_mode = mmap)"
LAYER = "0.00.011.000 D load_tensors: layer   0 assigned to device CUDA0, is_swa = 0"
QUEUE_DEBUG = "0.00.300.000 D que  process_new_: processing task, id = 0"
PAD_TOKEN = "0.00.011.000 I print_info: PAD token             = 11 '<pad>'"
NAME_WITH_D = "0.00.011.100 I print_info: general.name          = Tiny Moe Rev D Test"
MMAP = "0.00.011.839 W llama_model_loader: tensor overrides to CPU are used with mmap enabled - consider using "
FIT = ("0.00.050.000 E common_fit_params: encountered an error while trying to fit params to free device memory: "
       "failed to load model")
VK_LIMIT = "ggml_vulkan: Requested buffer size exceeds device buffer size limit: ErrorOutOfDeviceMemory"
VK_CONTEXT = ["ggml_gallocr_reserve_n: failed to allocate Vulkan0 buffer of size 2166360064",
              "llama_init_from_model: failed to initialize the context: failed to allocate compute pp buffers"]
CONTEXT_ERROR = "failed to initialize the context: failed to allocate compute pp buffers"
OOM = "(allocating 144817.04 MiB on device 0: cudaMalloc failed: out of memory)"
UP1, DOWN1, UP2 = "blk.1.ffn_up_exps.weight", "blk.1.ffn_down_exps.weight", "blk.2.ffn_up_exps.weight"

# tests/data/llama_logs/b7500_*: the nemotron_h_moe layout, one letter per block (M: Mamba, E: experts, *: attention)
NEMOTRON = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
NEMOTRON_EXPERTS = sorted("blk.%d.ffn_%s_exps.weight" % (b, k)
                          for b, c in enumerate(NEMOTRON) if c == "E" for k in ("up", "down"))
QWEN3_EXPERTS = sorted("blk.%d.ffn_%s_exps.weight" % (b, k) for b in range(48) for k in ("gate", "up", "down"))
# public/ik_llama_ot_cuda1_and_cpu.log: the routed experts of block 57 overridden to the CPU
IK_CPU = ["blk.57.ffn_gate_exps.weight", "blk.57.ffn_down_exps.weight", "blk.57.ffn_up_exps.weight"]
LV4 = DATA / "b7500_nemotron_cuda_lv4_overridden_cuda_host.log"
DEFAULT = DATA / "b7500_nemotron_cuda_default_verbosity.log"


def read(name):
    """The text of a log of tests/data/llama_logs (``public/<name>`` for a public one)."""
    return (DATA / name).read_text(encoding="utf-8")


def line(fmt, *args):
    return TS + "I " + fmt % args


def model_buf(name, mib):
    return line("%s: %12s model buffer size = %8.2f MiB", "load_tensors", name, mib)


def kv_buf(name, mib):
    return line("%s: %10s KV buffer size = %8.2f MiB", "llama_kv_cache", name, mib)


def rs_buf(name, mib):
    return line("%s: %10s RS buffer size = %8.2f MiB", "llama_memory_recurrent", name, mib)


def compute_buf(name, mib):
    return line("%s: %10s compute buffer size = %8.2f MiB", "sched_reserve", name, mib)


def offloaded(n, m):
    return line("%s: offloaded %d/%d layers to GPU", "load_tensors", n, m)


def override(tensor, buffer, mib=100, kind="q8_0"):
    return TS + "D tensor %s (%d MiB %s) buffer type overridden to %s" % (tensor, mib, kind, buffer)


def text(*lines):
    return "\n".join(lines) + "\n"


def tensors(parsed):
    """The sorted names of the overridden tensors of a parsed log."""
    return sorted(o["tensor"] for o in parsed["overridden"])


def load_lines(names, gpu_mib, marker=True, debug=True):
    """One model load: the loader's start lines (``marker``), the DEBUG layer line (``debug``), an override line per
    name, the offloaded layers, a CUDA0 model buffer of ``gpu_mib``, a KV and a compute buffer."""
    lines = [META, TENSORS] if marker else []
    lines += [LAYER] if debug else []
    lines += [override(t, "CPU", 1, "f16") for t in names]
    return lines + [offloaded(3, 3), model_buf("CUDA0", gpu_mib), kv_buf("CUDA0", 1.0), compute_buf("CUDA0", 2.0)]


BUF_CUDA0 = model_buf("CUDA0", 1369.43)
# Two GPUs at the default verbosity: every buffer line, no per-tensor line.
DEVICES_LOG = [offloaded(5, 5), BUF_CUDA0, model_buf("CUDA1", 812.5), model_buf("CPU_Mapped", 10240.0),
               kv_buf("CUDA0", 96.0), kv_buf("CUDA1", 32.0), rs_buf("CUDA0", 47.62), compute_buf("CUDA0", 300.5),
               compute_buf("CUDA_Host", 20.01), READY]

# A good load at -lv 5: one expert overridden to the CPU, the server ready.
GOOD_LOAD = [
    "0.00.089.974 I srv         start: binding port with default address family",
    "0.00.090.813 I srv    load_model: loading model 'm.gguf'",
    "0.00.120.000 D tensor blk.1.ffn_up_exps.weight (0 MiB f32) buffer type overridden to CPU",
    "0.00.120.100 I load_tensors: offloaded 6/6 layers to GPU",
    "0.00.120.200 I load_tensors:        RPC0 model buffer size =     0.75 MiB",
    "0.00.150.000 I srv  llama_server: model loaded",
    "0.00.150.100 I srv  llama_server: server is listening on http://127.0.0.1:8080",
]

# ggml/src/ggml-rpc/ggml-rpc.cpp RPC_STATUS_ASSERT: GGML_ABORT("Remote RPC server crashed or returned malformed
# response"), printed by ggml/src/ggml.c ggml_abort as "%s:%d: " and the message.
RPC_LINE = "/src/ggml/src/ggml-rpc/ggml-rpc.cpp:519: Remote RPC server crashed or returned malformed response"
RPC_WORDS = "an RPC server (rpc-server) that llama-server uses as a device died or answered garbage"

# The crash forms, each as (lines, crash, cause in plain words, whether a backtrace was printed). The formats:
# ggml/src/ggml.c ggml_abort ("%s:%d: " then the message, then ggml_print_backtrace: gdb's bt output, or glibc
# backtrace_symbols_fd lines "path(symbol+0xoff)[0xaddr]"); ggml/include/ggml.h GGML_ASSERT(x)
# (GGML_ABORT("GGML_ASSERT(%s) failed", #x)); ggml/src/ggml-cuda/ggml-cuda.cu ggml_cuda_error (GGML_CUDA_NAME
# " error: %s", CUDA, ROCm or MUSA, then GGML_ABORT(GGML_CUDA_NAME " error")); ggml/src/ggml-sycl/common.hpp
# ("SYCL error: %s: %s"); the RPC client's send failed/recv failed lines; ggml/src/ggml.cpp
# ggml_uncaught_exception and libstdc++'s "terminate called ..." and "  what():  ..."; the shell's
# "Segmentation fault (core dumped)" and the like for a signal.
SIGSEGV_WORDS = ("a segmentation fault: a bug, or a stack overflow (a very long --override-tensor pattern overflows "
                 "std::regex)")
GPU_WORDS = "the GPU backend failed (a GPU fault, a driver problem or out of GPU memory)"
ASSERT_WORDS = "an internal check of llama.cpp failed (GGML_ASSERT): a bug, or input it does not handle"
EXCEPTION_WORDS = "an uncaught C++ exception ended llama-server"
BACKTRACE_WORDS = "llama-server printed a backtrace: it aborted"
KILLED_WORDS = "it was killed, most often by the kernel's or the container's out-of-memory killer"
ILLEGAL_WORDS = ("an instruction this CPU does not have: the CPU backend was built for a newer CPU (use a build with "
                 "runtime CPU detection, or build for this CPU)")
RPC_ABORT = [
    "/home/runner/work/llama.cpp/llama.cpp/ggml/src/ggml-rpc/ggml-rpc.cpp:519: Remote RPC server crashed or "
    "returned malformed response",
    "/app/libggml-base.so(+0x16bcb)[0x7f5c6e2b0bcb]",
    "/app/libggml-base.so(ggml_print_backtrace+0x21f)[0x7f5c6e2b100f]",
    "/app/libggml-base.so(ggml_abort+0x152)[0x7f5c6e2b11e2]",
    "/app/libggml-rpc.so(+0x7c1a)[0x7f5c6e1d5c1a]",
    "/app/llama-server(+0x9e3a1)[0x55d6b2e3f3a1]",
]
_WAIT4 = "#0  0x00007f8d3c0ea42f in __GI___wait4 (pid=1235) at ../sysdeps/unix/sysv/linux/wait4.c:30"
_ASSERT = "/src/llama.cpp/ggml/src/ggml-cpu/ops.cpp:4321: GGML_ASSERT(ne00 % 32 == 0) failed"
_RPC_509 = "ggml-rpc.cpp:509: Remote RPC server crashed or returned malformed response"
_CUDA = "CUDA error: an illegal memory access was encountered"
_RUNTIME_ERROR = "terminate called after throwing an instance of 'std::runtime_error'"
_ABORT_WORDS = "llama-server aborted (GGML_ABORT)"


def alone(line, cause, backtrace=False, crash=None):
    """A crash form of one line, which is the crash (``crash``: the line as it is reported, when it differs)."""
    return [line], crash or line, cause, backtrace


CRASHES = [
    alone("0.00.500.000 E CUDA error: out of memory", GPU_WORDS, crash="CUDA error: out of memory"),
    alone("0.00.500.000 E ROCm error: invalid device function", GPU_WORDS, crash="ROCm error: invalid device function"),
    alone("0.00.500.000 E MUSA error: out of memory", GPU_WORDS, crash="MUSA error: out of memory"),
    alone("SYCL error: CHECK_TRY_ERROR(stream->wait()): Exception caught in this line of code.", GPU_WORDS),
    (["E " + _CUDA, "E   current device: 0, in function ggml_backend_cuda_synchronize at ggml-cuda.cu:2628",
      "/src/ggml/src/ggml-cuda/ggml-cuda.cu:88: CUDA error"], _CUDA, GPU_WORDS, False),
    # the abort of ggml_cuda_error alone (its "CUDA error: ..." line lost): the message holds no "error: "
    alone("/src/ggml/src/ggml-cuda/ggml-cuda.cu:88: CUDA error", _ABORT_WORDS),
    alone("0.01.000.000 E CUDA error: out of memory  ", GPU_WORDS, crash="CUDA error: out of memory"),
    alone("terminate called after throwing an instance of 'std::bad_alloc'", EXCEPTION_WORDS),
    alone("terminate called without an active exception", EXCEPTION_WORDS),
    ([_RUNTIME_ERROR, "  what():  tensor 'blk.0.attn_q.weight' has wrong shape"], _RUNTIME_ERROR,
     EXCEPTION_WORDS + ": tensor 'blk.0.attn_q.weight' has wrong shape", False),
    alone("/src/ggml/src/ggml.c:1715: GGML_ASSERT(ggml_can_mul_mat(a, b)) failed", ASSERT_WORDS),
    ([_ASSERT, "[New LWP 1234]", "[Thread debugging using libthread_db enabled]",
      "0x00007f8d3c0ea42f in __GI___wait4 (pid=1235, stat_loc=0x0, options=0, usage=0x0) at wait4.c:30",
      _WAIT4, "#1  0x00007f8d3c5a1b6b in ggml_print_backtrace () from /app/libggml-base.so",
      "[Inferior 1 (process 1) detached]"], _ASSERT, ASSERT_WORDS, True),
    alone("/app/ggml/src/ggml.c:1651: fatal error", _ABORT_WORDS),
    alone(RPC_LINE, RPC_WORDS),
    (RPC_ABORT, RPC_ABORT[0], RPC_WORDS, True),
    (["E send failed (bytes_sent=0, size_to_send=8)", _RPC_509], _RPC_509, RPC_WORDS, False),
    alone(_WAIT4, BACKTRACE_WORDS, True),
    alone("#0  0x00007fd6e02f0c7a in __GI___wait4 (pid=8930, stat_loc=0x0, options=0, usage=0x0) at "
          "../sysdeps/unix/sysv/linux/wait4.c:30", BACKTRACE_WORDS, True),
    alone(RPC_ABORT[3], BACKTRACE_WORDS, True),
    alone("/opt/llama.cpp/libggml-base.so(ggml_print_backtrace+0x1f)[0x7fd6e0616a8b]", BACKTRACE_WORDS, True),
    alone("[Inferior 1 (process 8927) detached]", BACKTRACE_WORDS, True),
    alone("Segmentation fault (core dumped)", SIGSEGV_WORDS),
    alone("Segmentation fault (core dumped) \t", SIGSEGV_WORDS, crash="Segmentation fault (core dumped)"),
    alone("Aborted (core dumped)",
          "llama-server aborted itself (GGML_ABORT, a failed GGML_ASSERT or an uncaught C++ exception)"),
    alone("Illegal instruction (core dumped)", ILLEGAL_WORDS),
    alone("Bus error (core dumped)", "a memory-mapped file went away or was truncated while in use (the model file?)"),
    alone("Floating point exception (core dumped)", "an arithmetic error (division by zero)"),
    alone("Killed", KILLED_WORDS),
    alone("Killed   ", KILLED_WORDS, crash="Killed"),
]

# Exit codes of a process killed by a signal (128 + N as a shell or podman reports it, -N as Python's subprocess),
# the signal's name and words of its cause.
SIGNAL_EXITS = [
    (132, "SIGILL", "instruction this CPU does not have"), (134, "SIGABRT", "aborted itself"),
    (139, "SIGSEGV", "segmentation fault"), (137, "SIGKILL", "out-of-memory killer"), (-11, "SIGSEGV", "stack"),
    (135, "SIGBUS", "memory-mapped"), (136, "SIGFPE", "arithmetic"),
]
