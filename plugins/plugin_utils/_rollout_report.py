# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollout report: one row per host, from what the llm_server role published and what Ansible did.

Standard library only. The callback plugin ``ai_llm.moe_offload.rollout_report`` records, per host, a
``HostRun`` (its serial batch, the last ``llm_server_result`` it published, the failure or unreachable message
that ended its run); ``build_report`` turns those into the dict written as ``rollout.json``; ``markdown`` and
``table`` render it as text, ``_rollout_page.page`` as the HTML page.

A host's status:

- ``unreachable``: Ansible lost it (in the preflight or in its batch);
- its ``llm_server_result.status`` from its batch (``changed``, ``unchanged``, ``failed``, ``rolled_back``,
  ``checked``), except ``failed`` when a later task of the play failed on it;
- ``failed``: its run ended with an Ansible failure (a plan refused in the preflight, an error outside the role),
  or its batch stopped before the role published a result on it;
- ``not_reached``: the rollout stopped before its batch; nothing was done on it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

STATUSES = ("changed", "unchanged", "checked", "rolled_back", "failed", "unreachable", "not_reached")
ROLE_STATUSES = ("changed", "unchanged", "failed", "rolled_back", "checked")
OK_STATUSES = ("changed", "unchanged", "checked")
# llama.cpp's GPU backend buffer names: <backend><device number> (CUDA0, Vulkan1, ROCm0...); everything else
# (CPU, CPU_Mapped, CPU_REPACK, AMX, CUDA_Host) lives in host memory.
GPU_BUFFER = re.compile(r"^(CUDA|ROCm|Vulkan|SYCL|MUSA|CANN|Metal|OpenCL|RPC\[.*\])(\d+)$")


class ReportError(ValueError):
    """Input the report cannot use: ``str()`` names the host and the field."""


@dataclass
class HostRun:
    """What the rollout did with one host (recorded by the callback plugin)."""

    host: str
    batch: int | None = None            # its serial batch (1-based); None: no batch of the rollout reached it
    result: dict | None = None          # the last llm_server_result it published
    result_phase: str | None = None     # the play that published it: "preflight" or "deploy"
    failure: str | None = None          # the message of the Ansible failure that ended its run
    failure_phase: str | None = None
    unreachable: str | None = None      # Ansible's message when it became unreachable
    unreachable_phase: str | None = None


@dataclass
class Rollout:
    """The rollout's settings as the playbook published them (``llm_rollout``) and the batches Ansible ran."""

    hosts: list = field(default_factory=list)
    report_dir: str = ""
    serial: object = None
    max_fail_percentage: object = None
    check_mode: bool = False
    batches: list = field(default_factory=list)     # [[host, ...], ...] in the order Ansible ran them
    batch_seconds: list = field(default_factory=list)
    started: str | None = None
    finished: str | None = None
    seconds: float | None = None


def one_line(text, limit=600):
    """``text`` on one line (whitespace runs folded), cut to ``limit`` characters."""
    line = re.sub(r"\s+", " ", str(text or "")).strip()
    return line if len(line) <= limit else line[: limit - 3] + "..."


def check_result(host, result):
    """The ``llm_server_result`` of ``host`` as a dict whose status the report knows, or ``ReportError``."""
    if not isinstance(result, dict):
        raise ReportError("%s: llm_server_result is %s, not a dict" % (host, type(result).__name__))
    status = result.get("status")
    if status not in ROLE_STATUSES:
        raise ReportError("%s: llm_server_result.status is %r, not one of %s"
                          % (host, status, ", ".join(ROLE_STATUSES)))
    return result


