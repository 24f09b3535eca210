"""playbooks/deploy.yml on a fleet of four fake hosts over real ssh (tests/helpers/fleet.py).

One fleet for the module; the tests run in order and each starts from the state the previous one left:
ssh to every host; the first rollout (a canary, then batches as serial cuts them); a run that changes nothing
(run as ai_llm.moe_offload.deploy); check mode; a changed pattern rolled out one host at a time while a poller
counts the hosts serving; a plan refused in the preflight (nothing restarts, or the others roll out when allowed);
a model llama-server cannot load on the second host (rolled back, the rollout stops, the later batches are
untouched), on the canary (nobody else is touched), on one host of a batch allowed 50% failures (the others go
on); a host's sshd killed in the middle of a rollout (unreachable, the others go on); a 2-shard model from a URL,
fetched by every host in the preflight before the batches roll it out. Every run writes its
report (rollout.json, rollout.md, rollout.html) into its own directory; the fleet is torn down whatever happens.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers.http_server import FileServer
from tests.helpers.llm_deploy import write_cut_model
from tests.helpers.fleet import Fleet, demo_fleet
from tests.helpers.fleet_cleanup import leftovers
from tests.helpers.fleet_health import HealthPoller
from tests.helpers.fleet_names import PREFIX, FleetNames, fleet_id
from tools.gguf_models import write_demo_model, write_wrong_shape

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PATTERN_ALL = "\\.ffn_.*_exps\\.weight"
PATTERN_BLOCK_4 = "blk\\.4\\.ffn_.*_exps\\.weight"
# A checkout path whose fleet id starts with two zeros: its /64 is fd7a:11f0:00dd::, written fd7a:11f0:dd::
ZERO_CHECKOUT = "/home/dev/moe_offload-115"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("sshd") or not shutil.which("podman"),
    reason="the fleet needs root (network namespaces), sshd and podman")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, request):
    """Four hosts h1..h4 (netns + ssh + private podman storage), the models, the base inventory."""
    fl = demo_fleet(request, tmp_path_factory.mktemp(PREFIX))
    # cut.gguf: the role refuses it in the preflight; wrong-shape.gguf: the header reads fine, llama-server
    # refuses to load it (the role recreates, sees it exit, rolls back)
    write_cut_model(fl.models / "demo.gguf", fl.models / "cut.gguf")
    write_wrong_shape(fl.models / "demo.gguf", fl.models / "wrong-shape.gguf")
    return fl


def inventory_with(fleet, name, host_vars=None, **group_vars):
    """An inventory of the fleet with other group variables or some hosts' own variables."""
    return fleet.inventory(fleet.base / name, group_vars=dict(fleet.group_vars, **group_vars), host_vars=host_vars)


def rollout_command(fleet, name, *args, inventory=None, playbook=None):
    return [str(BIN / "ansible-playbook"), "-i", str(inventory or fleet.base / "hosts.yml"),
            playbook or str(ROOT / "playbooks" / "deploy.yml"),
            "-e", "llm_rollout_report_dir=%s" % (fleet.base / ("report-" + name))] + list(args)


def finish(fleet, name, proc):
    (fleet.base / ("rollout-%s.log" % name)).write_text(proc.stdout + proc.stderr)
    path = fleet.base / ("report-" + name) / "rollout.json"
    return json.loads(path.read_text()) if path.exists() else None


def rollout(fleet, name, *args, rc=0, inventory=None, playbook=None):
    """Run the rollout, which exits with ``rc``; returns (process, rollout.json as a dict)."""
    proc = subprocess.run(rollout_command(fleet, name, *args, inventory=inventory, playbook=playbook),
                          capture_output=True, text=True, env=fleet.ansible_env(), cwd=str(fleet.base), timeout=900,
                          check=False)
    assert proc.returncode == rc, proc.stdout[-4000:] + proc.stderr
    return proc, finish(fleet, name, proc)


def pinged(fleet, inventory):
    """The hosts that answer ansible.builtin.ping over ssh, sorted."""
    proc = subprocess.run([str(BIN / "ansible"), "-i", str(inventory), "all", "-m", "ansible.builtin.ping"],
                          capture_output=True, text=True, env=fleet.ansible_env(), timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return sorted(re.findall(r"^(\S+) \| SUCCESS", proc.stdout, re.MULTILINE))


def rows(report):
    return {row["host"]: row for row in report["hosts"]}


def statuses(report):
    return [(row["host"], row["batch"], row["status"]) for row in report["hosts"]]


def recap(proc):
    """PLAY RECAP: {host: {"ok": n, "changed": n, ...}}."""
    out = {}
    for line in proc.stdout[proc.stdout.index("PLAY RECAP"):].splitlines()[1:]:
        match = re.match(r"^(\S+)\s+:\s+(.*)$", line)
        if match:
            out[match.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match.group(2))}
    return out


