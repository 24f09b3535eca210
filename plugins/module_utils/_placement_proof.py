# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Decide whether a parsed llama-server log (``_llama_log.parse_log``) proves where the tensors were placed.

Standard library only (runs on target hosts, Python >= 3.9).

The proof uses the strongest evidence the log holds: the per-tensor override lines of
src/llama-model-loader.cpp ``create_tensor`` (``-lv 5``), else the per-device model buffers of src/llama-model.cpp
``load_tensors``, else the sum of the device model buffers. The KV (src/llama-kv-cache.cpp), recurrent-state
(src/llama-memory-recurrent.cpp) and compute (src/llama-context.cpp) buffers and the ``offloaded N/M layers``
line are checked beside it, and the devices llama-server uses (its ``using device`` lines, ``_llama_devices``)
against the plan's cards. A log of a failed load, a crash or an exit before the server was ready proves nothing.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Optional

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_build import BUILD, COMMIT
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_devices import device_problem
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_log import MAX_OVERRIDES
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._pattern_syntax import matcher

__all__ = [
    "Expectations",
    "is_device_buffer",
    "gpu_model_mib",
    "verify_placement",
    "prove",
    "expected_from_pattern",
    "expected_from_overrides",
    "build_warning",
]

# Host-side buffer types: everything else (CUDA0, Vulkan0, ROCm0, Metal, SYCL0, CUDA_Split, RPC[...]) is a device.
_HOST_BUFFER = re.compile(r"(?:CPU.*|.*_Host|AMX|BLAS|KLEIDIAI.*)", re.IGNORECASE)
HOST_BUFFER_CHECKS = ("KV buffer ", "RS buffer ", "compute buffer ")
_HIDDEN = "the log's verbosity hides the per-tensor override lines (use -lv 5 or -v); "


def _no_buffer_lines(hidden):
    """The refusal when the log has no model buffer lines, after ``hidden`` (the override lines hidden, or "")."""
    if hidden:
        return hidden + "and the log has no model buffer lines either (verbosity too low?): not verified"
    return "the log has no model buffer lines (verbosity too low?): not verified"


def is_device_buffer(name):
    """True for a GPU/accelerator buffer name (``CUDA0``, ``Vulkan0``, ``ROCm1``, ``Metal``...)."""
    return not _HOST_BUFFER.fullmatch(name)


def gpu_model_mib(parsed):
    """Sum of the device (non-CPU, non-host) model buffers of a parsed log, or None without model buffer lines."""
    bufs = parsed.get("model_buffers") or {}
    if not bufs:
        return None
    return round(sum(v for k, v in bufs.items() if is_device_buffer(k)), 2)


def expected_from_pattern(pattern, all_names):
    """The names among ``all_names`` that llama.cpp's ``std::regex_search(name, std::regex(pattern))`` finds.

    Raises ``PatternError`` when Python cannot read the pattern as ECMAScript does.
    """
    found = matcher(pattern)
    return [n for n in all_names if found(n)]


def expected_from_overrides(overrides, all_names):
    """Buffer -> names: where a list of ``-ot`` items (``"PATTERN=BUFFER"``, in the order llama-server gets them)
    sends each tensor. As in src/llama-model-loader.cpp ``create_tensor``, the first item whose pattern matches a
    tensor decides its buffer; a tensor that no pattern matches is not overridden.

    Raises ``ValueError`` for an item without ``=`` and ``PatternError`` for a pattern Python cannot read alike.
    """
    items = []
    for item in overrides:
        pattern, sep, buffer = item.partition("=")
        if not sep or not pattern or not buffer:
            raise ValueError(f"override {item!r} is not PATTERN=BUFFER")
        items.append((matcher(pattern), buffer))
    result = {}
    for name in all_names:
        for found, buffer in items:
            if found(name):
                result.setdefault(buffer, []).append(name)
                break
    return result


def _device(buffer):
    """A device buffer name without the endpoint an RPC device adds: ``RPC0[127.0.0.1:50052]`` -> ``RPC0``."""
    at = buffer.find("[")
    return buffer[:at] if at > 0 and buffer.endswith("]") else buffer


