"""The rollout report's rules, field by field: each host's row, the outcome and its reason, the text renderings
(summary line, table, Markdown, JSON) and the memory views drawn from a host's ``llm_server_result``."""
from __future__ import annotations

import datetime

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._rollout_report import (
    KIND_LABELS, HostRun, ReportError, Rollout, batch_list, build_report, check_result, device_buffers, host_row,
    host_status, markdown, memory_views, one_line, stop_reason, summary_line, table, to_json)

NOT_REACHED = "not touched: the rollout stopped before this host's batch"
BATCH_STOPPED = ("its batch stopped before the llm_server role finished here (another host of the batch failed); "
                 "what it serves was not verified")
ROLE_STATUS_LIST = "changed, unchanged, failed, rolled_back, checked"
SKIP_HINT = "nothing was restarted (llm_rollout_skip_refused_hosts: true rolls out the other hosts)"


def error_of(call, *args):
    """The message of the ``ReportError`` that ``call(*args)`` raises."""
    with pytest.raises(ReportError) as caught:
        call(*args)
    return str(caught.value)


# ------------------------------------------------------------------------------------------------- one_line
def test_one_line_folds_whitespace_runs_and_strips_the_ends():
    assert one_line("  the model\n\tfailed   to load \r\n") == "the model failed to load"
    assert one_line(None) == ""
    assert one_line("") == ""
    assert one_line(42) == "42"


def test_one_line_keeps_600_characters_by_default_and_cuts_longer_text_with_an_ellipsis():
    assert one_line("x" * 600) == "x" * 600
    assert one_line("x" * 601) == "x" * 597 + "..."
    assert len(one_line("y" * 5000)) == 600


def test_one_line_limit_is_the_length_of_the_cut_text_ellipsis_included():
    assert one_line("abcdef", limit=6) == "abcdef"
    assert one_line("abcdefg", limit=6) == "abc..."
    assert one_line("a  b  c  d", limit=7) == "a b c d"      # folded first, then measured


# ---------------------------------------------------------------------------------------------- check_result
def test_check_result_returns_the_result_with_a_known_status():
    for status in ("changed", "unchanged", "failed", "rolled_back", "checked"):
        result = {"status": status, "message": "m"}
        assert check_result("h", result) is result


def test_check_result_names_the_host_and_what_is_wrong():
    assert error_of(check_result, "h1", "done") == "h1: llm_server_result is str, not a dict"
    assert error_of(check_result, "h1", None) == "h1: llm_server_result is NoneType, not a dict"
    assert error_of(check_result, "h2", {"status": "ok"}) == (
        "h2: llm_server_result.status is 'ok', not one of " + ROLE_STATUS_LIST)
    assert error_of(check_result, "h3", {}) == "h3: llm_server_result.status is None, not one of " + ROLE_STATUS_LIST
    for status in ("unreachable", "not_reached"):       # the report's statuses, never the role's
        assert error_of(check_result, "h", {"status": status}).startswith("h: llm_server_result.status is")


# ----------------------------------------------------------------------------------------------- host_status
def test_unreachable_names_the_phase_or_the_rollout_when_the_phase_is_unknown():
    assert host_status(HostRun("h", unreachable="ssh:\n  refused", unreachable_phase="preflight")) == (
        "unreachable", "unreachable in the preflight: ssh: refused")
    assert host_status(HostRun("h", batch=1, unreachable="gone")) == ("unreachable", "unreachable in the rollout: gone")
    # it wins over a failure and a result of the deploy
    run = HostRun("h", batch=1, result={"status": "changed", "message": "m"}, result_phase="deploy",
                  failure="boom", failure_phase="deploy", unreachable="gone", unreachable_phase="deploy")
    assert host_status(run) == ("unreachable", "unreachable in the deploy: gone")


def test_unreachable_message_is_one_line_of_at_most_600_characters():
    status, message = host_status(HostRun("h", unreachable="z" * 700, unreachable_phase="deploy"))
    assert status == "unreachable"
    assert message == "unreachable in the deploy: " + "z" * (597 - len("unreachable in the deploy: ")) + "..."


def test_a_deploy_result_gives_its_status_and_message_or_the_status_alone():
    for status in ("changed", "unchanged", "checked", "rolled_back", "failed"):
        assert host_status(HostRun("h", batch=1, result={"status": status, "message": "line 1\nline 2"},
                                   result_phase="deploy")) == (status, "line 1 line 2")
        assert host_status(HostRun("h", batch=1, result={"status": status}, result_phase="deploy")) == (status, status)
        assert host_status(HostRun("h", batch=1, result={"status": status, "message": ""},
                                   result_phase="deploy")) == (status, status)


def test_a_deploy_failure_after_a_good_role_result_makes_the_host_failed():
    for status in ("changed", "unchanged", "checked"):
        run = HostRun("h", batch=1, result={"status": status, "message": "m"}, result_phase="deploy",
                      failure="the disk\nis full", failure_phase="deploy")
        assert host_status(run) == ("failed", "after the role ended %s: the disk is full" % status)
    # the role's own bad outcomes keep their status and message
    for status in ("rolled_back", "failed"):
        run = HostRun("h", batch=1, result={"status": status, "message": "m"}, result_phase="deploy",
                      failure="boom", failure_phase="deploy")
        assert host_status(run) == (status, "m")
    # a phase without a failure message is no failure
    run = HostRun("h", batch=1, result={"status": "changed", "message": "m"}, result_phase="deploy",
                  failure_phase="deploy")
    assert host_status(run) == ("changed", "m")
    # a failure of the preflight does not override what the deploy published
    run = HostRun("h", batch=1, result={"status": "changed", "message": "m"}, result_phase="deploy",
                  failure="boom", failure_phase="preflight")
    assert host_status(run) == ("changed", "m")