def state(fleet):
    """Per host: ai-llm's container id and times, the .env, and what the server says about itself."""
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


def test_a_fleet_whose_network_has_leading_zeros_answers_ssh_with_host_key_checking(tmp_path):
    """ssh looks a numeric IPv6 address up in known_hosts in its canonical form (leading zeros dropped): the
    inventory, known_hosts and sshd_config of a fleet whose /64 has a group with leading zeros say that form."""
    names = FleetNames.of(ZERO_CHECKOUT)
    assert fleet_id(ZERO_CHECKOUT) == "00dd" and names.prefix != PREFIX
    assert names.controller_address == "fd7a:11f0:dd::1"
    fl = Fleet(tmp_path / "zero", names=("z1", "z2"), image=None, checkout=ZERO_CHECKOUT)
    assert [h.address for h in fl.hosts.values()] == ["fd7a:11f0:dd::11", "fd7a:11f0:dd::12"]
    try:
        fl.up()
        inventory = fl.inventory(fl.base / "hosts.yml")
        assert pinged(fl, inventory) == ["z1", "z2"]
        assert [line.split()[0] for line in fl.known_hosts.read_text().splitlines()] == [
            "fd7a:11f0:dd::11", "fd7a:11f0:dd::12"]
        assert "ListenAddress fd7a:11f0:dd::11\n" in (fl.hosts["z1"].dir / "sshd_config").read_text()
        hosts = yaml.safe_load(inventory.read_text())["all"]["children"]["llm_servers"]["hosts"]
        assert {name: host["ansible_host"] for name, host in hosts.items()} == {
            "z1": "fd7a:11f0:dd::11", "z2": "fd7a:11f0:dd::12"}
    finally:
        fl.down()
    assert leftovers(names) == [], "the fleet's teardown left something behind"


def test_ansible_reaches_every_host_over_ssh(fleet):
    assert pinged(fleet, fleet.base / "hosts.yml") == sorted(fleet.hosts)
    # each is its own machine: its own host name, its own (empty) container storage with the shared image
    for name, host in fleet.hosts.items():
        assert host.run(["hostname"]).stdout.strip() == name
        images = host.run(["podman", "images", "--format", "{{.Repository}}:{{.Tag}} {{.ReadOnly}}"]).stdout
        assert "%s true" % fleet.image in images
        assert host.run(["podman", "ps", "-aq"]).stdout.strip() == ""


def test_first_rollout_a_canary_then_the_batches(fleet):
    proc, report = rollout(fleet, "first")
    snap = state(fleet)
    for name in fleet.hosts:
        assert snap[name]["running"] and snap[name]["health"] == 200, (name, snap[name])
        assert "LLM_MOE_OFFLOAD_PATTERN='%s'" % PATTERN_ALL in snap[name]["env"]
        assert snap[name]["n_ctx"] == 2048
    assert len({s["id"] for s in snap.values()}) == 4
    # serial [1, "34%", "100%"] of four hosts: the canary, one host (34% of 4), the rest
    assert [b["hosts"] for b in report["batches"]] == [["h1"], ["h2"], ["h3", "h4"]]
    assert statuses(report) == [("h1", 1, "changed"), ("h2", 2, "changed"), ("h3", 3, "changed"),
                                ("h4", 3, "changed")]
    # each batch was serving before the next one's containers were created
    assert snap["h1"]["started"] < snap["h2"]["created"]
    assert snap["h2"]["started"] < min(snap["h3"]["created"], snap["h4"]["created"])
    assert report["outcome"] == "completed" and report["reason"] is None
    for row in report["hosts"]:
        assert row["pattern"] == PATTERN_ALL and row["result"]["status"] == "changed"
        assert row["ansible"]["outcome"] == "ok"
    files = sorted(p.name for p in (fleet.base / "report-first").iterdir())
    assert files == ["rollout.html", "rollout.json", "rollout.md"]
    html = (fleet.base / "report-first" / "rollout.html").read_text()
    assert all('data-host="%s" data-status="changed"' % name in html for name in fleet.hosts)
    # the output ends with the table
    tail = proc.stdout.rstrip().splitlines()[-7:]
    assert tail[0].split() == ["HOST", "BATCH", "STATUS", "PATTERN", "DECODE", "TOK/S", "PROMPT", "TOK/S", "MESSAGE"]
    assert [line.split()[:3] for line in tail[1:5]] == [["h1", "1", "changed"], ["h2", "2", "changed"],
                                                        ["h3", "3", "changed"], ["h4", "3", "changed"]]
    assert re.match(r"rollout completed: changed 4 in \d+\.\d s; fleet decode \d+\.\d tokens/s$", tail[5]), tail[5]
    assert tail[6].startswith("report: %s" % (fleet.base / "report-first" / "rollout.html"))
    fleet.after_first = snap


