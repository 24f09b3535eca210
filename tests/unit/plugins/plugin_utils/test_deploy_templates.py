"""_deploy_templates.files: the compose file's candidate, and the compose tool's check of the new .env
with the compose file the run leaves (the candidate when the compose file changes, else the one in place)."""
from __future__ import annotations

import shlex

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_templates import files

SETTINGS = {"project_dir": "/srv/ai llm", "compose_file": "docker-compose.prod.yml",
            "paths": {"compose": "/srv/ai llm/docker-compose.prod.yml"}}


def test_a_compose_file_that_changes_is_checked_as_its_candidate_with_the_new_env():
    got = files(SETTINGS, ["podman-compose"], True)
    assert got["candidate"] == "/srv/ai llm/.docker-compose.prod.yml.candidate"
    assert shlex.split(got["validate_env"]) == ["podman-compose", "--env-file", "%s", "-f", got["candidate"], "config"]


def test_a_compose_file_that_stays_is_checked_in_place_and_has_no_candidate():
    got = files(SETTINGS, ["docker", "compose"], False)
    assert got["candidate"] is None
    assert shlex.split(got["validate_env"]) == ["docker", "compose", "--env-file", "%s", "-f",
                                                "/srv/ai llm/docker-compose.prod.yml", "config"]


@pytest.mark.parametrize("changes", [True, False])
def test_the_validate_command_keeps_one_placeholder_for_the_template_module(changes):
    """The template module replaces %s with its temporary file: the command holds it once, unquoted."""
    got = files(SETTINGS, ["podman-compose"], changes)
    assert got["validate_env"].count("%s") == 1 and " %s " in got["validate_env"]
