#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llm_server_result
short_description: Internal to the ai_llm.moe_offload.llm_server role - publish what the run did as llm_server_result
version_added: 0.1.0
description:
  - Only the role M(ai_llm.moe_offload.llm_server) calls it; it is not meant to be called alone.
  - Sets C(llm_server_result) (the role's README, "Result", lists every key) from what the role's tasks registered,
    each given as an option, returns the host's line (RV(line), which the callback
    C(ai_llm.moe_offload.rollout_report) prints) and RV(record), the text the role writes into
    C(verification.json) when the run recreated, verified or rolled back ai-llm.
  - A failure's cause comes from the result of the task that failed (O(verify), O(recreated)) before the rescue's
    O(failure), so that a failed handler is reported with its own message.
  - This is an action plugin that runs on the controller; it changes nothing on the host.
author:
  - ai_llm maintainers (@ai-llm)
options:
  status:
    description: V(rolled_back) for the role's rollback entry point (it fails when nothing was rolled back to).
    type: str
    default: ''
  prepared:
    description: The registered result of the role's prepare step (M(ai_llm.moe_offload.llm_server_prepare)).
    type: dict
    required: true
  lock:
    description: The registered result of M(ai_llm.moe_offload.llm_server_lock).
    type: dict
  written:
    description: The registered results of the tasks that wrote ai-llm's files (a changed one makes the run changed).
    type: list
    elements: dict
  recreated:
    description: C(removed) and C(up), the registered results of the recreate's commands.
    type: dict
  verify:
    description: The registered result of M(ai_llm.moe_offload.llm_server_verify) that proved the placement.
    type: dict
  snapshot:
    description: The registered result of M(ai_llm.moe_offload.llm_server_snapshot) that kept the verified configuration.
    type: dict
  rollback:
    description: C(restored), C(cleared), C(returned) (the results of the rollback's steps) and C(error) (C(result)
      and C(task) of a rollback that failed).
    type: dict
  failure:
    description: In the rescue of a failed deploy, C(result) and C(task) (C(ansible_failed_result) and
      C(ansible_failed_task)).
    type: dict
extends_documentation_fragment:
  - ai_llm.moe_offload.info_module
  - ai_llm.moe_offload.controller_module
"""

EXAMPLES = r"""
- name: Publish what this run did as llm_server_result
  ai_llm.moe_offload.llm_server_result:
    prepared: "{{ _llm_server_prepared }}"
    verify: "{{ _llm_server_verify | default({}) }}"
"""

RETURN = r"""
ansible_facts:
  description: C(llm_server_result).
  returned: success
  type: dict
  sample: {llm_server_result: {status: unchanged, changed: false, message: "ai-llm serves ..."}}
line:
  description:
    - What the run did on this host in one line, for the default verbosity - the status,
      then the message of a failure or a rollback, else the pattern and its source, the tensors in host memory, the
      VRAM the routed experts free on a GPU host, the speed when it was measured; and the seconds the run took.
  returned: success
  type: str
  sample: "localhost: changed, --override-tensor \\.ffn_.*_exps\\.weight=CPU (plan), 4 tensors in host memory, no GPU, 3.8 s"
record:
  description: The text for C(verification.json) (C(llm_server_result) as JSON), V("") when this run does not record.
  returned: success
  type: str
"""
