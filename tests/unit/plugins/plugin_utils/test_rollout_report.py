"""The rollout report (plugins/plugin_utils/_rollout_report.py), rule by rule: each host's status and row, the
outcome and its reason, the failure percentage, and the text renderings (summary line, table, Markdown, JSON).
Each host's memory (``memory_views``): test_rollout_memory.py."""
from __future__ import annotations

import dataclasses
import datetime

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._rollout_report import (
    HostRun, Rollout, batch_list, build_report, check_result, host_fetch, host_row, host_speed, host_status, markdown,
    one_line, speed_text, stop_reason, summary_line, table, to_json)
from tests.helpers import rollout_samples as samples
from tests.helpers.rollout_samples import error_of

NOT_REACHED = "not touched: the rollout stopped before this host's batch"
BATCH_STOPPED = ("its batch stopped before the llm_server role finished here (another host of the batch failed); "
                 "what it serves was not verified")
ROLE_STATUS_LIST = "changed, unchanged, failed, rolled_back, checked"
SKIP_HINT = "nothing was restarted (llm_rollout_skip_refused_hosts: true rolls out the other hosts)"


@pytest.mark.parametrize("text, limit, expected", [
    ("  the model\n\tfailed   to load \r\n", 600, "the model failed to load"), (None, 600, ""), ("", 600, ""),
    (42, 600, "42"), ("abcdef", 6, "abcdef"), ("abcdefg", 6, "abc..."),
    ("a  b  c  d", 7, "a b c d"),                     # folded first, then measured
    ("x" * 600, None, "x" * 600), ("x" * 601, None, "x" * 597 + "...")])      # None: the default limit, 600
def test_one_line_folds_whitespace_runs_then_cuts_to_the_limit_ellipsis_included(text, limit, expected):
    assert (one_line(text) if limit is None else one_line(text, limit)) == expected


@pytest.mark.parametrize("result, error", [
    *[({"status": status, "message": "m"}, None) for status in ROLE_STATUS_LIST.split(", ")],
    ("done", "h: llm_server_result is str, not a dict"), (None, "h: llm_server_result is NoneType, not a dict"),
    # unknown, none, or the report's statuses, never the role's
    *[({"status": status} if status else {}, "h: llm_server_result.status is %r, not one of %s" % (
        status, ROLE_STATUS_LIST)) for status in ("ok", None, "unreachable", "not_reached")],
])
def test_check_result_returns_a_result_of_a_role_status_or_names_the_host_and_what_is_wrong(result, error):
    if error is None:
        assert check_result("h", result) is result
    else:
        assert error_of(check_result, "h", result) == error


def deploy(status, message="m", **kw):
    """A host of batch 1 whose deploy published a result of this status."""
    return HostRun("h", batch=1, result={"status": status, "message": message}, result_phase="deploy", **kw)


LONG = "unreachable in the deploy: " + "z" * (597 - len("unreachable in the deploy: ")) + "..."


