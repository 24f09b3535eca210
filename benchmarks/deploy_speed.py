"""Deploy speed of the llm_server role on the local demo (podman + podman-compose, CPU image, demo model).

  (a) ``podman-compose up -d --force-recreate ai-llm`` until ``/health`` answers 200: the time the service is
      away on a recreate, split into the compose command itself and the wait for the model to load
      (polled every 10 ms);
  (b) the wall time of a no-change run of the role (``ansible-playbook playbooks/deploy.yml`` on
      inventory/local with nothing to change), and that it really changed nothing (PLAY RECAP changed=0).

Needs the demo deployed first (``bash scripts/demo.sh``); uses its files under demo/ai-llm. Prints figures;
this is not a test. Usage: python benchmarks/deploy_speed.py [--repeat N]
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "demo" / "ai-llm"


def inventory_vars() -> dict:
    out = subprocess.run(["ansible-inventory", "--host", "localhost"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=1) as r:
            return r.status == 200
    except Exception:
        return False


def recreate_to_health(compose: list, service: str, port: int, timeout: float = 120.0):
    start = time.monotonic()
    subprocess.run(compose + ["up", "-d", "--force-recreate", service], check=True, capture_output=True)
    up_done = time.monotonic()
    while not healthy(port):
        if time.monotonic() - start > timeout:
            raise SystemExit("no /health 200 within %.0f s" % timeout)
        time.sleep(0.01)
    end = time.monotonic()
    return up_done - start, end - up_done, end - start


def no_change_run():
    start = time.monotonic()
    proc = subprocess.run(["ansible-playbook", "playbooks/deploy.yml"], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    wall = time.monotonic() - start
    m = re.search(r"ok=(\d+)\s+changed=(\d+).*?failed=(\d+)", proc.stdout)
    if proc.returncode != 0 or not m:
        sys.stdout.write(proc.stdout[-3000:])
        raise SystemExit("the role run failed")
    return wall, int(m.group(2))


def fmt(values):
    return "median %.3f s  min %.3f s  max %.3f s" % (statistics.median(values), min(values), max(values))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    if not (PROJECT / "docker-compose.prod.yml").exists():
        raise SystemExit("run bash scripts/demo.sh first (no %s)" % (PROJECT / "docker-compose.prod.yml"))
    v = inventory_vars()
    port = int(v["llm_server_port"])
    compose = ["podman-compose", "-p", v["llm_server_compose_project"], "-f", str(PROJECT / "docker-compose.prod.yml")]
    service = v.get("llm_server_service_name", "ai-llm")
    model = ROOT / "demo" / "models" / "demo.gguf"
    size_mib = model.stat().st_size / 2**20
    print("demo model: %s (%.1f MiB), image %s, port %d" % (model, size_mib, v["llm_server_image"], port))

    ups, loads, totals = [], [], []
    for _run in range(args.repeat):
        up, load, total = recreate_to_health(compose, service, port)
        ups.append(up)
        loads.append(load)
        totals.append(total)
    print("(a) recreate -> /health 200 (%d runs): %s" % (args.repeat, fmt(totals)))
    print("    of which `up -d --force-recreate` %s" % fmt(ups))
    print("    and `up -d` returned -> /health 200 %s" % fmt(loads))

    # The recreates above changed nothing the role owns: the next run must be a no-change run.
    walls, changed = [], []
    for _run in range(max(1, args.repeat // 2)):
        wall, ch = no_change_run()
        walls.append(wall)
        changed.append(ch)
    print("(b) no-change run of the role (%d runs): %s; changed=%s" % (len(walls), fmt(walls), changed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
