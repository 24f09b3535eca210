# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The first step of the llm_server role's ``rollback`` entry point, on the controller: checks the role's variables
into its settings without needing the model (``_deploy_settings.role_settings``), then reads what ai-llm runs and
what its project directory holds (``llm_server_service_info``: the service and the snapshots; no GPU, no model, no
plan). Given ``settings`` (checked earlier in the run), it only reads: the role reads again under the lock."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_prepare import role_api_key, service_args
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_settings import given_or_checked


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        settings, failure, warnings = given_or_checked(self._templar.template, task_vars,
                                                       self._task.args.get("settings"), "rollback")
        if failure:
            result.update(failure, warnings=warnings)
            return result
        service = self._execute_module("ai_llm.moe_offload.llm_server_service_info", task_vars=task_vars,
                                       module_args=service_args(settings, role_api_key(self._templar, settings,
                                                                                       task_vars), "rollback"))
        warnings.extend(service.pop("warnings", None) or [])
        service.pop("invocation", None)
        result.update(changed=False, settings=settings, service=service)
        if service.get("failed"):
            result.update(failed=True, msg=service.get("msg"))
        if warnings:
            result["warnings"] = warnings
        return result
