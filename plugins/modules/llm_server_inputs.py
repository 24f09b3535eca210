#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llm_server_inputs
short_description: Check the llm_server role's variables on the controller, one message per variable
version_added: 0.1.0
description:
  - Reads every C(llm_server_*) variable of the host and checks each on the controller, before anything is read or
    written on the host. Types, choices and defaults come from the role's argument spec and defaults; this adds the
    formats, the ranges and the rules between variables.
  - Numbers must be integers in range (a port from 1 to 65535, a context from 1 on, at most 256 slots...), names and
    image references must be what compose and the container engine accept, paths absolute and compared as paths
    (the model inside the mounted model directory), strings free of control characters, and every value that goes
    into C(.env) one that podman-compose and docker compose both read back byte for byte.
  - The API key is checked (printable ASCII without a leading or trailing space, what llama-server's key file and
    an HTTP header carry unchanged) and never returned or shown. An address other hosts reach needs a key or
    C(llm_server_allow_unauthenticated).
  - Fails with every problem at once, each naming its variable, and returns the checked settings otherwise.
  - This is an action plugin that runs on the controller only; the role M(ai_llm.moe_offload.llm_server) uses it.
author:
  - ai_llm maintainers (@ai-llm)
options:
  entry:
    description: The role's entry point; V(rollback) does not need the model.
    type: str
    choices: [main, rollback]
    default: main
extends_documentation_fragment:
  - ai_llm.moe_offload.info_module
  - ai_llm.moe_offload.controller_module
seealso:
  - module: ai_llm.moe_offload.llm_server_prepare
"""

EXAMPLES = r"""
- name: Check the role's variables
  ai_llm.moe_offload.llm_server_inputs:
  register: settings
"""

RETURN = r"""
port:
  description: The checked settings, one key per variable without the C(llm_server_) prefix (C(port), C(ctx_size)...).
  returned: success
  type: int
  sample: 8080
paths:
  description: The files of the deployment.
  returned: success
  type: dict
  sample: {env: /srv/ai-llm/.env, compose: /srv/ai-llm/docker-compose.prod.yml, api_key: /srv/ai-llm/secrets/api-key}
api_key_set:
  description: Whether an API key is set (the key itself is never returned).
  returned: success
  type: bool
  sample: true
problems:
  description: Every problem found, each as the variable, a colon and the message.
  returned: failure
  type: list
  elements: str
  sample: ["llm_server_port: 99999 is out of range: an integer from 1 to 65535"]
"""
