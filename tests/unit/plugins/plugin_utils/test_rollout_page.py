"""rollout.html as written: self-contained, escaped, one section and one chart per host, segments to scale."""
from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._rollout_page import CSP, page
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils import _rollout_page as rp
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._rollout_memory import memory_views
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._rollout_report import HostRun, Rollout, build_report
from tests.helpers import rollout_samples as samples
from tests.helpers.rollout_samples import error_of


class Elements(HTMLParser):
    """Every start tag as (tag, attributes dict), in document order."""

    def __init__(self, text):
        super().__init__()
        self.tags = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def test_the_page_fetches_nothing():
    tags = Elements(page(samples.sample_report())).tags
    assert ("meta", {"http-equiv": "Content-Security-Policy", "content": CSP}) in tags
    assert not [t for t, a in tags if t in ("script", "link", "img", "iframe", "object", "embed")]
    assert not [a for t, a in tags if any(k in ("src", "srcset", "action") for k in a)]
    # the only URL in an attribute is SVG's namespace name (a URL in a host's message is text); links stay inside
    urls = {v for t, a in tags for v in a.values() if v and re.match(r"\w+://", v)}
    assert urls == {"http://www.w3.org/2000/svg"}
    assert all(a["href"].startswith("#host-") for t, a in tags if t == "a")


# --- the page's parts, one by one, rendered exactly ---------------------------------------------------------------

LABELS_OF_PLANNED = ('<text x="39.0" y="254" text-anchor="middle">planned</text>'
                     '<text class="total" x="39.0" y="268" text-anchor="middle">151 MiB</text>')


@pytest.mark.parametrize("render, value, text", [
    # text is escaped with its quotes, None is empty
    (rp._e, None, ""), (rp._e, "", ""), (rp._e, 0, "0"),
    (rp._e, '<a href="x">&\'', "&lt;a href=&quot;x&quot;&gt;&amp;&#x27;"),
    # MiB are a whole number with thousands, or a dash
    (rp._mib, None, "-"), (rp._mib, 0, "0 MiB"), (rp._mib, 0.4, "0 MiB"), (rp._mib, 1234.6, "1,235 MiB"),
    (rp._mib, 24148.0, "24,148 MiB")])
def test_text_and_mib(render, value, text):
    assert render(value) == text


@pytest.mark.parametrize("status, shown, color", [
    ("changed", "changed", "#2e7d32"), ("unchanged", "unchanged", "#546e7a"), ("checked", "checked", "#1565c0"),
    ("rolled_back", "rolled_back", "#e65100"), ("failed", "failed", "#c62828"),
    ("unreachable", "unreachable", "#6a1b9a"), ("not_reached", "not_reached", "#8d8d8d"),
    ("odd<1>", "odd&lt;1&gt;", "#555")])             # an unknown status is a grey chip, escaped
def test_a_status_is_a_chip_in_its_own_color(status, shown, color):
    assert rp._status(status) == '<span class="status s-%s" style="background:%s">%s</span>' % (shown, color, shown)