@pytest.mark.parametrize("run, expected", [
    # unreachable: in its phase, or the rollout's; it wins over a failure and a result of the deploy; one line
    (HostRun("h", unreachable="ssh:\n  refused", unreachable_phase="preflight"),
     ("unreachable", "unreachable in the preflight: ssh: refused")),
    (HostRun("h", batch=1, unreachable="gone"), ("unreachable", "unreachable in the rollout: gone")),
    (deploy("changed", failure="boom", failure_phase="deploy", unreachable="gone", unreachable_phase="deploy"),
     ("unreachable", "unreachable in the deploy: gone")),
    (HostRun("h", unreachable="z" * 700, unreachable_phase="deploy"), ("unreachable", LONG)),
    # a deploy failure after a good role result makes the host failed
    (deploy("changed", failure="the disk\nis full", failure_phase="deploy"),
     ("failed", "after the role ended changed: the disk is full")),
    (deploy("unchanged", failure="boom", failure_phase="deploy"), ("failed", "after the role ended unchanged: boom")),
    (deploy("checked", failure="boom", failure_phase="deploy"), ("failed", "after the role ended checked: boom")),
    # the role's own bad outcomes keep their status and message
    (deploy("rolled_back", failure="boom", failure_phase="deploy"), ("rolled_back", "m")),
    (deploy("failed", failure="boom", failure_phase="deploy"), ("failed", "m")),
    # a phase without a failure message is no failure; a failure of the preflight does not override the deploy
    (deploy("changed", failure_phase="deploy"), ("changed", "m")),
    (deploy("changed", failure="boom", failure_phase="preflight"), ("changed", "m")),
    # a failed result outside the deploy: its message, or the phase
    (HostRun("h", result={"status": "failed", "message": "does not\nfit"}, result_phase="preflight"),
     ("failed", "does not fit")),
    (HostRun("h", result={"status": "failed"}, result_phase="preflight"), ("failed", "failed in the preflight")),
    (HostRun("h", result={"status": "failed"}), ("failed", "failed in the rollout")),
    # an Ansible failure without a failed result; a good preflight result does not hide a later failure
    (HostRun("h", failure="Could not find\n the model", failure_phase="preflight"),
     ("failed", "preflight: Could not find the model")),
    (HostRun("h", batch=2, failure="boom", failure_phase="deploy"), ("failed", "boom")),
    (HostRun("h", failure="boom"), ("failed", "boom")),
    (HostRun("h", batch=1, result={"status": "checked"}, result_phase="preflight", failure="boom",
             failure_phase="deploy"), ("failed", "boom")),
    # a host of a batch without a deploy result is failed, one without a batch not reached
    (HostRun("h", batch=1), ("failed", BATCH_STOPPED)),
    (HostRun("h", batch=1, result={"status": "checked"}, result_phase="preflight"), ("failed", BATCH_STOPPED)),
    (HostRun("h", batch=1, result_phase="deploy"), ("failed", BATCH_STOPPED)),
    (HostRun("h"), ("not_reached", NOT_REACHED)),
    (HostRun("h", result={"status": "changed"}, result_phase="preflight"), ("not_reached", NOT_REACHED)),
    # unchanged in the preflight: it runs this configuration, verified, and joins no batch; unless Ansible failed it
    (HostRun("h", result={"status": "unchanged", "message": "nothing\nchanged"}, result_phase="preflight"),
     ("unchanged", "nothing changed")),
    (HostRun("h", result={"status": "unchanged"}, result_phase="preflight"), ("unchanged", "unchanged")),
    (HostRun("h", result={"status": "unchanged"}, result_phase="preflight", failure="boom", failure_phase="preflight"),
     ("failed", "preflight: boom")),
    # a deploy result gives its status and its message on one line, or the status alone
    *[row for status in ("changed", "unchanged", "checked", "rolled_back", "failed") for row in (
        (deploy(status, "line 1\nline 2"), (status, "line 1 line 2")), (deploy(status, ""), (status, status)),
        (HostRun("h", batch=1, result={"status": status}, result_phase="deploy"), (status, status)))],
])
def test_host_status(run, expected):
    assert host_status(run) == expected


NO_SPEED = {"decode": {"before": None, "after": None}, "prompt": {"before": None, "after": None}}
NEVER_RUN = {"host": "h", "batch": None, "status": "not_reached", "message": NOT_REACHED, "pattern": None,
             "pattern_source": None, "config_hash": None, "speed": NO_SPEED, "fetch": None,
             "ansible": {"outcome": "not_run", "phase": None, "msg": None},
             "result_from": None, "result": None}
RAN = {"outcome": "ok", "phase": None, "msg": None}


