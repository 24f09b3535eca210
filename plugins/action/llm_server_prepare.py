# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The first step of the llm_server role, on the controller: checks the role's variables into its settings
(``_deploy_settings.role_settings``), reads the host once (the module ``llm_server_service_info``: the service,
the project directory, the GPUs, the host memory and the model's header), plans, places and tells whether the run
has anything to do (``_deploy_prepare.prepare``). Nothing on the host changes."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_decision import first_snapshot
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_prepare import (
    Refused,
    prepare,
    service_args,
)
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_settings import role_settings

ANSIBLE_KEYS = ("changed", "failed", "invocation", "warnings", "deprecations", "_ansible_no_log")


def _plain(result):
    """A module's or action's result without Ansible's own keys."""
    return {k: v for k, v in result.items() if k not in ANSIBLE_KEYS}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        entry = self._task.args.get("entry", "main")
        settings = self._task.args.get("settings")
        warnings = []
        if not settings:
            settings, failure, warnings = role_settings(self._templar.template, task_vars, entry)
            if failure:
                result.update(failure, warnings=warnings)
                return result
        result.update(changed=False, settings=settings)
        if not self._task.args.get("read", True):
            return result
        api_key = str(self._templar.template(task_vars.get("llm_server_api_key", ""))) \
            if settings.get("api_key_set") else ""
        service = self._execute_module("ai_llm.moe_offload.llm_server_service_info",
                                       module_args=service_args(settings, api_key, entry), task_vars=task_vars)
        warnings.extend(service.pop("warnings", None) or [])
        result["service"] = _plain(service)
        if settings.get("gpu_access") == "auto" and service.get("gpu_access"):
            settings["gpu_access"] = service["gpu_access"]  # the form this host's engine serves
        try:
            if service.get("failed"):
                raise Refused(service)
            if entry != "rollback":
                prepared = prepare(settings, result["service"], api_key, task_vars.get("inventory_hostname", "?"))
                warnings.extend(prepared.pop("warnings"))
                result.update(prepared)
                result["snapshot_serving"] = first_snapshot(settings, result["service"],
                                                            bool(self._play_context.check_mode))
        except Refused as exc:
            warnings.extend(exc.parts.pop("warnings", None) or [])
            result.update(exc.parts)
            result.update((k, v) for k, v in exc.result.items() if k not in result)
            result["failed"] = True
        if warnings:
            result["warnings"] = warnings
        return result