def test_second_rollout_changes_nothing(fleet):
    """The same rollout again, as the collection's playbook: changed=0 on every host, nothing restarted; every host
    is reported unchanged from the preflight's read and joins no batch (the deploy play matches no host)."""
    proc, report = rollout(fleet, "again", playbook="ai_llm.moe_offload.deploy")
    assert {host: counts["changed"] for host, counts in recap(proc).items()} == {h: 0 for h in fleet.hosts}
    assert "RUNNING HANDLER" not in proc.stdout
    assert statuses(report) == [("h1", None, "unchanged"), ("h2", None, "unchanged"), ("h3", None, "unchanged"),
                                ("h4", None, "unchanged")]
    assert report["summary"] == {"unchanged": 4} and report["outcome"] == "completed" and report["batches"] == []
    assert all(row["result_from"] == "preflight" for row in report["hosts"])
    # each host read once, in the preflight: the read's task ran in one play
    assert proc.stdout.count("llm_server : Check the variables, fetch the model if missing, read the host, plan and decide]") == 1
    assert state(fleet) == fleet.after_first


def test_check_mode_changes_nothing(fleet):
    proc, report = rollout(fleet, "check", "--check", "-e", "llm_server_ctx_size=1024")
    assert report["check_mode"] is True and report["summary"] == {"checked": 4}
    assert all(row["message"].startswith("check mode: ") for row in report["hosts"])
    assert state(fleet) == fleet.after_first


def test_changed_pattern_one_host_at_a_time_while_the_others_serve(fleet):
    """Batches of one: a poller inside each host's namespace never sees fewer than N - 1 hosts serving."""
    inv = inventory_with(fleet, "block-4.yml", llm_server_moe_offload_pattern=PATTERN_BLOCK_4)
    with HealthPoller(fleet.hosts.values(), interval=0.2) as poller:
        proc, report = rollout(fleet, "pattern", "-e", '{"llm_rollout_serial": [1]}', inventory=inv)
    assert [b["hosts"] for b in report["batches"]] == [["h1"], ["h2"], ["h3"], ["h4"]]
    assert report["summary"] == {"changed": 4}
    for name, row in rows(report).items():
        assert row["pattern"] == PATTERN_BLOCK_4 and row["pattern_source"] == "inventory", row
        assert "LLM_MOE_OFFLOAD_PATTERN='%s'" % PATTERN_BLOCK_4 in fleet.hosts[name].deploy_file(".env")
    counts = [pair[1] for pair in poller.serving()]
    assert len(counts) > 50, counts
    # every host went down once (its recreate) and the poller saw it: it can see a host missing ...
    for name, samples in poller.samples.items():
        assert any(sample[1] != 200 for sample in samples), (name, samples)
    # ... and it never saw more than one host (the batch) missing at a time
    missing = sorted((t, name, status) for name, rows in poller.samples.items() for t, status in rows if status != 200)
    assert min(counts) == len(fleet.hosts) - 1, missing
    assert state(fleet)["h4"]["health"] == 200