@pytest.mark.parametrize("run, row", [
    # never run; a phase without a result
    (HostRun("h"), NEVER_RUN), (HostRun("h", result_phase="preflight"), dict(NEVER_RUN, ansible=RAN)),
    # an empty pattern is none
    (HostRun("h", result={"status": "checked", "pattern": ""}, result_phase="preflight"),
     dict(NEVER_RUN, ansible=RAN, result_from="preflight", result={"status": "checked", "pattern": ""})),
    # what Ansible did: unreachable wins over a failure; its message on one line
    (HostRun("h", batch=1, unreachable="ssh\n  refused", unreachable_phase="deploy", failure="boom",
             failure_phase="deploy"),
     dict(NEVER_RUN, batch=1, status="unreachable", message="unreachable in the deploy: ssh refused",
          ansible={"outcome": "unreachable", "phase": "deploy", "msg": "ssh refused"})),
    (HostRun("h", unreachable="gone"), dict(NEVER_RUN, status="unreachable", message="unreachable in the rollout: gone",
                                            ansible={"outcome": "unreachable", "phase": None, "msg": "gone"})),
    (HostRun("h", failure="plan\nrefused", failure_phase="preflight"), dict(
        NEVER_RUN, status="failed", message="preflight: plan refused",
        ansible={"outcome": "failed", "phase": "preflight", "msg": "plan refused"})),
    (HostRun("h", batch=1), dict(NEVER_RUN, batch=1, status="failed", message=BATCH_STOPPED, ansible=RAN)),
])
def test_host_row(run, row):
    assert host_row(run) == row


def result(status, message="m", **kw):
    return dict(kw, status=status, message=message)


def test_build_report_whole_dict_of_a_rollout_that_completed_with_failures_and_of_an_empty_one():
    a = result("changed", "m a", pattern="pa", pattern_source="plan", config_hash="h1")
    b = result("failed", "boom")
    rollout = Rollout(hosts=["a", "b"], report_dir="r", serial=2, max_fail_percentage="25%", check_mode=1,
                      batches=[["a"], ["b"]], batch_seconds=[3.5], started="S", finished="F", seconds=9.25)
    report = build_report(rollout, [HostRun("b", 2, b, "deploy"), HostRun("a", 1, a, "deploy")])
    assert report == {
        "outcome": "completed_with_failures", "reason": None, "check_mode": True,
        "summary": {"changed": 1, "failed": 1}, "serial": 2, "max_fail_percentage": 25,
        "batches": [{"batch": 1, "hosts": ["a"], "seconds": 3.5}, {"batch": 2, "hosts": ["b"], "seconds": None}],
        "started": "S", "finished": "F", "seconds": 9.25, "fleet_decode_tokens_per_second": None,
        "hosts": [
            {"host": "a", "batch": 1, "status": "changed", "message": "m a", "pattern": "pa", "pattern_source": "plan",
             "config_hash": "h1", "speed": NO_SPEED, "fetch": None, "ansible": RAN, "result_from": "deploy", "result": a},
            {"host": "b", "batch": 2, "status": "failed", "message": "boom", "pattern": None, "pattern_source": None,
             "config_hash": None, "speed": NO_SPEED, "fetch": None, "ansible": RAN, "result_from": "deploy", "result": b}],
        "errors": []}
    assert list(report) == ["outcome", "reason", "check_mode", "summary", "serial", "max_fail_percentage",
                            "batches", "started", "finished", "seconds", "fleet_decode_tokens_per_second", "hosts",
                            "errors"]
    # each batch its own time, in order (batch_seconds[i - 1] of batch i)
    timed = build_report(dataclasses.replace(rollout, batch_seconds=[3.5, 4.25]), [])
    assert [batch["seconds"] for batch in timed["batches"]] == [3.5, 4.25]
    # the defaults
    assert build_report(Rollout(), []) == {
        "outcome": "completed", "reason": None, "check_mode": False, "summary": {}, "serial": None,
        "max_fail_percentage": 0, "batches": [], "started": None, "finished": None, "seconds": None,
        "fleet_decode_tokens_per_second": None, "hosts": [], "errors": []}


@pytest.mark.parametrize("run, outcome", [
    *[(HostRun("a", 1, result(status), "deploy"), "completed") for status in ("changed", "unchanged", "checked")],
    *[(HostRun("a", 1, result(status), "deploy"), "completed_with_failures") for status in ("failed", "rolled_back")],
    (HostRun("a", 1, unreachable="gone", unreachable_phase="deploy"), "completed_with_failures")])
