"""playbooks/fleet_rollout.yml on a fleet of three fake hosts over real ssh (tests/integration/fleet).

One fleet for the module; the tests run in order and each starts from the state the previous one left:
(a) ping, (b) first rollout: canary, then the batch, (c) second rollout: nothing changes, (d) a bad model on a
non-canary host: rolled back, the rollout stops before the next batch; with a permissive threshold the others
proceed, (e) a failing canary: nobody else is touched.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tools.gguf_models import write_demo_model
from tests.integration.fleet import PREFIX, Fleet, clean_leftovers, leftovers

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("sshd") or not shutil.which("podman"),
    reason="the fleet needs root (network namespaces), sshd and podman")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, request):
    """Three hosts h1..h3 (netns + ssh + private podman storage), the models, the base inventory."""
    found = leftovers()
    if found:
        warnings.warn("a previous fleet run left %s; cleaning up" % found)
    clean_leftovers()
    image = subprocess.run(["bash", str(ROOT / "images/ai-llm/build.sh")], check=True, capture_output=True,
                           text=True, timeout=600).stdout.split()[-1]
    fl = Fleet(tmp_path_factory.mktemp(PREFIX), names=("h1", "h2", "h3"), image=image)

    def teardown():
        fl.down()
        assert leftovers() == [], "the fleet's teardown left something behind"
    request.addfinalizer(teardown)
    fl.up()
    models = fl.base / "models"
    models.mkdir()
    write_demo_model(str(models / "demo.gguf"))
    data = (models / "demo.gguf").read_bytes()
    # cut.gguf: a valid header, the tensor data cut in half (the role's header reader refuses it in preflight)
    (models / "cut.gguf").write_bytes(data[: len(data) // 2])
    # wrong-shape.gguf: every byte in place, embedding_length 128 where the tensors have 64: the header reads
    # fine, llama-server refuses to load it (the role recreates, sees it exit, rolls back)
    shutil.copyfile(models / "demo.gguf", models / "wrong-shape.gguf")
    import gguf  # pylint: disable=import-outside-toplevel
    reader = gguf.GGUFReader(str(models / "wrong-shape.gguf"), "r+")
    field = reader.fields["nemotron_h_moe.embedding_length"]
    field.parts[field.data[0]][0] = 128
    reader.data.flush()
    del reader
    fl.models = models
    fl.group_vars = {
        "llm_server_project_dir": str(fl.deploy_dir),
        "llm_server_model_path": str(models / "demo.gguf"),
        "llm_server_image": image,
        "llm_server_network_mode": "host",
        "llm_server_port": 8080,
        "llm_server_ctx_size": 2048,
        "llm_moe_offload_mode": "all",
        "llm_server_health_timeout": 60,
    }
    fl.inventory(fl.base / "hosts.yml", group_vars=fl.group_vars)
    return fl


def inventory_with(fleet, name, host_vars):
    """An inventory of the fleet where some hosts get their own variables."""
    return fleet.inventory(fleet.base / name, group_vars=fleet.group_vars, host_vars=host_vars)


def rollout(fleet, name, *args, inventory=None):
    """Run playbooks/fleet_rollout.yml; returns (process, report dict)."""
    report = fleet.base / ("report-%s.json" % name)
    env = fleet.ansible_env()
    env.update({
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": str(ROOT / ".collections"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default",
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCALHOST_WARNING": "0",
    })
    cmd = [str(BIN / "ansible-playbook"), "-i", str(inventory or fleet.base / "hosts.yml"),
           str(ROOT / "playbooks" / "fleet_rollout.yml"), "-e", "fleet_report_path=%s" % report] + list(args)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(fleet.base), timeout=600, check=False)
    (fleet.base / ("rollout-%s.log" % name)).write_text(proc.stdout + proc.stderr)
    data = json.loads(report.read_text()) if report.exists() else None
    return proc, data


def hosts_of(report):
    return {row["host"]: row for row in report["hosts"]}


def progress(proc):
    """The rollout's progress lines ("fleet rollout: ..."), in order."""
    return re.findall(r'"fleet rollout: ([^"\n]*)"', proc.stdout)


def state(fleet):
    """Per host: ai-llm's container id and start time, the .env, and what the server says about itself."""
    snap = {}
    for name, host in fleet.hosts.items():
        container = host.container()
        status, props = host.http_get("/props")
        snap[name] = {
            "id": container["Id"] if container else None,
            "started": container["State"]["StartedAt"] if container else None,
            "created": container["Created"] if container else None,
            "running": bool(container and container["State"]["Running"]),
            "env": host.deploy_file(".env") if (host.dir / "deploy" / ".env").exists() else "",
            "health": host.http_get("/health")[0],
            "n_ctx": json.loads(props)["default_generation_settings"]["n_ctx"] if status == 200 else None,
        }
    return snap