def _host_key(buffer):
    """``host`` for any host buffer, else the device (``CUDA1``, ``RPC0``) a tensor or buffer belongs to."""
    return "host" if not is_device_buffer(buffer) else _device(buffer)


@dataclass(frozen=True)
class Expectations:
    """What a log must show (see ``verify_placement``); ``None`` is no expectation, an empty one is one."""

    host: Optional[tuple] = None            # tensor names that must go to a host buffer
    overrides: Optional[dict] = None        # buffer -> tensor names
    gpu_model_mib: Optional[float] = None
    tolerance_mib: float = 1.0
    tolerance_pct: float = 1.0
    model_buffers: Optional[dict] = None    # device -> MiB
    kv_buffers: Optional[dict] = None
    rs_buffers: Optional[dict] = None
    compute_buffers: Optional[dict] = None
    offloaded_layers: Optional[int] = None
    buffer_tolerance_mib: float = 0.01
    require_ready: bool = False
    devices: Optional[tuple] = None         # the plan's devices, {device, pci_bus_id, name}; () for a CPU plan

    @property
    def of_tensors(self):
        return self.host is not None or self.overrides is not None

    def tensors(self):
        """``host`` or a device (``CUDA1``) -> the set of names expected there."""
        wanted = {}
        if self.host is not None:
            wanted["host"] = set(self.host)
        for buffer, names in (self.overrides or {}).items():
            wanted.setdefault(_host_key(buffer), set()).update(names)
        return wanted

    def any_given(self):
        others = (self.gpu_model_mib, self.model_buffers, self.kv_buffers, self.rs_buffers, self.compute_buffers,
                  self.offloaded_layers)
        return self.of_tensors or self.devices is not None or any(v is not None for v in others)

    def of_placement(self):
        """Whether anything beside the devices is expected."""
        return replace(self, devices=None).any_given()


def verify_placement(parsed, expected=None, expect_gpu_model_mib=None, tolerance_mib=1.0, tolerance_pct=1.0, *,
                     expect_overrides=None, expect_model_buffers=None, expect_kv_buffers=None,
                     expect_rs_buffers=None, expect_compute_buffers=None, expect_offloaded_layers=None,
                     buffer_tolerance_mib=0.01, require_ready=False, expect_devices=None):
    """Decide whether the parsed log proves the expected placement.

    Placement, by the first evidence the log and the expectations allow:

    * ``per_tensor``: with the per-tensor lines visible, the log must list exactly the expected overrides:
      ``expected`` (names that must go to a host buffer: ``CPU``, ``CPU_REPACK``, ``CUDA_Host``, ``AMX``...) and
      ``expect_overrides`` (buffer -> names; ``CPU`` stands for any host buffer, another key such as ``CUDA1``
      for that device). Overrides to a device no expectation names are listed but neither missing nor unexpected;
    * ``device_buffers``: otherwise (the default verbosity hides those lines) every device's model buffer against
      ``expect_model_buffers`` (device -> MiB) within ``buffer_tolerance_mib``, and no other device buffer;
    * ``buffers``: otherwise the sum of the device model buffers against ``expect_gpu_model_mib`` within
      ``max(tolerance_mib, expect_gpu_model_mib * tolerance_pct / 100)``.

    Every other expectation given is checked too: ``expect_model_buffers`` also with per-tensor evidence,
    ``expect_kv_buffers`` and ``expect_rs_buffers`` (equal within ``buffer_tolerance_mib``),
    ``expect_compute_buffers`` (at most: the plan's compute figure is an upper bound) and
    ``expect_offloaded_layers`` (the N of ``offloaded N/M layers``). Never verified after a load error, a crash,
    an exit before the server was ready, without the ready line when ``require_ready``, or without evidence.
    ``expect_devices`` (the plan's ``devices``, ``[]`` for a CPU plan): the log's ``using device`` lines must
    name exactly those devices, each ``CUDA<n>`` on the card of the plan (``_llama_devices.device_problem``).

    Returns ``verified`` (bool), ``evidence`` (``per_tensor``, ``device_buffers``, ``buffers``, ``host_buffers`` or
    ``none``), ``missing``, ``unexpected`` (sorted names; empty lists without per-tensor evidence), ``checks`` (one
    dict per buffer or layer check: ``check``, ``expected``, ``logged``, ``ok``, ``note``), ``gpu_model_mib``,
    ``gpu_model_tolerance_mib`` and ``msg``.
    """
    want = Expectations(
        None if expected is None else tuple(expected), expect_overrides, expect_gpu_model_mib, tolerance_mib,
        tolerance_pct, expect_model_buffers, expect_kv_buffers, expect_rs_buffers, expect_compute_buffers,
        expect_offloaded_layers, buffer_tolerance_mib, require_ready,
        None if expect_devices is None else tuple(expect_devices))
    return prove(parsed, want)


