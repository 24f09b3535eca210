"""The collection as Galaxy users get it: ``ansible-galaxy collection build``, installed into an empty collections
path, and used from there only (no ansible.cfg of this repository, no .collections link): ansible-doc on every
module, the filter and the role, the syntax check of every playbook by its FQCN, a check-mode deploy, and
galaxy-importer (the checks Galaxy runs on an upload) on the tarball.
"""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.helpers.collection_run import INSTALLED, check_deploy, check_deploy_problems, install_tarball
from tools.gguf_models import write_demo_model

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
IMPORTER = ROOT / ".cache" / "venvs" / "galaxy-importer" / "bin"

# What users run, and nothing else (galaxy.yml build_ignore).
TOP_LEVEL = {"FILES.json", "MANIFEST.json", "LICENSE", "README.md", "changelogs", "docs", "images", "inventory",
             "meta", "playbooks", "plugins", "roles"}
USER_DOCS = {"docs/deploy.md", "docs/execution-environment.yml", "docs/fleet.md", "docs/memory-model.md"}
IMAGE_FILES = {"images/ai-llm/Dockerfile.cuda", "images/ai-llm/start-llama-server"}
SHIPPED_WHOLE = ("plugins", "roles", "playbooks", "meta", "inventory/examples")


def tracked(*folders):
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *folders],
                         capture_output=True, text=True, cwd=ROOT, check=True).stdout
    return {line for line in out.splitlines() if (ROOT / line).is_file()}


@pytest.fixture(scope="module")
def installed(tarball, tmp_path_factory):
    """(environment, working directory) of an empty collections path holding only the installed tarball."""
    home = tmp_path_factory.mktemp("user")
    env = install_tarball(BIN, tarball, home)[0]
    proc = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "list", "ai_llm.moe_offload"],
                          capture_output=True, text=True, env=env, cwd=home, timeout=120, check=False)
    # the only copy ansible sees is the installed one
    assert re.findall(r"^# (/.*)$", proc.stdout, re.MULTILINE) == [str(home / "collections" / "ansible_collections")]
    return env, home


def run(env, cwd, *cmd):
    return subprocess.run([str(BIN / cmd[0])] + list(cmd[1:]), capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=600, check=False)


def test_the_tarball_holds_what_users_run(tarball):
    with tarfile.open(tarball) as archive:
        files = {m.name for m in archive.getmembers() if m.isfile()}
    assert {name.split("/")[0] for name in files} == TOP_LEVEL
    assert {name for name in files if name.startswith("docs/")} == USER_DOCS
    assert {name for name in files if name.startswith("images/")} == IMAGE_FILES
    assert {name for name in files if name.startswith(SHIPPED_WHOLE)} == tracked(*SHIPPED_WHOLE)
    assert "changelogs/changelog.yaml" in files
    assert not [name for name in files if "__pycache__" in name or name.endswith(".pyc")]


def test_ansible_doc_on_every_module_the_filter_and_the_role(installed):
    env, home = installed
    plugins = home / "collections" / INSTALLED / "plugins"
    modules = sorted(p.stem for p in (plugins / "modules").glob("*.py"))
    assert modules == sorted(Path(p).stem for p in tracked("plugins/modules"))
    proc = run(env, home, "ansible-doc", "-l", "ai_llm.moe_offload")
    assert proc.returncode == 0, proc.stderr
    assert sorted(re.findall(r"^ai_llm\.moe_offload\.(\w+)", proc.stdout, re.MULTILINE)) == modules
    filters = sorted(p.stem for p in (plugins / "filter").glob("*.py"))
    assert "container_model" in filters
    # one ansible-doc per kind: each name's page says the installed file it comes from
    for kind, names in (("module", modules), ("filter", filters), ("role", ["llm_server"])):
        proc = run(env, home, "ansible-doc", "-t", kind, *["ai_llm.moe_offload." + name for name in names])
        assert proc.returncode == 0 and not proc.stderr.strip(), (kind, names, proc.stderr)
        for name in names:
            if kind != "role":
                assert re.search(r"^> %s ai_llm\.moe_offload\.%s \(%s/" % (kind.upper(), name, re.escape(str(plugins))),
                                 proc.stdout, re.MULTILINE), (name, proc.stdout[:500])
            else:
                assert "ai_llm.moe_offload.%s" % name in proc.stdout, proc.stdout[:500]
    proc = run(env, home, "ansible-doc", "-t", "role", "-l", "ai_llm.moe_offload")
    assert re.search(r"^ai_llm\.moe_offload\.llm_server\b", proc.stdout, re.MULTILINE), proc.stdout