def test_build_report_outcome_is_completed_only_when_every_host_is_ok(run, outcome):
    report = build_report(Rollout(hosts=["a"], batches=[["a"]]), [run])
    assert (report["outcome"], report["reason"], report["errors"]) == (outcome, None, [])


def test_build_report_counts_in_the_order_of_the_statuses_and_lists_the_inventory_first_then_the_others_sorted():
    runs = [HostRun("u", 1, unreachable="gone"), HostRun("f", 1, result("failed"), "deploy"),
            HostRun("r", 1, result("rolled_back"), "deploy"), HostRun("k", 1, result("checked"), "deploy"),
            HostRun("n", 1, result("unchanged"), "deploy"), HostRun("c", 1, result("changed"), "deploy"),
            HostRun("b", 1, result("changed"), "deploy")]
    report = build_report(Rollout(hosts=["n", "x"], batches=[[r.host for r in runs]], max_fail_percentage=100), runs)
    assert list(report["summary"].items()) == [("changed", 2), ("unchanged", 1), ("checked", 1), ("rolled_back", 1),
                                               ("failed", 1), ("unreachable", 1), ("not_reached", 1)]
    assert [(r["host"], r["status"]) for r in report["hosts"]] == [
        ("n", "unchanged"), ("x", "not_reached"), ("b", "changed"), ("c", "changed"), ("f", "failed"),
        ("k", "checked"), ("r", "rolled_back"), ("u", "unreachable")]


def test_a_result_the_report_cannot_read_fails_its_host_in_the_phase_that_published_it():
    run = HostRun("p", result={"status": "bogus"}, result_phase="preflight")
    report = build_report(Rollout(hosts=["p"]), [run])
    error = "p: llm_server_result.status is 'bogus', not one of " + ROLE_STATUS_LIST
    assert report["errors"] == [error]
    assert report["hosts"] == [dict(NEVER_RUN, host="p", status="failed", message="preflight: " + error,
                                    ansible={"outcome": "failed", "phase": "preflight", "msg": error})]
    assert report["outcome"] == "stopped"
    assert report["reason"] == "preflight: p (failed); " + SKIP_HINT


def max_fail(value):
    return build_report(Rollout(max_fail_percentage=value), [])["max_fail_percentage"]


def test_max_fail_percentage_reads_numbers_and_percent_strings_from_0_to_100():
    assert max_fail(None) == 0 and isinstance(max_fail(None), int)
    for given, read in ((0, 0), (100, 100), ("100", 100), ("100%", 100), (" 25% ", 25), ("0%", 0),
                        (12.5, 12.5), ("12.5%", 12.5), (100.0, 100), ("50.0", 50), ("25", 25), ("12.5", 12.5),
                        (33.0, 33), (50, 50)):
        assert max_fail(given) == read, given
        assert type(max_fail(given)) is type(read), given        # whole numbers are ints


def test_max_fail_percentage_outside_0_to_100_or_not_a_number_is_refused():
    for given in (100.5, 101, "101%", -1, "-0.5", True, False, "all", "", "%", [25]):
        assert error_of(max_fail, given) == (
            "llm_rollout_max_fail_percentage is %r: give a percentage from 0 to 100" % (given,)), given


