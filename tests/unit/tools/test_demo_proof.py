"""tools/demo_proof.py, the block scripts/demo.sh ends with: its header and why are this run's row of the rollout
report, so a run that changed nothing says ``unchanged`` (verification.json, the last run that changed something,
would say ``changed``); the proof comes from the role's result of this run; a host that does not serve what its
result describes gets the header and why alone."""
from __future__ import annotations

import json

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._rollout_report import to_json
from tests.helpers.rollout_samples import sample_report
from tools import demo_proof


def rows():
    return {row["host"]: row for row in sample_report()["hosts"]}


def test_a_run_that_changed_nothing_is_headed_unchanged_with_the_proof_of_what_serves():
    row = rows()["gpu-box-2"]
    last = row["result"]
    assert last["status"] == "unchanged" and last["changed"] is False
    lines = demo_proof.block(row)
    assert lines[:2] == ["=== ai-llm on gpu-box-2, unchanged (buffers evidence from llama-server's log)",
                         "why:      " + row["message"]]
    assert row["message"].endswith("; nothing to change")
    # the proof the last verification made, which the unchanged result carries
    assert "model buffers:   CUDA0 10870.00 MiB, CUDA1 12260.00 MiB" in lines
    assert "pattern:  none (every tensor where -ngl puts it)" in lines
    assert lines[-1] == "stop it:  bash scripts/demo.sh --down"


def test_a_changed_run_shows_what_moved_and_where():
    lines = demo_proof.block(rows()["gpu-box-1"], engine="docker")
    assert lines[0] == "=== ai-llm on gpu-box-1, changed (buffers evidence from llama-server's log)"
    assert lines[1].startswith("why:      the configuration changed (LLM_MOE_OFFLOAD_PATTERN)")
    assert "pattern:  --override-tensor 'blk\\.[13]\\.ffn_.*_exps\\.weight=CPU' (from the plan)" in lines
    assert "model buffers:   CUDA0 21003.12 MiB, CPU_Mapped 2375.20 MiB" in lines
    assert "moved to CPU (6 tensors): " + ", ".join(rows()["gpu-box-1"]["result"]["tensors_moved"]) in lines
    assert lines[-1] == "stop it:  bash scripts/demo.sh --engine docker --down"


def test_a_host_that_serves_no_proved_configuration_gets_its_status_and_why_alone():
    for host, status in (("gpu-box-3", "rolled_back"), ("gpu-box-5", "unreachable"), ("gpu-box-6", "failed")):
        row = rows()[host]
        assert demo_proof.block(row) == ["=== ai-llm on %s, %s" % (host, status), "why:      " + row["message"],
                                         "stop it:  bash scripts/demo.sh --down"]


def test_the_command_reads_the_report_of_the_run_and_says_when_there_is_none(tmp_path, capsys):
    (tmp_path / "rollout.json").write_text(to_json(sample_report()))
    assert demo_proof.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    hosts = [row["host"] for row in json.loads((tmp_path / "rollout.json").read_text())["hosts"]]
    assert [line.split(",")[0] for line in out.splitlines() if line.startswith("=== ")] == [
        "=== ai-llm on %s" % host for host in hosts]
    assert demo_proof.main([str(tmp_path / "elsewhere")]) == 0
    assert capsys.readouterr().out == ("demo: no report of this run in %s (llm_rollout_report_dir sent it "
                                       "elsewhere?)\n" % (tmp_path / "elsewhere"))
