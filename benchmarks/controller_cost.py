"""The controller's cost per host: CPU seconds and peak memory of ``ansible-playbook playbooks/deploy.yml`` (the
controller and its workers and ssh clients, not the modules, which run on the hosts) against fleets of fake hosts
(tests/helpers/fleet.py: network namespaces with sshd), for a check-mode run and a no-change run, at each forks.

    sudo python benchmarks/controller_cost.py                         # check mode at 1 8 32 64 hosts, no-change
                                                                       # at 1 8, forks 5 (Ansible's default) and 32
    sudo python benchmarks/controller_cost.py --check-hosts 1 8 --change-hosts 1 --forks 5
    sudo python benchmarks/controller_cost.py --mitogen ...            # the same with mitogen's strategy

A check-mode run needs no container (each host is read, planned and reported ``checked``); a no-change run needs
ai-llm deployed first on every host (one deploy, not measured). CPU: user + system seconds of every process of the
run that ended (``RUSAGE_CHILDREN`` of this process, taken before and after); peak memory: the largest sum of the
resident memory of the run's process tree, sampled every 0.1 s. Printed per row: the seconds, the CPU seconds and
MiB, and both per host. Needs root, sshd, podman and the local CPU image (images/ai-llm/build.sh); run it inside
the podman lock on a shared machine. ``--mitogen``: mitogen (requirements/mitogen.txt, installed into
.cache/mitogen) and its ``mitogen_linear`` strategy, which runs the modules in a persistent interpreter on each
host over one connection instead of a new Python per task.
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / ".collections")]

from benchmarks.rollout import demo_fleet  # noqa: E402  pylint: disable=wrong-import-position
from tests.helpers.llm_deploy import cpu_image  # noqa: E402  pylint: disable=wrong-import-position
from tests.helpers.fleet_cleanup import clean_leftovers  # noqa: E402  pylint: disable=wrong-import-position

BIN = Path(sys.executable).parent
PAGE = os.sysconf("SC_PAGE_SIZE")


def tree_rss(pid):
    """The resident bytes of ``pid`` and its descendants (from /proc; processes that end meanwhile count 0)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
                children.setdefault(int(fields[1]), []).append((int(entry), int(fields[21])))
            except (OSError, IndexError, ValueError):
                pass
    total, todo = 0, [pid]
    while todo:
        for child, rss in children.get(todo.pop(), []):
            total += rss * PAGE
            todo.append(child)
    try:
        with open("/proc/%d/statm" % pid) as handle:
            total += int(handle.read().split()[1]) * PAGE
    except OSError:
        pass
    return total


def mitogen_env():
    """The environment that makes ansible-playbook use mitogen's linear strategy (installed into .cache/mitogen)."""
    target = ROOT / ".cache" / "mitogen"
    if not (target / "ansible_mitogen").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target",
                        str(target), "-r", str(ROOT / "requirements" / "mitogen.txt")], check=True)
    return {"ANSIBLE_STRATEGY_PLUGINS": str(target / "ansible_mitogen" / "plugins" / "strategy"),
            "ANSIBLE_STRATEGY": "mitogen_linear",
            "PYTHONPATH": os.pathsep.join([str(target)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}


EXTRA_ENV = {}


def run(fleet, name, forks, *args):
    """One ansible-playbook run: (wall seconds, CPU seconds, peak MiB, return code)."""
    cmd = [str(BIN / "ansible-playbook"), "-i", str(fleet.base / "hosts.yml"), str(ROOT / "playbooks" / "deploy.yml"),
           "--forks", str(forks), "-e", "llm_rollout_report_dir=%s" % (fleet.base / ("report-" + name))] + list(args)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    with open(fleet.base / ("run-%s.log" % name), "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(fleet.ansible_env(), **EXTRA_ENV),
                                cwd=str(fleet.base))
        peak = [0]

        def sample():
            while proc.poll() is None:
                peak[0] = max(peak[0], tree_rss(proc.pid))
                time.sleep(0.1)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        code = proc.wait(timeout=3600)
        sampler.join()
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, peak[0] / 2.0 ** 20, code


def fleet_of(size, image):
    """The benchmark's fleet, the speed check at the tests' sizes (64 hosts share the two CPUs)."""
    return demo_fleet(size, image, "cost", llm_server_health_timeout=300, llm_server_speed_runs=1,
                      llm_server_speed_prompt_tokens=8, llm_server_speed_predict_tokens=4)


def row(kind, size, forks, got):
    wall, cpu, peak, code = got
    print("%-9s  %5d  %5d  %8.1f  %8.1f  %9.3f  %8.0f  %9.1f  %s" % (
        kind, size, forks, wall, cpu, cpu / size, peak, peak / size, "ok" if code == 0 else "exit %d" % code),
        flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--check-hosts", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--change-hosts", type=int, nargs="*", default=[1, 8], help="no-change runs (a deploy first)")
    parser.add_argument("--forks", type=int, nargs="+", default=[5, 32], help="5 is Ansible's default")
    parser.add_argument("--mitogen", action="store_true", help="mitogen's mitogen_linear strategy")
    args = parser.parse_args()
    if args.mitogen:
        EXTRA_ENV.update(mitogen_env())
    if os.geteuid() != 0:
        raise SystemExit("the fleet needs root (network namespaces)")
    clean_leftovers()
    image = cpu_image()
    print("playbooks/deploy.yml on fake hosts, demo model, default serial, strategy %s, %d CPUs"
          % (EXTRA_ENV.get("ANSIBLE_STRATEGY", "linear"), os.cpu_count()))
    print("%-9s  %5s  %5s  %8s  %8s  %9s  %8s  %9s" % (
        "run", "hosts", "forks", "wall s", "CPU s", "CPU/host", "peak MiB", "MiB/host"))
    for size in sorted(set(args.check_hosts) | set(args.change_hosts)):
        fleet = fleet_of(size, image)
        try:
            if size in args.check_hosts:
                for forks in args.forks:
                    row("check", size, forks, run(fleet, "check-%d" % forks, forks, "--check"))
            if size in args.change_hosts:
                deployed = run(fleet, "deploy", max(args.forks))
                if deployed[3] != 0:
                    raise SystemExit("the deploy of %d hosts failed: see %s" % (size, fleet.base))
                for forks in args.forks:
                    row("no-change", size, forks, run(fleet, "again-%d" % forks, forks))
        finally:
            fleet.down()


if __name__ == "__main__":
    main()