@pytest.mark.parametrize("statuses, batches, limit, reason", [
    # every host was reached
    ({}, [], 0, None),
    ({"a": "checked", "b": "changed", "c": "unchanged"}, [], 0, None),
    ({"a": "failed", "b": "unreachable", "c": "rolled_back"}, [["a", "b", "c"]], 0, None),
    # a preflight that refused or lost hosts names them
    ({"a": "changed", "b": "failed", "c": "unreachable", "d": "not_reached", "e": "rolled_back"}, [], 0,
     "preflight: b (failed), c (unreachable); " + SKIP_HINT),
    ({"a": "checked", "b": "not_reached"}, [], 0, "preflight: no host; " + SKIP_HINT),
    ({"a": "rolled_back"}, [], 0, "preflight: no host; " + SKIP_HINT),
    # a run that ended after a good batch names the hosts not reached
    ({"a": "changed", "b": "failed", "c": "not_reached", "d": "not_reached", "e": "changed"}, [["b"], ["a", "e"]], 0,
     "the run ended after batch 2 without reaching c, d"),
    # a batch that failed names its bad hosts and the threshold
    ({"a": "changed", "b": "failed", "c": "unreachable", "d": "not_reached", "e": "rolled_back"},
     [["a"], ["b", "a", "c", "x"]], 12.5,
     "batch 2: b failed, c unreachable (2 of 4 hosts); Ansible stops the rollout when more than "
     "llm_rollout_max_fail_percentage (12.5%) of a batch fails, or all of it"),
])
def test_stop_reason(statuses, batches, limit, reason):
    rows = [{"host": host, "status": status} for host, status in statuses.items()]
    assert stop_reason(rows, batches, limit) == reason


def test_to_json_is_two_space_indented_in_the_report_order_and_writes_other_values_as_text():
    text = to_json({"outcome": "completed", "batches": [1], "started": datetime.date(2026, 12, 1)})
    assert text == '{\n  "outcome": "completed",\n  "batches": [\n    1\n  ],\n  "started": "2026-12-01"\n}\n'


def test_summary_line_and_batch_list():
    report = {"outcome": "stopped", "check_mode": False, "summary": {"changed": 1, "not_reached": 2},
              "seconds": None}
    assert summary_line(report) == "rollout stopped: changed 1, not_reached 2"
    assert summary_line(dict(report, check_mode=True, seconds=72.34)) == (
        "rollout stopped (check mode): changed 1, not_reached 2 in 72.3 s")
    assert summary_line(dict(report, seconds=0.0)) == "rollout stopped: changed 1, not_reached 2 in 0.0 s"
    assert summary_line({"outcome": "completed", "check_mode": False, "summary": {}}) == "rollout completed: no hosts"
    assert batch_list({"batches": [{"batch": 1, "hosts": ["h1"]}, {"batch": 2, "hosts": ["h2", "h3"]}]}) == (
        "1: h1; 2: h2, h3")
    assert batch_list({"batches": []}) == "none"


def table_report(hosts, reason=None):
    return {"outcome": "stopped" if reason else "completed", "check_mode": False, "reason": reason,
            "summary": {"changed": len(hosts)}, "seconds": None, "hosts": hosts}


def test_table_aligns_the_columns_and_ends_with_the_summary_and_the_reason():
    report = table_report([
        {"host": "a", "batch": 1, "status": "changed", "pattern": "p1", "message": "all good"},
        {"host": "bb", "batch": 2, "status": "failed", "pattern": None,
         "message": "llm_server: the deploy on bb failed: disk full"},
        {"host": "c", "batch": None, "status": "not_reached", "pattern": "", "message": "not touched"}], reason="R")
    report["summary"] = {"changed": 1, "failed": 1, "not_reached": 1}
    assert table(report) == "\n".join([
        "HOST  BATCH  STATUS       PATTERN  MESSAGE",
        "a     1      changed      p1       all good",
        "bb    2      failed       -        disk full",
        "c     -      not_reached  -        not touched",
        "rollout stopped: changed 1, failed 1, not_reached 1",
        "stopped: R"])


def test_the_table_and_rollout_md_show_the_model_fetched_when_a_host_fetched_one():
    report = table_report([
        {"host": "a", "batch": 1, "status": "changed", "pattern": "p", "message": "ok",
         "fetch": {"bytes": 9 * 2 ** 20, "seconds": 15.04}},
        {"host": "b", "batch": 2, "status": "changed", "pattern": "p", "message": "ok", "fetch": None}])
    assert table(report).splitlines()[:3] == [
        "HOST  BATCH  STATUS   PATTERN  MODEL FETCHED      MESSAGE",
        "a     1      changed  p        9.0 MiB in 15.0 s  ok",
        "b     2      changed  p        -                  ok"]
    report.update(serial=[1], max_fail_percentage=0, batches=[])
    assert "| a | 1 | **changed** | `` p `` | 9.0 MiB in 15.0 s | ok |" in markdown(report)
    assert host_fetch({"model_fetch": {"bytes": 5, "seconds": 1.0}}) == {"bytes": 5, "seconds": 1.0}
    assert host_fetch({"model_fetch": {"bytes": 0, "seconds": 1.0}}) is host_fetch(None) is None


