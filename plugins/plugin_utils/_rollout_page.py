# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``rollout.html``: the rollout report as one self-contained page (inline CSS and SVG, fetches nothing).

Standard library only. ``page(report)`` takes the dict of ``_rollout_report.build_report``. Per host: its
status, batch, pattern and message, and a chart with, per GPU, two stacked columns side by side (planned:
weights, KV cache, recurrent state, compute, margin, free; measured: llama-server's own buffers, the rest of
the GPU memory the container took, free), then the host RAM (the routed experts planned, the CPU model
buffers llama-server logged). All GPU columns of the page share one scale, all host-RAM columns another, so
that hosts compare at a glance. Every drawn segment is a ``<rect>`` with ``data-column``, ``data-kind`` and
``data-mib``; a Content-Security-Policy forbids any fetch.
"""

from __future__ import annotations

from html import escape

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import mib_text
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._rollout_memory import KIND_LABELS, memory_views
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._rollout_report import (
    batch_list, has_speed, speed_text, summary_line)

COLORS = {
    "model": "#4e79a7", "kv": "#f28e2b", "recurrent": "#76b7b2", "compute": "#e15759", "margin": "#bab0ac",
    "other": "#b07aa1", "free": "#f4f6f8", "overflow": "#d62728", "experts": "#59a14f",
}
STATUS_COLORS = {
    "changed": "#2e7d32", "unchanged": "#546e7a", "checked": "#1565c0", "rolled_back": "#e65100",
    "failed": "#c62828", "unreachable": "#6a1b9a", "not_reached": "#8d8d8d",
}
CSP = "default-src 'none'; style-src 'unsafe-inline'"
BAR_HEIGHT = 200        # px of the tallest column of a scale
COLUMN = 58             # px width of a column
GAP = 10                # px between the planned and the measured column
GROUP = 180             # px width of a group (one GPU, or the host RAM) with the space after it
TOP = 40                # px above the columns (the group's title and what was free)
BOTTOM = 36             # px below them (the column's name and total)
STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:24px;color:#1d2329;
background:#fff}
h1{font-size:22px;margin:0 0 6px}h2{font-size:17px;margin:0}
.summary{margin:6px 0 14px}.reason{color:#b71c1c;font-weight:600}
.chip,.status{display:inline-block;border-radius:10px;padding:1px 9px;color:#fff;font-size:12px;font-weight:600;
margin-right:4px}
table.hosts{border-collapse:collapse;margin:10px 0 18px;width:100%}
table.hosts th,table.hosts td{border-bottom:1px solid #e3e6ea;padding:4px 8px;text-align:left;vertical-align:top}
table.hosts td:nth-child(-n+3){white-space:nowrap}
table.hosts th{background:#f4f6f8;font-size:12px;text-transform:uppercase;letter-spacing:.03em}
code{font:12px/1.4 ui-monospace,"DejaVu Sans Mono",monospace;background:#f4f6f8;padding:1px 4px;border-radius:3px;
word-break:break-all}
.legend{display:flex;flex-wrap:wrap;gap:14px;margin:6px 0 18px;font-size:12px}
.legend span{display:inline-flex;align-items:center;gap:5px}
.legend i{display:inline-block;width:14px;height:14px;border:1px solid #9aa3ab}
section.host{border:1px solid #dde1e5;border-radius:6px;padding:12px 14px;margin:0 0 14px}
section.host header{display:flex;flex-wrap:wrap;align-items:center;gap:10px;margin-bottom:4px}
.batch{color:#5f6b76;font-size:13px}.message{margin:4px 0 2px;color:#37414a}.facts{margin:0 0 8px;color:#5f6b76;
font-size:12px}
.none{color:#7a858f;font-style:italic}
svg.chart text{font:11px system-ui,"DejaVu Sans",sans-serif;fill:#37414a}
svg.chart text.title{font-weight:600;font-size:12px}svg.chart text.total{fill:#5f6b76;font-size:10px}
details.numbers{font-size:12px;margin-top:4px}details.numbers table{border-collapse:collapse}
details.numbers th,details.numbers td{padding:2px 8px;text-align:right;border-bottom:1px solid #eef0f2}
"""


