"""Deploy speed of the llm_server role, side by side: this checkout ("after", its working tree) and another
revision ("before": --before REV, by default HEAD, checked out in a scratch clone). Both sides get this checkout's
variable names, so REV is a revision with the same llm_server_* variables.

For each side, on this machine (podman + podman-compose, this checkout's CPU image for both sides, the demo model),
with its own project directory, compose project, container and loopback port:

  (a) a first deploy (not timed);
  (b) no-change runs, interleaved: of the role alone (a playbook of one play with the role) and of
      ``playbooks/deploy.yml`` (a preflight play only with several hosts: one here): the wall time of ``ansible-playbook``,
      the tasks the run went through (the TASK lines: run or skipped), and that nothing changed (PLAY RECAP
      changed=0);
  (c) this checkout only: ``<compose> up -d --force-recreate`` until ``/health`` answers 200.

Prints figures; this is not a test. Run it under the podman lock:
  flock /tmp/ai-llm-podman.lock python benchmarks/deploy_speed.py [--before REV] [--repeat N]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tools.gguf_models import write_demo_model  # noqa: E402  pylint: disable=wrong-import-position


def git(*args, cwd=ROOT):
    return subprocess.run(["git"] + list(args), cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def healthy(port):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=1) as answer:
            return answer.status == 200
    except Exception:  # pylint: disable=broad-except
        return False


class Side:
    """One version of the collection with its own deployment."""

    def __init__(self, label, checkout, work, model, image):
        self.label = label
        self.checkout = Path(checkout)
        self.name = "ai-llm-speed-%s-%s" % (label, uuid.uuid4().hex[:6])
        self.project = Path(work) / label / "ai-llm"
        self.port = free_port()
        collections = self.checkout / ".collections" / "ansible_collections" / "ai_llm"
        collections.mkdir(parents=True, exist_ok=True)
        if not (collections / "moe_offload").exists():
            (collections / "moe_offload").symlink_to(self.checkout)
        self.image = image
        host = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "llm_server_project_dir": str(self.project),
            "llm_server_compose_project": self.name,
            "llm_server_container_name": self.name,
            "llm_server_image": self.image,
            "llm_server_model_path": model,
            "llm_server_network_mode": "host",
            "llm_server_port": self.port,
            "llm_server_ctx_size": 2048,
            "llm_server_health_timeout": 120,
            "llm_server_moe_offload_mode": "all",
            "llm_server_log_verbosity": 5,
        }
        self.inventory = Path(work) / label / "inventory.json"
        self.inventory.parent.mkdir(parents=True, exist_ok=True)
        self.inventory.write_text(json.dumps({"llm_servers": {"hosts": {"localhost": host}}}))

    def run(self, playbook="playbooks/deploy.yml"):
        env = dict(os.environ, ANSIBLE_CONFIG=str(self.checkout / "ansible.cfg"),
                   ANSIBLE_COLLECTIONS_PATH=str(self.checkout / ".collections"), ANSIBLE_LOCALHOST_WARNING="0",
                   ANSIBLE_DEPRECATION_WARNINGS="0")
        start = time.monotonic()
        proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), str(playbook),
                               "-i", str(self.inventory)], cwd=self.checkout, env=env, capture_output=True,
                              text=True, check=False)
        wall = time.monotonic() - start
        recap = dict((k, int(v)) for k, v in re.findall(r"(\w+)=(\d+)", proc.stdout.split("PLAY RECAP")[-1]))
        if proc.returncode != 0:
            sys.stdout.write(proc.stdout[-3000:])
            raise SystemExit("%s: the role run failed" % self.label)
        tasks = len(re.findall(r"^(?:TASK|RUNNING HANDLER) \[", proc.stdout, re.MULTILINE))
        return wall, tasks, recap

    def compose(self, *args):
        return ["podman-compose", "-p", self.name, "-f", str(self.project / "docker-compose.prod.yml")] + list(args)

    def down(self):
        if (self.project / "docker-compose.prod.yml").exists():
            subprocess.run(self.compose("down"), capture_output=True, check=False)
        subprocess.run(["podman", "rm", "--force", self.name], capture_output=True, check=False)


def build_image():
    """This checkout's CPU image (its llama-server build and start command), which both sides run: the comparison
    is of the role."""
    build = ROOT / "images" / "ai-llm" / "build.sh"
    return subprocess.run(["bash", str(build), "--checkout"], check=True, capture_output=True, text=True,
                          cwd=ROOT).stdout.split()[-1]


def fmt(values):
    return "median %.2f s (min %.2f, max %.2f)" % (statistics.median(values), min(values), max(values))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--before", default="HEAD", help="the revision to compare with (default: HEAD)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    before_rev = args.before
    work = Path(tempfile.mkdtemp(prefix="ai-llm-speed-"))
    sides = []
    try:
        clone = work / "before-checkout"
        subprocess.run(["git", "clone", "-q", "--shared", str(ROOT), str(clone)], check=True)
        git("checkout", "-q", git("rev-parse", before_rev), cwd=clone)
        (clone / ".venv").symlink_to(ROOT / ".venv")
        (work / "models").mkdir()
        model = write_demo_model(str(work / "models" / "demo.gguf"))
        print("before: %s (%s)" % (git("log", "-1", "--format=%h %s", cwd=clone)[:100], before_rev))
        print("after:  this checkout (%s)" % git("log", "-1", "--format=%h %s")[:100])
        image = build_image()
        print("image:  %s (both sides)" % image)
        sides = [Side("before", clone, work, model, image), Side("after", ROOT, work, model, image)]
        role_only = work / "role.yml"
        role_only.write_text("- name: The llm_server role alone\n  hosts: llm_servers\n  gather_facts: false\n"
                             "  roles:\n    - ai_llm.moe_offload.llm_server\n")
        runs = (("the role alone", role_only), ("playbooks/deploy.yml", "playbooks/deploy.yml"))
        for side in sides:
            side.run()  # the first deploy
        rows = {}
        for _round in range(args.repeat):  # interleaved, so that the machine's load falls on both alike
            for side in sides:
                for what, playbook in runs:
                    rows.setdefault((side.label, what), []).append(side.run(playbook))
        for what, _playbook in runs:
            print("\nno-change run, %s (%d runs each):" % (what, args.repeat))
            for side in sides:
                done = rows[(side.label, what)]
                walls = [w for w, _t, _r in done]
                tasks, recap = done[-1][1], done[-1][2]
                changed = sorted({r.get("changed") for _w, _t, r in done})
                print("  %-6s %s; %d tasks (ok=%d skipped=%d); changed=%s" % (
                    side.label, fmt(walls), tasks, recap.get("ok", 0), recap.get("skipped", 0), changed))
        after = sides[1]
        times = []
        for _run in range(max(1, args.repeat // 2)):
            start = time.monotonic()
            subprocess.run(after.compose("up", "-d", "--force-recreate", "ai-llm"), check=True, capture_output=True)
            while not healthy(after.port):
                time.sleep(0.01)
            times.append(time.monotonic() - start)
        print("\nrecreate -> /health 200 (after, %d runs): %s" % (len(times), fmt(times)))
    finally:
        for side in sides:
            side.down()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
