# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parse a llama-server log: the build, the runs and loads, the overridden tensors, the buffers, errors and crashes.

Standard library only (runs on target hosts, Python >= 3.9).

The parser reads the log of every llama.cpp era (``llm_load_tensors:``/``load_tensors:``, the KV prefixes
``llama_kv_cache_init:``, ``init:``, ``llama_kv_cache_unified:``, ``llama_kv_cache:``, ``overriden``/``overridden``
with or without size, ik_llama.cpp's ``Tensor ... overriden`` line, the ``0.00.011.842 D `` prefix, the ``srv  ``
component tag). The printf formats are those of llama.cpp's src/llama-model-loader.cpp (``create_tensor``: the
override line), src/llama-model.cpp (``load_tensors``: model buffers, offloaded layers), src/llama-kv-cache.cpp,
src/llama-memory-recurrent.cpp and src/llama-context.cpp (KV, RS and compute buffers). ``_placement_proof``
decides from the result whether a placement is proven.

Two things in a log repeat and only the last one counts:

* a *run*: the logs of a restarted container hold one run per start. A run starts at the build line
  (``build: 4500 (abc1234) ...`` or ``common_params_print_info: build 1 (7e4c0a9) ...``), the
  ``verbosity = N`` line or the server's ``loading model '...'`` line;
* a *load*: ``-fit on`` loads the model once with dummy buffers (a dry run) and then for real, so the whole
  load block is printed twice. A load starts at ``llama_model_loader: loaded meta data`` or
  ``load_tensors: loading model tensors``; when those INFO lines are hidden, a line that belongs to an earlier
  phase of a load (an override line after a buffer line, a model buffer after a KV/compute buffer) starts one too.