def host_status(run):
    """``(status, message)`` of one ``HostRun`` (the rules in this module's docstring)."""
    result = run.result
    if run.unreachable is not None:
        phase = run.unreachable_phase or "rollout"
        return "unreachable", one_line("unreachable in the %s: %s" % (phase, run.unreachable))
    if result is not None and run.result_phase == "deploy":
        status = result["status"]
        if run.failure is not None and run.failure_phase == "deploy" and status in OK_STATUSES:
            return "failed", one_line("after the role ended %s: %s" % (status, run.failure))
        return status, one_line(result.get("message") or status)
    if result is not None and result["status"] == "failed":
        return "failed", one_line(result.get("message") or "failed in the %s" % (run.result_phase or "rollout"))
    if run.failure is not None:
        prefix = "preflight: " if run.failure_phase == "preflight" else ""
        return "failed", one_line(prefix + run.failure)
    if run.batch is not None:
        return "failed", ("its batch stopped before the llm_server role finished here (another host of the "
                          "batch failed); what it serves was not verified")
    return "not_reached", "not touched: the rollout stopped before this host's batch"


def _ansible_outcome(run):
    if run.unreachable is not None:
        return {"outcome": "unreachable", "phase": run.unreachable_phase, "msg": one_line(run.unreachable)}
    if run.failure is not None:
        return {"outcome": "failed", "phase": run.failure_phase, "msg": one_line(run.failure)}
    return {"outcome": "ok" if run.batch is not None or run.result_phase else "not_run", "phase": None, "msg": None}


def host_row(run):
    """The report row of one host: ``host``, ``batch``, ``status``, ``message``, the pattern, what Ansible said,
    and the role's result verbatim (``result``; ``result_from`` says which play published it)."""
    status, message = host_status(run)
    result = run.result or {}
    return {
        "host": run.host,
        "batch": run.batch,
        "status": status,
        "message": message,
        "pattern": result.get("pattern") or None,
        "pattern_source": result.get("pattern_source"),
        "config_hash": result.get("config_hash"),
        "ansible": _ansible_outcome(run),
        "result_from": run.result_phase if run.result is not None else None,
        "result": run.result,
    }


def _percent(value, name):
    """A percentage 0..100 from ``value`` (a number, or a string like Ansible's ``"25"``, ``"12.5%"``), as an int
    when it is whole, or ``ReportError`` naming ``name``."""
    text = str(value).strip()
    text = text[:-1] if text.endswith("%") else text
    try:
        number = float(text)
    except ValueError:
        number = -1.0
    if isinstance(value, bool) or not 0 <= number <= 100:
        raise ReportError("%s is %r: give a percentage from 0 to 100" % (name, value))
    return int(number) if number.is_integer() else number


def stop_reason(rows, batches, max_fail):
    """Why the rollout stopped before some hosts (``None`` when it reached every host)."""
    ended_in_preflight = not batches and any(row["status"] not in OK_STATUSES for row in rows)
    if not ended_in_preflight and not any(row["status"] == "not_reached" for row in rows):
        return None
    by_host = {row["host"]: row for row in rows}
    if not batches:
        refused = [row for row in rows if row["status"] in ("failed", "unreachable")]
        names = ", ".join("%s (%s)" % (row["host"], row["status"]) for row in refused) or "no host"
        return ("preflight: %s; nothing was restarted (llm_rollout_skip_refused_hosts: true rolls out the other "
                "hosts)" % names)
    last = batches[-1]
    bad = [by_host[h] for h in last if h in by_host and by_host[h]["status"] not in OK_STATUSES]
    if not bad:
        missing = [row["host"] for row in rows if row["status"] == "not_reached"]
        return "the run ended after batch %d without reaching %s" % (len(batches), ", ".join(missing))
    names = ", ".join("%s %s" % (row["host"], row["status"]) for row in bad)
    return ("batch %d: %s (%d of %d hosts); Ansible stops the rollout when more than "
            "llm_rollout_max_fail_percentage (%s%%) of a batch fails, or all of it"
            % (len(batches), names, len(bad), len(last), max_fail))