def _e(text):
    return escape("" if text is None else str(text), quote=True)


def _mib(value):
    """The page's MiB: whole, with the unit (the tables of rollout.md keep one decimal)."""
    return mib_text(value, decimals=0, unit=" MiB")


def _status(status):
    return '<span class="status s-%s" style="background:%s">%s</span>' % (
        _e(status), STATUS_COLORS.get(status, "#555"), _e(status))


def _column(x, column, segments, scale, group, total_label):
    """One stacked column at ``x``: ``segments`` [(kind, MiB)] bottom up, its name and total below it."""
    parts = ['<g class="column" data-column="%s" data-group="%s">' % (_e(column), _e(group))]
    y = TOP + BAR_HEIGHT
    for kind, mib in segments:
        height = mib * scale
        if height <= 0:
            continue
        y -= height
        stroke = ' stroke="#c3c9cf"' if kind == "free" else ""
        parts.append('<rect class="seg k-%s" data-group="%s" data-column="%s" data-kind="%s" data-mib="%.1f" '
                     'x="%d" y="%.2f" width="%d" height="%.2f" fill="%s"%s><title>%s %s: %s</title></rect>' % (
                         kind, _e(group), _e(column), kind, mib, x, y, COLUMN, height, COLORS[kind], stroke,
                         _e(column), _e(KIND_LABELS[kind]), _e(_mib(mib))))
    parts.append(_labels(x, column, total_label))
    parts.append("</g>")
    return "".join(parts)


def _labels(x, column, total_label):
    middle = x + COLUMN / 2
    return ('<text x="%.1f" y="%d" text-anchor="middle">%s</text><text class="total" x="%.1f" y="%d" '
            'text-anchor="middle">%s</text>' % (middle, TOP + BAR_HEIGHT + 14, _e(column), middle,
                                                TOP + BAR_HEIGHT + 28, _e(total_label)))


def _empty_column(x, column, group, note):
    middle, centre = x + COLUMN / 2, TOP + BAR_HEIGHT / 2
    return ('<g class="column" data-column="%s" data-group="%s"><rect class="empty" x="%d" y="%d" width="%d" '
            'height="%d" fill="none" stroke="#c3c9cf" stroke-dasharray="4 3"/><text x="%.1f" y="%d" '
            'text-anchor="middle" transform="rotate(-90 %.1f %d)">%s</text>%s</g>' % (
                _e(column), _e(group), x, TOP, COLUMN, BAR_HEIGHT, middle, centre, middle, centre, _e(note),
                _labels(x, column, "")))


def _gpu_group(x, gpu, scale):
    group = "gpu%s" % gpu["index"]
    parts = ['<g class="gpu" data-gpu="%s" data-available-mib="%s">' % (
        _e(gpu["index"]), "" if gpu["available"] is None else "%.1f" % gpu["available"])]
    parts.append('<text class="title" x="%d" y="13">GPU %s %s</text>' % (x, _e(gpu["index"]), _e(gpu["name"] or "")))
    parts.append('<text x="%d" y="28">free before: %s</text>' % (x, _e(_mib(gpu["available"]))))
    parts.append(_column(x, "planned", gpu["planned"], scale, group, _mib(gpu["planned_total"])))
    if gpu["overflow"] > 0:
        # the part of the planned stack above what was free: drawn over it, not added to it
        top = TOP + BAR_HEIGHT - gpu["planned_total"] * scale
        parts.append('<rect class="over" data-column="planned" data-kind="overflow" data-overlay="1" '
                     'data-mib="%.1f" x="%d" y="%.2f" width="%d" height="%.2f" fill="%s" fill-opacity="0.35" '
                     'stroke="%s"><title>planned beyond the free memory: %s</title></rect>' % (
                         gpu["overflow"], x, top, COLUMN, gpu["overflow"] * scale, COLORS["overflow"],
                         COLORS["overflow"], _e(_mib(gpu["overflow"]))))
    if gpu["measured"] is None:
        parts.append(_empty_column(x + COLUMN + GAP, "measured", group, "not measured"))
    else:
        parts.append(_column(x + COLUMN + GAP, "measured", gpu["measured"], scale, group,
                             _mib(gpu["measured_total"])))
    if gpu["available"] is not None:
        level = TOP + BAR_HEIGHT - gpu["available"] * scale
        parts.append('<line class="available" x1="%d" x2="%d" y1="%.2f" y2="%.2f" stroke="#37414a" '
                     'stroke-dasharray="3 2"/>' % (x - 3, x + 2 * COLUMN + GAP + 3, level, level))
    parts.append("</g>")
    return "".join(parts)


