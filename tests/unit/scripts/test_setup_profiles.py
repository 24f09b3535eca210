"""scripts/setup.sh's profiles, read with ``--list`` (which installs nothing): the demo's set-up holds what the demo
and a deploy need and nothing only the tests need; ``--docker`` adds docker; ``--tests`` adds the tests' packages and
environments to both."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TESTS_ONLY = {"chromium", "debootstrap", "shellcheck", "openssh-server", "iproute2", "rsync"}
TOOL_VENVS = {".cache/venvs/galaxy-importer requirements/galaxy-importer.txt", ".cache/venvs/ee requirements/ee.txt"}


def listed(*options):
    """{"debian": [packages], "venv": [...], "llama.cpp": [...], "docker": [...]} of ``setup.sh OPTIONS --list``."""
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")] + list(options) + ["--list"],
                          capture_output=True, text=True, check=True, timeout=60)
    found = {}
    for line in proc.stdout.splitlines():
        key, value = line.split(": ", 1)
        found.setdefault(key, []).append(value)
    found["debian"] = found["debian"][0].split()
    return found


def packages(profile):
    """The packages requirements/debian.txt gives ``profile``: a package, then ``# PROFILE: why``."""
    found = []
    for line in (ROOT / "requirements" / "debian.txt").read_text().splitlines():
        package, _sep, comment = line.partition("#")
        if package.strip() and comment.strip().split(":", 1)[0] == profile:
            found.append(package.strip())
    return found


def test_the_demo_profile_installs_what_the_demo_needs_and_nothing_only_the_tests_need():
    demo = listed()
    assert demo["debian"] == packages("demo")
    assert {"podman", "catatonit", "runc", "libgomp1", "cmake", "g++", "busybox-static"} <= set(demo["debian"])
    assert not set(demo["debian"]) & (TESTS_ONLY | {"docker.io"})
    assert demo["venv"] == [".venv requirements/dev.txt"] and "docker" not in demo
    assert demo["llama.cpp"] == ["scripts/llama-cpp.sh"]


def test_the_docker_profile_adds_docker_and_compose_v2():
    docker = listed("--docker")
    assert docker["debian"] == packages("demo") + ["docker.io"] and packages("docker") == ["docker.io"]
    assert docker["docker"] == ["scripts/docker.sh install"] and docker["venv"] == [".venv requirements/dev.txt"]


@pytest.mark.parametrize("options", [("--tests",), ("--docker", "--tests")])
def test_the_tests_profile_holds_every_package_and_environment(options):
    tests = listed(*options)
    assert tests["debian"] == packages("demo") + packages("docker") + packages("tests")
    assert set(packages("tests")) == TESTS_ONLY and len(set(tests["debian"])) == len(tests["debian"])
    assert tests["venv"][0] == ".venv requirements/dev.txt" and set(tests["venv"][1:]) == TOOL_VENVS
    assert tests["docker"] == ["scripts/docker.sh install"]


def test_an_unknown_option_is_refused_before_anything_is_installed():
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh"), "--test"], capture_output=True, text=True,
                          check=False, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "setup: unknown option --test (--docker, --tests, --list)\n"


def test_a_package_without_a_known_profile_stops_the_set_up(tmp_path):
    """setup.sh reads requirements/debian.txt of the checkout it lies in: a copy of scripts/ and requirements/."""
    for folder in ("scripts", "requirements"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    listing = tmp_path / "requirements" / "debian.txt"
    listing.write_text(listing.read_text() + "nano              # editor: a package of no profile\n")
    proc = subprocess.run(["bash", str(tmp_path / "scripts" / "setup.sh"), "--list"], capture_output=True, text=True,
                          check=False, timeout=60)
    line = len(listing.read_text().splitlines())
    assert proc.returncode == 1 and "debian:" not in proc.stdout
    assert proc.stderr == ('setup: requirements/debian.txt line %d: want "PACKAGE  # PROFILE: why" (demo, docker or '
                           'tests), got: nano              # editor: a package of no profile\n' % line)