def test_a_failed_result_outside_the_deploy_is_failed_with_its_message_or_the_phase():
    assert host_status(HostRun("h", result={"status": "failed", "message": "does not\nfit"},
                               result_phase="preflight")) == ("failed", "does not fit")
    assert host_status(HostRun("h", result={"status": "failed"}, result_phase="preflight")) == (
        "failed", "failed in the preflight")
    assert host_status(HostRun("h", result={"status": "failed"})) == ("failed", "failed in the rollout")


def test_an_ansible_failure_without_a_failed_result_is_failed_with_its_message():
    assert host_status(HostRun("h", failure="Could not find\n the model", failure_phase="preflight")) == (
        "failed", "preflight: Could not find the model")
    assert host_status(HostRun("h", batch=2, failure="boom", failure_phase="deploy")) == ("failed", "boom")
    assert host_status(HostRun("h", failure="boom")) == ("failed", "boom")
    # a good preflight result does not hide a later failure
    assert host_status(HostRun("h", batch=1, result={"status": "checked"}, result_phase="preflight",
                               failure="boom", failure_phase="deploy")) == ("failed", "boom")


def test_a_host_of_a_batch_without_a_deploy_result_is_failed_and_one_without_a_batch_not_reached():
    assert host_status(HostRun("h", batch=1)) == ("failed", BATCH_STOPPED)
    assert host_status(HostRun("h", batch=1, result={"status": "checked"}, result_phase="preflight")) == (
        "failed", BATCH_STOPPED)
    assert host_status(HostRun("h")) == ("not_reached", NOT_REACHED)
    assert host_status(HostRun("h", batch=1, result_phase="deploy")) == ("failed", BATCH_STOPPED)
    assert host_status(HostRun("h", result={"status": "changed"}, result_phase="preflight")) == (
        "not_reached", NOT_REACHED)


# -------------------------------------------------------------------------------------------------- host_row
def test_host_row_of_a_host_never_run():
    assert host_row(HostRun("h")) == {
        "host": "h", "batch": None, "status": "not_reached", "message": NOT_REACHED, "pattern": None,
        "pattern_source": None, "config_hash": None, "ansible": {"outcome": "not_run", "phase": None, "msg": None},
        "result_from": None, "result": None}


def test_host_row_carries_the_pattern_and_the_result_verbatim():
    result = {"status": "changed", "message": "m", "pattern": "blk\\.1\\.", "pattern_source": "plan",
              "config_hash": "c" * 64, "extra": [1]}
    assert host_row(HostRun("h", batch=2, result=result, result_phase="deploy")) == {
        "host": "h", "batch": 2, "status": "changed", "message": "m", "pattern": "blk\\.1\\.",
        "pattern_source": "plan", "config_hash": "c" * 64, "ansible": {"outcome": "ok", "phase": None, "msg": None},
        "result_from": "deploy", "result": result}
    # an empty pattern is no pattern
    row = host_row(HostRun("h", result={"status": "checked", "pattern": ""}, result_phase="preflight"))
    assert row["pattern"] is None and row["pattern_source"] is None and row["config_hash"] is None
    assert row["result_from"] == "preflight"


def test_host_row_result_from_is_none_without_a_result():
    row = host_row(HostRun("h", result_phase="preflight"))
    assert row["result_from"] is None and row["result"] is None
    assert row["ansible"] == {"outcome": "ok", "phase": None, "msg": None}


def test_host_row_says_what_ansible_did():
    def ansible(run):
        return host_row(run)["ansible"]
    assert ansible(HostRun("h", batch=1, unreachable="ssh\n  refused", unreachable_phase="deploy",
                           failure="boom", failure_phase="deploy")) == {
        "outcome": "unreachable", "phase": "deploy", "msg": "ssh refused"}
    assert ansible(HostRun("h", unreachable="gone")) == {"outcome": "unreachable", "phase": None, "msg": "gone"}
    assert ansible(HostRun("h", failure="plan\nrefused", failure_phase="preflight")) == {
        "outcome": "failed", "phase": "preflight", "msg": "plan refused"}
    assert ansible(HostRun("h", batch=1)) == {"outcome": "ok", "phase": None, "msg": None}
    assert ansible(HostRun("h", batch=1, result={"status": "changed"}, result_phase="deploy")) == {
        "outcome": "ok", "phase": None, "msg": None}
    assert ansible(HostRun("h")) == {"outcome": "not_run", "phase": None, "msg": None}


# ---------------------------------------------------------------------------------------------- build_report
def result(status, message="m", **kw):
    return dict(kw, status=status, message=message)


