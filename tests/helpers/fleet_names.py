"""The names, addresses and paths of one checkout's test fleet (tests/helpers/fleet.py): its namespaces, veths and
state file start with ``aillmXXXX``, its addresses are ``fd7a:11f0:XXXX::/64``, ``XXXX`` from the checkout's path.
"""
from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]    # the checkout: its path names the fleet
HOST_INIT = Path(__file__).resolve().parent / "fleet_host_init.sh"
NETNS_DIR = Path("/run/netns")


def fleet_id(checkout):
    """Four hex digits of the SHA-256 of the checkout's path: one fleet per checkout, so that the names and the
    addresses of two checkouts' fleets on one machine never collide."""
    return hashlib.sha256(str(checkout).encode()).hexdigest()[:4]


def fleet_address(network, offset):
    """Address ``offset`` of ``network`` in its canonical text (RFC 5952: leading zeros dropped), the form ssh
    looks a numeric address up in ``known_hosts``: ``fd7a:11f0:525::11``, never ``fd7a:11f0:0525::11``."""
    return network[offset].compressed


@dataclasses.dataclass(frozen=True)
class FleetNames:
    """The names and addresses of one checkout's fleet (``FleetNames.of(path)``)."""

    prefix: str
    network: ipaddress.IPv6Network

    @classmethod
    def of(cls, checkout):
        """``aillmXXXX`` (the start of every namespace, veth and state file) and ``fd7a:11f0:XXXX::/64``."""
        xxxx = fleet_id(checkout)
        return cls("aillm" + xxxx, ipaddress.IPv6Network("fd7a:11f0:%s::/64" % xxxx))

    @property
    def bridge_ns(self):
        return self.prefix + "-br"

    @property
    def uplink(self):
        """The controller's veth in the root namespace (<= 15 characters)."""
        return self.prefix + "0"

    @property
    def controller_address(self):
        return fleet_address(self.network, 1)

    @property
    def state_file(self):
        return Path(tempfile.gettempdir()) / (self.prefix + ".state.json")


NAMES = FleetNames.of(ROOT)
PREFIX = NAMES.prefix
