"""The rollout report's rules: each host's status, the outcome, why it stopped, the table, Markdown, memory views."""
from __future__ import annotations

import json

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._rollout_report import (
    STATUSES, HostRun, ReportError, Rollout, build_report, device_buffers, host_status, markdown, memory_views,
    table, to_json)
from tests.helpers import rollout_samples as samples


def rollout(hosts, batches, max_fail=0, **kw):
    return Rollout(hosts=hosts, report_dir="r", serial=[1, "34%", "100%"], max_fail_percentage=max_fail,
                   batches=batches, **kw)


def deployed(host, batch, result):
    return HostRun(host, batch=batch, result=result, result_phase="deploy")


def test_statuses_come_from_the_role_result_of_the_batch():
    for make, status in ((samples.changed_single, "changed"), (samples.unchanged_dual, "unchanged"),
                         (samples.rolled_back_busy, "rolled_back"), (samples.checked_cpu, "checked"),
                         (samples.refused_busy, "failed")):
        result = make()
        assert host_status(deployed("h", 1, result)) == (status, result["message"])


def test_unreachable_wins_over_an_earlier_result():
    run = deployed("h", 2, samples.changed_single())
    run.unreachable, run.unreachable_phase = "Failed to connect to the host via ssh: Connection refused", "deploy"
    assert host_status(run) == (
        "unreachable", "unreachable in the deploy: Failed to connect to the host via ssh: Connection refused")


def test_a_failure_after_the_role_ended_well_makes_the_host_failed():
    run = deployed("h", 1, samples.changed_single())
    run.failure, run.failure_phase = "the disk is full", "deploy"
    assert host_status(run) == ("failed", "after the role ended changed: the disk is full")
    # the role's own failure keeps the role's status and message
    run.result = samples.rolled_back_busy()
    assert host_status(run)[0] == "rolled_back"


def test_preflight_refusal_and_failures_outside_the_role():
    refused = HostRun("h", result=samples.refused_busy(), result_phase="preflight",
                      failure="plan refused", failure_phase="preflight")
    assert host_status(refused) == ("failed", samples.refused_busy()["message"])
    no_result = HostRun("h", failure="Could not find the model\n  at /srv/models", failure_phase="preflight")
    assert host_status(no_result) == ("failed", "preflight: Could not find the model at /srv/models")
    planned_only = HostRun("h", result=samples.checked_cpu(), result_phase="preflight")
    assert host_status(planned_only)[0] == "not_reached"
    assert host_status(HostRun("h"))[0] == "not_reached"
    # in a batch, but the batch stopped before the role published anything here
    status, message = host_status(HostRun("h", batch=3, result=samples.checked_cpu(), result_phase="preflight"))
    assert status == "failed" and "not verified" in message


def test_corrupted_model_on_the_second_host_stops_the_rollout():
    """Canary h1 changed, h2 rolled back, 0% allowed: Ansible stopped before h3 and h4."""
    hosts = ["h1", "h2", "h3", "h4"]
    runs = [deployed("h1", 1, samples.changed_single()), deployed("h2", 2, samples.rolled_back_busy()),
            HostRun("h3", result=samples.checked_cpu(), result_phase="preflight"), HostRun("h4")]
    runs[1].failure, runs[1].failure_phase = "rolled back", "deploy"
    report = build_report(rollout(hosts, [["h1"], ["h2"]]), runs)
    assert report["outcome"] == "stopped"
    assert [(r["host"], r["batch"], r["status"]) for r in report["hosts"]] == [
        ("h1", 1, "changed"), ("h2", 2, "rolled_back"), ("h3", None, "not_reached"), ("h4", None, "not_reached")]
    assert report["summary"] == {"changed": 1, "rolled_back": 1, "not_reached": 2}
    assert report["reason"] == ("batch 2: h2 rolled_back (1 of 1 hosts); Ansible stops the rollout when more than "
                                "llm_rollout_max_fail_percentage (0%) of a batch fails, or all of it")
    assert report["batches"] == [{"batch": 1, "hosts": ["h1"], "seconds": None},
                                 {"batch": 2, "hosts": ["h2"], "seconds": None}]
    h2 = report["hosts"][1]
    assert h2["result"]["rollback"]["serving"] is True and h2["result_from"] == "deploy"
    assert h2["pattern"] == samples.PATTERN_2            # what serves again: the restored configuration's pattern
    assert h2["ansible"] == {"outcome": "failed", "phase": "deploy", "msg": "rolled back"}
    assert report["hosts"][2]["result_from"] == "preflight"
    # rollout.json is JSON with the same content
    assert json.loads(to_json(report)) == json.loads(json.dumps(report))


def test_outcomes_when_every_host_was_reached():
    hosts = ["a", "b"]
    ok = build_report(rollout(hosts, [["a"], ["b"]]), [deployed("a", 1, samples.changed_single()),
                                                       deployed("b", 2, samples.unchanged_dual())])
    assert ok["outcome"] == "completed" and ok["reason"] is None
    with_failure = build_report(rollout(hosts, [["a", "b"]], max_fail=50), [
        deployed("a", 1, samples.changed_single()), deployed("b", 1, samples.rolled_back_busy())])
    assert with_failure["outcome"] == "completed_with_failures"
    assert with_failure["max_fail_percentage"] == 50