def test_build_report_whole_dict_of_a_rollout_that_completed_with_failures():
    a = result("changed", "m a", pattern="pa", pattern_source="plan", config_hash="h1")
    b = result("failed", "boom")
    rollout = Rollout(hosts=["a", "b"], report_dir="r", serial=2, max_fail_percentage="25%", check_mode=1,
                      batches=[["a"], ["b"]], batch_seconds=[3.5], started="S", finished="F", seconds=9.25)
    report = build_report(rollout, [HostRun("b", 2, b, "deploy"), HostRun("a", 1, a, "deploy")])
    assert report == {
        "outcome": "completed_with_failures", "reason": None, "check_mode": True,
        "summary": {"changed": 1, "failed": 1}, "serial": 2, "max_fail_percentage": 25,
        "batches": [{"batch": 1, "hosts": ["a"], "seconds": 3.5}, {"batch": 2, "hosts": ["b"], "seconds": None}],
        "started": "S", "finished": "F", "seconds": 9.25,
        "hosts": [
            {"host": "a", "batch": 1, "status": "changed", "message": "m a", "pattern": "pa",
             "pattern_source": "plan", "config_hash": "h1",
             "ansible": {"outcome": "ok", "phase": None, "msg": None}, "result_from": "deploy", "result": a},
            {"host": "b", "batch": 2, "status": "failed", "message": "boom", "pattern": None,
             "pattern_source": None, "config_hash": None,
             "ansible": {"outcome": "ok", "phase": None, "msg": None}, "result_from": "deploy", "result": b}],
        "errors": []}
    assert list(report) == ["outcome", "reason", "check_mode", "summary", "serial", "max_fail_percentage",
                            "batches", "started", "finished", "seconds", "hosts", "errors"]


def test_build_report_defaults_of_an_empty_rollout():
    assert build_report(Rollout(), []) == {
        "outcome": "completed", "reason": None, "check_mode": False, "summary": {}, "serial": None,
        "max_fail_percentage": 0, "batches": [], "started": None, "finished": None, "seconds": None,
        "hosts": [], "errors": []}


def test_build_report_outcome_is_completed_only_when_every_host_is_ok():
    for status in ("changed", "unchanged", "checked"):
        report = build_report(Rollout(hosts=["a"], batches=[["a"]]), [HostRun("a", 1, result(status), "deploy")])
        assert (report["outcome"], report["reason"]) == ("completed", None)
    for status in ("failed", "rolled_back"):
        report = build_report(Rollout(hosts=["a"], batches=[["a"]], max_fail_percentage=100),
                              [HostRun("a", 1, result(status), "deploy")])
        assert (report["outcome"], report["reason"]) == ("completed_with_failures", None)
    report = build_report(Rollout(hosts=["a"], batches=[["a"]]),
                          [HostRun("a", 1, unreachable="gone", unreachable_phase="deploy")])
    assert (report["outcome"], report["errors"]) == ("completed_with_failures", [])


def test_build_report_stops_when_a_host_was_not_reached():
    report = build_report(Rollout(hosts=["a", "b"], batches=[["a"]], max_fail_percentage=0),
                          [HostRun("a", 1, result("failed", "x"), "deploy")])
    assert report["outcome"] == "stopped"
    assert report["reason"] == ("batch 1: a failed (1 of 1 hosts); Ansible stops the rollout when more than "
                                "llm_rollout_max_fail_percentage (0%) of a batch fails, or all of it")
    assert report["hosts"][1]["status"] == "not_reached"


def test_build_report_summary_counts_follow_the_order_of_the_statuses():
    runs = [HostRun("u", 1, unreachable="gone"), HostRun("f", 1, result("failed"), "deploy"),
            HostRun("r", 1, result("rolled_back"), "deploy"), HostRun("k", 1, result("checked"), "deploy"),
            HostRun("n", 1, result("unchanged"), "deploy"), HostRun("c", 1, result("changed"), "deploy"),
            HostRun("c2", 1, result("changed"), "deploy")]
    report = build_report(Rollout(hosts=[r.host for r in runs] + ["x"], batches=[[r.host for r in runs]],
                                  max_fail_percentage=100), runs)
    assert list(report["summary"].items()) == [("changed", 2), ("unchanged", 1), ("checked", 1), ("rolled_back", 1),
                                               ("failed", 1), ("unreachable", 1), ("not_reached", 1)]


def test_build_report_orders_inventory_hosts_first_then_the_others_sorted():
    runs = [HostRun("z", 1, result("changed"), "deploy"), HostRun("b", 1, result("changed"), "deploy"),
            HostRun("m", 1, result("changed"), "deploy")]
    report = build_report(Rollout(hosts=["m", "q"], batches=[["m", "z", "b"]]), runs)
    assert [(r["host"], r["status"]) for r in report["hosts"]] == [
        ("m", "changed"), ("q", "not_reached"), ("b", "changed"), ("z", "changed")]
    assert report["hosts"][1]["ansible"] == {"outcome": "not_run", "phase": None, "msg": None}


def test_a_result_the_report_cannot_read_fails_its_host_in_the_phase_that_published_it():
    run = HostRun("p", result={"status": "bogus"}, result_phase="preflight")
    report = build_report(Rollout(hosts=["p"]), [run])
    error = "p: llm_server_result.status is 'bogus', not one of " + ROLE_STATUS_LIST
    assert report["errors"] == [error]
    assert report["hosts"] == [{
        "host": "p", "batch": None, "status": "failed", "message": "preflight: " + error, "pattern": None,
        "pattern_source": None, "config_hash": None,
        "ansible": {"outcome": "failed", "phase": "preflight", "msg": error}, "result_from": None, "result": None}]
    assert report["outcome"] == "stopped"
    assert report["reason"] == "preflight: p (failed); " + SKIP_HINT