START = "h     1      changed  p        "                 # 29 characters and two blanks


@pytest.mark.parametrize("message, pattern, width, line", [
    # only the role's prefix at the start of a message is dropped; no trailing blanks
    ("llm_server: the deploy on h-1 failed: the model failed", "p", (), START + "the model failed"),
    ("llm_server: plan refused", "p", (), START + "plan refused"),
    ("the deploy on h failed: oom", "p", (), START + "oom"),
    ("see llm_server: x", "p", (), START + "see llm_server: x"), ("llm_server: ", "p", (), "h     1      changed  p"),
    # the message is cut to the width but keeps at least 20 characters; the default width is 132
    ("m" * 29, "p", (60,), START + "m" * 29), ("m" * 30, "p", (60,), START + "m" * 26 + "..."),
    ("m" * 20, "p", (40,), START + "m" * 20), ("m" * 21, "p", (40,), START + "m" * 17 + "..."),
    ("m" * 101, "p", (), START + "m" * 101), ("m" * 102, "p", (), START + "m" * 98 + "..."),
    # a pattern longer than 32 characters is cut
    ("m", "p" * 32, (), "h     1      changed  %s  m" % ("p" * 32)),
    ("m", "p" * 33, (), "h     1      changed  %s...  m" % ("p" * 29)),
])
def test_table_line_of_one_host(message, pattern, width, line):
    report = table_report([{"host": "h", "batch": 1, "status": "changed", "pattern": pattern, "message": message}])
    assert table(report, *width).splitlines()[1] == line


# llm_server_result.speed of a host measured at 12.34 decode / 400.06 prompt tokens/s after 20.1 / 380 before.
SPEED = {"decode_tokens_per_second": 12.34, "prompt_tokens_per_second": 400.06, "runs": 3, "prompt_tokens": 512,
         "predicted_tokens": 128, "previous": {"decode_tokens_per_second": 20.1, "prompt_tokens_per_second": 380},
         "decode_ratio": 0.614, "prompt_ratio": 1.053}


def test_host_speed_before_and_after_from_the_result_and_none_without_a_speed():
    assert host_speed({"speed": SPEED}) == {"decode": {"before": 20.1, "after": 12.3},
                                            "prompt": {"before": 380.0, "after": 400.1}}
    assert host_speed({"speed": dict(SPEED, previous=None)})["decode"] == {"before": None, "after": 12.3}
    assert host_speed({"speed": None}) == host_speed(None) == {"decode": {"before": None, "after": None},
                                                               "prompt": {"before": None, "after": None}}
    assert [speed_text(f) for f in ({"before": 20.1, "after": 12.3}, {"before": None, "after": 12.3},
                                    {"before": 1.0, "after": None})] == ["20.1 -> 12.3", "12.3", "-"]


def test_the_fleet_decode_is_the_sum_over_the_hosts_that_serve_and_the_outputs_show_each_hosts_speed():
    ok = {"status": "changed", "message": "m", "speed": SPEED}
    other = dict(ok, speed=dict(SPEED, decode_tokens_per_second=7.66, previous=None))
    report = build_report(Rollout(hosts=["a", "b", "c"], batches=[["a", "b", "c"]]), [
        HostRun("a", batch=1, result=ok, result_phase="deploy"),
        HostRun("b", batch=1, result=other, result_phase="deploy"),
        HostRun("c", batch=1, result=dict(ok, status="failed"), result_phase="deploy")])
    assert report["fleet_decode_tokens_per_second"] == 20.0  # 12.3 + 7.7; the failed host does not serve
    assert summary_line(report).endswith("; fleet decode 20.0 tokens/s")
    lines = table(report).splitlines()
    assert lines[0].split()[:6] == ["HOST", "BATCH", "STATUS", "PATTERN", "DECODE", "TOK/S"]
    assert "20.1 -> 12.3" in lines[1] and "380.0 -> 400.1" in lines[1] and "  7.7  " in lines[2]
    text = markdown(report)
    assert "| host | batch | status | pattern | decode tokens/s | prompt tokens/s | message |" in text
    assert "| a | 1 | **changed** | - | 20.1 -> 12.3 | 380.0 -> 400.1 | m |" in text