def test_refused_plan_restarts_nothing_unless_allowed(fleet):
    """h3 gets a truncated model: the preflight refuses its plan, and no host restarts; allowed, the others go."""
    before = state(fleet)
    cut = {"h3": {"llm_server_model_path": str(fleet.models / "cut.gguf")}}
    inv = inventory_with(fleet, "cut-h3.yml", host_vars=cut, llm_server_ctx_size=1536)
    proc, report = rollout(fleet, "refused", inventory=inv, rc=2)
    assert state(fleet) == before
    assert statuses(report) == [("h1", None, "not_reached"), ("h2", None, "not_reached"), ("h3", None, "failed"),
                                ("h4", None, "not_reached")]
    h3 = rows(report)["h3"]
    assert "cut.gguf" in h3["message"] and "beyond the end of the file" in h3["message"], h3
    assert report["batches"] == [] and report["reason"].startswith("preflight: h3 (failed); nothing was restarted")

    proc, report = rollout(fleet, "refused-skip", "-e", "llm_rollout_skip_refused_hosts=true", inventory=inv, rc=2)
    after = state(fleet)
    assert after["h3"] == before["h3"]
    for name in ("h1", "h2", "h4"):
        assert after[name]["n_ctx"] == 1536 and after[name]["health"] == 200, (name, after[name])
    got = {row["host"]: row["status"] for row in report["hosts"]}
    assert got == {"h1": "changed", "h2": "changed", "h3": "failed", "h4": "changed"}
    assert report["outcome"] == "completed_with_failures"


def test_corrupted_model_rolls_back_and_stops_the_rollout(fleet):
    """h2 (batch 2) gets a model llama-server cannot load: it serves its old configuration again, h3 and h4 are
    not touched, and the report says so."""
    before = state(fleet)
    inv = inventory_with(fleet, "bad-h2.yml",
                         host_vars={"h2": {"llm_server_model_path": str(fleet.models / "wrong-shape.gguf")}},
                         llm_server_ctx_size=1024)
    proc, report = rollout(fleet, "bad-h2", inventory=inv, rc=2)
    after = state(fleet)
    assert statuses(report) == [("h1", 1, "changed"), ("h2", 2, "rolled_back"), ("h3", None, "not_reached"),
                                ("h4", None, "not_reached")]
    assert after["h1"]["n_ctx"] == 1024
    # h2 was recreated with the bad model, failed, and serves its previous configuration again
    h2 = rows(report)["h2"]
    assert h2["result"]["rollback"]["performed"] is True, h2
    assert "Rolled back" in h2["message"] or "rolled back" in h2["message"], h2
    assert after["h2"]["id"] != before["h2"]["id"]
    assert after["h2"]["health"] == 200 and after["h2"]["n_ctx"] == before["h2"]["n_ctx"]
    assert after["h2"]["env"] == before["h2"]["env"]
    # the threshold (0%) stopped the rollout: the last batch was not touched
    assert after["h3"] == before["h3"] and after["h4"] == before["h4"]
    assert report["outcome"] == "stopped"
    assert report["reason"].startswith("batch 2: h2 rolled_back (1 of 1 hosts); Ansible stops the rollout")
    assert [b["hosts"] for b in report["batches"]] == [["h1"], ["h2"]]
    markdown = (fleet.base / "report-bad-h2" / "rollout.md").read_text()
    assert "| h2 | 2 | **rolled_back** |" in markdown and "| h4 | - | **not_reached** |" in markdown
    html = (fleet.base / "report-bad-h2" / "rollout.html").read_text()
    assert 'data-host="h2" data-status="rolled_back"' in html and 'data-host="h3" data-status="not_reached"' in html
    assert re.search(r"^h2\s+2\s+rolled_back\s", proc.stdout, re.MULTILINE)


def test_failing_canary_stops_before_any_other_host(fleet):
    before = state(fleet)
    inv = inventory_with(fleet, "bad-h1.yml",
                         host_vars={"h1": {"llm_server_model_path": str(fleet.models / "wrong-shape.gguf")}},
                         llm_server_ctx_size=512)
    proc, report = rollout(fleet, "bad-h1", "-e", "llm_rollout_max_fail_percentage=100", inventory=inv, rc=2)
    # a batch that failed whole ends the play whatever the percentage: the canary stops the rollout
    assert statuses(report) == [("h1", 1, "rolled_back"), ("h2", None, "not_reached"), ("h3", None, "not_reached"),
                                ("h4", None, "not_reached")]
    after = state(fleet)
    assert after["h1"]["health"] == 200 and after["h1"]["n_ctx"] == before["h1"]["n_ctx"]
    assert all(after[name] == before[name] for name in ("h2", "h3", "h4"))
    assert [b["hosts"] for b in report["batches"]] == [["h1"]]