def test_a_result_the_report_cannot_read_keeps_the_host_unreachable_and_its_batch():
    run = HostRun("u", batch=1, result="oops", result_phase="deploy", unreachable="gone", unreachable_phase="deploy")
    report = build_report(Rollout(hosts=["u"], batches=[["u"]]), [run])
    assert report["errors"] == ["u: llm_server_result is str, not a dict"]
    row = report["hosts"][0]
    assert (row["batch"], row["status"], row["message"]) == (1, "unreachable", "unreachable in the deploy: gone")
    assert row["ansible"] == {"outcome": "unreachable", "phase": "deploy", "msg": "gone"}


def test_the_seconds_of_each_batch_are_given_where_ansible_timed_them():
    rollout = Rollout(hosts=["a", "b", "c"], batches=[["a"], ["b"], ["c"]], batch_seconds=[1.0, 2.0])
    runs = [HostRun(h, 1, result("changed"), "deploy") for h in "abc"]
    assert build_report(rollout, runs)["batches"] == [
        {"batch": 1, "hosts": ["a"], "seconds": 1.0}, {"batch": 2, "hosts": ["b"], "seconds": 2.0},
        {"batch": 3, "hosts": ["c"], "seconds": None}]


# ---------------------------------------------------------------------------------- the failure percentage
def max_fail(value):
    return build_report(Rollout(max_fail_percentage=value), [])["max_fail_percentage"]


def test_max_fail_percentage_reads_numbers_and_percent_strings_from_0_to_100():
    assert max_fail(None) == 0 and isinstance(max_fail(None), int)
    for given, read in ((0, 0), (100, 100), ("100", 100), ("100%", 100), (" 25% ", 25), ("0%", 0),
                        (12.5, 12.5), ("12.5%", 12.5), (100.0, 100), ("50.0", 50)):
        assert max_fail(given) == read, given
        assert type(max_fail(given)) is type(read), given        # whole numbers are ints


def test_max_fail_percentage_outside_0_to_100_or_not_a_number_is_refused():
    for given in (100.5, 101, "101%", -1, "-0.5", True, False, "all", "", "%", [25]):
        assert error_of(max_fail, given) == (
            "llm_rollout_max_fail_percentage is %r: give a percentage from 0 to 100" % (given,)), given


# ----------------------------------------------------------------------------------------------- stop_reason
def rows(**statuses):
    return [{"host": host, "status": status} for host, status in statuses.items()]


def test_no_stop_reason_when_every_host_was_reached():
    assert stop_reason([], [], 0) is None
    assert stop_reason(rows(a="checked", b="changed", c="unchanged"), [], 0) is None
    assert stop_reason(rows(a="failed", b="unreachable", c="rolled_back"), [["a", "b", "c"]], 0) is None


def test_a_preflight_that_refused_hosts_names_them():
    reason = stop_reason(rows(a="changed", b="failed", c="unreachable", d="not_reached", e="rolled_back"), [], 0)
    assert reason == "preflight: b (failed), c (unreachable); " + SKIP_HINT
    assert stop_reason(rows(a="checked", b="not_reached"), [], 0) == "preflight: no host; " + SKIP_HINT
    assert stop_reason(rows(a="rolled_back"), [], 0) == "preflight: no host; " + SKIP_HINT


def test_a_run_that_ended_after_a_good_batch_names_the_hosts_not_reached():
    reason = stop_reason(rows(a="changed", b="failed", c="not_reached", d="not_reached", e="changed"),
                         [["b"], ["a", "e"]], 0)
    assert reason == "the run ended after batch 2 without reaching c, d"


def test_a_batch_that_failed_names_its_bad_hosts_and_the_threshold():
    reason = stop_reason(rows(a="changed", b="failed", c="unreachable", d="not_reached", e="rolled_back"),
                         [["a"], ["b", "a", "c", "x"]], 12.5)
    assert reason == ("batch 2: b failed, c unreachable (2 of 4 hosts); Ansible stops the rollout when more than "
                      "llm_rollout_max_fail_percentage (12.5%) of a batch fails, or all of it")


# ------------------------------------------------------------------------------------------- text renderings
def test_to_json_is_two_space_indented_in_the_report_order_and_writes_other_values_as_text():
    text = to_json({"outcome": "completed", "batches": [1], "started": datetime.date(2026, 12, 1)})
    assert text == '{\n  "outcome": "completed",\n  "batches": [\n    1\n  ],\n  "started": "2026-12-01"\n}\n'


def test_summary_line_counts_the_statuses_and_says_check_mode_and_the_time():
    report = {"outcome": "stopped", "check_mode": False, "summary": {"changed": 1, "not_reached": 2},
              "seconds": None}
    assert summary_line(report) == "rollout stopped: changed 1, not_reached 2"
    assert summary_line(dict(report, check_mode=True, seconds=72.34)) == (
        "rollout stopped (check mode): changed 1, not_reached 2 in 72.3 s")
    assert summary_line(dict(report, seconds=0.0)) == "rollout stopped: changed 1, not_reached 2 in 0.0 s"
    assert summary_line({"outcome": "completed", "check_mode": False, "summary": {}}) == "rollout completed: no hosts"


def test_batch_list_names_each_batch_and_its_hosts_or_none():
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