GPU_RESULT = {
    "status": "checked", "message": "serves *new* <config>", "pattern": "blk\\.1\\.ffn_`x`",
    "plan": {"gpus": [{"index": 0, "name": "RTX_A", "model_mib": 1000, "kv_mib": 200, "recurrent_mib": 0,
                       "compute_mib": 300, "margin_mib": 500, "free_mib": 4000}],
             "host": {"experts_mib": 1500, "available_mib": 8000}},
    "buffers": {"model": {"CUDA0": 990, "CPU_Mapped": 1510.5}, "kv": {"CUDA0": 200}, "compute": {"CUDA0": 310}},
    "vram": [{"index": 0, "used_mib": 2000, "ok": True}]}


def test_markdown_whole_text_of_a_stopped_rollout():
    """A host without a plan has no memory table, and the hosts after it have theirs: one planned and measured,
    one planned only, one of host RAM only."""
    planned_only = {"status": "changed", "message": "a|b `c` d\\e",
                    "plan": {"gpus": [{"index": 1, "model_mib": 1234567.89, "free_mib": 2000000}],
                             "host": {"experts_mib": 4, "available_mib": 2048}}}
    cpu_only = {"status": "unchanged", "message": "ok", "pattern": "x",
                "plan": {"gpus": [], "host": {"available_mib": 2048}}}
    rollout = Rollout(hosts=["g_1", "none", "gpu", "cpu", "c"], serial=[1, "50%"], check_mode=True, seconds=12.0,
                      batches=[["g_1", "none", "gpu", "cpu"]])
    report = build_report(rollout, [
        HostRun("g_1", 1, GPU_RESULT, "deploy"), HostRun("none", 1, {"status": "changed", "message": "m"}, "deploy"),
        HostRun("gpu", 1, planned_only, "deploy"), HostRun("cpu", 1, cpu_only, "deploy")])
    stopped = "\nStopped: the run ended after batch 1 without reaching c.\n"
    text = "\n".join([
        "# ai-llm rollout: stopped",
        "",
        "rollout stopped (check mode): changed 2, unchanged 1, checked 1, not\\_reached 1 in 12.0 s.",
        "",
        "Stopped: the run ended after batch 1 without reaching c.",
        "",
        'Batches as Ansible ran them (serial [1, "50%"], llm_rollout_max_fail_percentage 0): 1: g\\_1, none, gpu, cpu.',
        "",
        "| host | batch | status | pattern | message |",
        "|---|---|---|---|---|",
        "| g\\_1 | 1 | **checked** | `` blk\\.1\\.ffn_'x' `` | serves \\*new\\* &lt;config> |",
        "| none | 1 | **changed** | - | m |",
        "| gpu | 1 | **changed** | - | a\\|b \\`c\\` d\\\\e |",
        "| cpu | 1 | **unchanged** | `` x `` | ok |",
        "| c | - | **not_reached** | - | %s |" % NOT_REACHED,
        "",
        "## g\\_1 (checked)",
        "",
        "| memory | planned MiB | measured MiB |",
        "|---|---|---|",
        "| **GPU 0 RTX\\_A** (free before: 4,000.0) | 2,000.0 | 2,000.0 |",
        "| weights | 1,000.0 | 990.0 |",
        "| KV cache | 200.0 | 200.0 |",
        "| recurrent state | 0.0 | 0.0 |",
        "| compute | 300.0 | 310.0 |",
        "| margin | 500.0 | - |",
        "| other (CUDA context...) | - | 500.0 |",
        "| free | 2,000.0 | 2,000.0 |",
        "| **host RAM** (available: 8,000.0) | experts 1,500.0 | CPU model buffers 1,510.5 |",
        "",
        "## gpu (changed)",
        "",
        "| memory | planned MiB | measured MiB |",
        "|---|---|---|",
        "| **GPU 1** (free before: 2,000,000.0) | 1,234,567.9 | - |",
        "| weights | 1,234,567.9 | - |",
        "| KV cache | 0.0 | - |",
        "| recurrent state | 0.0 | - |",
        "| compute | 0.0 | - |",
        "| margin | 0.0 | - |",
        "| free | 765,432.1 | - |",
        "| **host RAM** (available: 2,048.0) | experts 4.0 | CPU model buffers - |",
        "",
        "## cpu (unchanged)",
        "",
        "| memory | planned MiB | measured MiB |",
        "|---|---|---|",
        "| **host RAM** (available: 2,048.0) | experts - | CPU model buffers - |",
    ]) + "\n"
    assert markdown(report) == text
    # without a reason, no "Stopped:" paragraph; the serial as JSON
    assert markdown(dict(report, reason=None, serial=None)) == text.replace(stopped, "").replace(
        'serial [1, "50%"]', "serial null")