def test_permissive_threshold_lets_the_rest_of_the_batch_proceed(fleet):
    """One batch of all hosts, 50% allowed: h3's failed deploy is rolled back, the other three take the change."""
    before = state(fleet)
    inv = inventory_with(fleet, "bad-h3.yml",
                         host_vars={"h3": {"llm_server_model_path": str(fleet.models / "wrong-shape.gguf")}},
                         llm_server_ctx_size=1280)
    proc, report = rollout(fleet, "bad-h3", "-e", '{"llm_rollout_serial": ["100%"]}',
                           "-e", "llm_rollout_max_fail_percentage=50", inventory=inv, rc=2)
    assert statuses(report) == [("h1", 1, "changed"), ("h2", 1, "changed"), ("h3", 1, "rolled_back"),
                                ("h4", 1, "changed")]
    assert report["outcome"] == "completed_with_failures" and report["reason"] is None
    after = state(fleet)
    assert [after[name]["n_ctx"] for name in ("h1", "h2", "h4")] == [1280] * 3
    assert after["h3"]["health"] == 200 and after["h3"]["n_ctx"] == before["h3"]["n_ctx"]


def test_sshd_killed_in_the_middle_of_a_rollout(fleet):
    """h3's sshd dies while the canary deploys: h3 is reported unreachable and keeps serving what it served;
    h4, in the same batch, and the hosts before it roll out."""
    before = state(fleet)
    inv = inventory_with(fleet, "ctx-768.yml", llm_server_ctx_size=768)
    name = "sshd-h3"
    output = fleet.base / ("output-%s.log" % name)
    with output.open("w") as sink, subprocess.Popen(rollout_command(fleet, name, inventory=inv), stdout=sink,
                                                    stderr=subprocess.STDOUT, text=True, env=fleet.ansible_env(),
                                                    cwd=str(fleet.base)) as run:
        try:
            deadline = time.monotonic() + 600
            while (fleet.hosts["h1"].container() or {}).get("Id") == before["h1"]["id"]:   # the canary's recreate
                assert run.poll() is None and time.monotonic() < deadline, "the canary was not recreated"
                time.sleep(0.2)
            killed = fleet.hosts["h3"].kill_sshd()
            run.wait(timeout=900)
        finally:
            if run.poll() is None:
                run.kill()
    out = output.read_text()
    proc = subprocess.CompletedProcess(run.args, run.returncode, out, "")
    report = finish(fleet, name, proc)
    try:
        assert killed and proc.returncode == 4, out[-4000:]            # Ansible's code for unreachable hosts
        assert statuses(report) == [("h1", 1, "changed"), ("h2", 2, "changed"), ("h3", 3, "unreachable"),
                                    ("h4", 3, "changed")]
        assert report["outcome"] == "completed_with_failures"
        h3 = rows(report)["h3"]
        assert h3["message"].startswith("unreachable in the deploy: ") and "Connection refused" in h3["message"]
        after = state(fleet)
        for other in ("h1", "h2", "h4"):
            assert after[other]["n_ctx"] == 768 and after[other]["health"] == 200
        assert after["h3"] == before["h3"]          # still serving its configuration, untouched
    finally:
        fleet.hosts["h3"].start_sshd()