def build_report(rollout, runs):
    """The report dict (``rollout.json``) of a ``Rollout`` and its ``HostRun`` records (any order)."""
    by_host = {}
    errors = []
    for run in runs:
        if run.result is not None:
            try:
                check_result(run.host, run.result)
            except ReportError as exc:        # the host is reported failed, with what is wrong in its result
                errors.append(str(exc))
                run = HostRun(run.host, batch=run.batch, failure=str(exc), failure_phase=run.result_phase,
                              unreachable=run.unreachable, unreachable_phase=run.unreachable_phase)
        by_host[run.host] = run
    order = list(rollout.hosts) + sorted(h for h in by_host if h not in rollout.hosts)
    rows = [host_row(by_host.get(host) or HostRun(host)) for host in order]
    max_fail = _percent(0 if rollout.max_fail_percentage is None else rollout.max_fail_percentage,
                        "llm_rollout_max_fail_percentage")
    summary = {}
    for row in rows:
        summary[row["status"]] = summary.get(row["status"], 0) + 1
    reason = stop_reason(rows, rollout.batches, max_fail)
    if reason is not None:
        outcome = "stopped"
    elif all(row["status"] in OK_STATUSES for row in rows):
        outcome = "completed"
    else:
        outcome = "completed_with_failures"
    return {
        "outcome": outcome,
        "reason": reason,
        "check_mode": bool(rollout.check_mode),
        "summary": {status: summary[status] for status in STATUSES if status in summary},
        "serial": rollout.serial,
        "max_fail_percentage": max_fail,
        "batches": [{"batch": i, "hosts": list(batch),
                     "seconds": rollout.batch_seconds[i - 1] if i <= len(rollout.batch_seconds) else None}
                    for i, batch in enumerate(rollout.batches, 1)],
        "started": rollout.started,
        "finished": rollout.finished,
        "seconds": rollout.seconds,
        "hosts": rows,
        "errors": errors,
    }


def to_json(report):
    return json.dumps(report, indent=2, sort_keys=False, default=str) + "\n"


def summary_line(report):
    counts = ", ".join("%s %d" % (status, count) for status, count in report["summary"].items())
    line = "rollout %s%s: %s" % (report["outcome"], " (check mode)" if report["check_mode"] else "", counts or "no hosts")
    if report.get("seconds") is not None:
        line += " in %.1f s" % report["seconds"]
    return line


def batch_list(report):
    """The batches as Ansible ran them, e.g. ``1: h1; 2: h2, h3``."""
    return "; ".join("%d: %s" % (b["batch"], ", ".join(b["hosts"])) for b in report["batches"]) or "none"


def _cell(value):
    return "-" if value in (None, "", []) else str(value)


def _short(text, limit):
    return text if len(text) <= limit else text[: limit - 3] + "..."


# The start of the role's failure messages, which the table's own columns already say (the host, that it failed).
ROLE_PREFIX = re.compile(r"^(llm_server: )?(the deploy on \S+ failed: )?")


def table(report, width=132):
    """The short table the play's output ends with: one line per host, then the outcome; a message is cut to fit
    after the role's own prefix is dropped (rollout.md and rollout.json keep it whole)."""
    heads = ("HOST", "BATCH", "STATUS", "PATTERN", "MESSAGE")
    rows = [(row["host"], _cell(row["batch"]), row["status"], _short(_cell(row["pattern"]), 32),
             ROLE_PREFIX.sub("", row["message"])) for row in report["hosts"]]
    widths = [max([len(heads[i])] + [len(r[i]) for r in rows]) for i in range(4)]
    lines = []
    for cells in [heads] + rows:
        head = "  ".join(cells[i].ljust(widths[i]) for i in range(4))
        lines.append((head + "  " + _short(cells[4], max(width - len(head) - 2, 20))).rstrip())
    lines.append(summary_line(report))
    if report["reason"]:
        lines.append("stopped: " + report["reason"])
    return "\n".join(lines)


def _md(text):
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("`", "\\`").replace("*", "\\*") \
        .replace("_", "\\_").replace("<", "&lt;")


def _md_code(text):
    return "`` %s ``" % str(text).replace("`", "'") if text else "-"