def test_markdown_names_the_host_whose_plan_is_malformed():
    bad = {"status": "changed", "message": "m", "plan": {"gpus": "not a list"}}
    report = build_report(Rollout(hosts=["gpu-7"], batches=[["gpu-7"]]), [HostRun("gpu-7", 1, bad, "deploy")])
    assert error_of(markdown, report) == "gpu-7: llm_server_result.plan.gpus is str, not a list"


def test_corrupted_model_on_the_second_host_stops_the_rollout():
    """Canary h1 changed, h2 rolled back, 0% allowed: Ansible stopped before h3 and h4."""
    hosts = ["h1", "h2", "h3", "h4"]
    runs = [HostRun("h1", 1, samples.changed_single(), "deploy"),
            HostRun("h2", 2, samples.rolled_back_busy(), "deploy", failure="rolled back", failure_phase="deploy"),
            HostRun("h3", result=samples.checked_cpu(), result_phase="preflight"), HostRun("h4")]
    report = build_report(Rollout(hosts=hosts, batches=[["h1"], ["h2"]]), runs)
    assert report["outcome"] == "stopped"
    assert [(r["host"], r["batch"], r["status"]) for r in report["hosts"]] == [
        ("h1", 1, "changed"), ("h2", 2, "rolled_back"), ("h3", None, "not_reached"), ("h4", None, "not_reached")]
    assert report["reason"] == ("batch 2: h2 rolled_back (1 of 1 hosts); Ansible stops the rollout when more than "
                                "llm_rollout_max_fail_percentage (0%) of a batch fails, or all of it")


def test_a_result_the_report_cannot_read_fails_its_host_and_keeps_it_unreachable_and_its_batch():
    good = samples.changed_single()
    runs = [HostRun("h1", 1, good, "deploy"), HostRun("h2", 1, dict(good, status="done"), "deploy"),
            HostRun("h3", 1, [], "deploy"),
            HostRun("u", 1, "oops", "deploy", unreachable="gone", unreachable_phase="deploy")]
    report = build_report(Rollout(hosts=["h1", "h2", "h3", "u"], batches=[["h1", "h2", "h3", "u"]]), runs)
    assert report["errors"] == ["h2: llm_server_result.status is 'done', not one of " + ROLE_STATUS_LIST,
                                "h3: llm_server_result is list, not a dict", "u: llm_server_result is str, not a dict"]
    assert [(row["batch"], row["status"], row["message"], row["result"]) for row in report["hosts"]] == [
        (1, "changed", good["message"], good), (1, "failed", report["errors"][0], None),
        (1, "failed", report["errors"][1], None), (1, "unreachable", "unreachable in the deploy: gone", None)]
    assert report["hosts"][3]["ansible"] == {"outcome": "unreachable", "phase": "deploy", "msg": "gone"}
