#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llm_server_config
short_description: Internal to the ai_llm.moe_offload.llm_server role - clear the offload pattern in .env
version_added: 0.1.0
description:
  - Only the role M(ai_llm.moe_offload.llm_server) calls it (the on-demand rollback V(none)); it is not meant to be
    called alone. The deploy writes C(.env) and the compose file from the role's templates.
  - Clears C(LLM_MOE_OFFLOAD_PATTERN) and C(LLM_DEVICE_OVERRIDES) in the role's block of the current C(.env), keeps
    every other line, and writes a new configuration hash (C(LLM_CONFIG_HASH)), so that the next deploy sees that
    ai-llm runs something else than the inventory asks.
  - Before C(.env) is replaced, the compose tool's C(config) command reads it with the compose file (not in check
    mode). It is written to a temporary file next to it and renamed.
author:
  - ai_llm maintainers (@ai-llm)
options:
  settings:
    description: The role's settings, checked (RV(ai_llm.moe_offload.llm_server_prepare#module:settings)).
    type: dict
    required: true
  compose_command:
    description: The compose tool as an argv list, used to check C(.env) before it is written.
    type: list
    elements: str
    required: true
  state:
    description: V(pattern_cleared), the only state.
    type: str
    choices: [pattern_cleared]
    default: pattern_cleared
attributes:
  check_mode:
    support: full
    description: Reports and shows what it would write and writes nothing.
  diff_mode:
    support: full
    description: Shows C(.env) before and after.
  idempotent:
    support: full
    description: A cleared pattern stays cleared, and nothing is written.
"""

EXAMPLES = r"""
- name: Clear the offload pattern in .env
  ai_llm.moe_offload.llm_server_config:
    settings: "{{ prepared.settings }}"
    compose_command: [podman-compose]
"""

RETURN = r"""
config_hash:
  description: The hash of the configuration now on disk (C(LLM_CONFIG_HASH)).
  returned: success
  type: str
  sample: 9b1e4c...
changed_keys:
  description: The role's C(.env) keys whose value changes, with the old and new value.
  returned: success
  type: list
  elements: dict
  sample: [{key: LLM_MOE_OFFLOAD_PATTERN, old: "\\.ffn_.*_exps\\.weight", new: ""}]
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import read_bytes, sha256_hex
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_container import compose_config_check
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_files import atomic_write
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_render import (
    ENV_KEYS,
    HASH_KEY,
    config_hash,
    env_block,
    merge_env,
    parse_env,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            settings=dict(type="dict", required=True),
            compose_command=dict(type="list", elements="str", required=True),
            state=dict(type="str", choices=["pattern_cleared"], default="pattern_cleared"),
        ),
        supports_check_mode=True,
    )
    paths = module.params["settings"]["paths"]
    old_env = (read_bytes(paths["env"]) or b"").decode("utf-8", "replace")
    compose_text = (read_bytes(paths["compose"]) or b"").decode("utf-8", "replace")
    old_values = parse_env(old_env)
    if HASH_KEY not in old_values:
        module.fail_json(msg="llm_server: %s holds no block of the role: nothing to clear" % paths["env"])
    values = {key: old_values.get(key, "") for key, _c in ENV_KEYS}
    values.update(LLM_MOE_OFFLOAD_PATTERN="", LLM_DEVICE_OVERRIDES="")
    changes = [{"key": key, "old": old_values.get(key), "new": values[key]}
               for key, _c in ENV_KEYS if old_values.get(key) != values[key]]
    # the compose file stays: the hash names it by its bytes
    digest = config_hash(values, {"compose_sha256": sha256_hex(compose_text.encode("utf-8"))}, (),
                         read_bytes(paths["api_key"]) or b"") if changes else old_values[HASH_KEY]
    new_env = merge_env(old_env, env_block(values, digest))[0]
    changed = new_env != old_env
    if changed and not module.check_mode:
        error = compose_config_check(lambda argv: module.run_command(argv, errors="replace"),
                                     module.params["compose_command"], os.path.basename(paths["compose"]), new_env,
                                     compose_text)
        if error:
            module.fail_json(msg="llm_server: .env was not written: %s" % error, changed=False)
        try:
            atomic_write(paths["env"], new_env.encode("utf-8"), 0o600)
        except OSError as exc:
            module.fail_json(msg="llm_server: writing %s failed: %s" % (paths["env"], exc), changed=False)
    module.exit_json(changed=changed, config_hash=digest, changed_keys=changes,
                     diff=[{"before_header": paths["env"], "after_header": paths["env"], "before": old_env,
                            "after": new_env}] if changed else [])


if __name__ == "__main__":
    main()