It streams: the log is read in chunks of whole lines (``_log_chunks.iter_chunks``), what it keeps is bounded
(``MAX_OVERRIDES`` override lines per load, ``MAX_BUFFER_NAMES`` names per buffer table, messages of ``MAX_MESSAGE``
characters), and every regular expression runs in time linear in the line, so a log of any size is parsed in
linear time and bounded memory. Only the lines that hold one of ``_KEYWORDS`` (found with ``str.find`` over a whole
chunk) are parsed one by one: the per-token lines of a debug log cost next to nothing. The crash lines and what they
mean are in ``_llama_crash``, the stages of a start in ``_llama_stages``.
"""
from __future__ import annotations

import re
import subprocess
from collections import deque
from dataclasses import dataclass, field
from typing import Optional

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import shorten
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_crash import (
    ABORT,
    ABORT_HINT,
    BACKTRACE,
    GPU_ERROR,
    SHELL_SIGNALS,
    SIGNALS,
    crash_cause,
    signal_of_exit_code,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_devices import USING_DEVICE, parse_using_device
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._log_chunks import iter_chunks
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._log_prefixes import strip_prefixes as _strip

__all__ = [
    "LogParser",
    "parse_log",
    "parse_runs",
    "parse_command_log",
]

MAX_OVERRIDES = 65536   # override lines kept per load (more tensors than any model llama.cpp loads)
MAX_BUFFER_NAMES = 64   # distinct buffer names kept per table
MAX_MESSAGE = 512       # characters kept of an error message
_MESSAGE_WIDTH = MAX_MESSAGE + len("...")  # a longer message: its first MAX_MESSAGE characters and "..."

# Numbers are bounded in length: int() of thousands of digits raises (and a number that long is no number).
_BUILD = [
    # b10434: "common_params_print_info: build 1 (7e4c0a9) with GNU 11.4.0 for Linux x86_64"
    # older:  "build: 4500 (abc1234) with cc (GCC) for x86_64-linux-gnu" / "main: build = 4500 (abc1234)"
    re.compile(r"(?:^|\s)build(?::| =)? (?P<num>\d{1,9}) \((?P<commit>[0-9a-fA-F]{1,40})\)").search,
    # `llama-server --version`: "version: 4500 (abc1234)" and "version: 0.1.0-dev (build 1, commit 7e4c0a9)"
    re.compile(r"version: (?P<num>\d{1,9}) \((?P<commit>[0-9a-fA-F]{1,40})\)").match,
    re.compile(r"version: \S{1,64} \(build (?P<num>\d{1,9}), commit (?P<commit>[0-9a-fA-F]{1,40})\)").match,
    # /props build_info style "b4500-abc1234" printed as "build_info: b4500-abc1234"
    re.compile(r"build_info\W{1,8}b(?P<num>\d{1,9})-(?P<commit>[0-9a-fA-F]{1,40})").search,
]
# the 2024 server (and ik_llama.cpp): 'INFO [main] build info | tid="1" timestamp=1 build=3642 commit="a1b2c3d"'
_BUILD_INFO = re.compile(r"\bbuild=(?P<num>\d{1,9}) commit=\"?(?P<commit>[0-9a-fA-F]{1,40})")
_VERBOSITY = re.compile(r"verbosity = \d{1,10} \(adjust")  # (-v sets INT_MAX: common/arg.cpp)
_RUN_START_AT = ("main: build = ", "system_info: ")
_LOAD_START_AT = ("llama_model_loader: loaded meta data with", "load_tensors: loading model tensors",
                  "llm_load_tensors: loading model tensors")
# DEBUG lines the loader prints in the same function, at the same level, as the override lines.
_DEBUG_MARKER = re.compile(r"(?:(?:llm_)?load_tensors: +layer +\d+ assigned to device|create_tensor: loading tensor)")
# "tensor blk.1.ffn_up_exps.weight (0 MiB f32) buffer type overridden to CPU"
# "tensor blk.1.ffn_up_exps.weight buffer type overriden to CPU"            (before PR #13364)
# "Tensor blk.1.ffn_up_exps.weight buffer type overriden to CPU"            (ik_llama.cpp, INFO)
# "Tensor blk.4.ffn_down_exps.weight (size = 136.00 MiB) buffer type overriden to CPU"   (ik_llama.cpp, 2025-26)
# The buffer can be "CUDA1", "CUDA_Host", "ROCm_Host", "RPC[127.0.0.1:50053]"... A pasted or unflushed log can hold
# several of them on one line ("... overriden to CPUTensor blk.33..."): every match of a line counts.
_OVERRIDE = re.compile(
    r"[Tt]ensor (?P<tensor>\S+)"
    r"(?: \((?:(?P<mib>\d{1,12}) MiB (?P<type>\w+)|size = (?P<fmib>\d{1,12}(?:\.\d{1,6})?) MiB)\))?"
    r" buffer type overrid+en to (?P<buffer>\w+?(?:\[[^\]\s]*\])?)(?=[Tt]ensor |\s|$)"
)
_OFFLOADED = re.compile(r"offloaded (?P<n>\d{1,9})/(?P<m>\d{1,9}) layers to GPU")
_NUMBER = r"(?P<mib>\d{1,15}(?:\.\d{1,6})?) MiB"
_MODEL_BUF = re.compile(r"(?:llm_)?load_tensors: +(?P<buf>\S+) +(?:model )?buffer size *= *" + _NUMBER)
_KV_BUF = re.compile(r"[\w.]+: +(?P<buf>\S+) +KV buffer size *= *" + _NUMBER)
_RS_BUF = re.compile(r"[\w.]+: +(?P<buf>\S+) +RS buffer size *= *" + _NUMBER)
# (the vision projector's clip graph prints "reserve_compute_meta:"/"alloc_compute_meta:" compute lines of its own)
_COMPUTE_BUF = re.compile(r"(?!(?:reserve|alloc)_compute_meta:)[\w.]+: +(?P<buf>\S+) +compute buffer size *= *"
                          + _NUMBER)
_MMAP_WARN = "tensor overrides to CPU are used with mmap enabled"
# Load errors, most specific first: (phrase that starts the message, kept from there; whether the phrase itself is
# dropped). The message ends at the end of the line, or at a quote for the 2024 server's JSON lines
# ('..."msg":"unable to load model","tid":...').
_LOAD_ERRORS = (
    # (phrase, the phrase is dropped from the message, the message ends at a double quote)
    ("error loading model: ", True, False),
    # the context (KV cache, compute buffers) could not be created: "failed to allocate compute pp buffers"
    ("failed to initialize the context: ", False, False),
    ("failed to create context with model", False, False),
    ("unable to load model", False, True),
    ("failed to load model", False, True),
    # a bad argument ends the server before any load: 'error while handling argument "-ot": unknown buffer type'
    ("error while handling argument", False, False),
    ("exiting due to model loading error", False, False),
)
_LOAD_ERROR_RANK = {phrase: rank for rank, (phrase, _drop, _json) in enumerate(_LOAD_ERRORS)}
_LOAD_ERROR_RANK["failed to load model"] = _LOAD_ERROR_RANK["unable to load model"]
# Allocation failures: not fatal by themselves (llama.cpp retries a compute buffer without pipeline parallelism),
# but the reason behind a load error that follows them.
# (the message starts at the group "msg"; the first and third run to the end of the line, the others are the match)
_ALLOC_FAILURES = (
    (re.compile(r"(?P<msg>allocating [0-9.]{1,24} MiB on device \d{1,4}: \w+ failed: )"), True),
    (re.compile(r"(?P<msg>failed to allocate \S+ buffer of size \d{1,24})"), False),
    (re.compile(r"ggml_vulkan: (?P<msg>Device memory allocation of size \d{1,24} failed|Requested buffer size "
                r"exceeds)"), True),
    (re.compile(r"(?P<msg>unable to allocate \S+ buffer)"), False),
)
# (b10435: "llama_server: model loaded", "llama_server: listening on http://..."; older: "main: server is listening
# on http://..."; the older "HTTP server is listening, hostname: ..." comes before the load and proves nothing)
_READY = ("model loaded", "listening on http", "all slots are idle")
# Every line that a handler of LogParser.feed reads holds one of these (or matches ABORT_HINT): the build and
# run-start lines, the loader's lines ("model", "tensor"), buffers, allocation failures, ready lines, load errors
# ("model", "context", "argument") and every crash form. Other lines are skipped unread.
_KEYWORDS = ("build", "version: ", "verbosity = ", "system_info: ", "model", "tensor", "buffer", "alloc",
             "listening on ", "slots are idle", "context", "argument", "error", "terminate called", "what():",
             "GGML_", "fault", "Abort", "Illegal", "Killed", "exception", "0x", "[Inferior", USING_DEVICE)

# Phases of one load, in the order llama.cpp prints them.
_PH_NONE, _PH_TENSORS, _PH_MODEL_BUF, _PH_CONTEXT = 0, 1, 2, 3


@dataclass
class _Load:
    """What one model load printed."""

    overridden: list = field(default_factory=list)
    overridden_dropped: int = 0
    model_buffers: dict = field(default_factory=dict)
    kv_buffers: dict = field(default_factory=dict)
    rs_buffers: dict = field(default_factory=dict)
    compute_buffers: dict = field(default_factory=dict)
    offloaded: Optional[dict] = None
    mmap_warning: bool = False
    debug_marker: bool = False
    phase: int = _PH_NONE
    has_content: bool = False


@dataclass
class _Run:
    """What one server run printed (the last load only, and the run's errors)."""

    build: Optional[str] = None
    build_number: Optional[int] = None
    debug_visible: bool = False     # a DEBUG-level line was seen in this run
    load_errors: dict = field(default_factory=dict)  # rank -> the last message of that rank
    alloc_failures: list = field(default_factory=list)  # of the current load (the reason of a load error)
    crash: Optional[str] = None     # the first fatal error of the run
    crash_cause: Optional[str] = None
    backtrace: bool = False
    terminate_pending: bool = False  # "terminate called ..." seen: the next "what():" line says why
    ready: bool = False             # the run shows the server loaded and serving
    loads: int = 0                  # loads seen in this run
    load: _Load = field(default_factory=_Load)
    devices: dict = field(default_factory=dict)  # device name -> its last "using device" line (_llama_devices)

    def has_content(self):
        return self.load.has_content or bool(self.load_errors) or self.loads > 0 or self.crash is not None


# (line, phase, _Load attribute, summed): model/KV/RS lines of one buffer add up (CPU_Mapped is printed once per
# shard, an iSWA cache prints two KV lines); compute lines are one per backend and reserve: the last one counts.
_BUFFER_LINES = (
    (_MODEL_BUF, _PH_MODEL_BUF, "model_buffers", True),
    (_KV_BUF, _PH_CONTEXT, "kv_buffers", True),
    (_RS_BUF, _PH_CONTEXT, "rs_buffers", True),
    (_COMPUTE_BUF, _PH_CONTEXT, "compute_buffers", False),
)


class LogParser:
    """Feed it lines (``feed``), then ask for the result (``result``): see ``parse_log``."""

    def __init__(self):
        self.runs = 0
        self.run = _Run()
        self.seen_text = False
        self.last_line = ""   # the last line that is not blank (an exit code's crash names it)

    # -- runs and loads

    def new_run(self):
        self.runs += 1
        self.run = _Run()

    def new_load(self):
        run = self.run
        run.loads += 1
        run.load = _Load()
        # an error of an earlier (dry-run) load does not describe this one
        run.load_errors = {}
        run.alloc_failures = []

    def enter_phase(self, phase):
        """Start a new load when a line belongs to an earlier phase than what was already seen."""
        run = self.run
        if run.loads == 0 or run.load.phase > phase:
            self.new_load()
        load = run.load
        load.phase = max(load.phase, phase)
        load.has_content = True

    # -- one line

    def feed(self, raw):
        lvl, msg = _strip(raw)
        if not msg:
            return
        self.seen_text = True
        self.last_line = raw
        if self._build(msg) or self._run_start(msg):
            return
        run = self.run
        if lvl == "D":
            run.debug_visible = True
        if USING_DEVICE in msg:
            device = parse_using_device(msg)
            if device is not None:
                if len(run.devices) < MAX_BUFFER_NAMES or device["device"] in run.devices:
                    run.devices[device["device"]] = device
                return
        if run.terminate_pending:
            run.terminate_pending = False
            if msg.startswith("what():"):
                run.crash_cause = shorten(f"an uncaught C++ exception ended llama-server: {msg[7:].strip()}",
                                          _MESSAGE_WIDTH)
                return
        if msg.startswith(_LOAD_START_AT):
            if run.load.has_content or run.loads == 0:
                self.new_load()
            return
        if "load_tensors" in msg or "create_tensor" in msg:
            m = _DEBUG_MARKER.match(msg)
            if m:
                if msg.startswith(("load_tensors", "llm_load_tensors")):
                    self.enter_phase(_PH_TENSORS)
                run.load.debug_marker = True
                return
        if "overrid" in msg and self._overrides(msg):
            return
        if _MMAP_WARN in msg:
            self.enter_phase(_PH_TENSORS)
            run.load.mmap_warning = True
            return
        if "offloaded " in msg:
            m = _OFFLOADED.search(msg)
            if m:
                self.enter_phase(_PH_MODEL_BUF)
                run.load.offloaded = {"offloaded": int(m.group("n")), "total": int(m.group("m"))}
                return
        if "buffer size" in msg and self._buffer(msg):
            return
        if any(text in msg for text in _READY):
            run.ready = True
            return
        if self._load_error(msg):
            return
        if self._alloc_failure(msg):
            return
        self._crash(msg)

    def feed_chunk(self, chunk):
        """Feed a piece of log made of whole lines: only the lines that hold a keyword are parsed one by one.

        The same result as ``feed`` on every line: the other lines can only show a DEBUG level (looked for between
        the parsed lines while the run has not shown one) and be the last line of the log.
        """
        find = chunk.find
        starts = set()
        for keyword in _KEYWORDS:
            i = find(keyword)
            while i >= 0:
                starts.add(chunk.rfind("\n", 0, i) + 1)
                end = find("\n", i)
                if end < 0:
                    break
                i = find(keyword, end + 1)
        m = ABORT_HINT.search(chunk)
        while m:
            starts.add(chunk.rfind("\n", 0, m.start()) + 1)
            end = find("\n", m.end())
            m = ABORT_HINT.search(chunk, end + 1) if end >= 0 else None
        previous = 0
        for start in sorted(starts):
            if not self.run.debug_visible and start > previous:
                self._debug_between(chunk, previous, start)
            end = find("\n", start)
            end = len(chunk) if end < 0 else end
            self.feed(chunk[start:end])
            previous = end + 1
        if not self.run.debug_visible and previous < len(chunk):
            self._debug_between(chunk, previous, len(chunk))
        end = len(chunk)
        while end > 0:
            start = chunk.rfind("\n", 0, end - 1) + 1
            line = chunk[start:end].strip()
            if line:
                self.last_line = line
                self.seen_text = True
                break
            end = start

    def _debug_between(self, chunk, lo, hi):
        """Whether a line of ``chunk[lo:hi]`` (whole lines of the current run) is at DEBUG level."""
        i = chunk.find("D ", lo, hi)
        while i >= 0:
            # (after a space, a newline, a "|" or the "m" that ends a colour escape of --log-colors)
            if i == lo or chunk[i - 1] in " \n|m":
                start = chunk.rfind("\n", 0, i) + 1
                end = chunk.find("\n", i, hi)
                end = hi if end < 0 else end
                if _strip(chunk[start:end])[0] == "D":
                    self.run.debug_visible = True
                    return
                i = chunk.find("D ", end, hi)
            else:
                i = chunk.find("D ", i + 2, hi)

    def _build(self, msg):
        build = None
        if "build" in msg or msg.startswith("version: "):
            for find in _BUILD:
                m = find(msg)
                if m:
                    build = (int(m.group("num")), m.group("commit"))
                    break
            if build is None and "build info" in msg:
                m = _BUILD_INFO.search(msg)
                if m:
                    build = (int(m.group("num")), m.group("commit"))
        if build is None:
            return False
        if self.runs == 0 or self.run.has_content():
            self.new_run()
        self.run.build_number, self.run.build = build[0], "b%d-%s" % build
        return True

    def _run_start(self, msg):
        if not (msg.startswith(_RUN_START_AT) or "load_model: loading model '" in msg
                or ("verbosity = " in msg and _VERBOSITY.search(msg))):
            return False
        if self.runs == 0 or self.run.has_content():
            self.new_run()   # (a run whose build line is hidden keeps build None, not the previous run's)
        return True

    def _overrides(self, msg):
        found = False
        load = None
        for m in _OVERRIDE.finditer(msg):
            if not found:
                self.enter_phase(_PH_TENSORS)
                load = self.run.load
                found = True
            if len(load.overridden) >= MAX_OVERRIDES:
                load.overridden_dropped += 1
                continue
            mib = m.group("mib") if m.group("mib") is not None else m.group("fmib")
            load.overridden.append({
                "tensor": m.group("tensor"),
                # integer-truncated like llama.cpp's %zu; ik_llama.cpp prints "size = 136.00 MiB"
                "mib": int(float(mib)) if mib is not None else None,
                "type": m.group("type"),
                "buffer": m.group("buffer"),
            })
        return found

    def _buffer(self, msg):
        for rx, phase, table, summed in _BUFFER_LINES:
            m = rx.match(msg)
            if m:
                self.enter_phase(phase)
                buffers = getattr(self.run.load, table)
                name = m.group("buf")
                if name not in buffers and len(buffers) >= MAX_BUFFER_NAMES:
                    return True
                mib = float(m.group("mib")) + (buffers.get(name, 0.0) if summed else 0.0)
                buffers[name] = round(mib, 2)
                return True
        return False

    def _load_error(self, msg):
        if "fit params" in msg:
            return False
        for phrase, drop, json in _LOAD_ERRORS:
            at = msg.find(phrase)
            if at < 0:
                continue
            text = msg[at + len(phrase):] if drop else msg[at:]
            quote = text.find('"') if json else -1
            if quote >= 0:
                # the 2024 server: JSON ('"msg":"unable to load model",...') or text ('... | tid="140" ...')
                text = text[:quote].split(" | ", 1)[0]
            self.run.load_errors[_LOAD_ERROR_RANK[phrase]] = shorten(text.strip(), _MESSAGE_WIDTH)
            return True
        return False

    def _alloc_failure(self, msg):
        if "alloc" not in msg and "Requested buffer size" not in msg:
            return False
        for rx, whole in _ALLOC_FAILURES:
            m = rx.search(msg)
            if m:
                failures = self.run.alloc_failures
                if len(failures) < 8:
                    text = msg[m.start("msg"):].strip() if whole else m.group("msg")
                    failures.append(shorten(text, _MESSAGE_WIDTH))
                return True
        return False

    def _crash(self, msg):
        run = self.run
        message = None   # the part of the line that says what happened (after "file:line: " for an abort)
        gpu = GPU_ERROR.search(msg) if "error: " in msg else None
        abort = ABORT.match(msg) if ABORT_HINT.search(msg) else None
        if msg.startswith("terminate called"):
            message = msg
            run.terminate_pending = True
        elif gpu:
            msg = message = msg[gpu.start():]
        elif abort:
            message = msg[abort.start("msg"):]
        elif "GGML_ASSERT(" in msg:
            msg = message = msg[msg.find("GGML_ASSERT("):]
        elif msg.startswith(tuple(text for text, _number in SHELL_SIGNALS)) or msg == "Killed":
            message = msg
        elif ("0x" in msg and BACKTRACE.match(msg)) or msg.startswith("[Inferior 1 (process"):
            run.backtrace = True
            if run.crash is None:
                run.crash = shorten(msg, _MESSAGE_WIDTH)
                run.crash_cause = "llama-server printed a backtrace: it aborted"
            return
        if message is not None and run.crash is None:
            run.crash = shorten(msg, _MESSAGE_WIDTH)
            run.crash_cause = crash_cause(message)

    # -- the result

    def result(self, exit_code=None):
        run = self.run
        load = run.load
        load_error = None
        if run.load_errors:
            # the most specific kind of message, the last of that kind
            load_error = run.load_errors[min(run.load_errors)]
            # with the allocation that failed, when the message does not already say it
            details = [a for a in run.alloc_failures if a not in load_error]
            if details:
                load_error = f"{load_error} ({details[0]})"
        crash, cause = run.crash, run.crash_cause
        signal = signal_of_exit_code(exit_code)
        if signal in SIGNALS:
            name, meaning = SIGNALS[signal]
            if crash is None:
                last = _strip(self.last_line)[1] if self.last_line else ""
                after = f" after the line: {shorten(last, _MESSAGE_WIDTH)}" if last else ""
                crash, cause = f"exit code {exit_code} ({name}){after}", meaning
            elif name not in (cause or ""):
                cause = f"{cause} ({name}, exit code {exit_code})"
        failure = None
        if crash:
            failure = f"llama-server died: {crash} ({cause})" if cause else f"llama-server died: {crash}"
        elif load_error:
            failure = f"the model failed to load: {load_error}"
        elif exit_code is not None and not run.ready:
            failure = f"llama-server exited with code {exit_code} before it was ready"
        visible = bool(load.overridden) or load.debug_marker or run.debug_visible
        return {
            "build": run.build,
            "build_number": run.build_number,
            "overridden": load.overridden,
            "overridden_dropped": load.overridden_dropped,
            "model_buffers": load.model_buffers,
            "kv_buffers": load.kv_buffers,
            "rs_buffers": load.rs_buffers,
            "compute_buffers": load.compute_buffers,
            "offloaded_layers": load.offloaded,
            "mmap_override_warning": load.mmap_warning,
            "load_error": load_error,
            "crash": crash,
            "crash_cause": cause,
            "backtrace": run.backtrace,
            "exit_code": exit_code,
            "failure": failure,
            "server_ready": run.ready,
            "per_tensor_lines_visible": visible,
            "runs": max(self.runs, 1) if self.seen_text else 0,
            "loads": run.loads,
            "devices": list(run.devices.values()),
        }


def parse_log(source, exit_code=None):
    """Parse a llama-server log (stderr, ``podman logs`` or a ``--log-file``), streaming.

    ``source``: the text, bytes, a file object or an iterable of lines (see ``iter_chunks``). ``exit_code``: how the
    process ended when it is known (a container's ``State.ExitCode``); 128 + a signal number (or -N) is a crash.

    Returns a dict with ``build`` (``"b<number>-<commit>"`` or None), ``build_number`` (int or None),
    ``overridden`` (list of ``{tensor, mib, type, buffer}``; ``mib``/``type`` None in the old format),
    ``overridden_dropped`` (override lines past ``MAX_OVERRIDES``, not kept), ``model_buffers``, ``kv_buffers``,
    ``rs_buffers``, ``compute_buffers`` (buffer name -> MiB; model, KV and RS lines of the same buffer are summed:
    ``CPU_Mapped`` is printed once per shard), ``offloaded_layers`` (``{offloaded, total}`` or None),
    ``mmap_override_warning``, ``load_error`` (message or None; with the allocation that failed when the log names
    one), ``crash`` (the first fatal error of the last run, during or after the load: ``CUDA error: ...``,
    ``ggml-rpc.cpp:519: Remote RPC server crashed ...``, ``GGML_ASSERT(...) failed``, ``terminate called ...``, a
    backtrace, ``Segmentation fault``, or ``exit code 139 (SIGSEGV) ...``; or None), ``crash_cause`` (in plain
    words), ``backtrace`` (a backtrace was printed), ``exit_code`` (as given), ``failure`` (one line: why the run
    failed, or None), ``server_ready`` (the last run shows the server loaded and serving), ``per_tensor_lines_visible``,
    ``runs`` and ``loads`` (how many of each the text held; only the last load of the last run is reported),
    ``devices`` (the last run's ``using device`` lines in order: ``{device, description, id, pci_bus_id,
    free_mib}``, see ``_llama_devices.parse_using_device``).
    """
    parser = LogParser()
    for chunk in iter_chunks(source):
        parser.feed_chunk(chunk)
    return parser.result(exit_code)


def parse_runs(lines, exit_code=None):
    """``parse_log`` of ``lines`` (a list of log lines) in one pass, with the indexes of the lines that start a run
    of llama-server as it counts its runs (the lines before the first index belong to a run whose start is not
    among them): ``(result, starts)``."""
    parser = LogParser()
    starts = []
    for index, line in enumerate(lines):
        runs = parser.runs
        for chunk in iter_chunks(line + "\n"):
            parser.feed_chunk(chunk)
        if parser.runs != runs:
            starts.append(index)
    return parser.result(exit_code), starts


def parse_command_log(argv, exit_code=None, keep=5):
    """Run ``argv`` (``podman logs NAME``) and parse its stdout and stderr, merged in one stream, as it comes.

    Returns ``(parsed, return code, the last keep lines)``: the lines say why, when the command failed. Memory
    stays bounded whatever the size of the log; bytes that are not UTF-8 are replaced.
    """
    parser = LogParser()
    tail = deque(maxlen=keep)
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,  # pylint: disable=consider-using-with
                            stderr=subprocess.STDOUT)
    try:
        for chunk in iter_chunks(proc.stdout):
            parser.feed_chunk(chunk)
            lines = chunk[-keep * MAX_MESSAGE:].splitlines()
            tail.extend([shorten(line, _MESSAGE_WIDTH) for line in lines if line.strip()][-keep:])
    finally:
        proc.stdout.close()
        rc = proc.wait()
    return parser.result(exit_code), rc, list(tail)
