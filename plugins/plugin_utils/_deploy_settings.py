# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The llm_server role's settings, on the controller: the role's variables templated and checked by
``_role_variables.check_settings`` (one message per variable) before anything is read or written on the host, and a
word about every name with the role's prefixes that means nothing to the role or the playbooks (a typo)."""

from __future__ import annotations

import difflib
import time

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._role_spec import PREFIX, SECRETS, VARIABLES
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._role_variables import SettingsError, check_settings


# The names with the role's prefixes that are not the role's variables: what the collection's playbooks read
# (docs/fleet.md) and the fact the role publishes.
PLAYBOOK_VARIABLES = (
    "llm_server_hosts", "llm_server_result", "llm_rollout_batch", "llm_rollout_max_fail_percentage",
    "llm_rollout_report_dir", "llm_rollout_serial", "llm_rollout_skip_refused_hosts",
)
KNOWN_VARIABLES = tuple(sorted(set(VARIABLES) | set(SECRETS) | set(PLAYBOOK_VARIABLES)))
PREFIXES = (PREFIX, "llm_rollout_")


def unknown_variables(names):
    """``(name, message)`` for every name with the prefixes ``PREFIXES`` that neither the role nor the playbooks
    know, in name order, each with the closest known name when one is close (difflib's ratio 0.6 or more)."""
    problems = []
    for name in sorted(n for n in names if n.startswith(PREFIXES) and n not in KNOWN_VARIABLES):
        close = difflib.get_close_matches(name, KNOWN_VARIABLES, n=1)
        problems.append((name, "no variable of the llm_server role or of the collection's playbooks has this name"
                         + ("; did you mean %s?" % close[0] if close else "")))
    return problems


def role_settings(template, task_vars, entry="main"):
    """The checked settings of one host as a dict (with ``started``, the time of the check), or a failed result,
    and the warnings about unknown names.

    ``template`` renders one variable's value (the action's templar); the role's defaults give the host every
    variable of the argument spec. Returns ``(settings, None, warnings)`` or ``(None, failure, warnings)``,
    where the failure is an action result: ``failed``, ``problems`` (one line per variable) and ``msg`` (the refusal
    naming the host). An unknown name is a warning, and a problem when ``llm_server_strict_variables`` is true."""
    values = {n: template(task_vars[n]) for n in VARIABLES if n in task_vars}
    key = template(task_vars.get(PREFIX + "api_key", ""))
    unknown = unknown_variables(task_vars)
    warnings = ["%s: %s" % problem for problem in unknown]
    try:
        settings = check_settings(values, api_key=None if key is None else str(key), entry=entry, unknown=unknown,
                                  model_headers=template(task_vars.get(PREFIX + "model_headers") or {}))
    except SettingsError as exc:
        return None, {"failed": True, "problems": exc.lines(),
                      "msg": exc.refusal(task_vars.get("inventory_hostname", "?"))}, warnings
    return dict(settings.as_dict(), started=time.time()), None, warnings


def given_or_checked(template, task_vars, given=None, entry="main"):
    """``role_settings``' answer, or ``(given, None, [])`` for settings checked earlier in the same run (the read
    again under the lock)."""
    if given:
        return given, None, []
    return role_settings(template, task_vars, entry)
