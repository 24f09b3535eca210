# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollout report: one row per host, from what the llm_server role published and what Ansible did.

Standard library only. The callback plugin ``ai_llm.moe_offload.rollout_report`` records, per host, a
``HostRun`` (its serial batch, the last ``llm_server_result`` it published, the failure or unreachable message
that ended its run); ``build_report`` turns those into the dict written as ``rollout.json``; ``markdown`` and
``table`` render it as text (with each host's memory from ``_rollout_memory``), ``_rollout_page.page`` as the
HTML page.

A host's status:

- ``unreachable``: Ansible lost it (in the preflight or in its batch);
- its ``llm_server_result.status`` from its batch (``changed``, ``unchanged``, ``failed``, ``rolled_back``,
  ``checked``), except ``failed`` when a later task of the play failed on it;
- ``unchanged`` from the preflight: it already ran this configuration, verified, and joined no batch;
- ``failed``: its run ended with an Ansible failure (a plan refused in the preflight, an error outside the role),
  or its batch stopped before the role published a result on it;
- ``not_reached``: the rollout stopped before its batch; nothing was done on it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import mib, mib_text, shorten
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._rollout_memory import (
    KIND_LABELS, ReportError, memory_views)

STATUSES = ("changed", "unchanged", "checked", "rolled_back", "failed", "unreachable", "not_reached")
ROLE_STATUSES = ("changed", "unchanged", "failed", "rolled_back", "checked")
OK_STATUSES = ("changed", "unchanged", "checked")


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
    return shorten(re.sub(r"\s+", " ", str(text or "")).strip(), limit)


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
    if result is not None and result["status"] == "unchanged" and run.failure is None:
        return "unchanged", one_line(result.get("message") or "unchanged")  # the preflight's: it joined no batch
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


def _figure(value):
    return round(float(value), 1) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def host_speed(result):
    """``{"decode": {"before", "after"}, "prompt": {...}}`` in tokens/s from ``llm_server_result.speed`` (after: what
    runs, before: the last verified configuration's), None where the result has none."""
    speed = (result or {}).get("speed")
    if not isinstance(speed, dict):
        return {"decode": {"before": None, "after": None}, "prompt": {"before": None, "after": None}}
    previous = speed.get("previous") if isinstance(speed.get("previous"), dict) else {}
    return {kind: {"before": _figure(previous.get(kind + "_tokens_per_second")),
                   "after": _figure(speed.get(kind + "_tokens_per_second"))} for kind in ("decode", "prompt")}


def speed_text(figures):
    """``before -> after`` tokens/s, ``after`` alone without a before, ``-`` without either."""
    if figures["after"] is None:
        return "-"
    return "%s -> %s" % (figures["before"], figures["after"]) if figures["before"] is not None \
        else str(figures["after"])


def fleet_decode(rows):
    """The fleet's decode tokens/s: the sum over the hosts that serve (a status in OK_STATUSES) with a speed."""
    figures = [row["speed"]["decode"]["after"] for row in rows
               if row["status"] in OK_STATUSES and row["speed"]["decode"]["after"] is not None]
    return round(sum(figures), 1) if figures else None


def host_fetch(result):
    """``{"bytes", "seconds"}`` of the model this run fetched onto the host (``llm_server_result.model_fetch``),
    or None when it fetched nothing."""
    fetched = (result or {}).get("model_fetch")
    if not isinstance(fetched, dict) or not fetched.get("bytes"):
        return None
    return {"bytes": fetched["bytes"], "seconds": fetched.get("seconds")}


def fetch_text(fetched):
    """A fetch as the table writes it: ``1,234.5 MiB in 12.3 s``, ``-`` for none."""
    if not fetched:
        return "-"
    return "%s in %.1f s" % (mib_text(mib(fetched["bytes"]), unit=" MiB"), fetched.get("seconds") or 0)


def has_fetch(report):
    """Whether a host of ``report`` fetched its model in this run: the table and rollout.md show the column then."""
    return any(row.get("fetch") for row in report["hosts"])


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
        "speed": host_speed(result),
        "fetch": host_fetch(result),
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
        "fleet_decode_tokens_per_second": fleet_decode(rows),
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
    if report.get("fleet_decode_tokens_per_second") is not None:
        line += "; fleet decode %s tokens/s" % report["fleet_decode_tokens_per_second"]
    return line


def batch_list(report):
    """The batches as Ansible ran them, e.g. ``1: h1; 2: h2, h3``."""
    return "; ".join("%d: %s" % (b["batch"], ", ".join(b["hosts"])) for b in report["batches"]) or "none"


def _cell(value):
    return "-" if value in (None, "", []) else str(value)


# The start of the role's failure messages, which the table's own columns already say (the host, that it failed).
ROLE_PREFIX = re.compile(r"^(llm_server: )?(the deploy on \S+ failed: )?")


def has_speed(report):
    """Whether a host of ``report`` has a measured speed: the table and rollout.md show the speed columns then."""
    return any(((row.get("speed") or {}).get("decode") or {}).get("after") is not None for row in report["hosts"])


def table(report, width=132):
    """The short table the play's output ends with: one line per host (with the decode and prompt tokens/s, before
    -> after, when a host has them), then the outcome; a message is cut to fit after the role's own prefix is
    dropped (rollout.md and rollout.json keep it whole)."""
    speeds, fetches = has_speed(report), has_fetch(report)
    heads = ("HOST", "BATCH", "STATUS", "PATTERN") + (("DECODE TOK/S", "PROMPT TOK/S") if speeds else ()) \
        + (("MODEL FETCHED",) if fetches else ()) + ("MESSAGE",)
    rows = [(row["host"], _cell(row["batch"]), row["status"], shorten(_cell(row["pattern"]), 32))
            + ((speed_text(row["speed"]["decode"]), speed_text(row["speed"]["prompt"])) if speeds else ())
            + ((fetch_text(row.get("fetch")),) if fetches else ())
            + (ROLE_PREFIX.sub("", row["message"]),) for row in report["hosts"]]
    columns = len(heads) - 1
    widths = [max([len(heads[i])] + [len(r[i]) for r in rows]) for i in range(columns)]
    lines = []
    for cells in [heads] + rows:
        head = "  ".join(cells[i].ljust(widths[i]) for i in range(columns))
        lines.append((head + "  " + shorten(cells[columns], max(width - len(head) - 2, 20))).rstrip())
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
    speeds, fetches = has_speed(report), has_fetch(report)
    heads = ["host", "batch", "status", "pattern"] + (["decode tokens/s", "prompt tokens/s"] if speeds else []) \
        + (["model fetched"] if fetches else []) + ["message"]
    out += ["", "| %s |" % " | ".join(heads), "|%s" % ("---|" * len(heads))]
    for row in report["hosts"]:
        cells = [_md(row["host"]), _cell(row["batch"]), "**%s**" % row["status"], _md_code(row["pattern"])] \
            + ([_md(speed_text(row["speed"]["decode"])), _md(speed_text(row["speed"]["prompt"]))] if speeds else []) \
            + ([_md(fetch_text(row.get("fetch")))] if fetches else []) + [_md(row["message"])]
        out.append("| %s |" % " | ".join(cells))
    for row in report["hosts"]:
        views = memory_views(row.get("result"), row["host"])
        if not views["gpus"] and not views["host"]:
            continue
        out += ["", "## %s (%s)" % (_md(row["host"]), row["status"]), "",
                "| memory | planned MiB | measured MiB |", "|---|---|---|"]
        for gpu in views["gpus"]:
            out.append("| **GPU %s%s** (free before: %s) | %s | %s |" % (
                gpu["index"], " " + _md(gpu["name"]) if gpu["name"] else "", mib_text(gpu["available"]),
                mib_text(gpu["planned_total"]),
                mib_text(gpu["measured_total"])))
            planned, measured = dict(gpu["planned"]), dict(gpu["measured"] or [])
            for kind in ("model", "kv", "recurrent", "compute", "margin", "other", "free"):
                if kind in planned or kind in measured:
                    out.append("| %s | %s | %s |" % (KIND_LABELS[kind], mib_text(planned.get(kind)),
                                                     mib_text(measured.get(kind))))
        if views["host"]:
            ram = views["host"]
            out.append("| **host RAM** (available: %s) | experts %s | CPU model buffers %s |" % (
                mib_text(ram["available"]), mib_text(ram["planned"]), mib_text(ram["measured"])))
    return "\n".join(out) + "\n"
