# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a crash of llama-server looks like in its log, and what it means in plain words.

Standard library only (runs on target hosts, Python >= 3.9).

ggml/src/ggml.c ``ggml_abort`` prints ``<file>:<line>: <message>`` (``GGML_ABORT``; ``GGML_ASSERT(x)``
prints ``GGML_ASSERT(x) failed`` as its message) and then ``ggml_print_backtrace`` (gdb's ``#0  0x... in ...``
frames, or glibc ``backtrace_symbols_fd`` lines ``lib.so(symbol+0x1f)[0x7f...]``); an uncaught C++ exception
prints ``terminate called after throwing an instance of '...'`` and ``  what():  ...``; the backends print
``CUDA error: ...``. An exit code given with the log (``exit_code``) of 128 + a signal number, as a container
runtime or shell reports a process killed by SIGILL (132), SIGABRT (134) or SIGSEGV (139), is a crash too.
``_llama_log`` finds these lines in a log.
"""
from __future__ import annotations

import re

# Fatal errors of the running server (during or after the load): the process is gone.
# ggml/src/ggml.c ggml_abort: "%s:%d: " (file, line) and the message; the file is a source file of ggml or llama.cpp.
ABORT_HINT = re.compile(r"\.(?:c|cc|cpp|cxx|cu|cuh|h|hpp|m|mm|metal|comp):\d")
ABORT = re.compile(r"(?P<where>[^\s:]{0,400}\.(?:c|cc|cpp|cxx|cu|cuh|h|hpp|m|mm|metal|comp):\d{1,7}): (?P<msg>\S)")
GPU_ERROR = re.compile(r"\b(?:CUDA|ROCm|MUSA|HIP|SYCL) error: ")
# ggml_print_backtrace: gdb's frames and glibc backtrace_symbols_fd lines.
BACKTRACE = re.compile(r"(?:#\d{1,4} +0x[0-9a-fA-F]{1,16} in |[^\s()]{1,400}\([\w.]{0,400}\+0x[0-9a-fA-F]{1,16}\) ?"
                       r"\[0x[0-9a-fA-F]{1,16}\]$)")
SHELL_SIGNALS = (("Illegal instruction", 4), ("Aborted", 6), ("Segmentation fault", 11), ("Bus error", 7),
                 ("Floating point exception", 8))

# Signals by number (Linux x86-64/arm64 numbering) and what they mean for llama-server, in plain words.
SIGNALS = {
    4: ("SIGILL", "an instruction this CPU does not have: the CPU backend was built for a newer CPU "
                  "(use a build with runtime CPU detection, or build for this CPU)"),
    6: ("SIGABRT", "llama-server aborted itself (GGML_ABORT, a failed GGML_ASSERT or an uncaught C++ exception)"),
    7: ("SIGBUS", "a memory-mapped file went away or was truncated while in use (the model file?)"),
    8: ("SIGFPE", "an arithmetic error (division by zero)"),
    9: ("SIGKILL", "it was killed, most often by the kernel's or the container's out-of-memory killer"),
    11: ("SIGSEGV", "a segmentation fault: a bug, or a stack overflow (a very long --override-tensor pattern "
         "overflows std::regex)"),
}


def signal_of_exit_code(exit_code):
    """The signal number behind an exit code: 128 + N as shells and container runtimes report it, or -N as
    Python's ``subprocess`` does; ``None`` for a normal exit code (or ``None``)."""
    if exit_code is None:
        return None
    if exit_code < 0:
        return -exit_code
    if 128 < exit_code < 160:
        return exit_code - 128
    return None


def crash_cause(message):
    """A plain cause for a crash line."""
    if "GGML_ASSERT(" in message:
        return "an internal check of llama.cpp failed (GGML_ASSERT): a bug, or input it does not handle"
    if "Remote RPC server crashed or returned malformed response" in message:
        return "an RPC server (rpc-server) that llama-server uses as a device died or answered garbage"
    if GPU_ERROR.search(message):
        return "the GPU backend failed (a GPU fault, a driver problem or out of GPU memory)"
    if message.startswith("terminate called"):
        return "an uncaught C++ exception ended llama-server"
    for text, number in SHELL_SIGNALS:
        if message.startswith(text):
            return SIGNALS[number][1]
    if message == "Killed":
        return SIGNALS[9][1]
    return "llama-server aborted (GGML_ABORT)"
