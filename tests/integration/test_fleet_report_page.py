"""rollout.html in Debian's real headless chromium: what it renders, measured by the browser itself.

The page is the one ``rollout_report`` writes for a six-host sample rollout. Chromium takes a screenshot of it
as written (kept next to the page in the test's directory) and dumps the DOM of a copy that carries one extra
inline script: it writes, on every drawn segment, column and status chip, the box the browser laid it out in
and its computed colour. The assertions read those boxes: every segment drawn at its MiB on the page's scale,
planned and measured columns side by side on one baseline, the host RAM beside the GPUs, each host's status.
"""
from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from types import SimpleNamespace

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._rollout_page import (
    BAR_HEIGHT, COLUMN, GAP, STATUS_COLORS, page)
from tests.helpers.rollout_samples import sample_report

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (bash scripts/setup.sh --tests)")

MEASURE = """<script>
for (const el of document.querySelectorAll('[data-kind], g.column, section.host, .status, svg.chart')) {
  const r = el.getBoundingClientRect();
  el.setAttribute('data-box', [r.left, r.top, r.width, r.height].map(v => v.toFixed(2)).join(' '));
  el.setAttribute('data-bg', getComputedStyle(el).backgroundColor);
  el.setAttribute('data-text', el.textContent.trim().slice(0, 40));
}
document.body.setAttribute('data-measured', 'yes');
</script>"""


def chromium(tmp_path, *args, url):
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run",
           "--user-data-dir=%s" % (tmp_path / "profile"), "--window-size=1280,2400"] + list(args) + [url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)


class Boxes(HTMLParser):
    """Every element the script measured: (tag, attributes) with ``box`` as (left, top, width, height)."""

    def __init__(self, text):
        super().__init__()
        self.elements = []
        self.body = {}
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "body":
            self.body = attrs
        if "data-box" in attrs:
            attrs["box"] = tuple(float(v) for v in attrs["data-box"].split())
            self.elements.append((tag, attrs))


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("rollout-page")
    report = sample_report()
    html = page(report)
    (tmp_path / "rollout.html").write_text(html)
    chromium(tmp_path, "--screenshot=%s" % (tmp_path / "rollout.png"), url=(tmp_path / "rollout.html").as_uri())
    measured = html.replace("default-src 'none';", "default-src 'none'; script-src 'unsafe-inline';", 1)
    measured = measured.replace("</body>", MEASURE + "</body>")
    (tmp_path / "measured.html").write_text(measured)
    dom = chromium(tmp_path, "--dump-dom", url=(tmp_path / "measured.html").as_uri()).stdout
    return SimpleNamespace(report=report, boxes=Boxes(dom), dir=tmp_path)


def test_the_screenshot_is_a_picture_of_the_page_and_the_browser_ran_the_measurement(rendered):
    png = (rendered.dir / "rollout.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height) == (1280, 2400)
    assert rendered.boxes.body.get("data-measured") == "yes"
    assert len([e for e in rendered.boxes.elements if e[0] == "section"]) == 6


def test_each_host_shows_its_status_in_its_colour(rendered):
    chips = [a for t, a in rendered.boxes.elements if "status" in a.get("class", "").split()]
    # the overview table first, then each host's header
    expected = [row["status"] for row in rendered.report["hosts"]]
    assert [a["data-text"] for a in chips] == expected + expected
    for chip in chips:
        red, green, blue = (int(STATUS_COLORS[chip["data-text"]][i:i + 2], 16) for i in (1, 3, 5))
        assert chip["data-bg"] == "rgb(%d, %d, %d)" % (red, green, blue)
        assert chip["box"][2] > 30 and chip["box"][3] > 10          # drawn, with room for its word


def test_segments_are_drawn_at_their_mib(rendered):
    segments = [a for t, a in rendered.boxes.elements if t == "rect" and "data-overlay" not in a]
    assert len(segments) > 40
    per_px = {"gpu": BAR_HEIGHT / 24148.0, "host": BAR_HEIGHT / 122880.0}
    for seg in segments:
        left, top, width, height = seg["box"]
        assert width == pytest.approx(COLUMN, abs=0.5), seg
        scale = per_px["host" if seg["data-group"] == "host" else "gpu"]
        assert height == pytest.approx(float(seg["data-mib"]) * scale, abs=0.6), seg


def columns_by_host(boxes):
    """{host: [{group, column, segs: [segments bottom up]}, ...]} from the measured DOM, in document order."""
    out = {}
    host = None
    for tag, attrs in boxes.elements:
        if tag == "section":
            host = attrs["data-host"]
            out[host] = []
        elif tag == "g":
            out[host].append({"group": attrs["data-group"], "column": attrs["data-column"], "box": attrs["box"],
                              "segs": []})
        elif tag == "rect" and "data-overlay" not in attrs:
            out[host][-1]["segs"].append(attrs)
    return out


def test_planned_and_measured_side_by_side_and_host_ram_beside_the_gpus(rendered):
    hosts = columns_by_host(rendered.boxes)
    assert list(hosts) == [row["host"] for row in rendered.report["hosts"]]
    assert [(c["group"], c["column"]) for c in hosts["gpu-box-2"]] == [
        ("gpu0", "planned"), ("gpu0", "measured"), ("gpu1", "planned"), ("gpu1", "measured"),
        ("host", "planned"), ("host", "measured")]
    for host, columns in hosts.items():
        lefts = [c["box"][0] for c in columns]
        assert lefts == sorted(lefts), host                          # left to right: GPUs, then host RAM
        for planned, measured in zip(columns[::2], columns[1::2]):
            assert (planned["column"], measured["column"]) == ("planned", "measured")
            assert planned["group"] == measured["group"]
            segs, segs2 = planned["segs"], measured["segs"]
            if segs and segs2:
                assert segs2[0]["box"][0] - segs[0]["box"][0] == pytest.approx(COLUMN + GAP, abs=0.5)
                bottom = [s["box"][1] + s["box"][3] for s in (segs[0], segs2[0])]
                assert bottom[0] == pytest.approx(bottom[1], abs=0.5), host   # one baseline
            for stack in (segs, segs2):
                for lower, upper in zip(stack, stack[1:]):
                    assert upper["box"][1] + upper["box"][3] == pytest.approx(lower["box"][1], abs=0.5)


def test_what_the_single_gpu_host_shows(rendered):
    """gpu-box-1: 21,009 MiB of weights planned, 21,003 measured, 2,362 MiB of experts in host RAM."""
    planned, measured, ram_planned, ram_measured = (c["segs"] for c in columns_by_host(rendered.boxes)["gpu-box-1"])
    assert [s["data-kind"] for s in planned] == ["model", "kv", "recurrent", "compute", "margin", "free"]
    assert [s["data-kind"] for s in measured] == ["model", "kv", "recurrent", "compute", "other", "free"]
    assert planned[0]["data-mib"] == "21009.5" and measured[0]["data-mib"] == "21003.1"
    # both columns reach what was free (24,148 MiB) at the same height
    assert planned[-1]["box"][1] == pytest.approx(measured[-1]["box"][1], abs=0.5)
    assert planned[0]["box"][3] == pytest.approx(21009.47 * BAR_HEIGHT / 24148.0, abs=0.6)
    assert [s["data-kind"] for s in ram_planned] == ["experts", "free"]
    assert ram_measured[0]["data-mib"] == "2375.2"
