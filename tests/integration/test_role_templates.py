"""Your own compose template (``llm_server_compose_template``) on a real local deploy (podman, podman-compose, the
CPU image, the real llama-server): the role writes with it; a line it renders from the controller
(``ansible_managed``) rewrites the file without restarting ai-llm; a template whose file the compose tool refuses
replaces nothing, restarts nothing and rolls nothing back: the configuration that served keeps serving.

Run under the podman lock: ``flock /tmp/ai-llm-podman.lock python -m pytest tests/integration/test_role_templates.py``.
"""
from __future__ import annotations

import shutil

import dotenv
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


def test_a_change_of_env_alone_checks_it_with_the_compose_file_in_place_and_leaves_that_file(served):
    """Only .env changes (the context size): no candidate, the compose file not written again (same bytes and
    modification time), the compose tool's check of the new .env run against the file in place."""
    served.succeed("deploy")  # the files of this checkout's settings (the tests before rendered other lines)
    compose = served.project / "docker-compose.prod.yml"
    before, mtime = compose.read_bytes(), compose.stat().st_mtime_ns
    run = served.succeed("deploy", verbosity=3, llm_server_ctx_size=1024)
    tasks = {block.split("]", 1)[0]: block for block in run.stdout.split("\nTASK [")[1:]}
    role = "ai_llm.moe_offload.llm_server : "
    for name in ("Render the compose file as a candidate for the compose tool's check", "Write the compose file",
                 "Remove the candidate compose file"):
        assert "skipping: [localhost]" in tasks[role + name], tasks[role + name]
    written = tasks[role + "Write .env (the role's block; the compose tool reads it with the new compose file before "
                           "it replaces the old)"]
    assert "changed: [localhost]" in written and "-f %s config" % compose in written, written[-3000:]
    assert (compose.read_bytes(), compose.stat().st_mtime_ns) == (before, mtime)
    assert not list(served.project.glob(".*.candidate"))
    assert dotenv.dotenv_values(served.project / ".env")["LLM_CTX_SIZE"] == "1024"
    assert result(run.stdout)["status"] == "changed" and served.health() == 200
