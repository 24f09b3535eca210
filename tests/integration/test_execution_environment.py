"""The collection in an execution environment, as AWX and Automation Platform run it (ansible-builder 3.x, in
.cache/venvs/ee from requirements/ee.txt): ``ansible-builder introspect`` on the built tarball installed into an
empty collections path lists the collection's system requirements (meta/execution-environment.yml) and no Python
package; meta/ee-requirements.txt names every import of plugins/ outside the standard library and ansible-core
(none); ``ansible-builder create`` on docs/execution-environment.yml, next to the built tarball, writes the build
context (Containerfile, the galaxy requirements, the tarball, the build's scripts) without pulling any image, and
the context's own introspect script, the one the build runs, finds the collection's requirements.
"""
from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.collection_run import install_tarball

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
EE_BIN = ROOT / ".cache" / "venvs" / "ee" / "bin"
SOURCE = "  # from collection ai_llm.moe_offload"
# meta/ee-bindep.txt: ansible's ssh connection to the hosts (the EE's base image is RHEL-family: openssh-clients)
SYSTEM = ["openssh-client [platform:dpkg]", "openssh-clients [platform:rpm]"]
BASE_IMAGE = "quay.io/centos/centos:stream9"


def pin(requirements, package):
    """The version ``package==VERSION`` pins in the requirements file ``requirements`` (under requirements/)."""
    (version,) = re.findall(r"^%s==(\S+)" % re.escape(package), (ROOT / "requirements" / requirements).read_text(),
                            re.MULTILINE)
    return version


def builder(*args, cwd, home):
    """``ansible-builder ARGS`` with nothing of the caller's ANSIBLE_* variables and a home of its own."""
    assert (EE_BIN / "ansible-builder").exists(), "scripts/setup.sh --tests makes .cache/venvs/ee"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update({"HOME": str(home), "PATH": str(EE_BIN) + os.pathsep + env["PATH"]})
    return subprocess.run([str(EE_BIN / "ansible-builder")] + list(args), capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300, check=False)


def introspect_output(proc):
    """introspect's YAML ({"python": [...], "system": [...]}) after its '---' line."""
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return yaml.safe_load(proc.stdout[proc.stdout.index("---"):])


@pytest.fixture(scope="module")
def collections(tarball, tmp_path_factory):
    """An empty collections path holding only the installed tarball (as the build's galaxy stage makes one)."""
    home = tmp_path_factory.mktemp("user")
    install_tarball(BIN, tarball, home)
    return home / "collections"


def test_introspect_lists_the_collections_system_requirements_and_no_python_package(collections, tmp_path):
    proc = builder("introspect", "--write-pip", str(tmp_path / "requirements.txt"),
                   "--write-bindep", str(tmp_path / "bindep.txt"), str(collections), cwd=tmp_path, home=tmp_path)
    assert introspect_output(proc) == {"python": [], "system": [line + SOURCE for line in SYSTEM]}
    # the files the build's assemble step installs from: bindep's, and no pip file (nothing to install)
    assert (tmp_path / "bindep.txt").read_text().splitlines() == [line + SOURCE for line in SYSTEM]
    assert not (tmp_path / "requirements.txt").exists()


def test_the_python_requirements_name_every_import_outside_the_standard_library():
    """Every top-level module that plugins/ imports is the standard library's, ansible-core's or the collection's
    own; anything else would belong in meta/ee-requirements.txt, which names no package."""
    imported = set()
    for path in (ROOT / "plugins").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
    assert {"ansible", "ansible_collections", "json", "subprocess"} <= imported     # the walk saw the plugins
    third_party = imported - set(sys.stdlib_module_names) - {"__future__", "ansible", "ansible_collections"}
    meta = yaml.safe_load((ROOT / "meta" / "execution-environment.yml").read_text())
    assert meta["dependencies"] == {"python": "meta/ee-requirements.txt", "system": "meta/ee-bindep.txt"}
    named = [re.split(r"[<>=!~;\[ ]", line.strip())[0] for line in (ROOT / "meta" / "ee-requirements.txt").open()
             if line.strip() and not line.lstrip().startswith("#")]
    assert sorted(third_party) == sorted(named) == []


def test_create_writes_the_build_context_of_the_example_ee(tarball, collections, tmp_path):
    """docs/execution-environment.yml next to the built tarball: the context installs that tarball, ansible-core as
    requirements/dev.txt pins it and ansible-runner as requirements/ee.txt pins it, on the named base image."""
    version = yaml.safe_load((ROOT / "galaxy.yml").read_text())["version"]
    assert tarball.name == "ai_llm-moe_offload-%s.tar.gz" % version
    folder = tmp_path / "ee"
    folder.mkdir()
    shutil.copy(ROOT / "docs" / "execution-environment.yml", folder)
    shutil.copy(tarball, folder)
    proc = builder("create", "-f", "execution-environment.yml", "-c", "context", cwd=folder, home=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    context = folder / "context"
    files = sorted(str(p.relative_to(context)) for p in context.rglob("*") if p.is_file())
    scripts = ["assemble", "check_ansible", "check_galaxy", "entrypoint", "install-from-bindep", "introspect.py",
               "pip_install"]
    assert files == sorted(["Containerfile", "_build/requirements.yml", "_build/collections/" + tarball.name]
                           + ["_build/scripts/" + name for name in scripts])
    assert (context / "_build" / "collections" / tarball.name).read_bytes() == tarball.read_bytes()
    # ansible-galaxy runs in /build (the context's _build): the collection is the tarball there
    assert yaml.safe_load((context / "_build" / "requirements.yml").read_text()) == {
        "collections": [{"name": "collections/" + tarball.name, "type": "file"}]}
    containerfile = (context / "Containerfile").read_text()
    build_args = dict(re.findall(r'^ARG (\w+)="(.*)"$', containerfile, re.MULTILINE))
    assert build_args["EE_BASE_IMAGE"] == BASE_IMAGE
    assert build_args["ANSIBLE_INSTALL_REFS"] == "ansible-core==%s ansible-runner==%s" % (
        pin("dev.txt", "ansible-core"), pin("ee.txt", "ansible-runner"))
    assert build_args["PYCMD"] == "/usr/bin/python3.12"
    for line in ("COPY _build /build", "WORKDIR /build",
                 'RUN ANSIBLE_GALAXY_DISABLE_GPG_VERIFY=1 ansible-galaxy collection install '
                 '$ANSIBLE_GALAXY_CLI_COLLECTION_OPTS -r requirements.yml '
                 '--collections-path "/usr/share/ansible/collections"',
                 "RUN $PYCMD /output/scripts/introspect.py introspect --write-bindep=/tmp/src/bindep.txt "
                 "--write-pip=/tmp/src/requirements.txt",
                 "RUN /output/scripts/install-from-bindep && rm -rf /output/wheels"):
        assert line in containerfile.splitlines(), line
    # the build's introspect step, run here on the collection as the galaxy step installs it
    written = tmp_path / "src"
    written.mkdir()
    proc = subprocess.run([str(EE_BIN / "python"), str(context / "_build" / "scripts" / "introspect.py"), "introspect",
                           "--write-bindep=%s" % (written / "bindep.txt"),
                           "--write-pip=%s" % (written / "requirements.txt"), str(collections)], capture_output=True, text=True, timeout=120, check=False)
    assert introspect_output(proc)["system"] == [line + SOURCE for line in SYSTEM]
    assert (written / "bindep.txt").read_text().splitlines() == [line + SOURCE for line in SYSTEM]
    assert not (written / "requirements.txt").exists()