def _ram_group(x, ram, scale):
    parts = ['<g class="host-ram" data-available-mib="%s">' % (
        "" if ram["available"] is None else "%.1f" % ram["available"])]
    parts.append('<text class="title" x="%d" y="13">host RAM</text>' % x)
    parts.append('<text x="%d" y="28">available: %s</text>' % (x, _e(_mib(ram["available"]))))
    for offset, column, mib in ((0, "planned", ram["planned"]), (COLUMN + GAP, "measured", ram["measured"])):
        if mib is None:
            parts.append(_empty_column(x + offset, column, "host", "not measured"))
            continue
        segments = [("experts", mib)]
        if ram["available"] is not None:
            segments.append(("free", max(ram["available"] - mib, 0.0)))
        parts.append(_column(x + offset, column, segments, scale, "host", _mib(mib)))
    parts.append("</g>")
    return "".join(parts)


def _chart(host, views, gpu_scale, ram_scale):
    """The SVG of one host: a group per GPU (planned | measured), then the host RAM (planned | measured)."""
    parts = [_gpu_group(10 + i * GROUP, gpu, gpu_scale) for i, gpu in enumerate(views["gpus"])]
    if views["host"] is not None:
        parts.append(_ram_group(10 + len(views["gpus"]) * GROUP, views["host"], ram_scale))
    width = 10 + len(parts) * GROUP
    height = TOP + BAR_HEIGHT + BOTTOM
    return ('<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
            'role="img" aria-label="memory of %s">%s</svg>' % (width, height, width, height, _e(host), "".join(parts)))


def _numbers(views):
    """The figures behind the chart, planned and measured, as a small table."""
    rows = []
    for gpu in views["gpus"]:
        planned, measured = dict(gpu["planned"]), dict(gpu["measured"] or [])
        cells = "".join("<td>%s / %s</td>" % (_e(_mib(planned.get(k))), _e(_mib(measured.get(k))))
                        for k in ("model", "kv", "recurrent", "compute", "margin", "other", "free"))
        rows.append("<tr><th>GPU %s</th>%s</tr>" % (_e(gpu["index"]), cells))
    if not rows:
        return ""
    heads = "".join("<th>%s</th>" % _e(KIND_LABELS[k])
                    for k in ("model", "kv", "recurrent", "compute", "margin", "other", "free"))
    return ('<details class="numbers"><summary>MiB, planned / measured</summary><table><tr><th></th>%s</tr>%s'
            "</table></details>" % (heads, "".join(rows)))


def _facts(result):
    """One line of what the role measured: the config hash, the tensors moved, the rollback, the timings."""
    out = []
    if result.get("config_hash"):
        out.append("config %s" % str(result["config_hash"])[:12])
    moved = result.get("tensors_moved")
    if isinstance(moved, list) and moved:
        out.append("%d tensor%s on the CPU (llama-server's log)" % (len(moved), "" if len(moved) == 1 else "s"))
    rollback = result.get("rollback") or {}
    if isinstance(rollback, dict) and rollback.get("performed"):
        out.append("rolled back from %s" % (rollback.get("restored_from") or "the snapshot"))
    timings = result.get("timings") or {}
    if isinstance(timings, dict) and timings.get("total") is not None:
        parts = ["%s %.1f s" % (k, timings[k]) for k in ("recreate", "health") if timings.get(k) is not None]
        out.append("%.1f s%s" % (timings["total"], " (%s)" % ", ".join(parts) if parts else ""))
    return out