def test_a_column_stacks_its_segments_bottom_up_skips_the_empty_ones_and_escapes_its_labels():
    """Heights are MiB times the scale from the bottom line (y 240); zero or negative segments are not drawn,
    a segment of half a pixel is; the free part has a border; name and total sit centred under the column."""
    segments = [("model", 100.0), ("kv", 0.0), ("recurrent", 1.0), ("compute", -4.0), ("free", 50.0)]
    assert rp._column(10, "planned", segments, 0.5, "gpu0", "151 MiB") == (
        '<g class="column" data-column="planned" data-group="gpu0">'
        '<rect class="seg k-model" data-group="gpu0" data-column="planned" data-kind="model" data-mib="100.0" '
        'x="10" y="190.00" width="58" height="50.00" fill="#4e79a7"><title>planned weights: 100 MiB</title></rect>'
        '<rect class="seg k-recurrent" data-group="gpu0" data-column="planned" data-kind="recurrent" data-mib="1.0" '
        'x="10" y="189.50" width="58" height="0.50" fill="#76b7b2"><title>planned recurrent state: 1 MiB</title>'
        '</rect>'
        '<rect class="seg k-free" data-group="gpu0" data-column="planned" data-kind="free" data-mib="50.0" '
        'x="10" y="164.50" width="58" height="25.00" fill="#f4f6f8" stroke="#c3c9cf">'
        '<title>planned free: 50 MiB</title></rect>'
        + LABELS_OF_PLANNED + '</g>')
    # without segments it keeps its labels
    assert rp._column(10, "planned", [], 1.0, "gpu0", "151 MiB") == (
        '<g class="column" data-column="planned" data-group="gpu0">' + LABELS_OF_PLANNED + "</g>")
    # its name, group and total escaped
    assert rp._column(0, "a&b", [("experts", 2048.0)], 0.01, '"h"', "<2,048 MiB>") == (
        '<g class="column" data-column="a&amp;b" data-group="&quot;h&quot;">'
        '<rect class="seg k-experts" data-group="&quot;h&quot;" data-column="a&amp;b" data-kind="experts" '
        'data-mib="2048.0" x="0" y="219.52" width="58" height="20.48" fill="#59a14f">'
        '<title>a&amp;b routed experts: 2,048 MiB</title></rect>'
        '<text x="29.0" y="254" text-anchor="middle">a&amp;b</text>'
        '<text class="total" x="29.0" y="268" text-anchor="middle">&lt;2,048 MiB&gt;</text></g>')


def test_an_empty_column_is_a_dashed_frame_with_a_vertical_note_and_no_total():
    assert rp._empty_column(78, "measured", "gpu<0>", "not measured") == (
        '<g class="column" data-column="measured" data-group="gpu&lt;0&gt;">'
        '<rect class="empty" x="78" y="40" width="58" height="200" fill="none" stroke="#c3c9cf" '
        'stroke-dasharray="4 3"/><text x="107.0" y="140" text-anchor="middle" transform="rotate(-90 107.0 140)">'
        'not measured</text>'
        '<text x="107.0" y="254" text-anchor="middle">measured</text>'
        '<text class="total" x="107.0" y="268" text-anchor="middle"></text></g>')


def _gpu_view(index=0, name="NVIDIA RTX A5500", available=1000.0, planned=None, planned_total=600.0, overflow=0.0,
              measured=None, measured_total=None):
    return {"index": index, "name": name, "available": available,
            "planned": planned if planned is not None else [("model", 500.0), ("margin", 100.0), ("free", 400.0)],
            "planned_total": planned_total, "overflow": overflow, "measured": measured,
            "measured_total": measured_total}


MEASURED = [("model", 480.0), ("other", 70.0), ("free", 450.0)]


