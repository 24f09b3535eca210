#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llm_server_api_key
short_description: Keep llama-server's API key in a file that the ai-llm container reads
version_added: 0.1.0
description:
  - Writes the key to O(path) (one line, mode 0600, in a directory of mode 0700), the file llama-server reads with
    C(--api-key-file) in the container. The key never appears in the environment of the container (so not in
    C(podman inspect)), in C(.env) or on a command line.
  - An empty O(api_key) removes the file, and llama-server runs without a key.
  - A key that llama-server would not read back byte for byte (non-printable or non-ASCII characters, a leading or
    trailing space) is refused, without showing it.
  - Written to a temporary file next to it and renamed.
author:
  - ai_llm maintainers (@ai-llm)
options:
  path:
    description: The key file (the role uses C(<project dir>/secrets/api-key), mounted read-only).
    type: path
    required: true
  api_key:
    description: The key; empty to remove it.
    type: str
    default: ''
attributes:
  check_mode:
    support: full
    description: Reports whether the key would change and writes nothing.
  diff_mode:
    support: none
    description: The key is never shown; run the task with C(diff=false) and C(no_log=true).
  idempotent:
    support: full
    description: The same key writes nothing.
"""

EXAMPLES = r"""
- name: Keep the API key for llama-server
  ai_llm.moe_offload.llm_server_api_key:
    path: /srv/ai-llm/secrets/api-key
    api_key: "{{ vault_llm_api_key }}"
  no_log: true
  diff: false
"""

RETURN = r"""
present:
  description: Whether a key file exists now (in check mode, would exist).
  returned: success
  type: bool
  sample: true
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import read_bytes
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_files import atomic_write, ensure_dir
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_values import api_key_problem


def main():
    module = AnsibleModule(
        argument_spec=dict(path=dict(type="path", required=True), api_key=dict(type="str", default="", no_log=True)),
        supports_check_mode=True,
    )
    path, key = module.params["path"], module.params["api_key"] or ""
    if key:
        problem = api_key_problem(key)
        if problem:
            module.fail_json(msg="llm_server_api_key: the key cannot be deployed: %s (the key itself is not shown)"
                                 % problem)
    wanted = (key + "\n").encode("ascii") if key else None
    current = read_bytes(path)
    changed = current != wanted
    if changed and not module.check_mode:
        if wanted is None:
            os.unlink(path)
        else:
            ensure_dir(os.path.dirname(path), 0o700)
            atomic_write(path, wanted, 0o600)
    module.exit_json(changed=changed, present=wanted is not None)


if __name__ == "__main__":
    main()