def markdown(report):
    """``rollout.md``: the outcome, one table row per host, then each host's memory plan per GPU."""
    out = ["# ai-llm rollout: %s" % report["outcome"], "", _md(summary_line(report)) + "."]
    if report["reason"]:
        out += ["", "Stopped: " + _md(report["reason"]) + "."]
    out += ["", "Batches as Ansible ran them (serial %s, llm_rollout_max_fail_percentage %s): %s." % (
        _md(json.dumps(report["serial"])), report["max_fail_percentage"],
        _md(batch_list(report)))]
    out += ["", "| host | batch | status | pattern | message |", "|---|---|---|---|---|"]
    for row in report["hosts"]:
        cells = (_md(row["host"]), _cell(row["batch"]), row["status"], _md_code(row["pattern"]), _md(row["message"]))
        out.append("| %s | %s | **%s** | %s | %s |" % cells)
    for row in report["hosts"]:
        views = memory_views(row.get("result"), row["host"])
        if not views["gpus"] and not views["host"]:
            continue
        out += ["", "## %s (%s)" % (_md(row["host"]), row["status"]), "",
                "| memory | planned MiB | measured MiB |", "|---|---|---|"]
        for gpu in views["gpus"]:
            out.append("| **GPU %s%s** (free before: %s) | %s | %s |" % (
                gpu["index"], " " + _md(gpu["name"]) if gpu["name"] else "", _mib(gpu["available"]),
                _mib(gpu["planned_total"]),
                _mib(gpu["measured_total"])))
            planned, measured = dict(gpu["planned"]), dict(gpu["measured"] or [])
            for kind in ("model", "kv", "recurrent", "compute", "margin", "other", "free"):
                if kind in planned or kind in measured:
                    out.append("| %s | %s | %s |" % (KIND_LABELS[kind], _mib(planned.get(kind)),
                                                     _mib(measured.get(kind))))
        if views["host"]:
            ram = views["host"]
            out.append("| **host RAM** (available: %s) | experts %s | CPU model buffers %s |" % (
                _mib(ram["available"]), _mib(ram["planned"]), _mib(ram["measured"])))
    return "\n".join(out) + "\n"


def _mib(value):
    return "-" if value is None else "{:,.1f}".format(value)


# ---------------------------------------------------------------------------------------------- memory views
PLANNED_KINDS = (("model", "model_mib"), ("kv", "kv_mib"), ("recurrent", "recurrent_mib"),
                 ("compute", "compute_mib"), ("margin", "margin_mib"))
KIND_LABELS = {"model": "weights", "kv": "KV cache", "recurrent": "recurrent state", "compute": "compute",
               "margin": "margin", "other": "other (CUDA context...)", "free": "free", "overflow": "missing",
               "experts": "routed experts"}


