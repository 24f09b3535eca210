# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``moe_offload_plan`` plans on the controller when its model is a ``gguf_info`` result (the planner reads no file
then, so the host has nothing to do); with a path it runs the module on the host, which reads the file there."""

from __future__ import annotations

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_request import (
    ARGUMENT_SPEC,
    MUTUALLY_EXCLUSIVE,
    model_in_hand,
    run,
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        if not model_in_hand(self._task.args.get("gguf")):
            result.update(self._execute_module("ai_llm.moe_offload.moe_offload_plan", module_args=self._task.args,
                                               task_vars=task_vars))
            return result
        checked = ArgumentSpecValidator(ARGUMENT_SPEC, mutually_exclusive=MUTUALLY_EXCLUSIVE).validate(
            self._task.args)
        if checked.error_messages:
            result.update(failed=True, msg=" ".join(checked.error_messages))
            return result
        planned, warnings = run(checked.validated_parameters)
        result.update(planned)
        result.setdefault("failed", False)
        result["changed"] = False
        if warnings:
            result["warnings"] = warnings
        return result
