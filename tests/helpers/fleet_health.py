"""The health of a test fleet's hosts (tests/helpers/fleet.py) as a client inside each host sees it: ``/health``
polled from inside every host's network namespace, side by side, during a rollout.
"""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.helpers.fleet_names import NETNS_DIR


class HealthPoller:
    """``with HealthPoller(hosts) as poller:`` polls every host's ``/health`` from inside its network namespace.

    One small process per host (``fleet_poll_health.py``, started with ``nsenter --net``, stopped by its pid) polls
    every ``interval`` seconds, and a thread per host collects its answers: ``samples[host]`` is a list of
    ``(start epoch, HTTP status)``, ``serving()`` the number of hosts answering 200 after each poll of any host.
    Entering waits until every host has answered once. A poll that gets no answer in ``timeout`` seconds counts
    as not serving: the timeout is long enough for a loaded test machine, where a serving host may answer late.
    """

    def __init__(self, hosts, port=8080, interval=0.2, timeout=10.0):
        self.hosts = list(hosts)
        self.url = "http://127.0.0.1:%d/health" % port
        self.interval, self.timeout = interval, timeout
        self.procs = {}
        self.readers = []
        self.samples = {host.name: [] for host in self.hosts}

    def _read(self, name, stream):
        for line in stream:
            epoch, status = line.split()
            self.samples[name].append((float(epoch), int(status)))

    def __enter__(self):
        script = str(Path(__file__).resolve().parent / "fleet_poll_health.py")
        for host in self.hosts:
            proc = subprocess.Popen(  # pylint: disable=consider-using-with
                ["nsenter", "--net=" + str(NETNS_DIR / host.netns), "--", sys.executable, script, self.url,
                 str(self.interval), str(self.timeout)],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd="/")
            self.procs[host.name] = proc
            reader = threading.Thread(target=self._read, args=(host.name, proc.stdout), daemon=True)
            reader.start()
            self.readers.append(reader)
        deadline = time.monotonic() + 30
        while not all(self.samples.values()):
            if time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError("health pollers gave no answer in 30 s: %s" % self.samples)
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        for proc in self.procs.values():
            proc.terminate()
            proc.wait(timeout=30)
        for reader in self.readers:
            reader.join(timeout=30)
        return False

    def serving(self):
        """``[(epoch, hosts answering 200)]``: after each poll, each host counted by its latest answer."""
        events = sorted((t, name, status == 200) for name, rows in self.samples.items() for t, status in rows)
        latest = {}
        counts = []
        for epoch, name, ok in events:
            latest[name] = ok
            if len(latest) == len(self.samples):
                counts.append((epoch, sum(latest.values())))
        return counts