def prove(parsed, want):
    """``verify_placement`` with its expectations as one ``Expectations`` value."""
    res = {
        "verified": False,
        "evidence": "none",
        "missing": [],
        "unexpected": [],
        "checks": [],
        "gpu_model_mib": gpu_model_mib(parsed),
        "gpu_model_tolerance_mib": None,
        "msg": "",
    }
    refusal = _refusal(parsed, want, res["gpu_model_mib"])
    if refusal:
        res["msg"] = refusal
        return res
    devices = None if want.devices is None else device_problem(parsed, want.devices)
    if devices is not None and not want.of_placement():
        res["verified"] = not devices
        res["msg"] = devices or _devices_text(parsed)
        return res
    checks = _checks(parsed, want)
    res["checks"] = checks
    failed = [c for c in checks if not c["ok"]]
    placement_ok, placement_msg = _placement(parsed, res, want, failed)
    res["verified"] = placement_ok and not failed and not devices
    parts = [devices] if devices else []
    parts += [placement_msg] if placement_msg else []
    parts += [_failure_text(c) for c in failed]
    if res["verified"] and checks:
        parts.append(f"{len(checks)} buffer and layer checks match")
    res["msg"] = "; ".join(parts)
    return res


def _refusal(parsed, want, gpu_mib):
    """Why the log cannot prove anything whatever it shows, or ``None``."""
    if parsed.get("load_error"):
        return f"the model failed to load: {parsed['load_error']}"
    if parsed.get("crash"):
        cause = parsed.get("crash_cause")
        return f"llama-server died: {parsed['crash']}" + (f" ({cause})" if cause else "")
    if parsed.get("exit_code") is not None and not parsed.get("server_ready"):
        return f"llama-server exited with code {parsed['exit_code']} before the log shows it ready"
    if not want.any_given():
        return (f"no expectation given, nothing verified: {len(parsed.get('overridden') or [])} tensors "
                f"overridden, GPU model buffer {gpu_mib} MiB")
    if want.require_ready and not parsed.get("server_ready"):
        return ("the log does not show the server ready (no 'model loaded', 'listening on http' or "
                "'all slots are idle' line): not verified")
    return None


def _checks(parsed, want):
    """The buffer and layer checks of every expectation given: a list of check dicts."""
    tol = float(want.buffer_tolerance_mib)
    checks = []
    if want.model_buffers is not None:
        logged = dict(parsed.get("model_buffers") or {})
        checks += _compare_buffers("model buffer", logged, want.model_buffers, tol)
        planned = {_device(name) for name in want.model_buffers}
        for name in sorted(logged):
            if is_device_buffer(name) and name not in want.model_buffers and _device(name) not in planned:
                checks.append({"check": f"model buffer {name}", "expected": None, "logged": logged[name],
                               "ok": False, "note": "no buffer (the plan puts nothing on this device):"})
    for what, table, expected in (("KV buffer", "kv_buffers", want.kv_buffers),
                                  ("RS buffer", "rs_buffers", want.rs_buffers)):
        if expected is not None:
            checks += _compare_buffers(what, parsed.get(table) or {}, expected, tol)
    if want.compute_buffers is not None:
        checks += _compare_buffers("compute buffer", parsed.get("compute_buffers") or {}, want.compute_buffers,
                                   tol, at_most=True)
    if want.offloaded_layers is not None:
        layers = int(want.offloaded_layers)
        logged = (parsed.get("offloaded_layers") or {}).get("offloaded")
        checks.append({"check": "offloaded layers", "expected": layers, "logged": logged, "ok": logged == layers,
                       "note": str(layers)})
    return checks


