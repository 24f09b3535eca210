"""Rollout speed: playbooks/deploy.yml on 1, 2, 4 and 8 fake hosts (tests/helpers/fleet.py), first run and
no-change run, side by side.

    sudo python benchmarks/rollout.py                  # 1 2 4 8 hosts, the default serial, forks 8
    sudo python benchmarks/rollout.py --hosts 1 8 --forks 5 --serial '["100%"]'

Each size gets a fresh fleet (network namespaces, real ssh, podman, llama-server with the demo model); the
first run deploys ai-llm on every host, the second changes nothing. Printed per size: the forks, the batches
Ansible ran, the seconds of the preflight and of the whole run (from the rollout report), the tasks per host,
the no-change time relative to one host, and beside it Ansible's own floor on the same fleet: a playbook of one
``ansible.builtin.ping`` per host (one module run on every host, what any read of the hosts costs at least), and
its time relative to one host. Needs root, sshd, podman and the local CPU image (images/ai-llm/build.sh); run it
inside the podman lock on a shared machine.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / ".collections")]

from tests.helpers.llm_deploy import cpu_image  # noqa: E402  pylint: disable=wrong-import-position
from tests.helpers.fleet import Fleet  # noqa: E402  pylint: disable=wrong-import-position
from tests.helpers.fleet_cleanup import clean_leftovers  # noqa: E402  pylint: disable=wrong-import-position
from tests.helpers.fleet_names import PREFIX  # noqa: E402  pylint: disable=wrong-import-position
from tools.gguf_models import write_demo_model  # noqa: E402  pylint: disable=wrong-import-position

BIN = Path(sys.executable).parent


def run(fleet, name, forks, serial):
    """One rollout: (wall seconds, rollout.json, ok+changed tasks of the busiest host, return code)."""
    report_dir = fleet.base / ("report-" + name)
    env = fleet.ansible_env()
    cmd = [str(BIN / "ansible-playbook"), "-i", str(fleet.base / "hosts.yml"), str(ROOT / "playbooks" / "deploy.yml"),
           "--forks", str(forks), "-e", "llm_rollout_report_dir=%s" % report_dir]
    if serial:
        cmd += ["-e", json.dumps({"llm_rollout_serial": json.loads(serial)})]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(fleet.base), timeout=1800, check=False)
    wall = time.monotonic() - start
    (fleet.base / ("rollout-%s.log" % name)).write_text(proc.stdout + proc.stderr)
    report = json.loads((report_dir / "rollout.json").read_text())
    tasks = 0
    for line in proc.stdout[proc.stdout.rindex("PLAY RECAP"):].splitlines()[1:]:
        if " : ok=" in line:
            tasks = max(tasks, int(line.split("ok=")[1].split()[0]))
    return wall, report, tasks, proc.returncode


PING = """- name: One module run on every host, nothing else
  hosts: llm_servers
  gather_facts: false
  vars:
    ansible_pipelining: true
  tasks:
    - name: Ping
      ansible.builtin.ping:
"""


def ping(fleet, forks):
    """Wall seconds of one ``ansible.builtin.ping`` per host of ``fleet``, the playbook's floor."""
    playbook = fleet.base / "ping.yml"
    playbook.write_text(PING)
    cmd = [str(BIN / "ansible-playbook"), "-i", str(fleet.base / "hosts.yml"), str(playbook), "--forks", str(forks)]
    start = time.monotonic()
    subprocess.run(cmd, capture_output=True, text=True, env=fleet.ansible_env(), cwd=str(fleet.base), timeout=600,
                   check=True)
    return time.monotonic() - start


def demo_fleet(size, image, label, names=None, checkout=None, **role_vars):
    """A fleet of ``size`` fake hosts (``h1``.. or ``names``; ``checkout`` names the fleet apart from others, as
    ``Fleet`` takes it) up, the demo model written, its inventory (``hosts.yml``) with ``role_vars`` over the
    benchmarks' group variables, which ``fleet.group_vars`` keeps; the caller takes it down."""
    names = list(names or ["h%d" % i for i in range(1, size + 1)])
    more = {"checkout": checkout} if checkout else {}
    fleet = Fleet(Path(tempfile.mkdtemp(prefix="%s-%s-" % (PREFIX, label))), names=names, image=image, **more)
    fleet.up()
    models = fleet.base / "models"
    models.mkdir()
    write_demo_model(str(models / "demo.gguf"))
    fleet.group_vars = dict({
        "llm_server_project_dir": str(fleet.deploy_dir), "llm_server_model_path": str(models / "demo.gguf"),
        "llm_server_image": image, "llm_server_network_mode": "host", "llm_server_port": 8080,
        "llm_server_ctx_size": 2048, "llm_server_moe_offload_mode": "all", "llm_server_health_timeout": 120,
        # the per-tensor override lines, which the role needs to prove the placement on a CPU host
        "llm_server_log_verbosity": 5}, **role_vars)
    fleet.inventory(fleet.base / "hosts.yml", group_vars=fleet.group_vars)
    return fleet


def measure(size, forks, serial, image):
    fleet = demo_fleet(size, image, "bench")
    try:
        out = {}
        for name in ("first", "again"):
            wall, report, tasks, code = run(fleet, "%d-%s" % (size, name), forks, serial)
            expected = "changed" if name == "first" else "unchanged"
            if code != 0 or report["summary"] != {expected: size}:
                raise SystemExit("%d hosts, %s run: exit %d, %s (see %s)"
                                 % (size, name, code, report["summary"], fleet.base))
            batches = report["batches"]
            out[name] = {"wall": wall, "preflight": report["seconds"] - sum(b["seconds"] or 0 for b in batches),
                         "batches": [len(b["hosts"]) for b in batches], "tasks": tasks}
        out["ping"] = ping(fleet, forks)
        return out
    finally:
        fleet.down()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--forks", type=int, default=8, help="ansible-playbook --forks (default 8)")
    parser.add_argument("--serial", default="", help='llm_rollout_serial as JSON, e.g. \'["100%%"]\' '
                                                     "(default: the playbook's [1, \"34%%\", \"100%%\"])")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the fleet needs root (network namespaces)")
    clean_leftovers()
    image = cpu_image()
    print("playbooks/deploy.yml, demo model, image %s, forks %d, serial %s, %d CPUs"
          % (image, args.forks, args.serial or '[1, "34%", "100%"] (default)', os.cpu_count()))
    print("%5s  %5s  %-10s  %9s  %9s  %9s  %9s  %12s  %10s  %7s  %9s" % (
        "hosts", "forks", "batches", "first s", "preflight", "again s", "preflight", "tasks/host", "again/min",
        "ping s", "ping/min"))
    base = ping_base = None
    sizes = sorted(args.hosts)
    for size in sizes:
        got = measure(size, args.forks, args.serial, image)
        first, again = got["first"], got["again"]
        base, ping_base = base or again["wall"], ping_base or got["ping"]
        print("%5d  %5d  %-10s  %9.1f  %9.1f  %9.1f  %9.1f  %5d / %-4d  %9.2fx  %7.1f  %8.2fx" % (
            size, args.forks, "+".join(str(n) for n in again["batches"]), first["wall"], first["preflight"],
            again["wall"], again["preflight"], first["tasks"], again["tasks"], again["wall"] / base, got["ping"],
            got["ping"] / ping_base), flush=True)
        last, last_ping = again["wall"], got["ping"]
    print("no-change run, %d hosts against %d: %.2fx (target: at most 1.5x); one ping per host: %.2fx" % (
        sizes[-1], sizes[0], last / base, last_ping / ping_base))


if __name__ == "__main__":
    main()
