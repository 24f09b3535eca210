#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llm_server_snapshot
short_description: Internal to the ai_llm.moe_offload.llm_server role - keep the verified configuration as a snapshot, or put one back
version_added: 0.1.0
description:
  - Only the role M(ai_llm.moe_offload.llm_server) calls it; it is not meant to be called alone.
  - With O(state=saved), keeps C(.env) and the compose file of O(project_dir) as the C(last) snapshot in
    O(rollback_dir); the C(last) one before becomes C(previous). A snapshot is complete or absent, it is written
    in a temporary directory with a manifest (the sha256 of each file and the configuration hash) and renamed.
    A full disk or a killed run leaves the snapshots as they were and no temporary files (the next run removes
    what a killed run left).
  - With O(state=rolled_back), checks a snapshot (every file matches the sha256 in its manifest, and the compose
    tool's C(config) accepts it) before it replaces C(.env) and the compose file; a damaged snapshot is refused
    and nothing is written.
  - The API key is never part of a snapshot (it lives in C(secrets/api-key)), so a restored configuration runs with
    the current key.
author:
  - ai_llm maintainers (@ai-llm)
options:
  state:
    description: V(saved) keeps the current configuration, V(rolled_back) puts a kept one back.
    type: str
    choices: [saved, rolled_back]
    required: true
  project_dir:
    description: The project directory.
    type: path
    required: true
  compose_file:
    description: The compose file's name.
    type: str
    default: docker-compose.prod.yml
  rollback_dir:
    description: Where the snapshots are kept.
    type: path
    required: true
  config_hash:
    description: With O(state=saved), the configuration hash of the files kept.
    type: str
  source:
    description: With O(state=saved), what the snapshot is, V(verified) (after a verification) or V(serving) (what
      served before the role's first change).
    type: str
    choices: [verified, serving]
    default: verified
  which:
    description:
      - With O(state=rolled_back), V(last), V(previous), or V(auto), the last one unless it holds O(avoid_hash) (the
        configuration that failed, or that runs), then the one before it.
    type: str
    choices: [last, previous, auto]
    default: auto
  avoid_hash:
    description: With O(which=auto), the configuration hash not to return to.
    type: str
  compose_command:
    description: With O(state=rolled_back), the compose tool that checks the snapshot.
    type: list
    elements: str
attributes:
  check_mode:
    support: full
    description: Reports what it would do and writes nothing.
  diff_mode:
    support: none
    description: Snapshots are copies; the configuration's own diff is shown when it is written.
  idempotent:
    support: full
    description: Saving the same configuration again writes nothing.
"""

EXAMPLES = r"""
- name: Keep the verified configuration
  ai_llm.moe_offload.llm_server_snapshot:
    state: saved
    project_dir: /srv/ai-llm
    rollback_dir: /srv/ai-llm/.rollback
    config_hash: "{{ config.config_hash }}"

- name: Put the last verified configuration back
  ai_llm.moe_offload.llm_server_snapshot:
    state: rolled_back
    project_dir: /srv/ai-llm
    rollback_dir: /srv/ai-llm/.rollback
    compose_command: [podman-compose]
"""

RETURN = r"""
which:
  description: With O(state=rolled_back), the snapshot put back, V(last) or V(previous).
  returned: success
  type: str
  sample: last
missing:
  description: With O(state=rolled_back), when it failed, whether the snapshot asked for does not exist at all.
  returned: failure
  type: bool
  sample: true
env_keys:
  description: With O(state=rolled_back), the role's C(.env) keys of the configuration put back.
  returned: success
  type: dict
  sample: {LLM_MOE_OFFLOAD_PATTERN: 'blk\.1\.ffn_(up|down)_exps', LLM_CTX_SIZE: "512"}
restored_from:
  description: With O(state=rolled_back), its directory.
  returned: success
  type: str
  sample: /srv/ai-llm/.rollback/snapshots/20260504T101112-1a2b3c4d
config_hash:
  description: The configuration hash of the snapshot kept or put back.
  returned: success
  type: str
  sample: 9b1e4c...
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import read_bytes
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_container import compose_config_check
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_files import (
    SnapshotError,
    atomic_write,
    prepare,
    read_snapshot,
    save_snapshot,
    snapshot_hash,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_render import (
    HASH_KEY,
    managed_block,
    merge_env,
    parse_env,
)


def choose(rollback_dir, which, avoid_hash):
    if which != "auto":
        return which
    if avoid_hash and snapshot_hash(rollback_dir, "last") == avoid_hash and \
            os.path.lexists(os.path.join(rollback_dir, "previous")):
        return "previous"
    return "last"


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["saved", "rolled_back"], required=True),
            project_dir=dict(type="path", required=True),
            compose_file=dict(type="str", default="docker-compose.prod.yml"),
            rollback_dir=dict(type="path", required=True),
            config_hash=dict(type="str"),
            source=dict(type="str", choices=["verified", "serving"], default="verified"),
            which=dict(type="str", choices=["last", "previous", "auto"], default="auto"),
            avoid_hash=dict(type="str"),
            compose_command=dict(type="list", elements="str"),
        ),
        required_if=[("state", "rolled_back", ("compose_command",))],
        supports_check_mode=True,
    )
    p = module.params
    env_path = os.path.join(p["project_dir"], ".env")
    compose_path = os.path.join(p["project_dir"], p["compose_file"])
    if p["state"] == "saved":
        env, compose = read_bytes(env_path), read_bytes(compose_path)
        if env is None or compose is None:
            module.fail_json(msg="llm_server: keeping the snapshot failed: %s is missing"
                                 % (env_path if env is None else compose_path))
        digest = p["config_hash"] or parse_env(env.decode("utf-8", "replace")).get(HASH_KEY)
        files = {".env": env, p["compose_file"]: compose}
        if module.check_mode:
            module.exit_json(changed=snapshot_hash(p["rollback_dir"]) != digest, config_hash=digest)
        try:
            changed, details = save_snapshot(p["rollback_dir"], files, digest, p["source"])
        except OSError as exc:
            module.fail_json(msg="llm_server: keeping the snapshot in %s failed: %s" % (p["rollback_dir"], exc),
                             snapshot_failed=True)
        module.exit_json(changed=changed, config_hash=digest, **details)
    if not module.check_mode:
        prepare(p["rollback_dir"])
    which = choose(p["rollback_dir"], p["which"], p["avoid_hash"])
    try:
        files, manifest, path = read_snapshot(p["rollback_dir"], which)
    except SnapshotError as exc:
        missing = not os.path.lexists(os.path.join(p["rollback_dir"], which))
        module.fail_json(msg="llm_server: the %s snapshot cannot be restored: %s" % (which, exc), which=which,
                         missing=missing)
    env = files.get(".env", b"")
    compose = files.get(p["compose_file"])
    if compose is None or ".env" not in files:
        module.fail_json(msg="llm_server: the %s snapshot %s lacks .env or %s" % (which, path, p["compose_file"]))
    error = compose_config_check(lambda argv: module.run_command(argv, errors="replace"), p["compose_command"],
                                 p["compose_file"], env.decode("utf-8", "replace"), compose.decode("utf-8", "replace"))
    if error:
        module.fail_json(msg="llm_server: the %s snapshot %s cannot be restored: %s" % (which, path, error))
    digest = manifest.get("config_hash")  # what save_snapshot recorded: the hash of this very .env
    block = managed_block(env.decode("utf-8", "replace"))
    if not block:
        module.fail_json(msg="llm_server: the %s snapshot %s holds no block of the role in .env" % (which, path))
    live_env = read_bytes(env_path) or b""
    # Only the role's block comes back: the operator's own lines of the live .env stay as they are.
    new_env = merge_env(live_env.decode("utf-8", "replace"), block)[0].encode("utf-8")
    changed = new_env != live_env or compose != read_bytes(compose_path)
    if changed and not module.check_mode:
        atomic_write(env_path, new_env, 0o600)
        atomic_write(compose_path, compose, 0o640)
    module.exit_json(changed=changed, which=which, restored_from=path, config_hash=digest,
                     env_keys=parse_env(block))


if __name__ == "__main__":
    main()
