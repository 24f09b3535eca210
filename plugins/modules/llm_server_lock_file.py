#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llm_server_lock_file
short_description: Internal to the ai_llm.moe_offload.llm_server role - the project directory's lock file on the host
version_added: 0.1.0
description:
  - Only the action M(ai_llm.moe_offload.llm_server_lock) calls it; it is not meant to be called alone.
  - The lock is a file in the project directory that names its owner, the C(ansible-playbook) process on the
    controller (host, boot id, pid and the pid's start time), and a lease.
  - With O(state=acquired) it tries once to take the lock - it takes it when it is free, when its lease ran out, or
    when its token is O(takeover) - and otherwise returns who holds it (the action waits and asks again).
  - With O(state=released) it removes the lock when it still holds O(token).
author:
  - ai_llm maintainers (@ai-llm)
options:
  path:
    description:
      - The lock file (the role uses C(<project dir>/.llm_server.lock)). Its directory is created when missing.
    type: path
    required: true
  lease:
    description:
      - How long the lock holds without its owner, in seconds. A lock older than its lease is taken over
        (the owner may have been killed on another controller).
    type: int
    default: 3600
  owner:
    description: Who asks for the lock (the action names its C(ansible-playbook) process).
    type: dict
  takeover:
    description: The token of a lock whose owner the action proved gone, to take over.
    type: str
extends_documentation_fragment:
  - ai_llm.moe_offload.lock
seealso:
  - module: ai_llm.moe_offload.llm_server_service_info
"""

EXAMPLES = r"""
- name: Take the lock of the project directory
  ai_llm.moe_offload.llm_server_lock_file:
    path: /srv/ai-llm/.llm_server.lock
  register: lock

- name: Give it back
  ai_llm.moe_offload.llm_server_lock_file:
    path: /srv/ai-llm/.llm_server.lock
    state: released
    token: "{{ lock.token }}"
"""

RETURN = r"""
acquired:
  description: Whether the lock is held now (O(state=acquired)).
  returned: always
  type: bool
  sample: true
token:
  description: The token of the lock, for O(state=released).
  returned: when acquired
  type: str
  sample: 5c1a0c0e7f2b4f51a3b1f0a2b3c4d5e6
took_over:
  description: The lock that was taken over (O(takeover), or a lease run out), V(null) when none.
  returned: with O(state=acquired)
  type: str
holder:
  description: Who holds the lock when it was not acquired (the owner and the lease), for the action to wait on.
  returned: when not acquired
  type: dict
released:
  description: Whether the lock file was removed (O(state=released)).
  returned: with O(state=released)
  type: bool
  sample: true
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_lock import acquire, describe, release


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            state=dict(type="str", choices=["acquired", "released"], default="acquired"),
            lease=dict(type="int", default=3600),
            token=dict(type="str", no_log=False),
            owner=dict(type="dict"),
            takeover=dict(type="str"),
        ),
        required_if=[("state", "released", ("token",))],
    )
    p = module.params
    if p["state"] == "released":
        done = release(p["path"], p["token"])
        module.exit_json(changed=False, released=done,
                         msg="released the lock %s" % p["path"] if done else "the lock was not ours any more")
    result = acquire(p["path"], p["owner"] or {}, p["lease"], p["takeover"])
    holder = result.pop("holder")
    took_over = result.pop("took_over")
    module.exit_json(changed=result.pop("created_dir"), holder=holder, holder_text=describe(holder),
                     took_over=("%s (%s)" % (describe(took_over), took_over["reason"])) if took_over else None,
                     **result)


if __name__ == "__main__":
    main()