@pytest.mark.parametrize("x, gpu, scale, head, body", [
    # planned at x, measured one column and a gap to the right, the dashed line at what was free before
    (190, _gpu_view(index=1, name="RTX <A>", measured=MEASURED, measured_total=550.0), 0.1,
     ("1", "1000.0", "1 RTX &lt;A&gt;", "1,000 MiB"),
     rp._column(190, "planned", [("model", 500.0), ("margin", 100.0), ("free", 400.0)], 0.1, "gpu1", "600 MiB")
     + rp._column(258, "measured", MEASURED, 0.1, "gpu1", "550 MiB")
     + '<line class="available" x1="187" x2="319" y1="140.00" y2="140.00" stroke="#37414a" stroke-dasharray="3 2"/>'),
    # a plan that does not fit: the missing part drawn above the free line
    (10, _gpu_view(name="A", available=500.0, planned=[("model", 600.0)], overflow=100.0), 0.1,
     ("0", "500.0", "0 A", "500 MiB"),
     rp._column(10, "planned", [("model", 600.0)], 0.1, "gpu0", "600 MiB")
     + '<rect class="over" data-column="planned" data-kind="overflow" data-overlay="1" data-mib="100.0" '
       'x="10" y="180.00" width="58" height="10.00" fill="#d62728" fill-opacity="0.35" stroke="#d62728">'
       '<title>planned beyond the free memory: 100 MiB</title></rect>'
     + rp._empty_column(78, "measured", "gpu0", "not measured")
     + '<line class="available" x1="7" x2="139" y1="190.00" y2="190.00" stroke="#37414a" stroke-dasharray="3 2"/>'),
    # without a free figure or a name: no free line
    (370, _gpu_view(index=2, name=None, available=None, planned=[("model", 10.0), ("free", 0.0)], planned_total=10.0),
     1.0, ("2", "", "2 ", "-"),
     rp._column(370, "planned", [("model", 10.0), ("free", 0.0)], 1.0, "gpu2", "10 MiB")
     + rp._empty_column(438, "measured", "gpu2", "not measured")),
])
def test_a_gpu_group(x, gpu, scale, head, body):
    assert rp._gpu_group(x, gpu, scale) == (
        '<g class="gpu" data-gpu="%s" data-available-mib="%s"><text class="title" x="%d" y="13">GPU %s</text>'
        '<text x="%d" y="28">free before: %s</text>%s</g>' % (head[0], head[1], x, head[2], x, head[3], body))


def test_any_missing_memory_is_drawn_half_a_mib_too():
    assert 'data-overlay="1"' in rp._gpu_group(10, _gpu_view(overflow=0.5), 0.1)


@pytest.mark.parametrize("x, ram, scale, available, columns", [
    # the experts with what stays free of the available RAM
    (190, {"available": 1000.0, "planned": 300.0, "measured": 1200.0}, 0.1, ("1000.0", "1,000 MiB"),
     rp._column(190, "planned", [("experts", 300.0), ("free", 700.0)], 0.1, "host", "300 MiB")
     + rp._column(258, "measured", [("experts", 1200.0), ("free", 0.0)], 0.1, "host", "1,200 MiB")),
    # without an available figure no free part; a missing side is an empty column
    (10, {"available": None, "planned": None, "measured": 50.0}, 1.0, ("", "-"),
     rp._empty_column(10, "planned", "host", "not measured")
     + rp._column(78, "measured", [("experts", 50.0)], 1.0, "host", "50 MiB")),
    (10, {"available": 80.0, "planned": 20.0, "measured": None}, 1.0, ("80.0", "80 MiB"),
     rp._column(10, "planned", [("experts", 20.0), ("free", 60.0)], 1.0, "host", "20 MiB")
     + rp._empty_column(78, "measured", "host", "not measured")),
])
def test_host_ram_group(x, ram, scale, available, columns):
    assert rp._ram_group(x, ram, scale) == (
        '<g class="host-ram" data-available-mib="%s"><text class="title" x="%d" y="13">host RAM</text>'
        '<text x="%d" y="28">available: %s</text>%s</g>' % (available[0], x, x, available[1], columns))


def svg(width, label, body):
    return ('<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="%d" height="276" viewBox="0 0 %d 276" '
            'role="img" aria-label="memory of %s">%s</svg>' % (width, width, label, body))


def test_a_chart_has_one_group_per_gpu_then_the_host_ram_each_180_px_wide():
    first, second = _gpu_view(index=0), _gpu_view(index=1, measured=MEASURED, measured_total=550.0)
    ram = {"available": 4000.0, "planned": 100.0, "measured": None}
    assert rp._chart("a&b", {"gpus": [first, second], "host": ram}, 0.1, 0.05) == svg(
        550, "a&amp;b", rp._gpu_group(10, first, 0.1) + rp._gpu_group(190, second, 0.1) + rp._ram_group(370, ram, 0.05))
    # without host RAM, or without GPUs
    assert rp._chart("h", {"gpus": [first], "host": None}, 0.1, 0.05) == svg(190, "h", rp._gpu_group(10, first, 0.1))
    ram = dict(ram, measured=90.0)
    assert rp._chart("cpu", {"gpus": [], "host": ram}, 0.1, 0.05) == svg(190, "cpu", rp._ram_group(10, ram, 0.05))