def _number(value, where):
    """``value`` as a float (``None`` stays ``None``), or ``ReportError`` naming ``where``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ReportError("%s is %r, not a number of MiB" % (where, value))
    try:
        return float(value)
    except ValueError:
        raise ReportError("%s is %r, not a number of MiB" % (where, value)) from None


def _mapping(value, where):
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ReportError("%s is %s, not a dict" % (where, type(value).__name__))
    return value


def device_buffers(buffers, where="buffers"):
    """llama-server's buffers as ``{device: {model, kv, rs, compute}}`` (MiB).

    Takes them kind first (``{"model": {"CUDA0": 1369.4}, "kv": {...}}``, the shape of ``llama_server_log``'s
    ``*_buffers``), device first (``{"CUDA0": {"model": 1369.4, "kv": 768.0}}``) or as a list of
    ``{"device": ..., "model": ...}``.
    """
    if buffers is None:
        return {}
    if isinstance(buffers, list):
        items = {}
        for i, item in enumerate(buffers):
            item = _mapping(item, "%s[%d]" % (where, i))
            name = str(item.get("device") or item.get("buffer") or i)
            items[name] = {k: v for k, v in item.items() if k not in ("device", "buffer")}
        buffers = items
    buffers = _mapping(buffers, where)
    kinds = {"model": "model", "kv": "kv", "rs": "rs", "recurrent": "rs", "compute": "compute"}
    out = {}
    if buffers and all(key in kinds for key in buffers):
        for kind, per_device in buffers.items():
            for device, mib in _mapping(per_device, "%s.%s" % (where, kind)).items():
                out.setdefault(str(device), {})[kinds[kind]] = _number(mib, "%s.%s.%s" % (where, kind, device))
        return out
    for device, per_kind in buffers.items():
        for kind, mib in _mapping(per_kind, "%s.%s" % (where, device)).items():
            if kind in kinds:
                out.setdefault(str(device), {})[kinds[kind]] = _number(mib, "%s.%s.%s" % (where, device, kind))
    return out


def memory_views(result, host="host"):
    """What the page draws for one host: per GPU the planned and measured stacks, and the host RAM.

    ``{"gpus": [{index, name, available, planned: [(kind, MiB)...], planned_total, overflow,
    measured: [(kind, MiB)...] or None, measured_total, used, vram_ok}], "host": {available, planned, measured}
    or None}``. Planned comes from ``plan.gpus`` (weights, KV, recurrent, compute, margin, then the free rest
    of ``free_mib``); measured from llama-server's own buffers for that device (``CUDA<i>`` for the i-th GPU
    of the plan) and, when the role measured it, the GPU memory the container took (``vram[].used_mib``: what
    exceeds the buffers is ``other``).
    """
    result = _mapping(result, "%s: llm_server_result" % host)
    where = "%s: llm_server_result" % host
    plan = _mapping(result.get("plan"), where + ".plan")
    gpus = plan.get("gpus") or []
    if not isinstance(gpus, list):
        raise ReportError("%s.plan.gpus is %s, not a list" % (where, type(gpus).__name__))
    buffers = device_buffers(result.get("buffers"), where + ".buffers")
    by_number = {}
    host_side = 0.0
    host_seen = False
    for device, kinds in buffers.items():
        match = GPU_BUFFER.match(device)
        if match:
            by_number.setdefault(int(match.group(2)), {}).update(kinds)
        elif kinds.get("model") is not None:
            host_side += kinds["model"]
            host_seen = True
    vram = result.get("vram") or []
    if not isinstance(vram, list):
        vram = []       # the role writes a sentence instead of rows where it measured nothing
    views = []
    for i, gpu in enumerate(gpus):
        gwhere = "%s.plan.gpus[%d]" % (where, i)
        gpu = _mapping(gpu, gwhere)
        planned = [(kind, _number(gpu.get(key), "%s.%s" % (gwhere, key)) or 0.0) for kind, key in PLANNED_KINDS]
        total = _number(gpu.get("total_mib"), gwhere + ".total_mib")
        total = sum(pair[1] for pair in planned) if total is None else total
        available = _number(gpu.get("free_mib"), gwhere + ".free_mib")
        free_after = None if available is None else available - total
        planned.append(("free", max(free_after or 0.0, 0.0)))
        row = next((r for r in vram if isinstance(r, dict) and r.get("index") == gpu.get("index")), None) \
            if gpu.get("index") is not None else None  # (without an index, the row in the same place)
        if row is None and i < len(vram) and isinstance(vram[i], dict):
            row = vram[i]
        used = _number((row or {}).get("used_mib"), "%s.vram[%d].used_mib" % (where, i))
        logged = by_number.get(i)
        measured = None
        measured_total = used
        if logged or used is not None:
            measured = [(kind, (logged or {}).get(key)) for kind, key in
                        (("model", "model"), ("kv", "kv"), ("recurrent", "rs"), ("compute", "compute"))]
            measured = [(kind, mib or 0.0) for kind, mib in measured]
            in_buffers = sum(pair[1] for pair in measured)
            if used is not None and used > in_buffers:
                measured.append(("other", used - in_buffers))
            measured_total = used if used is not None else in_buffers
            if available is not None:
                measured.append(("free", max(available - measured_total, 0.0)))
        views.append({
            "index": gpu.get("index", i), "name": gpu.get("name"), "available": available,
            "planned": planned, "planned_total": total,
            "overflow": max(-free_after, 0.0) if free_after is not None else 0.0,
            "measured": measured, "measured_total": measured_total, "used": used,
            "vram_ok": (row or {}).get("ok"),
        })
    ram = _mapping(plan.get("host"), where + ".plan.host")
    experts = _number(ram.get("experts_mib"), where + ".plan.host.experts_mib")
    available = _number(ram.get("available_mib"), where + ".plan.host.available_mib")
    host_view = None
    if experts is not None or available is not None or host_seen:
        host_view = {"available": available, "planned": experts, "measured": host_side if host_seen else None}
    return {"gpus": views, "host": host_view}
