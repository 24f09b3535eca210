"""The rollout_report callback inside real ansible-playbook runs: serial batches, max_fail_percentage, rescued and
unrescued failures, unreachable hosts, check mode, and playbooks that are no rollout.

The playbook below has the shape of playbooks/deploy.yml (a preflight play that publishes ``llm_rollout``, a
serial play that publishes ``llm_rollout_batch`` per batch) with ``set_fact``/``fail`` tasks standing where the
role publishes ``llm_server_result`` and fails; the hosts are local connections, plus one ssh host at
127.0.0.1 port 1, where nothing listens (unreachable).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]
BIN = Path(sys.executable).parent

PLAYBOOK = """
- name: Preflight
  hosts: fleet
  gather_facts: false
  max_fail_percentage: 0
  tasks:
    - name: Publish the rollout
      ansible.builtin.set_fact:
        llm_rollout: {report_dir: "{{ report_dir }}", hosts: "{{ ansible_play_hosts_all }}", serial: "{{ serial }}",
                      max_fail_percentage: "{{ max_fail }}"}
      run_once: true
    - name: Plan
      ansible.builtin.set_fact:
        llm_server_result: {status: checked, message: planned, pattern: "{{ pattern }}", plan: {gpus: []}}
    - name: Refuse a plan
      when: refuse | default(false)
      block:
        - name: The plan does not fit
          ansible.builtin.set_fact:
            llm_server_result: {status: failed, message: "the plan does not fit: 2829 MiB missing", plan: {gpus: []}}
        - name: Fail
          ansible.builtin.fail: {msg: the plan does not fit}

- name: Deploy
  hosts: fleet
  gather_facts: false
  serial: "{{ serial }}"
  max_fail_percentage: "{{ max_fail }}"
  tasks:
    - name: Publish the batch
      ansible.builtin.set_fact: {llm_rollout_batch: "{{ ansible_play_batch }}"}
      run_once: true
    - name: Reach the host
      ansible.builtin.ping:
    - name: Deploy with a health gate and a rollback
      block:
        - name: Health gate
          ansible.builtin.fail: {msg: "llama-server exited: check_tensor_dims wrong shape"}
          when: bad_model | default(false) or flaky | default(false)
      rescue:
        - name: Retry (a flaky host recovers)
          ansible.builtin.set_fact: {recovered: true}
          when: flaky | default(false)
        - name: Roll back
          ansible.builtin.set_fact:
            llm_server_result: {status: rolled_back, message: "llama-server exited; rolled back",
                                pattern: "{{ pattern }}"}
          when: bad_model | default(false)
        - name: Fail the host
          ansible.builtin.fail: {msg: "the deploy failed and was rolled back"}
          when: bad_model | default(false)
    - name: Publish the result
      ansible.builtin.set_fact:
        llm_server_result: {status: "{{ 'checked' if ansible_check_mode else 'changed' }}", message: "recreated",
                            pattern: "{{ pattern }}", plan: {gpus: []}}
