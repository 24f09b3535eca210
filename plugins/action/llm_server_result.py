# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The llm_server role's last step, on the controller: ``llm_server_result`` from what the role's tasks registered,
given as this action's options (``_deploy_result``), set as a fact; the host's line (``line``, which the callback
``rollout_report`` prints); and ``record``, the text
for verification.json when the run recreated, verified or rolled back ai-llm (the role writes it with
``ansible.builtin.copy``)."""

from __future__ import annotations

import json

from ansible.plugins.action import ActionBase

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_result import parts_from, publishing, to_record

# The options (the module's documentation, plugins/modules/llm_server_result.py, says what each is).
ARGUMENT_SPEC = {
    "status": {"type": "str", "default": ""},
    "prepared": {"type": "dict", "required": True},
    "lock": {"type": "dict"},
    "written": {"type": "list", "elements": "dict"},
    "recreated": {"type": "dict"},
    "verify": {"type": "dict"},
    "snapshot": {"type": "dict"},
    "rollback": {"type": "dict"},
    "failure": {"type": "dict"},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        _checked, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        given = dict(args, host=task_vars.get("inventory_hostname"))
        check_mode = bool(self._play_context.check_mode)
        parts = parts_from(given, check_mode)
        if given.get("status") == "rolled_back" and not parts["failure"] and not parts["rollback"].get("performed"):
            result.update(failed=True, msg="llm_server: %s" % parts["rollback"].get("reason"))
            return result
        result.update(publishing(parts), changed=False)
        published = result["ansible_facts"]["llm_server_result"]
        result["record"] = json.dumps(published, indent=4, sort_keys=True) + "\n" \
            if to_record(published, given, check_mode) else ""
        return result
