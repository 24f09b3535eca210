"""A host deployed by the collection before its templates (the compose file and .env rendered in Python, the
commit below) is unchanged by the next run of this checkout: the same files byte for byte, the same configuration
hash, the same container, and the run changes nothing. The templates place exactly what the Python renderer
wrote, and the prepare step keeps the hash on disk when the files are already those it writes."""
from __future__ import annotations

import shutil
import subprocess
import io
import tarfile

import pytest

from tests.helpers.llm_deploy import ROOT, local_deploy, playbook_env

# The last commit whose role wrote .env and the compose file from Python (llm_server_config, state present).
BEFORE_TEMPLATES = "4407f1f1331b9d8948c4d04b09f1109888604906"

pytestmark = pytest.mark.skipif(not shutil.which("podman") or not shutil.which("podman-compose"),
                                reason="needs podman and podman-compose")


def checkout(commit, dest):
    """The tree of ``commit`` in ``dest`` (git archive): a collection as that commit shipped it."""
    proc = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", commit + "^{commit}"], capture_output=True,
                          check=False)
    if proc.returncode != 0:
        pytest.skip("the clone lacks commit %s (a shallow clone): nothing to upgrade from" % commit)
    data = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit], capture_output=True, check=True,
                          timeout=120).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="fully_trusted")
    return dest


def test_a_host_deployed_before_the_templates_is_unchanged(tmp_path):
    old = checkout(BEFORE_TEMPLATES, tmp_path / "before")
    with local_deploy(tmp_path / "host", "ai-llm-upgrade") as local:
        cmd, _env = local.command("deploy")
        cmd[1] = str(old / "playbooks" / "deploy.yml")
        env = playbook_env(ANSIBLE_CONFIG=str(old / "ansible.cfg"), ANSIBLE_COLLECTIONS_PATH=str(old / ".collections"))
        first = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(old), timeout=600, check=False)
        assert first.returncode == 0, first.stdout[-5000:] + first.stderr[-2000:]
        files = {name: (local.project / name).read_bytes() for name in (".env", "docker-compose.prod.yml")}
        label, container = local.label(), local.container()["id"]
        assert label and label.encode() in files[".env"]

        run = local.succeed("deploy")

        assert "changed=0" in run.stdout, run.stdout[-5000:]
        assert '"status": "unchanged"' in run.stdout, run.stdout[-5000:]
        assert {name: (local.project / name).read_bytes() for name in files} == files
        assert local.label() == label
        assert local.container()["id"] == container