"""


def inventory(hosts):
    rows = {}
    for name, hostvars in hosts.items():
        base = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
        if hostvars.pop("unreachable", False):
            base = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 1}
        rows[name] = dict(base, **hostvars)
    return {"all": {"children": {"fleet": {"hosts": rows}}}}


def play(tmp_path, hosts, *args, playbook=PLAYBOOK, serial=None, max_fail=0, enabled=True, env=None):
    (tmp_path / "playbook.yml").write_text(playbook)
    (tmp_path / "hosts.yml").write_text(json.dumps(inventory(hosts)))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".collections"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="0", ANSIBLE_RETRY_FILES_ENABLED="0",
               ANSIBLE_SSH_CONTROL_PATH_DIR=str(tmp_path / "cp"), **(env or {}))
    env.pop("ANSIBLE_CALLBACKS_ENABLED", None)
    if enabled:
        env["ANSIBLE_CALLBACKS_ENABLED"] = "ai_llm.moe_offload.rollout_report"
    else:       # a configuration that enables no callback
        (tmp_path / "ansible.cfg").write_text("[defaults]\nstdout_callback = ansible.builtin.default\n")
        env["ANSIBLE_CONFIG"] = str(tmp_path / "ansible.cfg")
    extra = {"report_dir": str(tmp_path / "report"), "serial": serial or [1], "max_fail": max_fail,
             "pattern": "\\.ffn_.*_exps\\.weight"}
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(tmp_path / "hosts.yml"),
                           str(tmp_path / "playbook.yml"), "-e", json.dumps(extra)] + list(args),
                          capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300, check=False)
    path = tmp_path / "report" / "rollout.json"
    return proc, json.loads(path.read_text()) if path.exists() else None


def rows(report):
    return [(r["host"], r["batch"], r["status"]) for r in report["hosts"]]


def test_a_rolled_back_canary_follower_stops_the_rollout(tmp_path):
    proc, report = play(tmp_path, {"h1": {"flaky": True}, "h2": {"bad_model": True}, "h3": {}, "h4": {}})
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr
    # h1's failure was rescued (it recovered): it ends changed; h2's rollback failed it and Ansible stopped
    assert rows(report) == [("h1", 1, "changed"), ("h2", 2, "rolled_back"), ("h3", None, "not_reached"),
                            ("h4", None, "not_reached")]
    assert [b["hosts"] for b in report["batches"]] == [["h1"], ["h2"]]
    assert all(b["seconds"] >= 0 for b in report["batches"])
    h1, h2, h3 = report["hosts"][:3]
    assert h1["ansible"] == {"outcome": "ok", "phase": None, "msg": None}
    assert h2["ansible"] == {"outcome": "failed", "phase": "deploy", "msg": "the deploy failed and was rolled back"}
    assert h2["message"] == "llama-server exited; rolled back" and h2["result_from"] == "deploy"
    assert h3["result_from"] == "preflight" and h3["result"]["status"] == "checked"
    assert report["check_mode"] is False and report["seconds"] > 0
    assert sorted(p.name for p in (tmp_path / "report").iterdir()) == ["rollout.html", "rollout.json", "rollout.md"]
    # the output ends with the table, after the recap
    tail = proc.stdout[proc.stdout.index("PLAY RECAP"):].rstrip().splitlines()
    table = tail[tail.index(next(line for line in tail if line.startswith("HOST "))):]
    assert [line.split()[:3] for line in table[1:5]] == [["h1", "1", "changed"], ["h2", "2", "rolled_back"],
                                                         ["h3", "-", "not_reached"], ["h4", "-", "not_reached"]]
    assert re.match(r"^rollout stopped: changed 1, rolled_back 1, not_reached 2 in \d+\.\d s$", table[5])
    assert table[-1] == "report: %s (rollout.json, rollout.md, rollout.html)" % (tmp_path / "report" / "rollout.html")


def test_an_unreachable_host_in_a_batch_and_a_permissive_threshold(tmp_path):
    proc, report = play(tmp_path, {"h1": {}, "u1": {"unreachable": True}, "h2": {}, "h3": {}},
                        serial=[1, "100%"], max_fail=50)
    assert proc.returncode == 4, proc.stdout[-3000:] + proc.stderr      # Ansible's code for unreachable hosts
    assert rows(report) == [("h1", 1, "changed"), ("u1", 2, "unreachable"), ("h2", 2, "changed"),
                            ("h3", 2, "changed")]
    u1 = report["hosts"][1]
    assert u1["message"].startswith("unreachable in the deploy: ") and "port 1" in u1["message"]
    assert u1["ansible"]["outcome"] == "unreachable"


def test_a_whole_batch_unreachable_stops_the_rollout(tmp_path):
    """Ansible ends the play when every host of a batch failed, whatever max_fail_percentage says."""
    proc, report = play(tmp_path, {"h1": {}, "u1": {"unreachable": True}, "h2": {}}, serial=[1], max_fail=100)
    assert proc.returncode == 4
    assert rows(report) == [("h1", 1, "changed"), ("u1", 2, "unreachable"), ("h2", None, "not_reached")]


def test_a_refused_plan_stops_before_any_batch(tmp_path):
    proc, report = play(tmp_path, {"h1": {}, "h2": {"refuse": True}, "h3": {}})
    assert proc.returncode == 2
    assert rows(report) == [("h1", None, "not_reached"), ("h2", None, "failed"), ("h3", None, "not_reached")]
    assert report["hosts"][1]["message"] == "the plan does not fit: 2829 MiB missing"
    assert report["batches"] == []


def test_check_mode(tmp_path):
    proc, report = play(tmp_path, {"h1": {}, "h2": {}}, "--check", serial=["100%"])
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert report["check_mode"] is True and rows(report) == [("h1", 1, "checked"), ("h2", 1, "checked")]
    assert report["outcome"] == "completed"
    assert "rollout completed (check mode): checked 2" in proc.stdout


@pytest.mark.parametrize("enabled", [True, False])
def test_other_playbooks_and_a_disabled_callback_write_nothing(tmp_path, enabled):
    other = "- hosts: fleet\n  gather_facts: false\n  tasks:\n    - ansible.builtin.ping:\n"
    proc, report = play(tmp_path, {"h1": {}}, playbook=PLAYBOOK if not enabled else other, enabled=enabled)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert report is None and not (tmp_path / "report").exists()
    assert "HOST  BATCH" not in proc.stdout


# A module standing where the role's publishing step is: it returns the host's line beside llm_server_result (in a
# library/ folder next to the playbook, where ansible-playbook finds modules)
PUBLISH = """#!/usr/bin/python
# WANT_JSON
import json, sys
with open(sys.argv[1]) as handle:
    args = json.load(handle)