NUMBER_HEADS = ("<th>weights</th><th>KV cache</th><th>recurrent state</th><th>compute</th><th>margin</th>"
                "<th>other (CUDA context...)</th><th>free</th>")


def test_the_numbers_table_has_planned_and_measured_per_kind_and_gpu():
    views = {"gpus": [
        {"index": 0, "planned": [("model", 1.0), ("kv", 2.0), ("recurrent", 3.0), ("compute", 4.0), ("margin", 5.0),
                                 ("free", 6.0)],
         "measured": [("model", 11.0), ("kv", 12.0), ("recurrent", 13.0), ("compute", 14.0), ("other", 15.0),
                      ("free", 16.0)]},
        {"index": "<1>", "planned": [("model", 1500.0)], "measured": None}], "host": None}
    assert rp._numbers(views) == (
        '<details class="numbers"><summary>MiB, planned / measured</summary><table><tr><th></th>'
        + NUMBER_HEADS + "</tr>"
        "<tr><th>GPU 0</th><td>1 MiB / 11 MiB</td><td>2 MiB / 12 MiB</td><td>3 MiB / 13 MiB</td>"
        "<td>4 MiB / 14 MiB</td><td>5 MiB / -</td><td>- / 15 MiB</td><td>6 MiB / 16 MiB</td></tr>"
        "<tr><th>GPU &lt;1&gt;</th><td>1,500 MiB / -</td>" + "<td>- / -</td>" * 6 + "</tr>"
        "</table></details>")
    # no GPU, no numbers table
    assert rp._numbers({"gpus": [], "host": {"available": 1.0, "planned": 1.0, "measured": None}}) == ""


@pytest.mark.parametrize("result, facts", [
    ({}, []),
    # the hash, the tensors moved, the rollback and the timings, in that order
    ({"config_hash": "0123456789abcdef0123", "tensors_moved": ["a", "b", "c"],
      "rollback": {"performed": True, "restored_from": "/srv/snap"},
      "timings": {"total": 14.25, "recreate": 3.14, "health": 2.0}},
     ["config 0123456789ab", "3 tensors on the CPU (llama-server's log)", "rolled back from /srv/snap",
      "14.2 s (recreate 3.1 s, health 2.0 s)"]),
    ({"config_hash": 12345}, ["config 12345"]),
    ({"tensors_moved": ["blk.1.ffn_up_exps.weight"]}, ["1 tensor on the CPU (llama-server's log)"]),
    # tensors moved count only as a non-empty list
    ({"tensors_moved": []}, []), ({"tensors_moved": "blk.1"}, []), ({"tensors_moved": None}, []),
    # a rollback without its snapshot path names the snapshot; one not performed is no fact
    ({"rollback": {"performed": True}}, ["rolled back from the snapshot"]),
    ({"rollback": {"performed": True, "restored_from": ""}}, ["rolled back from the snapshot"]),
    ({"rollback": {"performed": False, "restored_from": "/s"}}, []), ({"rollback": {}}, []),
    ({"rollback": None}, []), ({"rollback": "yes"}, []), ({"rollback": [1]}, []),
    # the timings: the total, then recreate and health when known; without a total, none
    ({"timings": {"total": 5.0}}, ["5.0 s"]), ({"timings": {"total": 0.0}}, ["0.0 s"]),
    ({"timings": {"total": 5.0, "health": 2.0}}, ["5.0 s (health 2.0 s)"]),
    ({"timings": {"total": 5.0, "recreate": 0.0, "health": None}}, ["5.0 s (recreate 0.0 s)"]),
    ({"timings": {"total": 5.0, "health": 1.0, "recreate": 2.0}}, ["5.0 s (recreate 2.0 s, health 1.0 s)"]),
    ({"timings": {"total": None, "health": 2.0}}, []), ({"timings": {"health": 2.0}}, []), ({"timings": {}}, []),
    ({"timings": None}, []), ({"timings": [5.0]}, []),
])
def test_facts(result, facts):
    assert rp._facts(result) == facts