def test_a_split_model_from_a_url_is_fetched_by_every_host_before_the_batches(fleet, tmp_path):
    """A model change to a 2-shard model served over HTTP (from the controller's address of the fleet): every host
    fetches both shards in the preflight, side by side, before any batch (the batches find them there); then the
    batches roll it out, canary first; the report gives each host's bytes and seconds."""
    served = tmp_path / "served"
    served.mkdir()
    names = [Path(p).name for p in write_demo_model(served / "split.gguf", seed=5, shards=2)]
    sums = "".join("%s  %s\n" % (hashlib.sha256((served / n).read_bytes()).hexdigest(), n) for n in names)
    (served / "SHA256SUMS").write_text(sums)
    size = sum((served / n).stat().st_size for n in names)
    models = fleet.deploy_dir / "models"   # the deploy directory: each host's own
    with FileServer(served, bind=fleet.names.controller_address) as server:
        server.pause = 0.08   # about 11 s per host: long enough for a line of progress, and to overlap
        inv = inventory_with(fleet, "split.yml", llm_server_model_url=server.url(names[0]),
                             llm_server_model_sha256=server.url("SHA256SUMS"),
                             llm_server_model_path=str(models / names[0]), llm_server_model_dir=str(models))
        proc, report = rollout(fleet, "split", inventory=inv)
        requests = server.take()
    assert statuses(report) == [("h1", 1, "changed"), ("h2", 2, "changed"), ("h3", 3, "changed"),
                                ("h4", 3, "changed")]
    after = state(fleet)
    for name, host in fleet.hosts.items():
        for shard in names:
            assert (host.dir / "deploy" / "models" / shard).read_bytes() == (served / shard).read_bytes()
        assert "LLM_MODEL_PATH='/models/%s'" % names[0] in after[name]["env"] and after[name]["health"] == 200
        assert rows(report)[name]["fetch"]["bytes"] == size
    # each host asked for each shard from its start once (a later piece goes on with a Range request), and the
    # hosts' downloads ran side by side (not one host after another)
    address = {host.address: name for name, host in fleet.hosts.items()}
    gets = sorted((r for r in requests if r.method == "GET" and r.path != "/SHA256SUMS"), key=lambda r: r.at)
    assert sorted((address[r.client], r.path) for r in gets if r.range is None) == sorted(
        (name, "/" + shard) for name in fleet.hosts for shard in names)
    order = [address[r.client] for r in gets]
    assert sum(a != b for a, b in zip(order, order[1:])) > len(fleet.hosts) - 1, order
    # the fetch ran in the preflight (changed there); the batches found the model (ok)
    preflight, batches = proc.stdout.split("PLAY [Deploy in batches", 1)
    task = "llm_server : Check the variables, fetch the model if missing, read the host, plan and decide]"
    for name in fleet.hosts:
        assert re.search(r"^changed: \[%s\]" % name, preflight.split(task, 1)[1].split("TASK [", 1)[0], re.M)
        assert re.search(r"^%s: fetching the model, [0-9.,]+ of [0-9.,]+ MiB \(\d+ %%\), \d+ s$" % name,
                         preflight, re.M), preflight[-4000:]
    assert "changed: [" not in batches.split(task, 1)[1].split("TASK [", 1)[0]
    assert "MODEL FETCHED" in proc.stdout


def unanswered_deploy(tmp_path, count, config, *args, settings=None, **env):
    """deploy.yml on ``count`` hosts that refuse ssh (127.0.0.1 port 1), with the ansible.cfg ``config``. No fleet."""
    hosts = {"u%d" % i: {"ansible_host": "127.0.0.1", "ansible_port": 1} for i in range(1, count + 1)}
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(json.dumps({"all": {"children": {"llm_servers": {"hosts": hosts, "vars": settings or {}}}}}))
    env = dict({k: v for k, v in os.environ.items() if k != "ANSIBLE_CALLBACKS_ENABLED"}, ANSIBLE_CONFIG=str(config),
               ANSIBLE_NOCOLOR="1", ANSIBLE_RETRY_FILES_ENABLED="0", ANSIBLE_SSH_CONTROL_PATH_DIR=str(tmp_path / "cp"),
               **env)
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), str(ROOT / "playbooks" / "deploy.yml")]
                          + list(args), capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300,
                          check=False)


def test_hosts_that_do_not_answer(tmp_path):
    """Hosts that refuse ssh: the preflight loses them all, nothing else runs."""
    settings = {"llm_server_model_path": "/srv/models/model.gguf", "llm_server_image": "localhost/ai-llm:cpu"}
    report_dir = "llm_rollout_report_dir=%s" % (tmp_path / "report")
    proc = unanswered_deploy(tmp_path, 3, ROOT / "ansible.cfg", "-e", report_dir, settings=settings,
                             ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".collections"),
                             ANSIBLE_CALLBACKS_ENABLED="ai_llm.moe_offload.rollout_report")
    assert proc.returncode == 4, proc.stdout[-3000:] + proc.stderr
    report = json.loads((tmp_path / "report" / "rollout.json").read_text())
    assert statuses(report) == [("u1", None, "unreachable"), ("u2", None, "unreachable"), ("u3", None, "unreachable")]
    assert report["outcome"] == "stopped" and report["batches"] == []
    assert all(row["message"].startswith("unreachable in the preflight: ") for row in report["hosts"])


def test_a_fleet_without_the_report_callback_is_refused(tmp_path):
    """Several hosts and no rollout_report callback: the preflight stops before it reads any host."""
    (tmp_path / "ansible.cfg").write_text("[defaults]\ncollections_path = %s\n" % (ROOT / ".collections"))
    proc = unanswered_deploy(tmp_path, 2, tmp_path / "ansible.cfg")
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr
    assert "the callback that writes the report is not enabled: add callbacks_enabled = " \
           "ai_llm.moe_offload.rollout_report to ansible.cfg" in proc.stdout.replace("\n", " ")
    assert "unreachable=1" not in proc.stdout and not (tmp_path / "rollout-report").exists()
