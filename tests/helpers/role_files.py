"""The role's files written as the role writes them, without a deploy: the role's ``tasks/files.yml`` (the API key
file, ``.env`` and the compose file from its templates, the compose tool's check first) run by ``ansible-playbook``
on localhost, with the values the prepare step computes (the same functions: ``env_values``, ``compose_values``,
``config_hash``). For tests that look at what the real tools read of those files."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_disk import api_key_bytes
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_render import (
    compose_values,
    config_hash,
    env_values,
)
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_templates import (
    COMPOSE_TEMPLATE,
    ENV_TEMPLATE,
    files,
)
from tests.helpers.llm_deploy import ROOT, playbook_env

TEMPLATES = ROOT / "roles" / "llm_server" / "templates"


def prepared(settings, placement, engine="podman", compose_command=("podman-compose",), api_key=""):
    """What the prepare step registers for ``tasks/files.yml`` (``_llm_server_prepared``), nothing restarted."""
    values = env_values(settings, placement)
    compose = compose_values(settings, placement, engine)
    templates = {"compose": str(TEMPLATES / COMPOSE_TEMPLATE), "env": str(TEMPLATES / ENV_TEMPLATE)}
    sources = [Path(templates["compose"]).read_bytes(), Path(templates["env"]).read_bytes()]
    paths = settings["paths"]
    # what the prepare step's host read says of the directories the tasks make and the key file they remove
    disk = {"secrets_dir": Path(paths["secrets"]).is_dir(), "api_key_file": Path(paths["api_key"]).exists()}
    return {"settings": settings, "service": {"disk": disk}, "env": values, "compose": compose, "templates": templates,
            "config": {"config_hash": config_hash(values, compose, sources, api_key_bytes(api_key)),
                       "files": ["env", "compose"]},
            "files": files(settings, list(compose_command), True),
            "converge": {"recreate": False}, "steps": {"verify": False, "parity_before": False}}


def write_files(settings, placement, engine="podman", compose_command=("podman-compose",), api_key="", check=False):
    """Run the role's ``tasks/files.yml`` on localhost; returns ``(CompletedProcess, prepared)``."""
    given = prepared(settings, placement, engine, compose_command, api_key)
    with tempfile.TemporaryDirectory() as tmp:
        variables = Path(tmp) / "vars.json"
        variables.write_text(json.dumps({"_llm_server_prepared": given, "llm_server_api_key": api_key,
                                         "ansible_python_interpreter": sys.executable}))
        play = Path(tmp) / "files.yml"
        play.write_text(json.dumps([{"name": "Write the role's files", "hosts": "localhost", "gather_facts": False,
                                     "connection": "local", "tasks": [{"ansible.builtin.include_role": {
                                         "name": "ai_llm.moe_offload.llm_server", "tasks_from": "files",
                                         "rolespec_validate": False}}]}]))
        cmd = [str(Path(sys.executable).parent / "ansible-playbook"), str(play), "-i", "localhost,", "-e",
               "@" + str(variables), "--diff"] + (["--check"] if check else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, env=playbook_env(), cwd=str(ROOT), timeout=300,
                              check=False)
    return proc, given
