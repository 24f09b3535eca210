# -*- coding: utf-8 -*-
# Copyright (c) ai_llm.moe_offload contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parse a llama-server log and verify where the tensors were placed.

Standard library only (runs on target hosts, Python >= 3.9).

The parser reads the log of every llama.cpp era described in the collection's reference
(``llm_load_tensors:``/``load_tensors:``, the KV prefixes ``llama_kv_cache_init:``, ``init:``,
``llama_kv_cache_unified:``, ``llama_kv_cache:``, ``overriden``/``overridden`` with or without size,
ik_llama.cpp's ``Tensor ... overriden`` line, the ``0.00.011.842 D `` prefix, the ``srv  `` component tag).

Two things in a log repeat and only the last one counts:

* a *run*: the logs of a restarted container hold one run per start. A run starts at the build line
  (``build: 4500 (abc1234) ...`` or ``common_params_print_info: build 1 (7e4c0a9) ...``), the
  ``verbosity = N`` line or the server's ``loading model '...'`` line;
* a *load*: ``-fit on`` loads the model once with dummy buffers (a dry run) and then for real, so the whole
  load block is printed twice. A load starts at ``llama_model_loader: loaded meta data`` or
  ``load_tensors: loading model tensors``; when those INFO lines are hidden, a line that belongs to an earlier
  phase of a load (an override line after a buffer line, a model buffer after a KV/compute buffer) starts one too.
"""
from __future__ import annotations

import re

__all__ = [
    "parse_log",
    "is_device_buffer",
    "gpu_model_mib",
    "verify_placement",
    "expected_from_pattern",
]

# ANSI colour sequences (--log-colors on, or colourised chat-template diagnostics).
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Prefixes that the log picks up on its way to the reader, stripped in this order (each optional):
# - a container runtime's timestamp (`docker logs -t`, `podman logs -t`): "2025-08-20T11:41:20.014123456Z ";
# - journald (`journalctl -u ...`): "Apr 17 23:09:42 athena ollama[2840147]: ";
# - "ai-llm-1  | " / "ai-llm | " / "[ai-llm] | ": the service prefix of `docker compose logs` / `podman-compose logs`;
# - "[47161] ": the llama-server router (--models-preset/--models-dir) prefixes every child line with its port.
_RUNTIME_TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)? ")
_JOURNAL = re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [\w.@/-]+(?:\[\d+\])?: ")
_COMPOSE = re.compile(r"^\[?[A-Za-z0-9][\w.-]*\]?\s*\| ?")
_ROUTER = re.compile(r"^\[\d+\] ")
# The loader's progress dots ("....") are printed without a newline, so the next line can be glued to them.
_DOTS = re.compile(r"^\.+")
# Optional "0.00.011.842 D " (timestamp + level letter), or just the level letter, then an optional
# component tag of the newer common logger ("srv  ", "cmn  ", "slot ", "que  ", "spec ").
_PREFIX = re.compile(
    r"^(?:(?P<ts>\d+(?:\.\d+){3}) )?(?:(?P<lvl>[IWEDT]) )?"
    r"(?:(?:srv|cmn|slot|que|spec|main|ctx|res) +(?=\S+:))?"
)

_BUILD = [
    # b10434: "common_params_print_info: build 1 (7e4c0a9) with GNU 11.4.0 for Linux x86_64"
    # older:  "build: 4500 (abc1234) with cc (GCC) for x86_64-linux-gnu" / "main: build = 4500 (abc1234)"
    re.compile(r"(?:^|\s)build(?::| =)? (?P<num>\d+) \((?P<commit>[0-9a-fA-F]+)\)"),
    # `llama-server --version`: "version: 4500 (abc1234)" and "version: 0.1.0-dev (build 1, commit 7e4c0a9)"
    re.compile(r"^version: (?P<num>\d+) \((?P<commit>[0-9a-fA-F]+)\)"),
    re.compile(r"^version: \S+ \(build (?P<num>\d+), commit (?P<commit>[0-9a-fA-F]+)\)"),
    # the 2024 server (and ik_llama.cpp): 'INFO [main] build info | tid="1" timestamp=1 build=3642 commit="a1b2c3d"'
    re.compile(r"build info .*\bbuild=(?P<num>\d+) commit=\"?(?P<commit>[0-9a-fA-F]+)"),
    # /props build_info style "b4500-abc1234" printed as "build_info: b4500-abc1234"
    re.compile(r"build_info\W+b(?P<num>\d+)-(?P<commit>[0-9a-fA-F]+)"),
]
_RUN_START = re.compile(
    r"(?:verbosity = \d+ \(adjust|load_model: loading model '|^main: build = |^system_info: )"
)
_LOAD_START = re.compile(
    r"^(?:llama_model_loader: loaded meta data with"
    r"|(?:llm_)?load_tensors: loading model tensors)"
)
# DEBUG lines the loader prints in the same function, at the same level, as the override lines.
_DEBUG_MARKER = re.compile(
    r"^(?:(?:llm_)?load_tensors: +layer +\d+ assigned to device|create_tensor: loading tensor)"
)
# "tensor blk.1.ffn_up_exps.weight (0 MiB f32) buffer type overridden to CPU"
# "tensor blk.1.ffn_up_exps.weight buffer type overriden to CPU"            (before PR #13364)
# "Tensor blk.1.ffn_up_exps.weight buffer type overriden to CPU"            (ik_llama.cpp, INFO)
# "Tensor blk.4.ffn_down_exps.weight (size = 136.00 MiB) buffer type overriden to CPU"   (ik_llama.cpp, 2025-26)
# The buffer can be "CUDA1", "CUDA_Host", "ROCm_Host", "RPC[127.0.0.1:50053]"... A pasted or unflushed log can hold
# several of them on one line ("... overriden to CPUTensor blk.33..."): every match of a line counts.
_OVERRIDE = re.compile(
    r"[Tt]ensor (?P<tensor>\S+)"
    r"(?: \((?:(?P<mib>\d+) MiB (?P<type>\w+)|size = (?P<fmib>\d+(?:\.\d+)?) MiB)\))?"
    r" buffer type overrid+en to (?P<buffer>\w+?(?:\[[^\]\s]*\])?)(?=[Tt]ensor |\s|$)"
)
_OFFLOADED = re.compile(r"offloaded (?P<n>\d+)/(?P<m>\d+) layers to GPU")
_MODEL_BUF = re.compile(
    r"^(?:llm_)?load_tensors: +(?P<buf>\S+) +(?:model )?buffer size *= *(?P<mib>[0-9.]+) MiB"
)
_KV_BUF = re.compile(r"^[\w.]+: +(?P<buf>\S+) +KV buffer size *= *(?P<mib>[0-9.]+) MiB")
_RS_BUF = re.compile(r"^[\w.]+: +(?P<buf>\S+) +RS buffer size *= *(?P<mib>[0-9.]+) MiB")
# (the vision projector's clip graph prints "reserve_compute_meta:"/"alloc_compute_meta:" compute lines of its own)
_COMPUTE_BUF = re.compile(
    r"^(?!(?:reserve|alloc)_compute_meta:)[\w.]+: +(?P<buf>\S+) +compute buffer size *= *(?P<mib>[0-9.]+) MiB"
)
_MMAP_WARN = re.compile(r"tensor overrides to CPU are used with mmap enabled")
_LOAD_ERRORS = [
    # most specific first
    re.compile(r"error loading model: (?P<msg>.+?)\s*$"),
    # the context (KV cache, compute buffers) could not be created: "failed to allocate compute pp buffers"
    re.compile(r"(?P<msg>failed to initialize the context: .+?)\s*$"),
    re.compile(r"(?P<msg>failed to create context with model.*?)\s*$"),
    # (up to a quote: the 2024 server's JSON line '..."msg":"unable to load model","tid":...')
    re.compile(r"(?P<msg>(?:unable|failed) to load model[^\"]*?)\s*(?:\"|$)"),
    # a bad argument ends the server before any load: 'error while handling argument "-ot": unknown buffer type'
    re.compile(r"(?P<msg>error while handling argument.*?)\s*$"),
    re.compile(r"(?P<msg>exiting due to model loading error)"),
]
# Allocation failures: not fatal by themselves (llama.cpp retries a compute buffer without pipeline parallelism),
# but the reason behind a load error that follows them.
_ALLOC_FAILURES = [
    re.compile(r"(?P<msg>allocating [0-9.]+ MiB on device \d+: \w+ failed: .+?)\s*$"),
    re.compile(r"(?P<msg>failed to allocate \S+ buffer of size \d+)"),
    re.compile(r"ggml_vulkan: (?P<msg>(?:Device memory allocation of size \d+ failed|Requested buffer size exceeds).*?)"
               r"\s*$"),
    re.compile(r"(?P<msg>unable to allocate \S+ buffer)"),
]
# A fatal error of the running server (during or after the load): the process is gone.
_CRASH = [
    re.compile(r"\b(?P<msg>(?:CUDA|ROCm|MUSA|HIP|SYCL) error: .+?)\s*$"),
    re.compile(r"(?P<msg>GGML_ASSERT\(.+?\) failed)"),
    re.compile(r"(?P<msg>terminate called after throwing an instance of .+?)\s*$"),
    re.compile(r"(?P<msg>Segmentation fault|Aborted \(core dumped\)|Killed$)"),
]
# The server finished loading and serves: "main: model loaded", "main: server is listening on http://...",
# "srv  update_slots: all slots are idle"; the 2024 server's 'INFO [main] model loaded | ...' and JSON lines.
# (The older "HTTP server is listening, hostname: ..." line comes *before* the load and proves nothing.)
_READY = re.compile(r"(?:\bmodel loaded\b|server is listening on |all slots are idle)")

# Phases of one load, in the order llama.cpp prints them.
_PH_NONE, _PH_TENSORS, _PH_MODEL_BUF, _PH_CONTEXT = 0, 1, 2, 3


# (line, phase, _State attribute, summed): model/KV/RS lines of one buffer add up (CPU_Mapped is printed once per
# shard, an iSWA cache prints two KV lines); compute lines are one per backend and reserve: the last one counts.
_BUFFER_LINES = [
    (_MODEL_BUF, _PH_MODEL_BUF, "model_buffers", True),
    (_KV_BUF, _PH_CONTEXT, "kv_buffers", True),
    (_RS_BUF, _PH_CONTEXT, "rs_buffers", True),
    (_COMPUTE_BUF, _PH_CONTEXT, "compute_buffers", False),
]


def _strip(line):
    """Return (level letter or None, the message without timestamp/level/component prefix)."""
    line = _ANSI.sub("", line).rstrip("\r\n").lstrip()
    # the wrappers nest in any order ("ai-llm-1  | 2025-08-20T11:41:20Z ..." with `compose logs -t`)
    before = None
    while before != line:
        before = line
        for rx in (_RUNTIME_TS, _JOURNAL, _COMPOSE, _ROUTER, _DOTS):
            line = rx.sub("", line, count=1).lstrip()
    m = _PREFIX.match(line)
    return m.group("lvl"), line[m.end():]


class _State(object):
    def __init__(self):
        self.build = None
        self.build_number = None
        self.debug_visible = False      # a DEBUG-level line was seen in this run
        self.load_error_msgs = []
        self.alloc_failures = []        # allocation failures of the current load (the reason of a load error)
        self.crash = None               # the first fatal error of the run
        self.ready = False              # the run shows the server loaded and serving
        self.loads = 0                  # loads seen in this run
        self.reset_load()

    def run_has_content(self):
        return self.load_content or bool(self.load_error_msgs) or self.loads > 0 or self.crash is not None

    def reset_load(self):
        self.overridden = []
        self.model_buffers = {}
        self.kv_buffers = {}
        self.rs_buffers = {}
        self.compute_buffers = {}
        self.offloaded = None
        self.mmap_warning = False
        self.load_debug_marker = False
        self.phase = _PH_NONE
        self.load_content = False


def parse_log(text):
    """Parse the text of a llama-server log (stderr, ``podman logs`` or a ``--log-file``).

    Returns a dict with ``build`` (``"b<number>-<commit>"`` or None), ``build_number`` (int or None),
    ``overridden`` (list of ``{tensor, mib, type, buffer}``; ``mib``/``type`` None in the old format),
    ``model_buffers``, ``kv_buffers``, ``rs_buffers``, ``compute_buffers`` (buffer name -> MiB; model, KV and
    RS lines of the same buffer are summed: ``CPU_Mapped`` is printed once per shard), ``offloaded_layers``
    (``{offloaded, total}`` or None), ``mmap_override_warning``, ``load_error`` (message or None; with the
    allocation that failed when the log names one), ``crash`` (the first fatal error of the last run, during or
    after the load: ``CUDA error: ...``, ``GGML_ASSERT(...) failed``, ``Segmentation fault``...; or None),
    ``server_ready`` (the last run shows the server loaded and serving; an INFO line, hidden at low verbosity),
    ``per_tensor_lines_visible``, ``runs`` and ``loads`` (how many of each the text held; only the last
    load of the last run is reported).
    """
    st = _State()
    runs = 0

    def new_run():
        nonlocal st, runs
        runs += 1
        st = _State()

    def new_load():
        st.loads += 1
        st.reset_load()
        # an error of an earlier (dry-run) load does not describe this one
        st.load_error_msgs = []
        st.alloc_failures = []

    def enter_phase(phase):
        """Start a new load when a line belongs to an earlier phase than what was already seen."""
        if st.loads == 0 or st.phase > phase:
            new_load()
        st.phase = max(st.phase, phase)
        st.load_content = True

    for raw in (text or "").splitlines():
        lvl, msg = _strip(raw)
        if not msg.strip():
            continue

        build = None
        for rx in _BUILD:
            m = rx.search(msg)
            if m:
                build = (int(m.group("num")), m.group("commit"))
                break
        if build is not None:
            if runs == 0 or st.run_has_content():
                new_run()
            st.build_number, st.build = build[0], "b%d-%s" % build
            continue
        if _RUN_START.search(msg):
            if runs == 0 or st.run_has_content():
                new_run()   # (a run whose build line is hidden keeps build None, not the previous run's)
            continue

        if lvl == "D":
            st.debug_visible = True

        if _LOAD_START.search(msg):
            if st.load_content or st.loads == 0:
                new_load()
            continue

        if _DEBUG_MARKER.search(msg):
            if msg.startswith(("load_tensors", "llm_load_tensors")):
                enter_phase(_PH_TENSORS)
            st.load_debug_marker = True
            continue

        found = list(_OVERRIDE.finditer(msg))
        if found:
            enter_phase(_PH_TENSORS)
            for m in found:
                mib = m.group("mib") if m.group("mib") is not None else m.group("fmib")
                st.overridden.append({
                    "tensor": m.group("tensor"),
                    # integer-truncated like llama.cpp's %zu; ik_llama.cpp prints "size = 136.00 MiB"
                    "mib": int(float(mib)) if mib is not None else None,
                    "type": m.group("type"),
                    "buffer": m.group("buffer"),
                })
            continue
        if _MMAP_WARN.search(msg):
            enter_phase(_PH_TENSORS)
            st.mmap_warning = True
            continue
        m = _OFFLOADED.search(msg)
        if m:
            enter_phase(_PH_MODEL_BUF)
            st.offloaded = {"offloaded": int(m.group("n")), "total": int(m.group("m"))}
            continue
        m = None
        for rx, phase, table, summed in _BUFFER_LINES:
            m = rx.search(msg)
            if m:
                enter_phase(phase)
                buffers = getattr(st, table)
                mib = float(m.group("mib")) + (buffers.get(m.group("buf"), 0.0) if summed else 0.0)
                buffers[m.group("buf")] = round(mib, 2)
                break
        if m:
            continue
        if _READY.search(msg):
            st.ready = True
            continue
        matched = False
        for i, rx in enumerate(_LOAD_ERRORS):
            m = rx.search(msg)
            if m and "fit params" not in msg:
                st.load_error_msgs.append((i, m.group("msg")))
                matched = True
                break
        if matched:
            continue
        for rx in _ALLOC_FAILURES:
            m = rx.search(msg)
            if m:
                st.alloc_failures.append(m.group("msg"))
                break
        else:
            for rx in _CRASH:
                m = rx.search(msg)
                if m and st.crash is None:
                    st.crash = m.group("msg")
                    break

    load_error = None
    if st.load_error_msgs:
        # the most specific kind of message, the last of that kind
        best = min(kind for kind, _msg in st.load_error_msgs)
        load_error = [text for kind, text in st.load_error_msgs if kind == best][-1]
        # with the allocation that failed, when the message does not already say it
        details = [a for a in st.alloc_failures if a not in load_error]
        if details:
            load_error = "%s (%s)" % (load_error, details[0])

    visible = bool(st.overridden) or st.load_debug_marker or st.debug_visible
    return {
        "build": st.build,
        "build_number": st.build_number,
        "overridden": st.overridden,
        "model_buffers": st.model_buffers,
        "kv_buffers": st.kv_buffers,
        "rs_buffers": st.rs_buffers,
        "compute_buffers": st.compute_buffers,
        "offloaded_layers": st.offloaded,
        "mmap_override_warning": st.mmap_warning,
        "load_error": load_error,
        "crash": st.crash,
        "server_ready": st.ready,
        "per_tensor_lines_visible": visible,
        "runs": max(runs, 1) if (text or "").strip() else 0,
        "loads": st.loads,
    }


# Host-side buffer types: everything else (CUDA0, Vulkan0, ROCm0, Metal, SYCL0, CUDA_Split, RPC[...]) is a device.
_HOST_BUFFER = re.compile(r"^(?:CPU.*|.*_Host|AMX|BLAS|KLEIDIAI.*)$", re.IGNORECASE)


def is_device_buffer(name):
    """True for a GPU/accelerator buffer name (``CUDA0``, ``Vulkan0``, ``ROCm1``, ``Metal``...)."""
    return not _HOST_BUFFER.match(name)


def gpu_model_mib(parsed):
    """Sum of the device (non-CPU, non-host) model buffers of a parsed log, or None without model buffer lines."""
    bufs = parsed.get("model_buffers") or {}
    if not bufs:
        return None
    return round(sum(v for k, v in bufs.items() if is_device_buffer(k)), 2)


def expected_from_pattern(pattern, all_names):
    """The names among ``all_names`` that ``re.search(pattern, name)`` matches (how ``-ot`` selects)."""
    rx = re.compile(pattern)
    return [n for n in all_names if rx.search(n)]


def verify_placement(parsed, expected=None, expect_gpu_model_mib=None,
                     tolerance_mib=1.0, tolerance_pct=1.0):
    """Decide whether the parsed log proves the expected placement.

    ``expected`` is the list of tensor names that must have been overridden to a host buffer (None when
    no tensor expectation is given). With the per-tensor lines visible the log must list exactly those
    tensors. When they are hidden by the log's verbosity the device model buffer is compared with
    ``expect_gpu_model_mib`` within ``max(tolerance_mib, expect_gpu_model_mib * tolerance_pct / 100)``.
    Without either evidence the result is never verified.

    Returns ``verified`` (bool), ``evidence`` (``per_tensor``, ``buffers`` or ``none``), ``missing``,
    ``unexpected`` (sorted names; empty lists without per-tensor evidence), ``gpu_model_mib``,
    ``gpu_model_tolerance_mib`` and ``msg``.
    """
    res = {
        "verified": False,
        "evidence": "none",
        "missing": [],
        "unexpected": [],
        "gpu_model_mib": gpu_model_mib(parsed),
        "gpu_model_tolerance_mib": None,
        "msg": "",
    }
    if parsed.get("load_error"):
        res["msg"] = "the model failed to load: %s" % parsed["load_error"]
        return res
    if parsed.get("crash"):
        res["msg"] = "llama-server died: %s" % parsed["crash"]
        return res
    if expected is None and expect_gpu_model_mib is None:
        res["msg"] = "no expectation given, nothing verified: %d tensors overridden, GPU model buffer %s MiB" % (
            len(parsed.get("overridden") or []), res["gpu_model_mib"])
        return res

    if expected is not None and parsed.get("per_tensor_lines_visible"):
        overridden = parsed.get("overridden") or []
        # only an override to a host buffer moves a tensor off the GPUs: "-ot ...=CUDA1" pins it to another device
        moved = [o["tensor"] for o in overridden if not is_device_buffer(o["buffer"])]
        on_device = dict((o["tensor"], o["buffer"]) for o in overridden if is_device_buffer(o["buffer"]))
        moved_set, exp_set = set(moved), set(expected)
        res["evidence"] = "per_tensor"
        res["missing"] = sorted(exp_set - moved_set)
        res["unexpected"] = sorted(moved_set - exp_set)
        res["verified"] = not res["missing"] and not res["unexpected"]
        if res["verified"]:
            res["msg"] = "the log shows exactly the %d expected tensors overridden to host memory" % len(exp_set)
            if on_device:
                res["msg"] += " (and %d tensors pinned to devices: %s)" % (
                    len(on_device), ", ".join(sorted(set(on_device.values()))))
        else:
            parts = []
            if not overridden:
                parts.append("the log shows no overridden tensor (the pattern matched nothing?)")
            elif not moved:
                parts.append("the log shows no tensor overridden to host memory, only to devices")
            if res["missing"]:
                named = ["%s (to %s)" % (n, on_device[n]) if n in on_device else n for n in res["missing"]]
                parts.append("%d expected tensors not overridden to host memory: %s"
                             % (len(res["missing"]), ", ".join(named)))
            if res["unexpected"]:
                parts.append("%d unexpected tensors overridden: %s"
                             % (len(res["unexpected"]), ", ".join(res["unexpected"])))
            res["msg"] = "; ".join(parts)
        return res

    hidden = ""
    if expected is not None:
        hidden = "the log's verbosity hides the per-tensor override lines (use -lv 5 or -v); "
    if expect_gpu_model_mib is None:
        res["msg"] = hidden + "no expected GPU model buffer given to fall back on: not verified"
        return res
    gpu = res["gpu_model_mib"]
    if gpu is None:
        res["msg"] = hidden + "and the log has no model buffer lines either (verbosity too low?): not verified"
        return res
    tol = max(float(tolerance_mib), abs(float(expect_gpu_model_mib)) * float(tolerance_pct) / 100.0)
    res["gpu_model_tolerance_mib"] = round(tol, 2)
    res["evidence"] = "buffers"
    diff = gpu - float(expect_gpu_model_mib)
    res["verified"] = abs(diff) <= tol
    res["msg"] = "%sGPU model buffer %.2f MiB, expected %.2f MiB +/- %.2f MiB: %s" % (
        hidden, gpu, float(expect_gpu_model_mib), tol, "match" if res["verified"] else "MISMATCH")
    return res
