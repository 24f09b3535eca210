# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checks the llm_server role's variables on the controller, before anything is read or written on the host:
every value through ``_deploy_values`` (one message per variable), and the deprecated ``llm_moe_offload_*``
names mapped to ``llm_server_moe_offload_*`` with a deprecation warning."""

from __future__ import annotations

import time
from dataclasses import fields

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_values import (
    InputError,
    Settings,
    check_settings,
)

display = Display()
PREFIX = "llm_server_"
# The stack's names of the offload settings, kept for one release: old name -> (new name, the role's default).
DEPRECATED = {
    "llm_moe_offload_mode": ("llm_server_moe_offload_mode", "auto"),
    "llm_moe_offload_layers": ("llm_server_moe_offload_layers", []),
    "llm_moe_offload_pattern": ("llm_server_moe_offload_pattern", ""),
    "llm_moe_offload_force": ("llm_server_moe_offload_force", False),
}
REMOVED_IN = "0.3.0"


def map_deprecated(values, old_values, warn):
    """``values`` with the deprecated names applied where the new name keeps its default; problems for names
    set both ways to different values."""
    values = dict(values)
    problems = []
    for old, value in old_values.items():
        new, default = DEPRECATED[old]
        warn("%s is deprecated: set %s instead (the old name stops working in ai_llm.moe_offload %s)"
             % (old, new, REMOVED_IN))
        current = values.get(new, default)
        if current == default or current == value:
            values[new] = value
        else:
            problems.append((new, "%r, while the deprecated %s says %r: set only %s" % (current, old, value, new)))
    return values, problems


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        names = [PREFIX + f.name for f in fields(Settings) if PREFIX + f.name in task_vars]
        values = {n: self._templar.template(task_vars[n]) for n in names}
        old = {n: self._templar.template(task_vars[n]) for n in DEPRECATED if n in task_vars}
        values, problems = map_deprecated(values, old, lambda msg: display.deprecated(
            msg, version="0.3.0", collection_name="ai_llm.moe_offload"))
        key = self._templar.template(task_vars.get(PREFIX + "api_key", ""))
        host = task_vars.get("inventory_hostname", "?")
        try:
            settings = check_settings(values, api_key=None if key is None else str(key),
                                      entry=self._task.args.get("entry", "main"))
            found = []
        except InputError as exc:
            settings, found = None, exc.problems
        named = {name for name, _msg in problems}
        lines = ["%s: %s" % p for p in problems + [p for p in found if p[0] not in named]]
        if lines:
            result.update(failed=True, problems=lines,
                          msg="llm_server: %s cannot be deployed on %s: %s. Nothing was changed."
                              % ("this value" if len(lines) == 1 else "these values", host, "; ".join(lines)))
            return result
        result.update(changed=False, started=time.time(), **settings.as_dict())
        return result
