"""rollout.html as written: self-contained, escaped, one section and one chart per host, segments to scale."""
from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._rollout_page import BAR_HEIGHT, CSP, page
import rollout_samples as samples


class Elements(HTMLParser):
    """Every start tag as (tag, attributes dict), in document order."""

    def __init__(self, text):
        super().__init__()
        self.tags = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


@pytest.fixture(scope="module")
def html():
    return page(samples.sample_report())


def test_the_page_fetches_nothing(html):
    tags = Elements(html).tags
    assert ("meta", {"http-equiv": "Content-Security-Policy", "content": CSP}) in tags
    assert CSP == "default-src 'none'; style-src 'unsafe-inline'"
    assert not [t for t, a in tags if t in ("script", "link", "img", "iframe", "object", "embed")]
    assert not [a for t, a in tags if any(k in ("src", "srcset", "action") for k in a)]
    # the only URL in an attribute is SVG's namespace name (a URL in a host's message is text); links stay inside
    urls = {v for t, a in tags for v in a.values() if v and re.match(r"\w+://", v)}
    assert urls == {"http://www.w3.org/2000/svg"}
    assert all(a["href"].startswith("#host-") for t, a in tags if t == "a")


def test_text_from_hosts_is_escaped(html):
    assert "cpu-<b>4</b>" not in html and "cpu-&lt;b&gt;4&lt;/b&gt;" in html


def test_one_section_per_host_in_report_order_with_status_and_pattern(html):
    tags = Elements(html).tags
    sections = [(a["data-host"], a["data-status"]) for t, a in tags if t == "section"]
    assert sections == [("gpu-box-1", "changed"), ("gpu-box-2", "unchanged"), ("gpu-box-3", "rolled_back"),
                        ("cpu-<b>4</b>", "not_reached"), ("gpu-box-5", "unreachable"), ("gpu-box-6", "failed")]
    assert "<code>%s</code>" % samples.PATTERN_2 in html


def test_every_gpu_has_a_planned_and_a_measured_column(html):
    tags = Elements(html).tags
    groups = [a["data-group"] for t, a in tags if t == "g" and "data-column" in a]
    # gpu-box-1: one GPU + RAM, gpu-box-2: two GPUs + RAM, gpu-box-3: one + RAM, cpu: RAM, gpu-box-6: one + RAM
    assert groups == ["gpu0", "gpu0", "host", "host", "gpu0", "gpu0", "gpu1", "gpu1", "host", "host", "gpu0", "gpu0",
                      "host", "host", "host", "host", "gpu0", "gpu0", "host", "host"]
    columns = [a["data-column"] for t, a in tags if t == "g" and "data-column" in a]
    assert columns == ["planned", "measured"] * 10


def test_segments_stack_to_scale(html):
    """Each rect's height is its MiB at one scale for every GPU column of the page; the stack is contiguous."""
    rects = [a for t, a in Elements(html).tags if t == "rect" and "data-kind" in a and "data-overlay" not in a]
    gpu_scale = BAR_HEIGHT / 24148.0      # the largest GPU figure of the page: the cards with 24,148 MiB free
    ram_scale = BAR_HEIGHT / 122880.0     # the largest host RAM: the dual host's
    for rect in rects:
        scale = ram_scale if rect["data-group"] == "host" else gpu_scale
        assert float(rect["height"]) == pytest.approx(float(rect["data-mib"]) * scale, abs=0.06), rect
    first = rects[:6]                          # gpu-box-1's planned column, bottom up
    assert [a["data-kind"] for a in first] == ["model", "kv", "recurrent", "compute", "margin", "free"]
    for lower, upper in zip(first, first[1:]):
        assert float(upper["y"]) + float(upper["height"]) == pytest.approx(float(lower["y"]), abs=0.02)


def test_a_plan_that_does_not_fit_shows_the_missing_part_over_its_stack(html):
    over = [a for t, a in Elements(html).tags if t == "rect" and a.get("data-overlay")]
    assert len(over) == 1
    assert float(over[0]["data-mib"]) == pytest.approx(samples.refused_busy()["plan"]["gpus"][0]["total_mib"] - 2048,
                                                       abs=0.05)


def test_what_the_role_measured_is_summed_up_under_the_message(html):
    # gpu-box-3 (rolled back): its hash, the snapshot it came back from, its timings
    config = samples.rolled_back_busy()["config_hash"][:12]
    assert ('<p class="facts">config %s \u00b7 rolled back from %s \u00b7 14.2 s '
            '(recreate 3.1 s, health 2.4 s)</p>' % (config, samples.SNAPSHOT)) in html
    moved = samples.changed_single()
    moved["tensors_moved"] = ["blk.1.ffn_up_exps.weight", "blk.1.ffn_down_exps.weight"]
    report = samples.sample_report()
    report["hosts"][0]["result"] = moved
    assert "2 tensors on the CPU (llama-server&#x27;s log)" in page(report)