print(json.dumps({"changed": False, "line": args["line"], "ansible_facts": {"llm_server_result": args["result"]},
                  "failed": args.get("fail", False), "msg": "failed" if args.get("fail") else ""}))
"""
SAYING = """
- name: The role alone, in a playbook that publishes no llm_rollout
  hosts: fleet
  gather_facts: false
  tasks:
    - name: Skipped everywhere
      ansible.builtin.debug: {msg: never}
      when: false
    - name: Publish the result
      publish:
        line: "{{ inventory_hostname }}: {{ status }}, --override-tensor x=CPU (plan), 4 tensors in host memory"
        result: {status: "{{ status }}", message: "ai-llm serves the configuration on disk"}
        fail: "{{ status == 'failed' }}"
"""


def test_the_line_of_each_host_comes_after_its_task_banner_and_result(tmp_path):
    (tmp_path / "library").mkdir()
    (tmp_path / "library" / "publish.py").write_text(PUBLISH)
    # with skipped hosts hidden, the default callback prints a task's banner only with its first result
    proc, report = play(tmp_path, {"h1": {"status": "unchanged"}, "h2": {"status": "failed"}}, playbook=SAYING,
                        env={"ANSIBLE_DISPLAY_SKIPPED_HOSTS": "false"})
    assert proc.returncode == 2 and report is None, proc.stdout[-3000:] + proc.stderr
    out = proc.stdout.splitlines()
    said = {host: "%s: %s, --override-tensor x=CPU (plan), 4 tensors in host memory" % (host, status)
            for host, status in (("h1", "unchanged"), ("h2", "failed"))}
    # one line each, on its own (the failure's dump quotes it too, inside the result)
    assert [out.count(line) for line in said.values()] == [1, 1], proc.stdout
    banner = out.index(next(line for line in out if line.startswith("TASK [Publish the result]")))
    assert banner < out.index("ok: [h1]") < out.index(said["h1"]), proc.stdout
    failed = out.index(next(line for line in out if line.startswith("fatal: [h2]: FAILED!")))
    assert banner < failed < out.index(said["h2"]), proc.stdout
