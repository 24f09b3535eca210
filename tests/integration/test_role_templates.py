"""Your own compose template (``llm_server_compose_template``) on a real local deploy (podman, podman-compose, the
CPU image, the real llama-server): the role writes with it; a line it renders from the controller
(``ansible_managed``) rewrites the file without restarting ai-llm; a template whose file the compose tool refuses
replaces nothing, restarts nothing and rolls nothing back: the configuration that served keeps serving.

Run under the podman lock: ``flock /tmp/ai-llm-podman.lock python -m pytest tests/integration/test_role_templates.py``.
"""
from __future__ import annotations

import shutil

import pytest

from tests.helpers.llm_deploy import ROOT, local_deploy, recap, result

pytestmark = pytest.mark.skipif(not shutil.which("podman") or not shutil.which("podman-compose"),
                                reason="needs podman and podman-compose")

ROLE_TEMPLATE = ROOT / "roles" / "llm_server" / "templates" / "docker-compose.prod.yml.j2"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("templates")
    mine = root / "my-compose.yml.j2"
    mine.write_text("# {{ ansible_managed }}\n" + ROLE_TEMPLATE.read_text())
    with local_deploy(root, "ai-llm-templates") as deploy:
        deploy.base_vars["llm_server_compose_template"] = str(mine)
        deploy.succeed("deploy")
        yield deploy


def state(deploy):
    return {"files": {name: (deploy.project / name).read_bytes() for name in (".env", "docker-compose.prod.yml")},
            "container": deploy.container()["id"], "label": deploy.label()}


def test_the_role_writes_with_your_template(served):
    compose = (served.project / "docker-compose.prod.yml").read_text()
    assert compose.startswith("# Ansible managed\n")
    assert "\n# Written by the ai_llm.moe_offload.llm_server role" in compose and "\nservices:\n" in compose
    assert served.health() == 200


def test_a_line_rendered_from_the_controller_rewrites_the_file_and_restarts_nothing(served):
    before = state(served)
    run = served.succeed("deploy", "-e", "ansible_managed='managed from another controller'")
    after = state(served)
    assert after["files"]["docker-compose.prod.yml"].startswith(b"# managed from another controller\n")
    assert after["files"][".env"] == before["files"][".env"]
    assert (after["container"], after["label"]) == (before["container"], before["label"])
    assert recap(run.stdout)["changed"] >= 1 and result(run.stdout)["status"] == "changed"


def test_a_template_the_compose_tool_refuses_replaces_nothing_and_restarts_nothing(served, tmp_path):
    broken = tmp_path / "broken.yml.j2"
    broken.write_text(ROLE_TEMPLATE.read_text().replace("    init: true\n", "    init: [true\n"))
    before = state(served)
    run = served.playbook("deploy", llm_server_compose_template=str(broken))
    shown = result(run.stdout)
    assert run.returncode != 0 and shown["status"] == "failed", run.stdout[-4000:]
    assert "the compose tool refused the new .env with the new compose file" in shown["message"], shown["message"]
    assert not shown["rollback"].get("performed"), shown["rollback"]
    assert state(served) == before
    assert served.health() == 200