def test_every_playbook_by_its_fqcn(installed):
    env, home = installed
    playbooks = sorted(p.stem for p in (home / "collections" / INSTALLED / "playbooks").glob("*.yml"))
    assert {"deploy", "rollback", "inspect"} <= set(playbooks)
    assert playbooks == sorted(Path(p).stem for p in tracked("playbooks") if re.match(r"playbooks/[^/]+\.yml$", p))
    for name in playbooks:
        proc = run(env, home, "ansible-playbook", "ai_llm.moe_offload." + name, "--syntax-check", "-i", "localhost,")
        assert proc.returncode == 0, (name, proc.stdout + proc.stderr)
        # resolved to the installed file
        assert proc.stdout.split() == ["playbook:", str(home / "collections" / INSTALLED / "playbooks" / (name + ".yml"))]


def test_a_check_mode_deploy_from_the_installed_collection(installed, tmp_path):
    env, home = installed
    (tmp_path / "models").mkdir()
    model = write_demo_model(tmp_path / "models" / "demo.gguf")
    proc, project = check_deploy(BIN / "ansible-playbook", tmp_path, model, env, home)
    assert check_deploy_problems(proc, project) == [], proc.stdout[-6000:] + proc.stderr[-2000:]


# Galaxy refuses a collection without a repository URL ("Invalid collection metadata. 'repository' is required").
# This one has no public address yet and galaxy.yml names none; the importer check gets the built tarball with
# this stand-in written into MANIFEST.json, every file unchanged.
STAND_IN_REPOSITORY = "https://example.invalid/ai_llm/moe_offload"


def with_repository(tarball, folder):
    """A copy of ``tarball`` whose MANIFEST.json names STAND_IN_REPOSITORY as the repository."""
    folder.mkdir()
    copy = folder / tarball.name
    with tarfile.open(tarball) as source, tarfile.open(copy, "w:gz") as target:
        for member in source.getmembers():
            data = source.extractfile(member) if member.isfile() else None
            if member.name == "MANIFEST.json":
                manifest = json.load(data)
                assert manifest["collection_info"]["repository"] is None
                manifest["collection_info"]["repository"] = STAND_IN_REPOSITORY
                payload = json.dumps(manifest, indent=4).encode()
                member.size = len(payload)
                data = io.BytesIO(payload)
            target.addfile(member, data)
    return copy


def test_galaxy_importer_finds_nothing_to_warn_about(tarball, tmp_path):
    """galaxy-importer runs ansible-doc and ansible-lint (offline) on the unpacked tarball; every line it logs
    below INFO (WARNING, ERROR) is a finding Galaxy would show."""
    assert (IMPORTER / "python").exists(), "scripts/setup.sh --tests makes .cache/venvs/galaxy-importer"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update({"PATH": str(IMPORTER) + os.pathsep + env["PATH"], "TMPDIR": str(tmp_path), "HOME": str(tmp_path)})
    proc = subprocess.run([str(IMPORTER / "python"), "-m", "galaxy_importer.main",
                           str(with_repository(tarball, tmp_path / "upload"))],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900, check=False)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert "Importer processing completed successfully" in log
    assert "Loading role llm_server" in log and "Loading module gguf_info" in log
    findings = [line for line in log.splitlines() if re.match(r"(WARNING|ERROR|CRITICAL)\b", line)]
    assert findings == [], log