def test_table_drops_only_the_role_prefix_at_the_start_of_a_message():
    def message(text):
        report = table_report([{"host": "h", "batch": 1, "status": "changed", "pattern": "p", "message": text}])
        return table(report).splitlines()[1][len("h     1      changed  p        "):]
    assert message("llm_server: the deploy on h-1 failed: the model failed") == "the model failed"
    assert message("llm_server: plan refused") == "plan refused"
    assert message("the deploy on h failed: oom") == "oom"
    assert message("see llm_server: x") == "see llm_server: x"
    report = table_report([{"host": "h", "batch": 1, "status": "changed", "pattern": "p", "message": "llm_server: "}])
    assert table(report).splitlines()[1] == "h     1      changed  p"        # no trailing blanks


def test_table_cuts_the_message_to_the_width_but_leaves_at_least_20_characters():
    def line(text, width):
        report = table_report([{"host": "h", "batch": 1, "status": "changed", "pattern": "p", "message": text}])
        return table(report, width).splitlines()[1]
    start = "h     1      changed  p        "                 # 29 characters and two blanks
    assert line("m" * 29, 60) == start + "m" * 29
    assert line("m" * 30, 60) == start + "m" * 26 + "..."
    assert line("m" * 20, 40) == start + "m" * 20
    assert line("m" * 21, 40) == start + "m" * 17 + "..."

    def default_width(text):
        report = table_report([{"host": "h", "batch": 1, "status": "changed", "pattern": "p", "message": text}])
        return table(report).splitlines()[1]
    assert default_width("m" * 101) == start + "m" * 101                # 132 characters
    assert default_width("m" * 102) == start + "m" * 98 + "..."


def test_table_cuts_patterns_longer_than_32_characters():
    def pattern_cell(pattern):
        report = table_report([{"host": "h", "batch": 1, "status": "changed", "pattern": pattern, "message": "m"}])
        return table(report).splitlines()[1].split()[3]
    assert pattern_cell("p" * 32) == "p" * 32
    assert pattern_cell("p" * 33) == "p" * 29 + "..."


GPU_RESULT = {
    "status": "checked", "message": "serves *new* <config>", "pattern": "blk\\.1\\.ffn_`x`",
    "plan": {"gpus": [{"index": 0, "name": "RTX_A", "model_mib": 1000, "kv_mib": 200, "recurrent_mib": 0,
                       "compute_mib": 300, "margin_mib": 500, "free_mib": 4000}],
             "host": {"experts_mib": 1500, "available_mib": 8000}},
    "buffers": {"model": {"CUDA0": 990, "CPU_Mapped": 1510.5}, "kv": {"CUDA0": 200}, "compute": {"CUDA0": 310}},
    "vram": [{"index": 0, "used_mib": 2000, "ok": True}]}


def test_markdown_whole_text_of_a_stopped_rollout():
    rollout = Rollout(hosts=["g_1", "c"], serial=[1, "50%"], check_mode=True, batches=[["g_1"]], seconds=12.0)
    report = build_report(rollout, [HostRun("g_1", batch=1, result=GPU_RESULT, result_phase="deploy")])
    assert markdown(report) == "\n".join([
        "# ai-llm rollout: stopped",
        "",
        "rollout stopped (check mode): checked 1, not\\_reached 1 in 12.0 s.",
        "",
        "Stopped: the run ended after batch 1 without reaching c.",
        "",
        'Batches as Ansible ran them (serial [1, "50%"], llm_rollout_max_fail_percentage 0): 1: g\\_1.',
        "",
        "| host | batch | status | pattern | message |",
        "|---|---|---|---|---|",
        "| g\\_1 | 1 | **checked** | `` blk\\.1\\.ffn_'x' `` | serves \\*new\\* &lt;config> |",
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
    ]) + "\n"


