#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llm_server_lock
short_description: Internal to the ai_llm.moe_offload.llm_server role - take or give back the project directory's lock
version_added: 0.1.0
description:
  - Only the role M(ai_llm.moe_offload.llm_server) calls it; it is not meant to be called alone.
  - The lock is a file in the project directory (M(ai_llm.moe_offload.llm_server_lock_file)) that names its owner,
    the C(ansible-playbook) process on the controller (host, boot id, pid and the pid's start time), and a lease.
  - With O(state=acquired) it tries to take the lock until C(llm_server_lock_timeout) seconds pass. While another
    deploy holds it, it waits and says for whom. It takes the lock over when the owner's lease
    (C(llm_server_lock_lease)) ran out, or when the owner ran on this controller and its C(ansible-playbook) process
    is gone (a killed run).
  - With O(state=released) it removes the lock when it still holds O(token).
  - The role takes the lock before it reads what runs and gives it back at the end, also when the deploy failed. A
    check mode run takes no lock.
  - This is an action plugin that runs on the controller; the lock file is written on the host.
author:
  - ai_llm maintainers (@ai-llm)
options:
  settings:
    description:
      - The checked settings of the role (RV(ai_llm.moe_offload.llm_server_prepare#module:settings)) - the lock file
        C(paths.lock), C(lock_timeout) and C(lock_lease).
    type: dict
    required: true
extends_documentation_fragment:
  - ai_llm.moe_offload.lock
  - ai_llm.moe_offload.controller_module
seealso:
  - module: ai_llm.moe_offload.llm_server_lock_file
"""

EXAMPLES = r"""
- name: Take the lock of the project directory
  ai_llm.moe_offload.llm_server_lock:
    settings: "{{ prepared.settings }}"
  register: lock

- name: Give it back
  ai_llm.moe_offload.llm_server_lock:
    settings: "{{ prepared.settings }}"
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
waited:
  description: Seconds spent waiting for another deploy.
  returned: with O(state=acquired)
  type: float
  sample: 12.4
waited_for:
  description: Who held the lock while this task waited, V(null) when it did not wait.
  returned: with O(state=acquired)
  type: str
  sample: ansible-playbook (pid 4242) on ctl-1, since 2026-05-04 10:11:12 UTC
took_over:
  description: The lock that was taken over and why, V(null) when none.
  returned: with O(state=acquired)
  type: str
  sample: ansible-playbook (pid 4242) on ctl-1, since 2026-05-04 10:11:12 UTC (its owner is gone)
queued:
  description: Whether this task waited for another deploy or took over a lock left behind (RV(msg) says which).
  returned: with O(state=acquired)
  type: bool
  sample: false
released:
  description: Whether the lock file was removed (O(state=released)).
  returned: with O(state=released)
  type: bool
  sample: true
msg:
  description: What happened, in one line.
  returned: always
  type: str
  sample: waited 12 s for the lock of /srv/ai-llm held by ansible-playbook (pid 4242) on ctl-1
"""