def test_ansible_reaches_every_host_over_ssh(fleet):
    env = fleet.ansible_env()
    env.update({"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"})
    proc = subprocess.run([str(BIN / "ansible"), "-i", str(fleet.base / "hosts.yml"), "all", "-m", "ansible.builtin.ping"],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in fleet.hosts:
        assert re.search(r"^%s \| SUCCESS" % name, proc.stdout, re.MULTILINE), proc.stdout
    # each is its own machine: its own host name, its own (empty) container storage with the shared image
    for name, host in fleet.hosts.items():
        assert host.run(["hostname"]).stdout.strip() == name
        images = host.run(["podman", "images", "--format", "{{.Repository}}:{{.Tag}} {{.ReadOnly}}"]).stdout
        assert "%s true" % fleet.image in images
        assert host.run(["podman", "ps", "-aq"]).stdout.strip() == ""


def test_rollout_deploys_the_canary_first_then_the_batch(fleet):
    proc, report = rollout(fleet, "first", "-e", '{"fleet_batches": ["100%"]}')
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    lines = progress(proc)
    assert lines.index("canary: deploying h1 (0 of 3 hosts done before it)") \
        < lines.index("canary done: h1 changed. Next batch.") \
        < lines.index("batch 1 of 1: deploying h2, h3 (1 of 3 hosts done before it)")
    snap = state(fleet)
    for name in fleet.hosts:
        assert snap[name]["running"] and snap[name]["health"] == 200, (name, snap[name])
        assert "LLM_MOE_OFFLOAD_PATTERN='\\.ffn_.*_exps\\.weight'" in snap[name]["env"]
        assert snap[name]["n_ctx"] == 2048
    assert len({s["id"] for s in snap.values()}) == 3
    # the canary was serving before the batch's containers were created
    assert snap["h1"]["started"] < min(snap["h2"]["created"], snap["h3"]["created"])
    assert report["outcome"] == "completed" and report["stop_reason"] is None
    assert report["canary"] == ["h1"] and report["batches"] == [["h2", "h3"]]
    assert [b["batch"] for b in report["batches_run"]] == ["canary", "batch 1"]
    assert report["summary"] == {"changed": 3}
    rows = hosts_of(report)
    assert [r["host"] for r in report["hosts"]] == ["h1", "h2", "h3"]
    for name, row in rows.items():
        assert row["status"] == "changed", row
        assert row["message"] == "recreated and verified: 4 tensors on the CPU"
        assert row["pattern"] == "\\.ffn_.*_exps\\.weight"
        assert row["plan"]["topology"] == "cpu" and row["plan"]["tensors_to_cpu"] == 4
        assert row["started"] and row["finished"] and row["seconds"] >= 0
    assert rows["h1"]["batch"] == "canary" and rows["h2"]["batch"] == rows["h3"]["batch"] == "batch 1"
    fleet.after_first = snap


def test_second_rollout_changes_nothing(fleet):
    proc, report = rollout(fleet, "again", "-e", '{"fleet_batches": ["100%"]}')
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    assert "RUNNING HANDLER" not in proc.stdout
    assert report["summary"] == {"unchanged": 3}
    assert all(r["message"] == "nothing to change" for r in report["hosts"])
    assert state(fleet) == fleet.after_first


def test_bad_model_on_a_batch_host_is_rolled_back_and_stops_the_rollout(fleet):
    """h2 gets a model llama-server cannot load; batches of one host, no failure allowed: h3 is never touched."""
    before = state(fleet)
    inv = inventory_with(fleet, "bad-h2.yml", {"h2": {"llm_server_model_path": str(fleet.models / "wrong-shape.gguf")}})
    proc, report = rollout(fleet, "bad-h2", "-e", "llm_server_ctx_size=1024", "-e", '{"fleet_batches": [1]}',
                           "-e", "fleet_max_fail_percentage=0", inventory=inv)
    assert proc.returncode != 0
    after = state(fleet)
    rows = hosts_of(report)
    # the canary took the new configuration
    assert rows["h1"]["status"] == "changed" and after["h1"]["n_ctx"] == 1024
    # h2 was recreated with the bad model, failed, and serves its previous configuration again
    assert rows["h2"]["status"] == "rolled_back", rows["h2"]
    assert rows["h2"]["message"].startswith("llm_server: the deploy on h2 failed: llama-server exited: ")
    assert "Rolled back to the last verified configuration" in rows["h2"]["message"]
    assert rows["h2"]["serving"] == "the previous configuration (rolled back)"
    assert after["h2"]["id"] != before["h2"]["id"]
    assert after["h2"]["health"] == 200 and after["h2"]["n_ctx"] == 2048
    assert after["h2"]["env"] == before["h2"]["env"]
    # the threshold stops the rollout: h3 (the next batch) is not attempted
    assert report["outcome"] == "stopped"
    assert report["stop_reason"] == "batch 1: h2 failed (100% of the batch, more than 0%)"
    assert rows["h3"]["status"] == "not_reached" and rows["h3"]["batch"] == "batch 2"
    assert rows["h3"]["message"].startswith("not attempted: the rollout stopped (batch 1: h2 failed")
    assert after["h3"] == before["h3"]
    assert [b["batch"] for b in report["batches_run"]] == ["canary", "batch 1"]
    assert not any(line.startswith("batch 2") for line in progress(proc))
    assert report["summary"] == {"changed": 1, "rolled_back": 1, "not_reached": 1}
    assert "h2: rolled_back" in proc.stdout and "h3: not_reached" in proc.stdout
    fleet.after_bad = after


def test_permissive_threshold_lets_the_rest_of_the_batch_proceed(fleet):
    """h2 gets a truncated model (refused before any change), h3 in the same batch proceeds under a 50% limit."""
    before = fleet.after_bad
    inv = inventory_with(fleet, "cut-h2.yml", {"h2": {"llm_server_model_path": str(fleet.models / "cut.gguf")}})
    proc, report = rollout(fleet, "cut-h2", "-e", "llm_server_ctx_size=1024", "-e", '{"fleet_batches": ["100%"]}',
                           "-e", "fleet_max_fail_percentage=50", inventory=inv)
    assert proc.returncode != 0          # a host failed: the rollout says so
    after = state(fleet)
    rows = hosts_of(report)
    assert report["outcome"] == "completed" and report["stop_reason"] is None
    assert rows["h1"]["status"] == "unchanged"
    assert rows["h2"]["status"] == "failed"
    assert "cut.gguf: at byte " in rows["h2"]["message"] and "lies beyond the end of the file" in rows["h2"]["message"]
    assert after["h2"] == before["h2"]   # refused before anything was written or restarted
    assert rows["h3"]["status"] == "changed" and after["h3"]["n_ctx"] == 1024 and after["h3"]["health"] == 200
    assert report["summary"] == {"unchanged": 1, "failed": 1, "changed": 1}


def test_failing_canary_stops_the_rollout_before_any_other_host(fleet):
    before = state(fleet)
    inv = inventory_with(fleet, "cut-h1.yml", {"h1": {"llm_server_model_path": str(fleet.models / "cut.gguf")}})
    proc, report = rollout(fleet, "cut-h1", "-e", "llm_server_ctx_size=512", "-e", "fleet_max_fail_percentage=100",
                           inventory=inv)
    assert proc.returncode != 0
    rows = hosts_of(report)
    assert rows["h1"]["status"] == "failed" and "lies beyond the end of the file" in rows["h1"]["message"]
    assert report["outcome"] == "stopped" and report["stop_reason"].startswith("the canary failed: h1 failed")
    assert rows["h2"]["status"] == rows["h3"]["status"] == "not_reached"
    assert [b["batch"] for b in report["batches_run"]] == ["canary"]
    assert [line for line in progress(proc) if "deploying" in line] == ["canary: deploying h1 (0 of 3 hosts done before it)"]
    assert state(fleet) == before
    assert "TASK [ai_llm.moe_offload.llm_server" not in proc.stdout.split("PLAY [Deploy the other hosts")[-1]


def test_plan_without_canary_and_hosts_that_do_not_answer(tmp_path):
    """No canary, batches "2,50%" of five hosts (as serial cuts them), hosts that refuse ssh count as failed.

    The hosts are 127.0.0.1 port 1 (nothing listens there): every ping is refused, so batch 1 fails entirely,
    more than the 50% allowed, and the later batches are not reached. No fleet needed.
    """
    hosts = {"u%d" % i: {"ansible_host": "127.0.0.1", "ansible_port": 1} for i in range(1, 6)}
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(json.dumps({"all": {"children": {"llm_servers": {"hosts": hosts}}}}))
    report_path = tmp_path / "report.yml"
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".collections"),
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default", ANSIBLE_CALLBACK_RESULT_FORMAT="json",
               ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="0", ANSIBLE_SSH_CONTROL_PATH_DIR=str(tmp_path / "cp"))
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), str(ROOT / "playbooks" / "fleet_rollout.yml"),
                           "-e", '{"fleet_canary": []}', "-e", "fleet_batches=2,50%", "-e", "fleet_max_fail_percentage=50",
                           "-e", "fleet_report_path=%s" % report_path],
                          capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300, check=False)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr
    import yaml  # pylint: disable=import-outside-toplevel
    report = yaml.safe_load(report_path.read_text())
    assert report["canary"] == [] and report["serial"] == ["2", "50%"]
    assert report["batches"] == [["u1", "u2"], ["u3", "u4"], ["u5"]]
    assert [line for line in progress(proc) if "deploying" in line] == ["batch 1 of 3: deploying u1, u2 (0 of 5 hosts done before it)"]
    assert report["outcome"] == "stopped"
    assert report["stop_reason"] == "batch 1: u1, u2 failed (100% of the batch, more than 50%)"
    rows = hosts_of(report)
    for name in ("u1", "u2"):
        assert rows[name]["status"] == "unreachable" and rows[name]["batch"] == "batch 1"
        assert rows[name]["message"].startswith("unreachable: ") and "Connection refused" in rows[name]["message"]
    assert [rows[name]["status"] for name in ("u3", "u4", "u5")] == ["not_reached"] * 3
    assert [rows[name]["batch"] for name in ("u3", "u4", "u5")] == ["batch 2", "batch 2", "batch 3"]
    assert report["summary"] == {"unreachable": 2, "not_reached": 3}