def _logged_value(logged, name):
    """The logged figure of ``name``: its own line, or the one line of that device with an endpoint."""
    if name in logged:
        return logged[name]
    same = [v for k, v in logged.items() if _device(k) == _device(name)]
    return same[0] if len(same) == 1 else None


def _compare_buffers(what, logged, expected, tolerance, at_most=False):
    """Checks of logged buffers (name -> MiB) against expected ones: a list of check dicts."""
    checks = []
    for name in sorted(expected):
        want = float(expected[name])
        got = _logged_value(logged, name)
        if got is None:
            ok, note = False, "not in the log"
        elif at_most:
            ok, note = got <= want + tolerance + 1e-9, f"at most {want:.2f}"
        else:
            ok, note = abs(got - want) <= tolerance + 1e-9, f"{want:.2f} +/- {tolerance:g}"
        checks.append({"check": f"{what} {name}", "expected": round(want, 2), "logged": got, "ok": ok,
                       "note": note})
    return checks


def _failure_text(check):
    """One failed check in words."""
    if check["expected"] is None:
        return f"{check['check']}: {check['logged']:.2f} MiB in the log, but the plan puts nothing there"
    if check["check"] == "offloaded layers":
        return f"offloaded layers: {check['logged']}, expected {check['expected']}"
    if check["logged"] is None:
        return f"{check['check']}: not in the log, expected {check['expected']:.2f} MiB"
    return f"{check['check']}: {check['logged']:.2f} MiB, expected {check['note']} MiB"


def _placement(parsed, res, want, failed_checks):
    """The placement proof (see ``verify_placement``): (ok, message); fills ``evidence``, ``missing``..."""
    if want.of_tensors and parsed.get("per_tensor_lines_visible"):
        return _per_tensor(parsed, res, want.tensors())
    hidden = _HIDDEN if want.of_tensors else ""
    if want.model_buffers is not None:
        if not parsed.get("model_buffers"):
            return False, _no_buffer_lines(hidden)
        res["evidence"] = "device_buffers"
        if any(c["check"].startswith("model buffer") for c in failed_checks):
            return False, hidden + "the per-device model buffers do not match the plan"
        return True, hidden + (f"the model buffers of {len(want.model_buffers)} device(s) match the plan "
                               "(per-device buffer evidence)")
    if want.gpu_model_mib is None:
        if want.of_tensors:
            return False, hidden + "no expected GPU model buffer given to fall back on: not verified"
        return _host_buffers(res)
    gpu = res["gpu_model_mib"]
    if gpu is None:
        return False, _no_buffer_lines(hidden)
    expect = float(want.gpu_model_mib)
    tol = max(float(want.tolerance_mib), abs(expect) * float(want.tolerance_pct) / 100.0)
    res["gpu_model_tolerance_mib"] = round(tol, 2)
    res["evidence"] = "buffers"
    ok = abs(gpu - expect) <= tol
    return ok, (f"{hidden}GPU model buffer {gpu:.2f} MiB, expected {expect:.2f} MiB "
                f"+/- {tol:.2f} MiB: {'match' if ok else 'MISMATCH'}")


def _host_buffers(res):
    """No tensor and no model-buffer expectation: host buffers only are evidence (a host without GPU below -lv 5)."""
    if not res["checks"]:
        return False, "the expectations given name no buffer to check: not verified"
    host_checks = [c for c in res["checks"] if c["check"].startswith(HOST_BUFFER_CHECKS)
                   and not is_device_buffer(c["check"].split()[-1])]
    if not host_checks or len(host_checks) != len(res["checks"]):
        return True, ""
    res["evidence"] = "host_buffers"
    matched = sum(1 for c in host_checks if c["ok"])
    which = "the" if matched == len(host_checks) else f"{matched} of the"
    return True, (f"no tensor or model buffer expected; {which} {len(res['checks'])} buffer(s) given match "
                  "the plan (host buffer evidence)")