def test_markdown_whole_text_of_a_completed_rollout_with_a_plan_not_measured():
    planned_only = {"status": "changed", "message": "a|b `c` d\\e",
                    "plan": {"gpus": [{"index": 1, "name": "A", "model_mib": 1234567.89, "free_mib": 2000000}],
                             "host": {"experts_mib": 4, "available_mib": 2048}}}
    cpu_only = {"status": "unchanged", "message": "ok", "pattern": "x",
                "plan": {"gpus": [], "host": {"available_mib": 2048}}}
    rollout = Rollout(hosts=["gpu", "cpu"], batches=[["gpu", "cpu"]])
    report = build_report(rollout, [HostRun("gpu", 1, planned_only, "deploy"), HostRun("cpu", 1, cpu_only, "deploy")])
    assert markdown(report) == "\n".join([
        "# ai-llm rollout: completed",
        "",
        "rollout completed: changed 1, unchanged 1.",
        "",
        "Batches as Ansible ran them (serial null, llm_rollout_max_fail_percentage 0): 1: gpu, cpu.",
        "",
        "| host | batch | status | pattern | message |",
        "|---|---|---|---|---|",
        "| gpu | 1 | **changed** | - | a\\|b \\`c\\` d\\\\e |",
        "| cpu | 1 | **unchanged** | `` x `` | ok |",
        "",
        "## gpu (changed)",
        "",
        "| memory | planned MiB | measured MiB |",
        "|---|---|---|",
        "| **GPU 1 A** (free before: 2,000,000.0) | 1,234,567.9 | - |",
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


def test_markdown_escapes_host_names_in_rows_and_headings():
    result_ = {"status": "changed", "message": "m", "plan": {"host": {"experts_mib": 1}}}
    report = build_report(Rollout(hosts=["<b>*h*</b>"], batches=[["x"]]),
                          [HostRun("<b>*h*</b>", 1, result_, "deploy")])
    text = markdown(report)
    assert "| &lt;b>\\*h\\*&lt;/b> | 1 | **changed** | - | m |" in text.splitlines()
    assert "## &lt;b>\\*h\\*&lt;/b> (changed)" in text.splitlines()


def test_markdown_gives_a_memory_table_to_every_host_with_a_plan_whatever_the_hosts_before_it():
    no_plan = {"status": "changed", "message": "m"}
    unnamed_gpu = {"status": "changed", "message": "m", "plan": {"gpus": [{"index": 0, "free_mib": 100}]}}
    report = build_report(Rollout(hosts=["a", "b"], batches=[["a", "b"]]),
                          [HostRun("a", 1, no_plan, "deploy"), HostRun("b", 1, unnamed_gpu, "deploy")])
    text = markdown(report)
    assert "## a (changed)" not in text
    assert text.endswith("\n".join([
        "## b (changed)",
        "",
        "| memory | planned MiB | measured MiB |",
        "|---|---|---|",
        "| **GPU 0** (free before: 100.0) | 0.0 | - |",
        "| weights | 0.0 | - |",
        "| KV cache | 0.0 | - |",
        "| recurrent state | 0.0 | - |",
        "| compute | 0.0 | - |",
        "| margin | 0.0 | - |",
        "| free | 100.0 | - |"]) + "\n")


def test_every_memory_kind_has_its_label():
    assert KIND_LABELS == {
        "model": "weights", "kv": "KV cache", "recurrent": "recurrent state", "compute": "compute",
        "margin": "margin", "other": "other (CUDA context...)", "free": "free", "overflow": "missing",
        "experts": "routed experts"}


# ------------------------------------------------------------------------------------------- device_buffers
def test_device_buffers_of_nothing_is_empty():
    assert device_buffers(None) == {}
    assert device_buffers({}) == {}
    assert device_buffers([]) == {}


def test_device_buffers_kind_first_reads_recurrent_as_rs_and_devices_as_text():
    assert device_buffers({"recurrent": {"CUDA0": 2}, "model": {0: "10.5", "CPU": None}}) == {
        "CUDA0": {"rs": 2.0}, "0": {"model": 10.5}, "CPU": {"model": None}}


def test_device_buffers_device_first_keeps_only_the_known_kinds():
    assert device_buffers({"CUDA0": {"model": 1, "weights": 9, "recurrent": 3}, "CPU": {"other": 1}}) == {
        "CUDA0": {"model": 1.0, "rs": 3.0}}
    # a mix of kinds and devices is read device first
    assert device_buffers({"model": {"CUDA0": 1.0}, "CUDA1": {"kv": 2.0}}) == {"CUDA1": {"kv": 2.0}}


def test_device_buffers_list_items_are_named_by_device_then_buffer_then_position():
    assert device_buffers([{"device": "CUDA0", "model": 1}, {"buffer": "CPU", "model": "2.5"},
                           {"device": "", "buffer": "", "kv": 3}]) == {
        "CUDA0": {"model": 1.0}, "CPU": {"model": 2.5}, "2": {"kv": 3.0}}


def test_device_buffers_errors_name_where_the_bad_value_is():
    assert error_of(device_buffers, "x") == "buffers is str, not a dict"
    assert error_of(device_buffers, "x", "h: llm_server_result.buffers") == (
        "h: llm_server_result.buffers is str, not a dict")
    assert error_of(device_buffers, [{"model": 1}, 7]) == "buffers[1] is int, not a dict"
    assert error_of(device_buffers, {"model": [1]}) == "buffers.model is list, not a dict"
    assert error_of(device_buffers, {"kv": {"CUDA0": True}}) == "buffers.kv.CUDA0 is True, not a number of MiB"
    assert error_of(device_buffers, {"CUDA0": 5}) == "buffers.CUDA0 is int, not a dict"
    assert error_of(device_buffers, {"CUDA0": {"kv": "x"}}) == "buffers.CUDA0.kv is 'x', not a number of MiB"
    assert error_of(device_buffers, [{"device": "CUDA1", "rs": [2]}]) == (
        "buffers.CUDA1.rs is [2], not a number of MiB")


# --------------------------------------------------------------------------------------------- memory_views
def gpu_view(index=0, name=None, available=None, planned=(), planned_total=0.0, overflow=0.0, measured=None,
             measured_total=None, used=None, vram_ok=None):
    return {"index": index, "name": name, "available": available, "planned": list(planned),
            "planned_total": planned_total, "overflow": overflow, "measured": measured,
            "measured_total": measured_total, "used": used, "vram_ok": vram_ok}


def planned(model=0.0, kv=0.0, recurrent=0.0, compute=0.0, margin=0.0, free=0.0):
    return [("model", model), ("kv", kv), ("recurrent", recurrent), ("compute", compute), ("margin", margin),
            ("free", free)]


def test_memory_views_of_no_result_or_no_plan_is_empty():
    assert memory_views(None) == {"gpus": [], "host": None}
    assert memory_views({}) == {"gpus": [], "host": None}
    assert memory_views({"plan": {"gpus": None, "host": None}, "vram": "not measured"}) == {"gpus": [], "host": None}


def test_memory_views_total_mib_of_the_plan_wins_over_the_sum_of_its_parts():
    views = memory_views({"plan": {"gpus": [{"index": 0, "name": "G", "model_mib": 100, "kv_mib": "50",
                                             "free_mib": 1000, "total_mib": 400}]}})
    assert views == {"gpus": [gpu_view(0, "G", 1000.0, planned(100.0, 50.0, free=600.0), 400.0)], "host": None}
    views = memory_views({"plan": {"gpus": [{"index": 0, "model_mib": 100, "kv_mib": 50, "recurrent_mib": 25,
                                             "compute_mib": 75, "margin_mib": 250, "free_mib": 1000}]}})
    assert views["gpus"] == [gpu_view(0, None, 1000.0, planned(100.0, 50.0, 25.0, 75.0, 250.0, 500.0), 500.0)]


def test_memory_views_overflow_is_what_the_plan_needs_beyond_the_free_memory():
    def view(free):
        return memory_views({"plan": {"gpus": [{"index": 0, "model_mib": 400, "free_mib": free}]}})["gpus"][0]
    assert (view(401)["overflow"], dict(view(401)["planned"])["free"]) == (0.0, 1.0)
    assert (view(400)["overflow"], dict(view(400)["planned"])["free"]) == (0.0, 0.0)
    assert (view(300)["overflow"], dict(view(300)["planned"])["free"]) == (100.0, 0.0)
    unknown = view(None)
    assert (unknown["available"], unknown["overflow"], dict(unknown["planned"])["free"]) == (None, 0.0, 0.0)


def test_memory_views_measured_from_the_buffers_and_the_vram_the_container_took():
    res = {"plan": {"gpus": [{"index": 0, "model_mib": 100, "free_mib": 1000}]},
           "buffers": {"CUDA0": {"model": 90, "kv": 10, "rs": 5, "compute": 20}},
           "vram": [{"index": 0, "used_mib": 300, "ok": False}]}
    (gpu,) = memory_views(res)["gpus"]
    assert gpu == gpu_view(0, None, 1000.0, planned(100.0, free=900.0), 100.0, measured=[
        ("model", 90.0), ("kv", 10.0), ("recurrent", 5.0), ("compute", 20.0), ("other", 175.0), ("free", 700.0)],
        measured_total=300.0, used=300.0, vram_ok=False)


def test_memory_views_other_is_only_what_the_vram_used_exceeds_the_buffers():
    def measured(used):
        res = {"plan": {"gpus": [{"index": 0, "free_mib": 1000}]}, "buffers": {"model": {"CUDA0": 100}},
               "vram": [{"index": 0, "used_mib": used}]}
        gpu = memory_views(res)["gpus"][0]
        return gpu["measured"], gpu["measured_total"]
    zeros = [("kv", 0.0), ("recurrent", 0.0), ("compute", 0.0)]
    assert measured(101) == ([("model", 100.0)] + zeros + [("other", 1.0), ("free", 899.0)], 101.0)
    assert measured(100) == ([("model", 100.0)] + zeros + [("free", 900.0)], 100.0)
    assert measured(80) == ([("model", 100.0)] + zeros + [("free", 920.0)], 80.0)


def test_memory_views_measured_free_is_never_negative():
    res = {"plan": {"gpus": [{"index": 0, "free_mib": 1000}]}, "vram": [{"index": 0, "used_mib": 1500}]}
    assert memory_views(res)["gpus"][0]["measured"] == [
        ("model", 0.0), ("kv", 0.0), ("recurrent", 0.0), ("compute", 0.0), ("other", 1500.0), ("free", 0.0)]
    res["vram"][0]["used_mib"] = 1000
    assert dict(memory_views(res)["gpus"][0]["measured"])["free"] == 0.0


def test_memory_views_measured_without_vram_or_free_memory():
    res = {"plan": {"gpus": [{"index": 0}]}, "buffers": {"CUDA0": {"model": 10, "compute": 2}}}
    gpu = memory_views(res)["gpus"][0]
    assert gpu == gpu_view(0, None, None, planned(), 0.0, measured=[
        ("model", 10.0), ("kv", 0.0), ("recurrent", 0.0), ("compute", 2.0)], measured_total=12.0)
    res = {"plan": {"gpus": [{"index": 0}]}, "vram": [{"index": 0, "used_mib": 7}]}
    assert memory_views(res)["gpus"][0]["measured"] == [
        ("model", 0.0), ("kv", 0.0), ("recurrent", 0.0), ("compute", 0.0), ("other", 7.0)]


def test_memory_views_the_ith_gpu_of_the_plan_gets_the_buffers_of_device_i():
    res = {"plan": {"gpus": [{"index": 0}, {"index": 1}, {"index": 2}, {"index": 3}]},
           "buffers": {"CUDA1": {"model": 1}, "Vulkan0": {"model": 2}, "ROCm2": {"kv": 3},
                       "RPC[10.0.0.1:50052]3": {"compute": 4}, "CUDA_Host": {"compute": 5}}}
    assert [dict(g["measured"]) for g in memory_views(res)["gpus"]] == [
        {"model": 2.0, "kv": 0.0, "recurrent": 0.0, "compute": 0.0},
        {"model": 1.0, "kv": 0.0, "recurrent": 0.0, "compute": 0.0},
        {"model": 0.0, "kv": 3.0, "recurrent": 0.0, "compute": 0.0},
        {"model": 0.0, "kv": 0.0, "recurrent": 0.0, "compute": 4.0}]


def test_memory_views_vram_rows_are_matched_by_index_then_by_position():
    res = {"plan": {"gpus": [{"index": 1}, {"index": 0}]},
           "vram": [{"index": 0, "used_mib": 100, "ok": True}, {"index": 1, "used_mib": 200, "ok": False}]}
    gpus = memory_views(res)["gpus"]
    assert [(g["index"], g["used"], g["vram_ok"]) for g in gpus] == [(1, 200.0, False), (0, 100.0, True)]
    res = {"plan": {"gpus": [{"index": 5}, {"index": 6}, {"index": 7}]},
           "vram": [{"index": 0, "used_mib": 40}, "not a row"]}
    assert [memory_views(res)["gpus"][i]["used"] for i in range(3)] == [40.0, None, None]


def test_memory_views_a_gpu_without_index_takes_its_position():
    res = {"plan": {"gpus": [{"name": "A"}, {"name": "B"}]},
           "vram": [{"index": 0, "used_mib": 1}, {"index": 7, "used_mib": 2}]}
    assert [(g["index"], g["name"], g["used"]) for g in memory_views(res)["gpus"]] == [(0, "A", 1.0), (1, "B", 2.0)]


def test_memory_views_host_ram_from_the_plan_and_the_host_side_model_buffers():
    only_experts = memory_views({"plan": {"host": {"experts_mib": 10}}})
    assert only_experts == {"gpus": [], "host": {"available": None, "planned": 10.0, "measured": None}}
    only_available = memory_views({"plan": {"host": {"available_mib": "2048"}}})
    assert only_available["host"] == {"available": 2048.0, "planned": None, "measured": None}
    buffers_only = memory_views({"buffers": {"model": {"CPU": 100, "CPU_REPACK": 50.5, "CUDA0": 9},
                                             "compute": {"CUDA_Host": 3}}})
    assert buffers_only == {"gpus": [], "host": {"available": None, "planned": None, "measured": 150.5}}
    assert memory_views({"buffers": {"compute": {"CUDA_Host": 3}, "model": {"CUDA0": 9}}})["host"] is None
    assert memory_views({"buffers": {"CPU": {"model": 0}}})["host"] == {
        "available": None, "planned": None, "measured": 0.0}


def test_memory_views_errors_name_the_host_and_the_field():
    def error(res, *host):
        return error_of(memory_views, res, *host)
    assert error([]) == "host: llm_server_result is list, not a dict"
    assert error([], "h") == "h: llm_server_result is list, not a dict"
    assert error({"plan": "x"}, "h") == "h: llm_server_result.plan is str, not a dict"
    assert error({"plan": {"gpus": {"a": 1}}}, "h") == "h: llm_server_result.plan.gpus is dict, not a list"
    assert error({"plan": {"gpus": ["x"]}}, "h") == "h: llm_server_result.plan.gpus[0] is str, not a dict"
    assert error({"plan": {"gpus": [{"total_mib": "x"}]}}, "h") == (
        "h: llm_server_result.plan.gpus[0].total_mib is 'x', not a number of MiB")
    assert error({"plan": {"gpus": [{}, {"free_mib": [1]}]}}, "h") == (
        "h: llm_server_result.plan.gpus[1].free_mib is [1], not a number of MiB")
    assert error({"plan": {"gpus": [{"margin_mib": True}]}}, "h") == (
        "h: llm_server_result.plan.gpus[0].margin_mib is True, not a number of MiB")
    assert error({"plan": {"gpus": [{}]}, "vram": [{"used_mib": "x"}]}, "h") == (
        "h: llm_server_result.vram[0].used_mib is 'x', not a number of MiB")
    assert error({"buffers": 3}, "h") == "h: llm_server_result.buffers is int, not a dict"
    assert error({"buffers": {"CUDA0": {"kv": "x"}}}, "h") == (
        "h: llm_server_result.buffers.CUDA0.kv is 'x', not a number of MiB")
    assert error({"plan": {"host": []}}, "h") == "h: llm_server_result.plan.host is list, not a dict"
    assert error({"plan": {"host": {"experts_mib": "many"}}}, "h") == (
        "h: llm_server_result.plan.host.experts_mib is 'many', not a number of MiB")
    assert error({"plan": {"host": {"available_mib": False}}}, "h") == (
        "h: llm_server_result.plan.host.available_mib is False, not a number of MiB")


def test_markdown_escapes_host_names_in_the_batches_line_as_in_the_table():
    report = build_report(Rollout(hosts=["<b>h_1</b>"], batches=[["<b>h_1</b>"]]),
                          [HostRun("<b>h_1</b>", 1, {"status": "changed", "message": "m"}, "deploy")])
    text = markdown(report)
    assert "<b>" not in text
    assert "1: &lt;b>h\\_1&lt;/b>." in text


def test_gpus_without_an_index_take_the_vram_row_in_the_same_place():
    result = {"status": "changed", "plan": {"gpus": [{"total_mib": 1.0}, {"total_mib": 2.0}]},
              "vram": [{"used_mib": 10}, {"used_mib": 20}]}
    assert [g["measured_total"] for g in memory_views(result)["gpus"]] == [10.0, 20.0]


def test_markdown_names_the_host_whose_plan_is_malformed():
    bad = {"status": "changed", "message": "m", "plan": {"gpus": "not a list"}}
    report = build_report(Rollout(hosts=["gpu-7"], batches=[["gpu-7"]]), [HostRun("gpu-7", 1, bad, "deploy")])
    with pytest.raises(ReportError) as raised:
        markdown(report)
    assert str(raised.value).startswith("gpu-7: ")
