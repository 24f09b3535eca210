# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The llm_server role's argument spec (``roles/llm_server/meta/argument_specs.yml``) read on the controller: the one
declaration of each variable's type, list elements, choices and default, and of the secrets (``no_log``). The
role's check of its variables (``_role_variables.check_settings``) takes all of these from here, and passes every
value through ansible-core's own check of the spec (``spec_problems``), so that it refuses whatever
``rolespec_validate`` would refuse."""

from __future__ import annotations

import os

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.common.yaml import yaml_load

PREFIX = "llm_server_"
# The collection's root: this file is plugins/plugin_utils/_role_spec.py in it, next to roles/.
SPEC_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         "roles", "llm_server", "meta", "argument_specs.yml")
# What ansible-core's check of a role's spec reads from an option (the rest is documentation).
_CHECKED = ("type", "elements", "choices", "default", "no_log")


def load_options(path=SPEC_PATH):
    """``{variable: option}`` of the role's spec; every entry point shares the options of ``main``."""
    with open(path, encoding="utf-8") as handle:
        return yaml_load(handle)["argument_specs"]["main"]["options"]


OPTIONS = load_options()
# The secrets: checked, never kept in the settings nor shown.
SECRETS = tuple(name for name, option in OPTIONS.items() if option.get("no_log"))
# Every variable check_settings reads from the values it is given, in the spec's order (the secrets are passed on
# their own).
VARIABLES = tuple(name for name in OPTIONS if name not in SECRETS)


def short(name):
    """The variable's name without the role's prefix (its setting's name)."""
    return name[len(PREFIX):]


def spec_problems(values):
    """``(variable, message)`` for each of ``values`` that ansible-core's check of the role's spec refuses
    (``ArgumentSpecValidator`` with the option's type, elements, choices and default, as ``rolespec_validate`` runs
    it), in its words; a secret's message does not show the value."""
    problems = []
    for name, value in values.items():
        option = OPTIONS[name]
        spec = {key: option[key] for key in _CHECKED if key in option}
        given = list(value) if isinstance(value, tuple) else value  # (a tuple from Python; YAML gives lists)
        checked = ArgumentSpecValidator({name: spec}).validate({name: given})
        if checked.error_messages:
            problems.append((name, "it is not a %s (the value is not shown)" % option["type"] if option.get("no_log")
                             else "ansible-core's check of the argument spec refuses it: "
                             + "; ".join(checked.error_messages)))
    return problems
