"""A fleet of fake hosts on this machine, reachable over real ssh, for rollout tests (no VMs).

Each host is a network namespace ``aillmXXXX-<name>`` whose ``eth0`` (a veth) sits in a bridge in the namespace
``aillmXXXX-br``, which the controller reaches through the veth ``aillmXXXX0``. ``XXXX`` comes from the checkout's
path (``fleet_id``), so that two checkouts' fleets on one machine never share a name or an address; the addresses
are the IPv6 ULA ``fd7a:11f0:XXXX::/64`` (controller ``::1``, hosts ``::11``, ``::12``...), routed nowhere else,
always written in the canonical form ssh looks up in ``known_hosts`` (``fleet_address``).
A host also has its own mount, UTS and PID namespaces (``unshare ... --mount-proc``, started through ``nsenter
--net``: ``ip netns exec`` would remount /sys and hide the cgroups podman needs); ``fleet_host_init.sh`` gives it a
private /run, /etc/containers, /var/lib/containers, deploy directory and root's home (an empty directory named in
the host's own /etc/passwd: no start-up file of this machine's root runs in its ssh sessions), starts its sshd
(host key and authorized key generated here) and becomes ``catatonit -P``. ``kill_sshd()`` kills its sshd alone
(the host and its containers keep running: Ansible finds it unreachable), ``start_sshd()`` starts it again.
Every host has its own containers of the local CPU image, from one shared read-only image store
(``additionalimagestores``), and its own loopback (llama-server on 127.0.0.1:8080 in each); the rest of the root
filesystem is shared.

Teardown (``Fleet.down``; ``clean_leftovers`` for a run that crashed, from the state file in the temp directory):
ssh masters, containers, the launchers (SIGKILL: ``unshare --fork`` ignores SIGTERM, ``--kill-child`` ends the
host), veths, namespaces.

The fleet's names and addresses are fleet_names.py's, what it can leave behind and its removal fleet_cleanup.py's,
the hosts' ``/health`` seen from inside them fleet_health.py's.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

import yaml

from tests.helpers.fleet_cleanup import (
    clean_leftovers, close_control_sockets, delete_network, ip_command, leftovers, netns_pids, our_netns, run_command,
    wait_gone)
from tests.helpers.fleet_names import HOST_INIT, NETNS_DIR, ROOT, FleetNames, fleet_address, fleet_id
from tests.helpers.llm_deploy import cpu_image
from tools.gguf_models import write_demo_model

DEPLOY_DIR = "srv/ai-llm"               # under the fleet's base directory; the same path on every host


def _host_env():
    """The environment for commands run inside a host: the host's own /etc/containers, not the repo's."""
    env = dict(os.environ)
    for key in ("CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF", "CONTAINERS_REGISTRIES_CONF"):
        env.pop(key, None)
    return env


class FleetHost:
    """One fake host: its name, address, namespace, directory and launcher process."""

    def __init__(self, fleet, index, name):
        self.fleet = fleet
        self.name = name
        self.address = fleet_address(fleet.names.network, 0x11 + index)
        self.netns = "%s-%s" % (fleet.names.prefix, name)
        self.port = "v" + name[:13]           # its veth in the bridge namespace
        self.dir = fleet.base / "hosts" / name
        self.launcher = None
        self.pid1 = None                      # catatonit, PID 1 of the host's PID namespace

    def run(self, argv, check=False, timeout=60):
        """Run ``argv`` inside the host (its mount, UTS, PID and network namespaces)."""
        cmd = ["nsenter", "--target", str(self.pid1), "--mount", "--uts", "--pid", "--net", "--"] + list(argv)
        return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=timeout, env=_host_env(),
                              cwd="/")

    def http_get(self, path, port=8080, timeout=5):
        """(status, body) of http://127.0.0.1:<port><path> inside the host's network namespace; status -1 = no answer."""
        code = (
            "import sys, urllib.request, urllib.error\n"
            "try:\n"
            "    r = urllib.request.urlopen(sys.argv[1], timeout=%d); print(r.status); print(r.read().decode())\n"
            "except urllib.error.HTTPError as e:\n"
            "    print(e.code); print(e.read().decode())\n"
            "except Exception as e:\n"
            "    print(-1); print(e)\n" % timeout)
        proc = subprocess.run(["nsenter", "--net=" + str(NETNS_DIR / self.netns), "--", "python3", "-c", code,
                               "http://127.0.0.1:%d%s" % (port, path)],
                              capture_output=True, text=True, timeout=timeout + 10, check=True)
        status, body = (proc.stdout.split("\n", 1) + [""])[:2]
        return int(status), body.strip()

    def sshd_pids(self):
        """The pids (in the root namespace) of the sshd processes of this host: listener and sessions."""
        own = os.readlink("/proc/%d/ns/pid" % self.pid1)
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.readlink(entry / "ns" / "pid") == own and (entry / "comm").read_text().strip() == "sshd":
                    pids.append(int(entry.name))
            except OSError:
                continue
        return pids

    def kill_sshd(self):
        """SIGKILL this host's sshd (listener and open sessions, by pid): it stops answering ssh, nothing else."""
        pids = self.sshd_pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        left = wait_gone(pids)
        if left or not pids:
            raise RuntimeError("fleet host %s: sshd pids %s, still there: %s" % (self.name, pids, left))
        return pids

    def start_sshd(self):
        """Start this host's sshd again (it daemonizes into the host) and wait for its banner."""
        self.run(["/usr/sbin/sshd", "-f", str(self.dir / "sshd_config"), "-E", str(self.dir / "sshd.log")],
                 check=True)
        self.fleet.wait_ssh(self)

    def container(self, name="ai-llm"):
        """``podman inspect`` of a container on this host (a dict), or None."""
        proc = self.run(["podman", "container", "inspect", name])
        if proc.returncode != 0:
            return None
        return json.loads(proc.stdout)[0]

    def deploy_file(self, name):
        """The text of a file in the host's deploy directory (read from its private directory)."""
        return (self.dir / "deploy" / name).read_text()


