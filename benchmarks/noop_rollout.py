"""A rollout that changes nothing against Ansible's floor: ``ansible-playbook playbooks/deploy.yml`` when every host
already runs its configuration, beside a playbook of one ``ansible.builtin.ping`` per host, on the same hosts, in
one run.

    flock /tmp/ai-llm-podman.lock python benchmarks/noop_rollout.py                     # 4 local hosts, 3 runs each
    flock /tmp/ai-llm-podman.lock python benchmarks/noop_rollout.py --local 4 --fleet 8 --runs 5

The hosts:

- ``--local N`` (default 4): N inventory names of this machine (``ansible_connection: local``), each with its own
  project directory, compose project, container, demo model and loopback port (``tests/helpers/llm_deploy.py``'s
  ``LocalDeploy``, one per host, in one inventory); podman and podman-compose, the local CPU image.
- ``--fleet N`` (default 0: none): N hosts of the test fleet (``tests/helpers/fleet.py``: network namespaces with
  sshd, real ssh; ``benchmarks/rollout.py``'s ``demo_fleet``). Needs root and the tests' set-up (``bash scripts/setup.sh --tests``).

On each set of hosts: one deploy (every host changed; timed, not compared), then ``--runs`` rounds of a no-change
deploy and a ping run, alternating (the order flips every round, so that a drift of the machine's load falls on
both alike), both with ``--forks`` (default: the number of hosts, all at once). Every no-change run must change
nothing, or the benchmark stops: exit 0, ``changed=0`` for every host in the PLAY RECAP, the rollout report's
summary all ``unchanged``, and every container the one the deploy started (the same id and start time).
Printed per set: the median, min and max seconds of each, the CPU seconds of the processes each run started
(``RUSAGE_CHILDREN``: ansible-playbook, its workers and the modules of local hosts; not the containers, nor a
fleet host's modules), and the ratio of the medians, no-change / ping (target: at most 1.3). Figures, not a test.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / ".collections")]

from benchmarks.rollout import PING, demo_fleet  # noqa: E402  pylint: disable=wrong-import-position
from tests.helpers.fleet import clean_leftovers  # noqa: E402  pylint: disable=wrong-import-position
from tests.helpers.llm_deploy import cpu_image, local_deploy, playbook_env  # noqa: E402  pylint: disable=wrong-import-position

BIN = Path(sys.executable).parent
DEPLOY = ROOT / "playbooks" / "deploy.yml"
TARGET = 1.3
# the speed check at the tests' sizes (tests/helpers/llm_deploy.py): the first deploy of every host shares the cores
SMALL_SPEED_CHECK = {"llm_server_speed_prompt_tokens": 8, "llm_server_speed_predict_tokens": 4, "llm_server_speed_runs": 1}


@dataclass
class Hosts:
    """One set of hosts: how to run ansible-playbook on them and how to read their containers."""

    label: str
    names: list
    inventory: Path
    env: dict
    work: Path
    containers: Callable[[], dict]    # {host: (container id, start time)}
    shape: str = ""                   # the tasks of the last no-change run


def local_hosts(stack, work, count):
    """``count`` local hosts (h1..hN), each a ``LocalDeploy`` of its own, taken down when ``stack`` closes."""
    names = ["h%d" % i for i in range(1, count + 1)]
    deploys = {name: stack.enter_context(local_deploy(work / name, "ai-llm-noop-" + name)) for name in names}
    inventory = work / "local-hosts.json"
    inventory.write_text(json.dumps({"llm_servers": {"hosts": {
        name: dict(deploy.base_vars, **SMALL_SPEED_CHECK) for name, deploy in deploys.items()}}}))

    def containers():
        found = {}
        for name, deploy in deploys.items():
            proc = subprocess.run(["podman", "container", "inspect", deploy.name], capture_output=True, text=True,
                                  check=False, timeout=60)
            found[name] = identity(json.loads(proc.stdout)[0]) if proc.returncode == 0 else None
        return found

    return Hosts("%d local hosts (ansible_connection: local)" % count, names, inventory, playbook_env(), work,
                 containers)


def fleet_hosts(stack, count, image):
    """``count`` hosts of the test fleet with the demo model, taken down when ``stack`` closes."""
    clean_leftovers()
    fleet = demo_fleet(count, image, "noop", **SMALL_SPEED_CHECK)
    stack.callback(shutil.rmtree, fleet.base, ignore_errors=True)
    stack.callback(fleet.down)

    def containers():
        found = {name: host.container() for name, host in fleet.hosts.items()}
        return {name: identity(inspected) if inspected else None for name, inspected in found.items()}

    return Hosts("%d fleet hosts (ssh)" % count, list(fleet.hosts), fleet.base / "hosts.yml", fleet.ansible_env(),
                 fleet.base, containers)


def identity(inspected):
    """What tells a container apart from one recreated or restarted in its place: its id and start time."""
    return inspected["Id"], inspected["State"]["StartedAt"]


def recaps(output):
    """{host: {ok, changed, ...}} from the PLAY RECAP of an ansible-playbook output."""
    tail = output[output.rindex("PLAY RECAP"):] if "PLAY RECAP" in output else ""
    return {host: {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", counts)}
            for host, counts in re.findall(r"^(\S+)\s+:\s+(ok=.*)$", tail, re.MULTILINE)}


def run(hosts, playbook, forks, *args):
    """One ansible-playbook run: (wall seconds, CPU seconds of the processes it started, the CompletedProcess)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(hosts.inventory), str(playbook), "--forks",
                           str(forks)] + list(args), capture_output=True, text=True, env=hosts.env,
                          cwd=str(hosts.work), timeout=1800, check=False)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, proc


