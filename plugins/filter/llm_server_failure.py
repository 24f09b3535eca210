# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: llm_server_failure
short_description: The cause of a failed task in one line
version_added: 0.1.0
author:
- ai_llm maintainers (@ai-llm)
description:
- The message of a failed task; for a command that only says C(non-zero return code), the end of what it printed (for example
  C(Argument list too long)).
- Given a list of registered results, the cause of the first one that failed, V("") when none did.
positional: _input, failed_task
options:
  _input:
    description: A failed task's result (C(ansible_failed_result)), or a list of registered results.
    type: raw
    required: true
  failed_task:
    description: The failed task (C(ansible_failed_task)), named when the result says nothing.
    type: dict
"""

EXAMPLES = r"""
- name: Say what went wrong
  ansible.builtin.set_fact:
    cause: "{{ ansible_failed_result | ai_llm.moe_offload.llm_server_failure(ansible_failed_task) }}"
"""

RETURN = r"""
---
_value:
  description: The cause, one line.
  type: str
"""

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_text import failure_cause


def llm_server_failure(failed, failed_task=None):
    """The cause of a failed task in one line; of a list of registered results, the first that failed (``""``
    when none did)."""
    if isinstance(failed, list):
        for result in failed:
            if isinstance(result, dict) and result.get("failed"):
                return failure_cause(result)
        return ""
    return failure_cause(failed, failed_task)


class FilterModule:
    """The filter llm_server_failure of the llm_server role."""

    def filters(self):
        return {"llm_server_failure": llm_server_failure}