def test_preflight_refusal_stops_before_any_batch():
    runs = [HostRun("a", result=samples.checked_cpu(), result_phase="preflight"),
            HostRun("b", result=samples.refused_busy(), result_phase="preflight", failure="refused",
                    failure_phase="preflight")]
    report = build_report(rollout(["a", "b"], []), runs)
    assert report["outcome"] == "stopped"
    assert report["reason"].startswith("preflight: b (failed); nothing was restarted")
    assert [r["status"] for r in report["hosts"]] == ["not_reached", "failed"]


def test_every_host_lost_in_the_preflight_stops_the_rollout():
    runs = [HostRun(h, unreachable="ssh: connect to host 127.0.0.1 port 1: Connection refused",
                    unreachable_phase="preflight") for h in ("u1", "u2")]
    report = build_report(rollout(["u1", "u2"], []), runs)
    assert report["outcome"] == "stopped" and report["summary"] == {"unreachable": 2}
    assert report["reason"].startswith("preflight: u1 (unreachable), u2 (unreachable); nothing was restarted")


def test_hosts_keep_the_inventory_order_and_unknown_hosts_follow():
    report = build_report(rollout(["z", "a"], [["z", "a"]]), [
        deployed("x", 1, samples.changed_single()), deployed("a", 1, samples.changed_single()),
        deployed("z", 1, samples.changed_single())])
    assert [r["host"] for r in report["hosts"]] == ["z", "a", "x"]


def test_bad_input_names_the_host_and_the_field():
    # a result the report cannot read makes its host failed, says why, and the others are reported as usual
    report = build_report(rollout(["h1", "h2", "h3"], [["h1", "h2", "h3"]]), [
        deployed("h1", 1, samples.changed_single()), deployed("h2", 1, dict(samples.changed_single(), status="done")),
        deployed("h3", 1, [])])
    assert [row["status"] for row in report["hosts"]] == ["changed", "failed", "failed"]
    assert report["errors"] == [
        "h2: llm_server_result.status is 'done', not one of changed, unchanged, failed, rolled_back, checked",
        "h3: llm_server_result is list, not a dict"]
    assert report["hosts"][1]["message"] == report["errors"][0] and report["hosts"][1]["result"] is None
    assert build_report(rollout(["h1"], [["h1"]]), [deployed("h1", 1, samples.changed_single())])["errors"] == []
    with pytest.raises(ReportError, match=r"^llm_rollout_max_fail_percentage is '120': give a percentage from 0"):
        build_report(rollout(["h2"], [], max_fail="120"), [])
    bad = samples.changed_single()
    bad["plan"]["gpus"][0]["kv_mib"] = "lots"
    with pytest.raises(ReportError, match=r"^h9: llm_server_result.plan.gpus\[0\].kv_mib is 'lots', not a number"):
        memory_views(bad, "h9")
    bad = samples.changed_single()
    bad["buffers"] = {"model": {"CUDA0": [1]}}
    with pytest.raises(ReportError, match=r"^h9: llm_server_result.buffers.model.CUDA0 is \[1\], not a number"):
        memory_views(bad, "h9")


def test_percentages_are_read_like_ansible_reads_them():
    for given, read in ((0, 0), ("25", 25), ("100%", 100), ("12.5", 12.5), (33.0, 33)):
        assert build_report(rollout([], [], max_fail=given), [])["max_fail_percentage"] == read


def test_buffers_in_every_shape_give_the_same_devices():
    kind_first = {"model": {"CUDA0": 10.0, "CPU_Mapped": 5.0}, "kv": {"CUDA0": 2.0}, "rs": {"CUDA0": 1.0},
                  "compute": {"CUDA0": 3.0, "CUDA_Host": 0.5}}
    device_first = {"CUDA0": {"model": 10.0, "kv": 2.0, "rs": 1.0, "compute": 3.0}, "CPU_Mapped": {"model": 5.0},
                    "CUDA_Host": {"compute": 0.5}}
    as_list = [{"device": "CUDA0", "model": 10.0, "kv": 2.0, "recurrent": 1.0, "compute": 3.0},
               {"device": "CPU_Mapped", "model": 5.0}, {"device": "CUDA_Host", "compute": 0.5}]
    expected = {"CUDA0": {"model": 10.0, "kv": 2.0, "rs": 1.0, "compute": 3.0}, "CPU_Mapped": {"model": 5.0},
                "CUDA_Host": {"compute": 0.5}}
    assert device_buffers(kind_first) == device_buffers(device_first) == device_buffers(as_list) == expected


