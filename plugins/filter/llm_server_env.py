# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

import base64

DOCUMENTATION = r"""
---
name: llm_server_env
short_description: Internal to the ai_llm.moe_offload.llm_server role - what its .env template places
version_added: 0.1.0
author:
  - ai_llm maintainers (@ai-llm)
description:
  - Takes the registered result of the role's prepare step and the C(.env) file as M(ansible.builtin.slurp) read it
    and returns the values the role's C(.env) template places (C(llm_server_env)) - the lines before and after the
    role's block as they are, without the lines outside the block that set one of the role's keys (a later line
    would win over the block), and the block's lines, each value single-quoted so that python-dotenv and compose-go
    read it back byte for byte.
positional: _input, slurped
options:
  _input:
    description: The registered result of the role's prepare step (C(ai_llm.moe_offload.llm_server_prepare)).
    type: dict
    required: true
  slurped:
    description: The registered result of M(ansible.builtin.slurp) on C(.env); a failed read is an empty file.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Write .env
  ansible.builtin.template:
    src: env.j2
    dest: /srv/ai-llm/.env
    mode: "0600"
  vars:
    llm_server_env: "{{ _llm_server_prepared | ai_llm.moe_offload.llm_server_env(env_now) }}"
"""

RETURN = r"""
_value:
  description: C(before) and C(after) (lists of lines), C(begin) and C(end) (the block's markers), C(block) (a list of
    [key, quoted value]) and C(dropped) (the keys of the lines removed).
  type: dict
"""

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_render import env_template_values  # noqa: E402


def llm_server_env(prepared, slurped):
    """``env_template_values`` for the prepare step's values and hash and ``.env`` as it is."""
    content = (slurped or {}).get("content")
    text = base64.b64decode(content).decode("utf-8", "replace") if content and not slurped.get("failed") else ""
    return env_template_values(prepared["env"], prepared["config"]["config_hash"], text)


class FilterModule:
    """The .env template's values."""

    def filters(self):
        return {"llm_server_env": llm_server_env}
