"""What a test fleet (tests/helpers/fleet.py) can leave behind on this machine, and its removal: ssh masters, the
hosts' launchers and processes, veths and network namespaces, the state file. ``clean_leftovers`` removes what a
run that crashed left; ``leftovers`` lists what is there (nothing, after a clean teardown).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.helpers.fleet_names import HOST_INIT, NAMES, NETNS_DIR


def run_command(argv, check=True, **kw):
    return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=60, **kw)


def ip_command(*args, check=True):
    return run_command(["ip"] + list(args), check=check)


def is_launcher(pid, names=NAMES):
    """True when ``pid`` is a host launcher of the fleet ``names`` (unshare ... fleet_host_init.sh ... PREFIX)."""
    try:
        cmdline = Path("/proc/%d/cmdline" % pid).read_bytes().split(b"\0")
    except OSError:
        return False
    return (bool(cmdline) and cmdline[0].endswith(b"unshare") and str(HOST_INIT).encode() in cmdline
            and names.prefix.encode() in cmdline)


def netns_pids(netns):
    out = ip_command("netns", "pids", netns, check=False).stdout
    return [int(p) for p in out.split()]


def wait_gone(pids, timeout=10.0):
    deadline = time.monotonic() + timeout
    left = list(pids)
    while left and time.monotonic() < deadline:
        left = [p for p in left if Path("/proc/%d" % p).exists() and not _is_zombie(p)]
        if left:
            time.sleep(0.05)
    return left


def _is_zombie(pid):
    try:
        return Path("/proc/%d/stat" % pid).read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def close_control_sockets(control_dir):
    """Close ansible's persistent ssh connections (ControlMaster processes) whose sockets are in ``control_dir``."""
    control_dir = Path(control_dir)
    if not control_dir.is_dir():
        return
    for sock in control_dir.iterdir():
        if sock.is_socket():
            run_command(["ssh", "-o", "ControlPath=" + str(sock), "-O", "exit", "fleet-host"], check=False)
            sock.unlink(missing_ok=True)


def our_netns(names=NAMES):
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(names.prefix + "-"))


def clean_leftovers(names=NAMES):
    """Remove what an earlier run left behind (crashed, killed): ssh masters, hosts, veths, namespaces."""
    state = {}
    if names.state_file.exists():
        try:
            state = json.loads(names.state_file.read_text())
        except ValueError:
            state = {}
    if state.get("control_dir"):
        close_control_sockets(state["control_dir"])
        shutil.rmtree(state["control_dir"], ignore_errors=True)
    # The launchers first (recorded, or found in our namespaces): SIGKILL ends each whole host.
    launchers = [p for p in state.get("launchers", []) if is_launcher(p, names)]
    hosts_ns = [ns for ns in our_netns(names) if ns != names.bridge_ns]
    for ns in hosts_ns:
        launchers += [p for p in netns_pids(ns) if is_launcher(p, names) and p not in launchers]
    for pid in launchers:
        os.kill(pid, signal.SIGKILL)
    wait_gone(launchers)
    # Anything still living in a fleet namespace was started there by an earlier run of this harness.
    stray = [p for ns in hosts_ns for p in netns_pids(ns)]
    for pid in stray:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_gone(stray)
    delete_network(hosts_ns, names)
    names.state_file.unlink(missing_ok=True)


def delete_network(hosts_ns, names):
    """veths first (the uplink in the root namespace, the host ports in the bridge namespace), then namespaces."""
    if Path("/sys/class/net", names.uplink).exists():
        ip_command("link", "del", names.uplink, check=False)
    bridge = names.bridge_ns
    if bridge in our_netns(names):
        links = ip_command("-n", bridge, "-o", "link", "show", "type", "veth", check=False).stdout
        for line in links.splitlines():
            port = line.split(":")[1].strip().split("@")[0]
            ip_command("-n", bridge, "link", "del", port, check=False)
    for ns in hosts_ns + ([bridge] if bridge in our_netns(names) else []):
        ip_command("netns", "del", ns, check=False)


def leftovers(names=NAMES):
    """What a fleet could leave behind: namespaces, the uplink, launchers, the state file (empty when clean)."""
    found = ["netns " + ns for ns in our_netns(names)]
    if Path("/sys/class/net", names.uplink).exists():
        found.append("link " + names.uplink)
    for pid_dir in Path("/proc").iterdir():
        if pid_dir.name.isdigit() and is_launcher(int(pid_dir.name), names):
            found.append("launcher pid %s" % pid_dir.name)
    if names.state_file.exists():
        found.append("state file %s" % names.state_file)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        if names.prefix in line:
            found.append("mount " + line.split()[4])
    return found