class Fleet:
    """``Fleet(base, names).up()`` ... ``down()``; ``hosts`` by name, ``inventory(path, ...)`` for ansible."""

    def __init__(self, base, names=("h1", "h2", "h3", "h4"), image="localhost/ai-llm:cpu-b10435", checkout=ROOT):
        self.base = Path(base).resolve()
        self.image = image                    # None: no image store (a fleet for ssh alone)
        self.names = FleetNames.of(checkout)
        self.hosts = {name: FleetHost(self, i, name) for i, name in enumerate(names)}
        # ssh's sockets in a short folder: a Unix socket path has at most 107 bytes, too few for a pytest tmp_path
        self.control_dir = Path(tempfile.gettempdir()) / f"{self.names.prefix}-cp-{fleet_id(self.base)}"
        self.key = self.base / "id_ed25519"
        self.known_hosts = self.base / "known_hosts"
        self.deploy_dir = self.base / DEPLOY_DIR
        self.image_store = self.base / "imagestore"

    # ------------------------------------------------------------------ set-up
    def up(self):
        clean_leftovers(self.names)
        self.base.mkdir(parents=True, exist_ok=True)
        self.control_dir.mkdir(mode=0o700, exist_ok=True)
        self.deploy_dir.mkdir(parents=True, exist_ok=True)
        (self.base / "bin").mkdir(exist_ok=True)
        compose = self.base / "bin" / "podman-compose"
        if not compose.is_symlink():
            compose.symlink_to(ROOT / ".venv" / "bin" / "podman-compose")
        self._write_state()
        try:
            self._fill_image_store()
            self._keys()
            self._network()
            for host in self.hosts.values():
                self._start(host)
            self._write_state()
            for host in self.hosts.values():
                self.wait_ssh(host)
        except BaseException:
            self.down()
            raise
        return self

    def _write_state(self):
        self.names.state_file.write_text(json.dumps({
            "base": str(self.base), "control_dir": str(self.control_dir),
            "launchers": [h.launcher.pid for h in self.hosts.values() if h.launcher is not None]}))

    def _fill_image_store(self):
        """The shared read-only image store: the local image, copied once from the machine's own storage."""
        if self.image is None:
            return
        run = self.base / "imagestore-run"
        # In a throw-away mount namespace: the overlay driver bind-mounts its directory onto itself.
        run_command(["unshare", "--mount", "--", "podman", "push", "-q", self.image,
                     "containers-storage:[overlay@%s+%s]%s" % (self.image_store, run, self.image)])

    def _keys(self):
        for old in self.base.glob("id_ed25519*"):
            old.unlink()
        run_command(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "fleet-controller", "-f", str(self.key)])
        (self.base / "authorized_keys").write_text(Path(str(self.key) + ".pub").read_text())
        lines = []
        for host in self.hosts.values():
            for sub in ("etc-containers", "containers", "deploy"):
                (host.dir / sub).mkdir(parents=True, exist_ok=True)
            (host.dir / "home").mkdir(mode=0o700, exist_ok=True)
            hostkey = host.dir / "ssh_host_ed25519_key"
            for old in host.dir.glob("ssh_host_ed25519_key*"):
                old.unlink()
            run_command(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", host.name, "-f", str(hostkey)])
            # port 22: "ADDRESS KEY", not "[ADDRESS]:22 KEY"
            lines.append("%s %s" % (host.address, " ".join(Path(str(hostkey) + ".pub").read_text().split()[:2])))
            self._host_files(host, hostkey)
        self.known_hosts.write_text("\n".join(lines) + "\n")

    def _host_files(self, host, hostkey):
        (host.dir / "sshd_config").write_text("\n".join([
            "Port 22",
            "ListenAddress " + host.address,
            "HostKey " + str(hostkey),
            "PidFile /run/sshd.pid",
            "AuthorizedKeysFile " + str(self.base / "authorized_keys"),
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "UseDNS no",
            "MaxStartups 100:30:200",
            "MaxSessions 100",
            "Subsystem sftp internal-sftp",
            # podman-compose comes from the repository's .venv: on PATH through the fleet's bin directory.
            "SetEnv PATH=%s:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" % (self.base / "bin"),
            "",
        ]))
        # /etc/passwd with root's home in the host's directory (fleet_host_init.sh mounts it over the machine's)
        users = [line.split(":") for line in Path("/etc/passwd").read_text().splitlines() if line]
        (host.dir / "passwd").write_text("".join(":".join(u[:5] + [str(host.dir / "home")] + u[6:] if u[0] == "root"
                                                          else u) + "\n" for u in users))
        etc = host.dir / "etc-containers"
        for name in ("policy.json", "registries.conf"):
            if Path("/etc/containers", name).exists():
                (etc / name).write_text(Path("/etc/containers", name).read_text())
        repo_conf = ROOT / "scripts" / "containers.conf"
        (etc / "containers.conf").write_text(repo_conf.read_text())
        (etc / "storage.conf").write_text("\n".join([
            "[storage]",
            'driver = "overlay"',
            'runroot = "/run/containers/storage"',
            'graphroot = "/var/lib/containers/storage"',
            "[storage.options]",
            'additionalimagestores = ["%s"]' % self.image_store,
            "",
        ]))

    def _network(self):
        bridge, uplink = self.names.bridge_ns, self.names.uplink
        ip_command("netns", "add", bridge)
        ip_command("-n", bridge, "link", "set", "lo", "up")
        ip_command("-n", bridge, "link", "add", "br0", "type", "bridge", "forward_delay", "0", "mcast_snooping", "0")
        ip_command("-n", bridge, "link", "set", "br0", "up")
        ip_command("link", "add", uplink, "type", "veth", "peer", "name", "uplink", "netns", bridge)
        ip_command("-n", bridge, "link", "set", "uplink", "master", "br0", "up")
        ip_command("addr", "add", "%s/%d" % (self.names.controller_address, self.names.network.prefixlen), "dev", uplink,
                   "nodad")
        ip_command("link", "set", uplink, "up")
        for host in self.hosts.values():
            ip_command("netns", "add", host.netns)
            ip_command("-n", bridge, "link", "add", host.port, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
            ip_command("-n", bridge, "link", "set", host.port, "master", "br0", "up")
            ip_command("-n", host.netns, "link", "set", "lo", "up")
            ip_command("-n", host.netns, "addr", "add", "%s/%d" % (host.address, self.names.network.prefixlen), "dev", "eth0",
                       "nodad")
            ip_command("-n", host.netns, "link", "set", "eth0", "up")

    def _start(self, host):
        # the launcher keeps its own copy of the log file; it lives until down() kills it
        with open(host.dir / "sshd.log", "ab") as log:
            host.launcher = subprocess.Popen(  # pylint: disable=consider-using-with
                ["nsenter", "--net=" + str(NETNS_DIR / host.netns), "--",
                 "unshare", "--mount", "--uts", "--pid", "--fork", "--kill-child", "--mount-proc", "--",
                 "sh", str(HOST_INIT), host.name, str(host.dir), str(self.deploy_dir), self.names.prefix],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd="/")

    def wait_ssh(self, host, timeout=15.0):
        """Wait until ``host`` answers with an SSH banner on port 22 (and its PID 1 is known)."""
        deadline = time.monotonic() + timeout
        children = Path("/proc/%d/task/%d/children" % (host.launcher.pid, host.launcher.pid))
        while time.monotonic() < deadline:
            if host.launcher.poll() is not None:
                raise RuntimeError("fleet host %s exited (%s): %s" % (
                    host.name, host.launcher.returncode, (host.dir / "sshd.log").read_text()[-2000:]))
            if host.pid1 is None:
                try:
                    kids = children.read_text().split()
                except OSError:
                    kids = []
                host.pid1 = int(kids[0]) if kids else None
            try:
                with socket.create_connection((host.address, 22), timeout=1) as conn:
                    if conn.recv(4).startswith(b"SSH-") and host.pid1 is not None:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("fleet host %s: no sshd on [%s]:22 after %ss: %s" % (
            host.name, host.address, timeout, (host.dir / "sshd.log").read_text()[-2000:]))

    # ------------------------------------------------------------------ use
    def inventory(self, path, group="llm_servers", group_vars=None, host_vars=None):
        """Write an ansible YAML inventory of the fleet (ssh as root, our key, our known_hosts) to ``path``."""
        hosts = {}
        for host in self.hosts.values():
            hosts[host.name] = dict({"ansible_host": host.address}, **(host_vars or {}).get(host.name, {}))
        variables = {
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.key),
            "ansible_ssh_common_args": "-o UserKnownHostsFile=%s -o IdentitiesOnly=yes" % self.known_hosts,
            "ansible_python_interpreter": "/usr/bin/python3",
        }
        variables.update(group_vars or {})
        Path(path).write_text(yaml.safe_dump({"all": {"children": {group: {"hosts": hosts, "vars": variables}}}},
                                             sort_keys=False))
        return Path(path)

    def ansible_env(self):
        """Environment for ansible/ansible-playbook against the fleet: this checkout's ansible.cfg and collection,
        the rollout report, no colours, known_hosts checked, our ControlPath dir."""
        return dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".collections"),
                    ANSIBLE_CALLBACKS_ENABLED="ai_llm.moe_offload.rollout_report", ANSIBLE_NOCOLOR="1",
                    ANSIBLE_RETRY_FILES_ENABLED="0", ANSIBLE_HOST_KEY_CHECKING="True",
                    ANSIBLE_SSH_CONTROL_PATH_DIR=str(self.control_dir))

    # ------------------------------------------------------------------ teardown
    def down(self):
        """Tear the fleet down (always safe to call): ssh masters, containers, launchers, veths, namespaces."""
        close_control_sockets(self.control_dir)
        shutil.rmtree(self.control_dir, ignore_errors=True)
        running = [h for h in self.hosts.values() if h.launcher is not None and h.launcher.poll() is None]
        # Remove the containers while the hosts live: podman removes their cgroups and mounts on the way.
        removals = [subprocess.Popen(  # pylint: disable=consider-using-with
            ["nsenter", "--target", str(h.pid1), "--mount", "--uts", "--pid", "--net", "--",
             "podman", "rm", "--all", "--force", "--time", "0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_host_env(), cwd="/")
            for h in running if h.pid1 is not None]
        for proc in removals:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for host in running:
            host.launcher.send_signal(signal.SIGKILL)
        for host in self.hosts.values():
            if host.launcher is not None:
                host.launcher.wait(timeout=30)
        # Processes of a host end with its launcher; wait until its namespace is empty.
        for host in self.hosts.values():
            if (NETNS_DIR / host.netns).exists():
                wait_gone(netns_pids(host.netns))
        delete_network([h.netns for h in self.hosts.values() if h.netns in our_netns(self.names)], self.names)
        self.names.state_file.unlink(missing_ok=True)
        # The container storage is big and useless now (no mount holds it any more); logs and reports stay.
        for path in [self.image_store, self.base / "imagestore-run"] + [h.dir / "containers" for h in self.hosts.values()]:
            shutil.rmtree(path, ignore_errors=True)


def demo_fleet(request, base, names=("h1", "h2", "h3", "h4"), checkout=ROOT):
    """A started fleet of the local CPU image whose ``models`` folder holds the demo model (``demo.gguf``), with
    ``group_vars`` (the demo's settings at the tests' sizes) written as the inventory ``base``/hosts.yml; torn down,
    and checked to leave nothing behind, by ``request``'s finalizer. ``checkout`` names the fleet (``FleetNames``):
    test modules that may run at the same time give different ones."""
    image = cpu_image()
    fl = Fleet(base, names=names, image=image, checkout=checkout)
    found = leftovers(fl.names)
    if found:
        warnings.warn("a previous fleet run left %s; cleaning up" % found)
    clean_leftovers(fl.names)

    def teardown():
        fl.down()
        assert leftovers(fl.names) == [], "the fleet's teardown left something behind"
    request.addfinalizer(teardown)
    fl.up()
    fl.models = fl.base / "models"
    fl.models.mkdir()
    write_demo_model(str(fl.models / "demo.gguf"))
    fl.group_vars = {
        "llm_server_project_dir": str(fl.deploy_dir),
        "llm_server_model_path": str(fl.models / "demo.gguf"),
        "llm_server_image": image,
        "llm_server_network_mode": "host",
        "llm_server_port": 8080,
        "llm_server_ctx_size": 2048,
        "llm_server_moe_offload_mode": "all",
        "llm_server_log_verbosity": 5,
        "llm_server_health_timeout": 60,
        # the speed check at the tests' sizes (tests/helpers/llm_deploy.py): four hosts share two cores
        "llm_server_speed_prompt_tokens": 8,
        "llm_server_speed_predict_tokens": 4,
        "llm_server_speed_runs": 1,
    }
    fl.inventory(fl.base / "hosts.yml", group_vars=fl.group_vars)
    return fl
