#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llm_server_config
short_description: Internal to the ai_llm.moe_offload.llm_server role - write .env and the compose file, checked and hashed
version_added: 0.1.0
description:
  - Only the role M(ai_llm.moe_offload.llm_server) calls it; it is not meant to be called alone.
  - Renders the role's keys of C(.env) (a marked block; the other lines stay) and the compose file from the checked
    settings of the role M(ai_llm.moe_offload.llm_server) and the placement its plan chose.
  - Every value is encoded by the collection's one encoder, C(.env) values single-quoted so that podman-compose
    (python-dotenv) and docker compose (compose-go) read them back byte for byte, compose values as JSON strings
    with C($) written C($$). A value that cannot be written so is refused, and nothing is written.
  - Computes the configuration hash (the C(.env) keys, the compose file and the API key file) and writes it into
    C(.env) as C(LLM_CONFIG_HASH); the compose file gives it to the container as the label
    C(ai_llm.moe_offload.config_hash), so that a later run sees whether the container runs what is on disk.
  - Before anything is replaced, both new files are checked together with the compose tool's C(config) command
    (not in check mode, like the O(ansible.builtin.template#module:validate) of a template). Each file is written to
    a temporary file next to it and renamed.
  - Lines outside the block that set one of the role's keys are removed (they would win over the block).
  - With O(state=pattern_cleared) it clears C(LLM_MOE_OFFLOAD_PATTERN) and C(LLM_DEVICE_OVERRIDES) of the
    current C(.env) and updates the hash (the on-demand rollback V(none)).
  - With O(state=recorded) it writes O(content) into C(verification.json) next to the compose file (the role's
    C(llm_server_result) of a run that recreated, verified or rolled back ai-llm), mode C(0640), through a temporary
    file renamed over it.
  - With O(service), its action plugin then decides on the controller whether ai-llm must be recreated, verified or
    waited for, and why (RV(converge)).
author:
  - ai_llm maintainers (@ai-llm)
options:
  settings:
    description: The role's settings, checked (RV(ai_llm.moe_offload.llm_server_prepare#module:settings)).
    type: dict
    required: true
  placement:
    description:
      - Where the weights go, C(pattern), C(device_overrides), C(gpu_devices), C(tensor_split), C(topology).
      - Required with O(state=present).
    type: dict
  compose_command:
    description:
      - The compose tool as an argv list, used to check the files before they are written.
      - Required with O(state=present) and O(state=pattern_cleared).
    type: list
    elements: str
  engine:
    description:
      - The container engine the compose tool drives (CDI devices and k8s-file logs for podman).
      - Required with O(state=present) and O(state=pattern_cleared).
    type: str
    choices: [podman, docker]
  state:
    description:
      - V(present) writes the configuration, V(pattern_cleared) clears the offload pattern, V(recorded) writes
        C(verification.json).
    type: str
    choices: [present, pattern_cleared, recorded]
    default: present
  content:
    description: The text of C(verification.json). Required with O(state=recorded).
    type: str
  service:
    description:
      - What M(ai_llm.moe_offload.llm_server_service_info) found before the writes; with it the action plugin returns
        RV(converge). It stays on the controller.
    type: dict
  key_changed:
    description: Whether the API key file changed in this run (for RV(converge)).
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Reports and shows what it would write and writes nothing.
  diff_mode:
    support: full
    description: Shows C(.env) and the compose file (or C(verification.json)) before and after. The API key is not in them.
  idempotent:
    support: full
    description: The same settings give the same files, and nothing is written.
seealso:
  - module: ai_llm.moe_offload.llm_server_service_info
"""

EXAMPLES = r"""
- name: Write .env and the compose file
  ai_llm.moe_offload.llm_server_config:
    settings: "{{ prepared.settings }}"
    placement: "{{ prepared.placement }}"
    compose_command: [podman-compose]
    engine: podman
  register: config
"""

RETURN = r"""
config_hash:
  description: The hash of the configuration now on disk (C(LLM_CONFIG_HASH)).
  returned: success, with O(state=present) or O(state=pattern_cleared)
  type: str
  sample: 9b1e4c...
changed_keys:
  description: The role's C(.env) keys whose value changes, with the old and new value.
  returned: success, with O(state=present) or O(state=pattern_cleared)
  type: list
  elements: dict
  sample: [{key: LLM_CTX_SIZE, old: "512", new: "1024"}]
files_changed:
  description: The files written (or, in check mode, that would be).
  returned: success
  type: list
  elements: str
  sample: [/srv/ai-llm/.env]
dropped_keys:
  description: Lines outside the role's block that set one of its keys, removed.
  returned: success, with O(state=present) or O(state=pattern_cleared)
  type: list
  elements: str
  sample: [LLM_CTX_SIZE]
converge:
  description:
    - With O(service), C(recreate), C(verify), C(wait) (booleans) and C(reason) (one line, empty when nothing is done).
    - Recreates when the files or the API key changed, when the container is missing, stopped, paused or
      crash-looping, when it was created from another configuration, when the key is not in force, or when a verified
      configuration stopped answering. Verifies without a recreate a configuration that runs but was never verified.
  returned: success, with O(service)
  type: dict
  sample: {recreate: true, verify: true, wait: true, reason: "the configuration changed (LLM_CTX_SIZE ...)"}
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_container import compose_config_check
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_disk import model_outside_dir

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import read_bytes
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_files import (
    atomic_write,
    ensure_dir,
    remove_leftovers,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_render import (
    HASH_KEY,
    ENV_KEYS,
    RenderError,
    config_hash,
    env_block,
    env_values,
    merge_env,
    parse_env,
    render_compose,
)


def record(module, path, content):
    """Write ``content`` into ``path`` (verification.json) when it differs; exits the module."""
    old = (read_bytes(path) or b"").decode("utf-8", "replace")
    changed = old != content
    if changed and not module.check_mode:
        try:
            atomic_write(path, content.encode("utf-8"), 0o640)
        except OSError as exc:
            module.fail_json(msg="llm_server: writing %s failed: %s" % (path, exc), changed=False)
    module.exit_json(changed=changed, files_changed=[path] if changed else [],
                     diff=[{"before_header": path, "after_header": path, "before": old, "after": content}] if changed else [])


def main():
    module = AnsibleModule(
        argument_spec=dict(
            settings=dict(type="dict", required=True),
            placement=dict(type="dict"),
            compose_command=dict(type="list", elements="str"),
            engine=dict(type="str", choices=["podman", "docker"]),
            state=dict(type="str", choices=["present", "pattern_cleared", "recorded"], default="present"),
            content=dict(type="str"),
            # For the action plugin's decision; it keeps them on the controller.
            service=dict(type="dict"),
            key_changed=dict(type="bool", default=False),
        ),
        required_if=[("state", "present", ("placement", "compose_command", "engine")),
                     ("state", "pattern_cleared", ("compose_command", "engine")),
                     ("state", "recorded", ("content",))],
        supports_check_mode=True,
    )
    p = module.params
    settings = p["settings"]
    paths = settings["paths"]
    if p["state"] == "recorded":
        record(module, paths["verification"], p["content"])
    old_env = (read_bytes(paths["env"]) or b"").decode("utf-8", "replace")
    old_compose = (read_bytes(paths["compose"]) or b"").decode("utf-8", "replace")
    api_key = read_bytes(paths["api_key"]) or b""
    old_values = parse_env(old_env)
    try:
        if p["state"] == "present":
            problem = model_outside_dir(settings["model_dir"], settings["model_path"])
            if problem:
                module.fail_json(msg=problem)
            values = env_values(settings, p["placement"])
            compose_text = render_compose(settings, p["placement"], p["engine"])
        else:
            if HASH_KEY not in old_values:
                module.fail_json(msg="llm_server: %s holds no block of the role: nothing to clear" % paths["env"])
            values = {key: old_values.get(key, "") for key, _c in ENV_KEYS}
            values.update(LLM_MOE_OFFLOAD_PATTERN="", LLM_DEVICE_OVERRIDES="")
            compose_text = old_compose
    except RenderError as exc:
        module.fail_json(msg="llm_server: %s" % exc)
    digest = config_hash(values, compose_text, api_key)
    new_env, dropped = merge_env(old_env, env_block(values, digest))
    changes = [{"key": key, "old": old_values.get(key), "new": values[key]}
               for key, _c in ENV_KEYS if old_values.get(key) != values[key]]
    files = []
    diff = []
    for path, old, new in ((paths["env"], old_env, new_env), (paths["compose"], old_compose, compose_text)):
        if old != new:
            files.append(path)
            diff.append({"before_header": path, "after_header": path, "before": old, "after": new})
    if files and not module.check_mode:
        error = compose_config_check(lambda argv: module.run_command(argv, errors="replace"), p["compose_command"],
                                     os.path.basename(paths["compose"]), new_env, compose_text)
        if error:
            module.fail_json(msg="llm_server: the new configuration was not written: %s" % error, changed=False)
    if not module.check_mode:
        ensure_dir(settings["project_dir"], 0o750)
        created = ensure_dir(paths["secrets"], 0o700)
        remove_leftovers(settings["project_dir"])
        if created and not files:
            files.append(paths["secrets"])
        try:
            if new_env != old_env:
                atomic_write(paths["env"], new_env.encode("utf-8"), 0o600)
            if compose_text != old_compose:
                atomic_write(paths["compose"], compose_text.encode("utf-8"), 0o640)
        except OSError as exc:
            module.fail_json(msg="llm_server: writing the configuration failed: %s" % exc, changed=True)
    module.exit_json(changed=bool(files), config_hash=digest, changed_keys=changes, files_changed=files,
                     dropped_keys=dropped, diff=diff)


if __name__ == "__main__":
    main()