def _scales(all_views):
    gpu_top = [1.0]
    ram_top = [1.0]
    for views in all_views:
        for gpu in views["gpus"]:
            gpu_top += [gpu["available"] or 0.0, gpu["planned_total"] or 0.0, gpu["measured_total"] or 0.0]
        if views["host"]:
            ram_top += [views["host"][k] or 0.0 for k in ("available", "planned", "measured")]
    return BAR_HEIGHT / max(gpu_top), BAR_HEIGHT / max(ram_top)


def _legend():
    kinds = ("model", "kv", "recurrent", "compute", "margin", "other", "free", "overflow", "experts")
    return '<div class="legend">%s</div>' % "".join(
        '<span><i style="background:%s"></i>%s</span>' % (COLORS[k], _e(KIND_LABELS[k])) for k in kinds)


def page(report, title="ai-llm rollout"):
    """The whole HTML page of a report dict."""
    all_views = [memory_views(row.get("result"), row["host"]) if row.get("result") else {"gpus": [], "host": None}
                 for row in report["hosts"]]
    gpu_scale, ram_scale = _scales(all_views)
    out = ['<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
           '<meta http-equiv="Content-Security-Policy" content="%s">' % CSP,
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           "<title>%s: %s</title><style>%s</style></head><body>" % (_e(title), _e(report["outcome"]), STYLE),
           '<h1>%s: <span class="outcome">%s</span></h1>' % (_e(title), _e(report["outcome"])),
           '<p class="summary">%s</p>' % "".join(
               '<span class="chip" style="background:%s">%s %d</span>' % (STATUS_COLORS[s], _e(s), n)
               for s, n in report["summary"].items())]
    if report.get("reason"):
        out.append('<p class="reason">stopped: %s</p>' % _e(report["reason"]))
    out.append("<p>%s. Batches as Ansible ran them: %s. Started %s, finished %s.</p>" % (
        _e(summary_line(report)),
        _e(batch_list(report)),
        _e(report.get("started") or "-"), _e(report.get("finished") or "-")))
    speeds = has_speed(report)
    out.append('<table class="hosts"><thead><tr><th>host</th><th>batch</th><th>status</th><th>pattern</th>%s'
               "<th>message</th></tr></thead><tbody>" % (
                   "<th>decode tokens/s</th><th>prompt tokens/s</th>" if speeds else ""))
    for row in report["hosts"]:
        speed = "<td>%s</td><td>%s</td>" % (_e(speed_text(row["speed"]["decode"])),
                                            _e(speed_text(row["speed"]["prompt"]))) if speeds else ""
        out.append('<tr data-host="%s"><td><a href="#host-%s">%s</a></td><td>%s</td><td>%s</td><td>%s</td>%s'
                   "<td>%s</td></tr>" % (
                       _e(row["host"]), _e(row["host"]), _e(row["host"]), _e(row["batch"] or "-"),
                       _status(row["status"]), "<code>%s</code>" % _e(row["pattern"]) if row["pattern"] else "-",
                       speed, _e(row["message"])))
    out.append("</tbody></table>")
    out.append(_legend())
    for row, views in zip(report["hosts"], all_views):
        out.append('<section class="host" id="host-%s" data-host="%s" data-status="%s"><header><h2>%s</h2>%s'
                   '<span class="batch">%s</span></header>' % (
                       _e(row["host"]), _e(row["host"]), _e(row["status"]), _e(row["host"]), _status(row["status"]),
                       _e("batch %s" % row["batch"] if row["batch"] else "no batch")))
        source = (" (from the %s)" % row["pattern_source"]) if row["pattern"] and row.get("pattern_source") else ""
        out.append('<div class="pattern">pattern%s: %s</div>' % (
            _e(source), "<code>%s</code>" % _e(row["pattern"]) if row["pattern"] else '<span class="none">none'
                                                                                      "</span>"))
        out.append('<p class="message">%s</p>' % _e(row["message"]))
        facts = _facts(row.get("result") or {})
        if facts:
            out.append('<p class="facts">%s</p>' % _e(" · ".join(facts)))
        if views["gpus"] or views["host"]:
            out.append(_chart(row["host"], views, gpu_scale, ram_scale) + _numbers(views))
        else:
            out.append('<p class="none">no memory plan published for this host</p>')
        out.append("</section>")
    out.append("</body></html>\n")
    return "\n".join(out)
