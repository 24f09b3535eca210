"""The locks of requirements/ (written by scripts/lock.sh) and the environments installed from them.

.venv holds exactly the packages of its lock, requirements/dev.txt, at the locked versions: a package installed by
hand, or a lock that scripts/setup.sh has not applied, fails here. Every lock pins each of its inputs' requirements
and requirements/constraints.in at a version they allow, every pin carries hashes, and requirements/compat.txt
has exactly one lock per release, pinning that release.
"""
from __future__ import annotations

import importlib.metadata
import re
import sys
import sysconfig
from pathlib import Path
from typing import NamedTuple

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from scripts import compat

ROOT = Path(__file__).resolve().parents[3]
REQUIREMENTS = ROOT / "requirements"
# name==version, an optional environment marker, then the line's continuation to its hashes
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]*?))?\s*\\$")
LOCKS = sorted(p.with_suffix(".txt") for p in REQUIREMENTS.glob("*.in") if p.name != "constraints.in")


class Pin(NamedTuple):
    """One package of a lock: its version, its environment marker (None: every environment) and its sha256s."""
    version: str
    marker: str | None
    hashes: list


def pins(lock):
    """{canonical name: Pin} of a lock written by uv pip compile --generate-hashes."""
    found = {}
    lines = lock.read_text().splitlines()
    for number, line in enumerate(lines):
        match = PIN.match(line)
        if match:
            hashes = []
            for following in lines[number + 1:]:
                hashed = re.match(r"^\s+--hash=sha256:([0-9a-f]{64})", following)
                if not hashed:
                    break
                hashes.append(hashed.group(1))
            name = canonicalize_name(match.group(1))
            assert name not in found, "%s: %s pinned twice" % (lock.name, name)
            found[name] = Pin(match.group(2), match.group(3), hashes)
        else:
            assert not re.match(r"^[A-Za-z0-9]", line), "%s: not a pin with hashes: %r" % (lock.name, line)
    return found


def requirements_of(path):
    """The requirements an input file names (comments and blank lines left out)."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [Requirement(line) for line in lines if line]


CONSTRAINTS = requirements_of(REQUIREMENTS / "constraints.in")


def installed(prefix_paths):
    """{canonical name: version} of the distributions installed in the given site-packages folders."""
    return {canonicalize_name(d.metadata["Name"]): d.version
            for d in importlib.metadata.distributions(path=[str(p) for p in prefix_paths])}


def test_the_venv_holds_exactly_its_lock_at_the_locked_versions():
    assert Path(sys.prefix) == ROOT / ".venv", "the tests run in .venv (scripts/test.sh), not in %s" % sys.prefix
    site = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    have = installed(site)
    want = {name: pin.version for name, pin in pins(REQUIREMENTS / "dev.txt").items()
            if pin.marker is None or Marker(pin.marker).evaluate()}
    assert {"ansible-core", "cryptography", "pytest", "pip"} <= set(have)    # the walk saw the venv's packages
    unlocked = sorted("%s %s" % item for item in have.items() if item[0] not in want)
    missing = sorted(name for name in want if name not in have)
    other = sorted("%s %s (locked %s)" % (name, have[name], want[name])
                   for name in have.keys() & want.keys() if have[name] != want[name])
    assert (unlocked, missing, other) == ([], [], []), (
        "'.venv' differs from requirements/dev.txt (not installed by the lock: %s; locked, not installed: %s; "
        "at another version: %s): bash scripts/setup.sh installs the lock" % (unlocked, missing, other))


def assert_allows(lock, requirements, required=True):
    """Every requirement (of an input: ``required``; of constraints.in: only where the lock holds the package) is
    pinned at a version it allows, and every pin of the lock has hashes."""
    locked = pins(lock)
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        assert name in locked or not required, "%s: %s is not locked: bash scripts/lock.sh" % (lock.name, requirement)
        if name in locked:
            assert requirement.specifier.contains(locked[name].version, prereleases=True), (
                "%s: %s==%s, %s asks for %s: bash scripts/lock.sh" % (
                    lock.name, name, locked[name].version, "the input" if required else "constraints.in", requirement))
    assert [name for name, pin in locked.items() if not pin.hashes] == [], lock.name


@pytest.mark.parametrize("lock", LOCKS, ids=lambda p: p.name)
def test_a_lock_pins_what_its_input_and_the_constraints_ask_for_with_hashes(lock):
    assert_allows(lock, requirements_of(lock.with_suffix(".in")))
    assert_allows(lock, CONSTRAINTS, required=False)


def test_each_compat_release_has_one_lock_that_pins_it_under_the_constraints():
    locks = {release[0]: compat.release_lock(release[0]) for release in compat.releases()}
    assert len(locks) == 3 and "ansible-core==2.21.5" in locks, locks      # the list was read
    assert sorted(locks.values()) == sorted((REQUIREMENTS / "compat").glob("*.txt")), (
        "requirements/compat/ holds a lock of a release that compat.txt no longer lists")
    for requirement, lock in locks.items():
        assert pins(lock)["ansible-core"].version == requirement.split("==")[1]
        assert_allows(lock, [Requirement(requirement)])
        assert_allows(lock, CONSTRAINTS, required=False)
    assert "cryptography" in {canonicalize_name(r.name) for r in CONSTRAINTS}


def test_a_compat_release_whose_lock_pins_another_version_stops_the_stage():
    with pytest.raises(SystemExit, match=r"^requirements/compat/ansible-core-2\.19\.txt: pins ansible-core 2\.19\.\d+, "
                                         r"requirements/compat\.txt asks for ansible-core==2\.19\.0: "
                                         r"run bash scripts/lock\.sh$"):
        compat.release_lock("ansible-core==2.19.0")
    with pytest.raises(SystemExit, match=r"^requirements/compat/ansible-core-2\.16\.txt: pins no ansible-core, "):
        compat.release_lock("ansible-core==2.16.14")