def refuse(hosts, what, proc, why):
    log = hosts.work / ("%s.log" % what.replace(" ", "-"))
    log.write_text(proc.stdout + proc.stderr)
    raise SystemExit("%s, %s: %s (output: %s)" % (hosts.label, what, why, log))


def deploy(hosts, forks, report, expected, what):
    """deploy.yml on every host; the run must exit 0 and the report say ``expected`` of every host."""
    wall, cpu, proc = run(hosts, DEPLOY, forks, "-e", "llm_rollout_report_dir=%s" % report)
    if proc.returncode != 0:
        refuse(hosts, what, proc, "exit %d" % proc.returncode)
    summary = json.loads((report / "rollout.json").read_text())["summary"]
    if summary != {expected: len(hosts.names)}:
        refuse(hosts, what, proc, "the report's summary is %s, not all %s" % (summary, expected))
    return wall, cpu, proc


def no_change(hosts, forks, report, containers):
    """A no-change deploy, checked to have changed nothing: the recap, the report, the containers."""
    wall, cpu, proc = deploy(hosts, forks, report, "unchanged", "no-change run")
    recap = recaps(proc.stdout)
    changed = {host: counts.get("changed") for host, counts in recap.items() if counts.get("changed") != 0}
    if sorted(recap) != sorted(hosts.names) or changed:
        refuse(hosts, "no-change run", proc, "PLAY RECAP: hosts %s, changed %s" % (sorted(recap), changed))
    now = hosts.containers()
    if now != containers:
        moved = sorted(h for h in hosts.names if now.get(h) != containers.get(h))
        refuse(hosts, "no-change run", proc, "containers recreated or restarted on %s" % ", ".join(moved))
    hosts.shape = "%d tasks, PLAY RECAP of %s: %s" % (
        len(re.findall(r"^TASK \[", proc.stdout, re.MULTILINE)), hosts.names[0],
        " ".join("%s=%d" % kv for kv in recap[hosts.names[0]].items() if kv[0] in ("ok", "skipped")))
    return wall, cpu


def ping(hosts, forks):
    playbook = hosts.work / "ping.yml"
    playbook.write_text(PING)
    wall, cpu, proc = run(hosts, playbook, forks)
    if proc.returncode != 0:
        refuse(hosts, "ping", proc, "exit %d" % proc.returncode)
    return wall, cpu


def figures(rows):
    walls = [wall for wall, _cpu in rows]
    return "median %5.2f s (min %5.2f, max %5.2f), CPU %5.2f s" % (
        statistics.median(walls), min(walls), max(walls), statistics.median([cpu for _wall, cpu in rows]))


def measure(hosts, runs, forks):
    forks = forks or len(hosts.names)
    report = hosts.work / "report"
    first, _cpu, _proc = deploy(hosts, forks, report, "changed", "first deploy")
    containers = hosts.containers()
    if None in containers.values():
        raise SystemExit("%s: no container after the first deploy on %s" % (
            hosts.label, ", ".join(h for h, c in containers.items() if c is None)))
    rows = {"no-change deploy.yml": [], "ping": []}
    for round_ in range(runs):
        steps = [("no-change deploy.yml", lambda: no_change(hosts, forks, report, containers)),
                 ("ping", lambda: ping(hosts, forks))]
        for what, step in steps if round_ % 2 == 0 else reversed(steps):
            rows[what].append(step())
    ratio = statistics.median(w for w, _c in rows["no-change deploy.yml"]) / statistics.median(w for w, _c in rows["ping"])
    print("\n%s, forks %d, first deploy %.1f s; %d runs each, alternating:" % (hosts.label, forks, first, runs))
    for what, done in rows.items():
        print("  %-21s %s" % (what, figures(done)))
    print("  no-change run: %s" % hosts.shape)
    print("  ratio no-change / ping: %.2f (target: at most %.1f); every no-change run: changed=0 on every host, "
          "the report all unchanged, the same containers" % (ratio, TARGET), flush=True)
    return ratio


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--local", type=int, default=4, help="local hosts (0: none; default 4)")
    parser.add_argument("--fleet", type=int, default=0, help="hosts of the test fleet (needs root; default 0: none)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each, alternating (default 3)")
    parser.add_argument("--forks", type=int, default=0, help="ansible-playbook --forks (default: the number of hosts)")
    args = parser.parse_args(argv)
    if args.fleet and os.geteuid() != 0:
        raise SystemExit("--fleet needs root (network namespaces)")
    image = cpu_image()
    print("playbooks/deploy.yml (demo model, image %s) against one ansible.builtin.ping per host; %d CPUs, load %s"
          % (image, os.cpu_count(), " ".join("%.2f" % x for x in os.getloadavg())))
    for kind, count in (("local", args.local), ("fleet", args.fleet)):
        if count <= 0:
            continue
        with tempfile.TemporaryDirectory(prefix="ai-llm-noop-") as work, contextlib.ExitStack() as stack:
            hosts = local_hosts(stack, Path(work), count) if kind == "local" else fleet_hosts(stack, count, image)
            measure(hosts, args.runs, args.forks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
