# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Writes ai-llm's configuration on the host (the module ``llm_server_config``) and, given what the host ran before
the writes (``service``), decides whether ai-llm must be recreated, verified or waited for
(``_deploy_decision.decide``), on the controller."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_decision import decide, next_steps


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        service = args.pop("service", None)
        key_changed = bool(args.pop("key_changed", False))
        result.update(self._execute_module("ai_llm.moe_offload.llm_server_config", module_args=args,
                                           task_vars=task_vars))
        if service is not None and not result.get("failed"):
            settings = args["settings"]
            result["converge"] = decide(service, result, key_changed, bool(settings.get("verify_always")),
                                        settings["container_name"])
            result["steps"] = next_steps(settings, service, result, result["converge"],
                                         bool(self._play_context.check_mode))
        return result