def _views(gpus=(), host=None):
    """A host's views from (available, planned, measured) MiB of each GPU and of the host RAM."""
    return {"gpus": [{"available": a, "planned_total": p, "measured_total": m} for a, p, m in gpus],
            "host": host and dict(zip(("available", "planned", "measured"), host))}


@pytest.mark.parametrize("all_views, scales", [
    # nothing to draw: one MiB is the full height
    ([], (200.0, 200.0)), ([_views()], (200.0, 200.0)),
    ([_views([(None, None, None)], (None, None, None))], (200.0, 200.0)),
    ([_views([(0.5, 0.25, 0.75)], (0.5, 0.5, 0.5))], (200.0, 200.0)),
    # the largest GPU figure, the largest host RAM figure
    ([_views([(800.0, 400.0, None)])], (0.25, 200.0)), ([_views([(None, 400.0, 100.0)])], (0.5, 200.0)),
    ([_views([(100.0, 50.0, 1000.0)])], (0.2, 200.0)), ([_views([], (800.0, 400.0, None))], (200.0, 0.25)),
    ([_views([], (None, 400.0, 100.0))], (200.0, 0.5)), ([_views([], (100.0, 50.0, 1000.0))], (200.0, 0.2)),
    # shared by every host of the page
    ([_views([(400.0, 100.0, 100.0)], (2000.0, 1.0, None)), _views(),
      _views([(100.0, 100.0, 100.0), (1.0, 800.0, 2.0)], (500.0, 1.0, 4000.0))], (0.25, 0.05)),
])
def test_scales(all_views, scales):
    assert rp._scales(all_views) == scales


def test_the_legend_shows_every_kind_in_its_color():
    assert rp._legend() == (
        '<div class="legend"><span><i style="background:#4e79a7"></i>weights</span>'
        '<span><i style="background:#f28e2b"></i>KV cache</span>'
        '<span><i style="background:#76b7b2"></i>recurrent state</span>'
        '<span><i style="background:#e15759"></i>compute</span>'
        '<span><i style="background:#bab0ac"></i>margin</span>'
        '<span><i style="background:#b07aa1"></i>other (CUDA context...)</span>'
        '<span><i style="background:#f4f6f8"></i>free</span>'
        '<span><i style="background:#d62728"></i>missing</span>'
        '<span><i style="background:#59a14f"></i>routed experts</span></div>')


def test_the_style_sheet_is_only_rules_for_what_the_page_draws():
    rules = re.findall(r"([^{}]*)\{[^{}]*\}", rp.STYLE)
    assert re.sub(r"[^{}]*\{[^{}]*\}", "", rp.STYLE).strip() == ""
    assert [" ".join(r.split()) for r in rules] == [
        "body", "h1", "h2", ".summary", ".reason", ".chip,.status", "table.hosts", "table.hosts th,table.hosts td",
        "table.hosts td:nth-child(-n+3)", "table.hosts th", "code", ".legend", ".legend span", ".legend i",
        "section.host", "section.host header", ".batch", ".message", ".facts", ".none", "svg.chart text",
        "svg.chart text.title", "svg.chart text.total", "details.numbers", "details.numbers table",
        "details.numbers th,details.numbers td"]


def _plan_result(gpus, host=None, **more):
    result = {"plan": {"gpus": gpus, "host": host}}
    result.update(more)
    return result


