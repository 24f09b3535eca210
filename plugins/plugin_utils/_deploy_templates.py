# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The llm_server role's templates on the controller: which files they are (the role's own, or the user's
``llm_server_compose_template``), their sources (part of the configuration hash), and the compose file rendered as
``ansible.builtin.template`` renders it with its default options, so that the prepare step can tell whether the
host already has exactly that file without a second call on the host."""

from __future__ import annotations

import os
import shlex

from ansible.template import generate_ansible_template_vars, trust_as_template

# The role's templates (roles/llm_server/templates/).
COMPOSE_TEMPLATE = "docker-compose.prod.yml.j2"
ENV_TEMPLATE = "env.j2"
# ansible.builtin.template's defaults (its options trim_blocks, lstrip_blocks and newline_sequence).
TEMPLATE_OVERRIDES = {"trim_blocks": True, "lstrip_blocks": False, "newline_sequence": "\n"}


def render(templar, src, source, dest, variables):
    """The text ``ansible.builtin.template`` writes for ``src`` (found at ``source`` on the controller) into ``dest``,
    with ``variables`` (the task's) and the template variables it adds (``ansible_managed`` unless set)."""
    with open(source, encoding="utf-8") as f:
        data = trust_as_template(f.read())
    temp_vars = dict(variables)
    found = generate_ansible_template_vars(path=src, fullpath=source, dest_path=dest)
    if "ansible_managed" in variables:
        found.pop("ansible_managed", None)
    temp_vars.update(found)
    searchpath = []
    for path in list(variables.get("ansible_search_path") or []) + [os.path.dirname(source)]:
        searchpath += [os.path.join(path, "templates"), path]
    text = templar.copy_with_new_env(searchpath=searchpath, available_variables=temp_vars).template(
        data, escape_backslashes=False, overrides=TEMPLATE_OVERRIDES)
    return text or ""


def files(settings, compose_command, compose_changes):
    """Where the compose file's ``candidate`` goes when the compose file changes (``compose_changes``: next to it, so
    that compose reads it from the same directory; ``None`` when the compose file stays), and the ``validate`` command
    of the ``.env`` template: the compose tool's own reading of the new ``.env`` (the template module's temporary
    file, ``%s``) with the compose file this run leaves, the candidate or the one in place, before ``.env`` replaces
    the old one."""
    candidate = os.path.join(settings["project_dir"], ".%s.candidate" % settings["compose_file"])
    compose = candidate if compose_changes else settings["paths"]["compose"]
    argv = list(compose_command or []) + ["--env-file", "%s", "-f", compose, "config"]
    return {"candidate": candidate if compose_changes else None,
            "validate_env": " ".join(shlex.quote(a) for a in argv)}
