# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Sets ``llm_server_result`` from what the llm_server role's tasks registered (``_deploy_result``), on the
controller; with ``failed`` it says what went wrong in a rescue (``_llm_server_failure``, or
``_llm_server_return_failure`` when the return to a snapshot failed too)."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_result import build, failure, parts_from


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        facts = task_vars or {}
        args = self._task.args
        result["changed"] = False
        if args.get("failed"):
            during = args.get("during", "deploy")
            name = "_llm_server_failure" if during == "deploy" else "_llm_server_return_failure"
            result["ansible_facts"] = {name: failure(facts, facts.get("ansible_failed_result") or {},
                                                     facts.get("ansible_failed_task") or {}, during)}
            return result
        parts = parts_from(facts, bool(self._play_context.check_mode), args.get("status", ""))
        rollback = parts["rollback"]
        if args.get("status") == "rolled_back" and not parts["failure"] and not rollback.get("performed"):
            result.update(failed=True, msg="llm_server: %s" % rollback.get("reason"))
            return result
        result["ansible_facts"] = {"llm_server_result": build(parts)}
        return result
