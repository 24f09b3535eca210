# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The llm_server role's settings, on the controller: the role's variables templated and checked by
``_deploy_values.check_settings`` (one message per variable) before anything is read or written on the host."""

from __future__ import annotations

import time

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_values import (
    PREFIX,
    VARIABLES,
    SettingsError,
    check_settings,
)


def role_settings(template, task_vars, entry="main"):
    """The checked settings of one host as a dict (with ``started``, the time of the check), or a failed result.

    ``template`` renders one variable's value (the action's templar); only the variables the host has are read, the
    others take check_settings' defaults. Returns ``(settings, None)`` or ``(None, failure)``, where the failure is
    an action result: ``failed``, ``problems`` (one line per variable) and ``msg`` (the refusal naming the host)."""
    values = {n: template(task_vars[n]) for n in VARIABLES if n in task_vars}
    key = template(task_vars.get(PREFIX + "api_key", ""))
    try:
        settings = check_settings(values, api_key=None if key is None else str(key), entry=entry)
    except SettingsError as exc:
        return None, {"failed": True, "problems": exc.lines(),
                      "msg": exc.refusal(task_vars.get("inventory_hostname", "?"))}
    return dict(settings.as_dict(), started=time.time()), None