def _tensor_verdict(went, wanted):
    """(missing, unexpected): the expected names not logged where expected, and the names logged where no
    expectation puts them (host memory, or a device some expectation names)."""
    missing = {name for key, names in wanted.items() for name in names
               if went.get(name) is None or _host_key(went[name]) != key}
    on_host = {t for t, b in went.items() if not is_device_buffer(b)}
    unexpected = on_host - wanted.get("host", set())
    for t, b in went.items():
        key = _host_key(b)
        if key != "host" and key in wanted and t not in wanted[key]:
            unexpected.add(t)
    return missing, unexpected


def _per_tensor(parsed, res, wanted):
    """The per-tensor proof: (ok, message); fills ``evidence``, ``missing`` and ``unexpected``."""
    overridden = parsed.get("overridden") or []
    res["evidence"] = "per_tensor"
    if parsed.get("overridden_dropped"):
        return False, (f"the log holds more than {MAX_OVERRIDES} override lines ({parsed['overridden_dropped']} not "
                       "kept): not verified")
    # where the log says each tensor went (the first line of a tensor counts)
    went = {}
    for o in overridden:
        went.setdefault(o["tensor"], o["buffer"])
    missing, unexpected = _tensor_verdict(went, wanted)
    res["missing"] = sorted(missing)
    res["unexpected"] = sorted(unexpected)
    if not missing and not unexpected:
        return True, _proved_text(went, wanted)
    parts = []
    if not overridden:
        parts.append("the log shows no overridden tensor (the pattern matched nothing?)")
    elif "host" in wanted and not any(not is_device_buffer(b) for b in went.values()):
        parts.append("the log shows no tensor overridden to host memory, only to devices")
    if missing:
        named = [f"{n} (to {went[n]})" if n in went else n for n in res["missing"]]
        where = "host memory" if set(wanted) == {"host"} else "their expected buffers"
        parts.append(f"{len(missing)} expected tensors not overridden to {where}: {', '.join(named)}")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected tensors overridden: {', '.join(res['unexpected'])}")
    return False, "; ".join(parts)


def _proved_text(went, wanted):
    """The message of a per-tensor proof that holds, with the tensors pinned to devices no expectation names."""
    parts = []
    if "host" in wanted:
        parts.append(f"exactly the {len(wanted['host'])} expected tensors overridden to host memory")
    for key in sorted(k for k in wanted if k != "host"):
        parts.append(f"exactly the {len(wanted[key])} expected tensors overridden to {key}")
    msg = "the log shows " + " and ".join(parts) if parts else "the log shows the expected overrides"
    expected_anywhere = set().union(*wanted.values()) if wanted else set()
    pinned = [t for t, b in went.items() if is_device_buffer(b) and t not in expected_anywhere]
    if pinned:
        msg += (f" (and {len(pinned)} tensors pinned to devices: "
                f"{', '.join(sorted({went[t] for t in pinned}))})")
    return msg


def _devices_text(parsed):
    """The devices of a log that match the plan, in words."""
    logged = parsed.get("devices") or []
    if not logged:
        return "llama-server uses no GPU, as planned"
    return "llama-server uses exactly the planned devices: " + ", ".join(
        f"{d['device']} ({d['pci_bus_id'] or d['id'] or d['description']})" for d in logged)


def build_warning(parsed):
    """Why the build of the log is not the one the collection models (``_llama_build``), or ``None`` (the same
    build, or no build line)."""
    number, build = parsed.get("build_number"), parsed.get("build")
    if number is None or not build:
        return None
    commit = build.rpartition("-")[2].lower()
    if number == BUILD and (commit.startswith(COMMIT) or COMMIT.startswith(commit)):
        return None
    return (f"llama-server runs build {number} ({commit}), the collection models build {BUILD} ({COMMIT}): its "
            "memory and log formats may differ from the plan's")