def test_memory_views_planned_and_measured_per_gpu():
    views = memory_views(samples.changed_single())
    (gpu,) = views["gpus"]
    planned = dict(gpu["planned"])
    assert list(planned) == ["model", "kv", "recurrent", "compute", "margin", "free"]
    assert planned["model"] == 21009.47 and planned["margin"] == 1024.0
    # free: the card's free memory before the deploy less everything planned
    assert planned["free"] == pytest.approx(24148 - (21009.47 + 192.0 + 47.62 + 1178.5 + 1024.0))
    measured = dict(gpu["measured"])
    assert measured["model"] == 21003.12 and measured["kv"] == 192.0 and measured["recurrent"] == 47.62
    # what the container took beyond llama-server's buffers (CUDA context, cuBLAS workspace)
    assert measured["other"] == pytest.approx(22843.0 - (21003.12 + 192.0 + 47.62 + 1178.5))
    assert measured["free"] == pytest.approx(24148 - 22843.0)
    assert gpu["measured_total"] == 22843.0 and gpu["overflow"] == 0.0 and gpu["vram_ok"] is True
    # host RAM: the experts planned; measured: the host-side model buffers llama-server logged
    assert views["host"] == {"available": 61440.0, "planned": 2362.5, "measured": 2375.2}


def test_memory_views_split_and_overflow_and_cpu_hosts():
    dual = memory_views(samples.unchanged_dual())
    assert [g["index"] for g in dual["gpus"]] == [0, 1]
    assert [dict(g["measured"])["model"] for g in dual["gpus"]] == [10870.0, 12260.0]   # CUDA0, CUDA1
    refused = memory_views(samples.refused_busy())["gpus"][0]
    assert refused["overflow"] == pytest.approx(refused["planned_total"] - 2048)
    assert dict(refused["planned"])["free"] == 0.0 and refused["measured"] is None
    cpu = memory_views(samples.checked_cpu())
    assert cpu["gpus"] == [] and cpu["host"] == {"available": 20480.0, "planned": 4.0, "measured": None}
    # a role that measured no VRAM writes a sentence there: the buffers alone are the measurement
    result = samples.changed_single()
    result["vram"] = "not measured (cpu topology)"
    gpu = memory_views(result)["gpus"][0]
    assert gpu["measured_total"] == pytest.approx(21003.12 + 192.0 + 47.62 + 1178.5)
    assert "other" not in dict(gpu["measured"])


def test_table_is_short_and_ends_with_the_outcome():
    long_pattern = dict(samples.changed_single(), pattern=samples.PATTERN_22)
    runs = [deployed("gpu-box-1", 1, long_pattern), deployed("gpu-box-2", 2, samples.rolled_back_busy()),
            HostRun("gpu-box-3")]
    report = build_report(rollout(["gpu-box-1", "gpu-box-2", "gpu-box-3"], [["gpu-box-1"], ["gpu-box-2"]]), runs)
    lines = table(report).splitlines()
    assert lines[0].split() == ["HOST", "BATCH", "STATUS", "PATTERN", "MESSAGE"]
    assert lines[1].split()[:4] == ["gpu-box-1", "1", "changed", samples.PATTERN_22[:29] + "..."]  # cut
    assert lines[2].split()[:4] == ["gpu-box-2", "2", "rolled_back", samples.PATTERN_2]    # the restored one
    assert lines[3].split()[:4] == ["gpu-box-3", "-", "not_reached", "-"]
    assert all(len(line) <= 132 for line in lines[:4])
    # the role's "llm_server: the deploy on <host> failed: " is dropped: the cause fits
    assert lines[2].split(None, 4)[4].startswith("the model failed to load: check_tensor_dims: tensor ")
    assert lines[4] == "rollout stopped: changed 1, rolled_back 1, not_reached 1"
    assert lines[5].startswith("stopped: batch 2: gpu-box-2 rolled_back (1 of 1 hosts)")


def test_markdown_has_a_row_per_host_and_the_memory_per_gpu():
    runs = [deployed("a|b", 1, samples.unchanged_dual()), HostRun("c")]
    text = markdown(build_report(rollout(["a|b", "c"], [["a|b"]]), runs))
    assert text.startswith("# ai-llm rollout: stopped\n")
    message = samples.unchanged_dual()["message"]
    assert message.startswith("ai-llm serves the configuration on disk (")
    assert "| a\\|b | 1 | **unchanged** | - | %s |" % message in text
    assert "| c | - | **not\\_reached** |" not in text          # statuses are not escaped
    assert "| c | - | **not_reached** | - | not touched: the rollout stopped before this host's batch |" in text
    assert "| **GPU 0 NVIDIA RTX A5500** (free before: 24,148.0) | 12,645.4 | 11,903.0 |" in text
    assert "| weights | 10,876.3 | 10,870.0 |" in text
    assert "| margin | 1,024.0 | - |" in text
    assert "| other (CUDA context...) | - | 287.9 |" in text      # 11903 used - 11615.09 in buffers
    assert "## c" not in text                                  # no plan, no memory table


def test_every_status_is_known():
    assert set(STATUSES) == {"changed", "unchanged", "failed", "rolled_back", "not_reached", "unreachable",
                             "checked"}