def _report(rows, **more):
    report = {"outcome": "stopped", "reason": None, "check_mode": False, "summary": {"changed": 1, "failed": 2},
              "batches": [{"batch": 1, "hosts": ["a&1"]}, {"batch": 2, "hosts": ["b", "c"]}],
              "started": "2026-12-01T10:00:00Z", "finished": "2026-12-01T10:01:12Z", "seconds": 72.3, "hosts": rows}
    report.update(more)
    return report


def _row(host, batch, status, message, pattern=None, pattern_source=None, result=None):
    return {"host": host, "batch": batch, "status": status, "message": message, "pattern": pattern,
            "pattern_source": pattern_source, "result": result}


HEAD = ('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">\n'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; style-src \'unsafe-inline\'">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n')
TABLE_HEAD = ('<table class="hosts"><thead><tr><th>host</th><th>batch</th><th>status</th><th>pattern</th>'
              "<th>message</th></tr></thead><tbody>")


def test_the_whole_page_of_a_report():
    """Head, summary chips, the stop reason, the run line, the hosts table, the legend, then a section per host
    whose chart shares the page's scales (the largest GPU figure: 4,000 MiB free on c; the largest RAM: a's)."""
    gpu_a = {"index": 0, "name": "A", "model_mib": 600.0, "margin_mib": 200.0, "total_mib": 800.0, "free_mib": 2000.0}
    gpu_c = {"index": 0, "name": "C", "model_mib": 1000.0, "total_mib": 1000.0, "free_mib": 4000.0}
    result_a = _plan_result([gpu_a], {"experts_mib": 100.0, "available_mib": 4000.0},
                            config_hash="0123456789abcdef", tensors_moved=["t"], timings={"total": 2.0})
    result_c = _plan_result([gpu_c])
    rows = [_row("a&1", 1, "changed", "moved <2>", "blk\\.1\\.ffn_.*", "plan", result_a),
            _row("b", 0, "failed", "no plan", "p"),
            _row("c", 2, "failed", "x", None, "none", result_c)]
    views_a, views_c = memory_views(result_a, "a&1"), memory_views(result_c, "c")
    expected = "\n".join([
        HEAD + "<title>ai-llm rollout: stopped</title><style>%s</style></head><body>" % rp.STYLE,
        '<h1>ai-llm rollout: <span class="outcome">stopped</span></h1>',
        '<p class="summary"><span class="chip" style="background:#2e7d32">changed 1</span>'
        '<span class="chip" style="background:#c62828">failed 2</span></p>',
        '<p class="reason">stopped: batch 2 &lt;failed&gt;</p>',
        "<p>rollout stopped: changed 1, failed 2 in 72.3 s. Batches as Ansible ran them: 1: a&amp;1; 2: b, c. "
        "Started 2026-12-01T10:00:00Z, finished 2026-12-01T10:01:12Z.</p>",
        TABLE_HEAD,
        '<tr data-host="a&amp;1"><td><a href="#host-a&amp;1">a&amp;1</a></td><td>1</td><td>%s</td>'
        "<td><code>blk\\.1\\.ffn_.*</code></td><td>moved &lt;2&gt;</td></tr>" % rp._status("changed"),
        '<tr data-host="b"><td><a href="#host-b">b</a></td><td>-</td><td>%s</td><td><code>p</code></td>'
        "<td>no plan</td></tr>" % rp._status("failed"),
        '<tr data-host="c"><td><a href="#host-c">c</a></td><td>2</td><td>%s</td><td>-</td><td>x</td></tr>'
        % rp._status("failed"),
        "</tbody></table>",
        rp._legend(),
        '<section class="host" id="host-a&amp;1" data-host="a&amp;1" data-status="changed"><header><h2>a&amp;1</h2>'
        '%s<span class="batch">batch 1</span></header>' % rp._status("changed"),
        '<div class="pattern">pattern (from the plan): <code>blk\\.1\\.ffn_.*</code></div>',
        '<p class="message">moved &lt;2&gt;</p>',
        '<p class="facts">config 0123456789ab \u00b7 1 tensor on the CPU (llama-server&#x27;s log) \u00b7 2.0 s</p>',
        rp._chart("a&1", views_a, 0.05, 0.05) + rp._numbers(views_a),
        "</section>",
        '<section class="host" id="host-b" data-host="b" data-status="failed"><header><h2>b</h2>'
        '%s<span class="batch">no batch</span></header>' % rp._status("failed"),
        '<div class="pattern">pattern: <code>p</code></div>',
        '<p class="message">no plan</p>',
        '<p class="none">no memory plan published for this host</p>',
        "</section>",
        '<section class="host" id="host-c" data-host="c" data-status="failed"><header><h2>c</h2>'
        '%s<span class="batch">batch 2</span></header>' % rp._status("failed"),
        '<div class="pattern">pattern: <span class="none">none</span></div>',
        '<p class="message">x</p>',
        rp._chart("c", views_c, 0.05, 0.05) + rp._numbers(views_c),
        "</section>",
        "</body></html>\n"])
    assert page(_report(rows, reason="batch 2 <failed>")) == expected


