# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checks the llm_server role's variables on the controller, before anything is read or written on the host:
every value through ``_deploy_values.check_settings`` (one message per variable)."""

from __future__ import annotations

import time

from ansible.plugins.action import ActionBase

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_values import (
    PREFIX,
    VARIABLES,
    InputError,
    check_settings,
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        values = {n: self._templar.template(task_vars[n]) for n in VARIABLES if n in task_vars}
        key = self._templar.template(task_vars.get(PREFIX + "api_key", ""))
        try:
            settings = check_settings(values, api_key=None if key is None else str(key),
                                      entry=self._task.args.get("entry", "main"))
        except InputError as exc:
            result.update(failed=True, problems=exc.lines(),
                          msg=exc.refusal(task_vars.get("inventory_hostname", "?")))
            return result
        result.update(changed=False, started=time.time(), **settings.as_dict())
        return result
