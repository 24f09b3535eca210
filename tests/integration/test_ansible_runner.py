"""playbooks/deploy.yml as AWX runs a job: ``ansible-runner run PRIVATE_DATA_DIR -p playbooks/deploy.yml``
(ansible-runner in .cache/venvs/ee, requirements/ee.txt; ansible-playbook from .venv) on two fake hosts of the test fleet
(tests/helpers/fleet.py), in check mode. The private data dir holds what an AWX job template gives a job:
``project`` (this checkout, as AWX checks a project out), ``inventory/hosts.yml`` (the fleet's), ``env/envvars``
(the collections path, the report callback), ``env/extravars`` (the report folder, the canary's serial) and
``env/cmdline`` (``--check``). The job ends ``successful`` with rc 0, its job events carry each host's
``llm_server_result`` as the role publishes it, the report (rollout.json) says what check mode found, per batch,
and no host has an ai-llm container.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.fleet import demo_fleet
from tests.helpers.fleet_names import PREFIX

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
EE_BIN = ROOT / ".cache" / "venvs" / "ee" / "bin"
IDENT = "deploy-check"
PUBLISH_TASK = "Publish what this run did as llm_server_result"    # roles/llm_server/tasks/result.yml

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("sshd") or not shutil.which("podman"),
    reason="the fleet needs root (network namespaces), sshd and podman")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, request):
    """Two hosts, r1 and r2, of a fleet named apart from test_fleet_rollout.py's, which may run at the same time."""
    return demo_fleet(request, tmp_path_factory.mktemp(PREFIX + "-runner"), names=("r1", "r2"),
                      checkout="%s:ansible-runner" % ROOT)


@pytest.fixture(scope="module")
def job(fleet):
    """The job's private data dir after ``ansible-runner run``, and the finished process."""
    private = fleet.base / "runner"
    for folder in ("env", "inventory"):
        (private / folder).mkdir(parents=True)
    (private / "project").symlink_to(ROOT, target_is_directory=True)
    fleet.inventory(private / "inventory" / "hosts.yml", group_vars=fleet.group_vars)
    envvars = {k: v for k, v in fleet.ansible_env().items() if k.startswith("ANSIBLE_")}
    envvars.pop("ANSIBLE_STDOUT_CALLBACK", None)           # ansible-runner's own event callback writes the events
    (private / "env" / "envvars").write_text(yaml.safe_dump(envvars))
    (private / "env" / "extravars").write_text(yaml.safe_dump({
        "llm_rollout_report_dir": str(private / "report"), "llm_rollout_serial": [1, "100%"]}))
    (private / "env" / "cmdline").write_text("--check")
    assert (EE_BIN / "ansible-runner").exists(), "scripts/setup.sh --tests makes .cache/venvs/ee"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env["PATH"] = os.pathsep.join([str(BIN), str(EE_BIN), env["PATH"]])     # .venv's ansible-playbook first
    proc = subprocess.run([str(EE_BIN / "ansible-runner"), "run", str(private), "-p", "playbooks/deploy.yml",
                           "--ident", IDENT], capture_output=True, text=True, env=env, cwd=str(fleet.base),
                          timeout=900, check=False)
    (fleet.base / "runner.log").write_text(proc.stdout + proc.stderr)
    return private, proc


def events(private):
    """The job events (artifacts/<ident>/job_events/*.json) in the order ansible-runner counted them."""
    loaded = [json.loads(p.read_text()) for p in (private / "artifacts" / IDENT / "job_events").glob("*.json")]
    return sorted(loaded, key=lambda event: event["counter"])


def test_the_job_is_successful(job):
    private, proc = job
    artifacts = private / "artifacts" / IDENT
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert (artifacts / "status").read_text() == "successful"
    assert (artifacts / "rc").read_text() == "0"
    assert (artifacts / "command").is_file()
    command = json.loads((artifacts / "command").read_text())["command"]
    assert command[0].endswith("ansible-playbook") and "--check" in command and "playbooks/deploy.yml" in command
    stats = [e for e in events(private) if e["event"] == "playbook_on_stats"][-1]["event_data"]
    assert sorted(stats["ok"]) == ["r1", "r2"] and not stats["failures"] and not stats["dark"]


def test_the_job_events_carry_each_hosts_llm_server_result(job):
    private = job[0]
    published = {e["event_data"]["host"]: e["event_data"]["res"]["ansible_facts"]["llm_server_result"]
                 for e in events(private) if e["event"] == "runner_on_ok" and e["event_data"]["task"] == PUBLISH_TASK}
    assert sorted(published) == ["r1", "r2"]
    for host, result in published.items():
        assert result["status"] == "checked", (host, result)
    report = json.loads((private / "report" / "rollout.json").read_text())
    # the report's result is the one the events carry
    assert {row["host"]: row["result"] for row in report["hosts"]} == published


def test_the_report_says_what_check_mode_found_and_nothing_runs(job, fleet):
    private = job[0]
    report = json.loads((private / "report" / "rollout.json").read_text())
    assert report["check_mode"] is True and report["outcome"] == "completed"
    assert report["summary"] == {"checked": 2} and report["serial"] == [1, "100%"]
    assert [(row["host"], row["batch"], row["status"]) for row in report["hosts"]] == [("r1", 1, "checked"),
                                                                                       ("r2", 2, "checked")]
    assert [batch["hosts"] for batch in report["batches"]] == [["r1"], ["r2"]]
    assert all(row["message"].startswith("check mode: ") for row in report["hosts"])
    assert {p.name for p in (private / "report").iterdir()} == {"rollout.json", "rollout.md", "rollout.html"}
    assert [host.container() for host in fleet.hosts.values()] == [None, None]