def test_a_page_with_its_own_title_without_reason_or_times():
    report = _report([], outcome="completed", summary={"not_reached": 1}, batches=[], started=None, finished="",
                     seconds=None)
    assert page(report, title="my <fleet>") == "\n".join([
        HEAD + "<title>my &lt;fleet&gt;: completed</title><style>%s</style></head><body>" % rp.STYLE,
        '<h1>my &lt;fleet&gt;: <span class="outcome">completed</span></h1>',
        '<p class="summary"><span class="chip" style="background:#8d8d8d">not_reached 1</span></p>',
        "<p>rollout completed: not_reached 1. Batches as Ansible ran them: none. Started -, finished -.</p>",
        TABLE_HEAD, "</tbody></table>", rp._legend(), "</body></html>\n"])


def test_a_cpu_only_host_has_a_chart_of_its_ram_and_no_numbers_table():
    result = _plan_result([], {"experts_mib": 100.0, "available_mib": 400.0})
    html = page(_report([_row("cpu", 1, "checked", "m", result=result)]))
    views = memory_views(result, "cpu")
    assert "\n" + rp._chart("cpu", views, 200.0, 0.5) + "\n</section>" in html


def test_a_malformed_memory_plan_is_a_report_error_naming_its_host():
    result = _plan_result("x", None, config_hash="abc")
    rows = [_row("ok", 1, "changed", "m"), _row("gpu-box-9", 2, "changed", "m", result=result)]
    assert error_of(page, _report(rows)) == "gpu-box-9: llm_server_result.plan.gpus is str, not a list"


def test_the_hosts_table_shows_each_hosts_speed_and_the_summary_the_fleets_decode():
    speed = {"decode_tokens_per_second": 12.34, "prompt_tokens_per_second": 400.06,
             "previous": {"decode_tokens_per_second": 20.1, "prompt_tokens_per_second": 380}}
    report = build_report(Rollout(hosts=["a", "b"], batches=[["a", "b"]]), [
        HostRun("a", batch=1, result={"status": "changed", "message": "m", "speed": speed}, result_phase="deploy"),
        HostRun("b", batch=1, result={"status": "unchanged", "message": "m", "speed": dict(speed, previous=None)},
                result_phase="deploy")])
    html = page(report)
    assert "<th>decode tokens/s</th><th>prompt tokens/s</th>" in html
    assert "<td>20.1 -&gt; 12.3</td><td>380.0 -&gt; 400.1</td>" in html and "<td>12.3</td><td>400.1</td>" in html
    assert "fleet decode 24.6 tokens/s" in html
    assert "decode tokens/s" not in page(build_report(Rollout(hosts=["a"]), []))
