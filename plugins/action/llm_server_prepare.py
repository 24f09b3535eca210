# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The first step of the llm_server role, on the controller: checks the role's variables into its settings
(``_deploy_settings.role_settings``), fetches the model when ``llm_server_model_url`` is set and the host lacks it
(the module ``llm_server_model``, in pieces with a line of progress between them), reads the host once (the module
``llm_server_service_info``: the service, the project directory, the GPUs, the host memory and the model's header),
plans, places (``_deploy_prepare.prepare``), encodes the values of the role's templates, and tells what the run
writes and does (``_deploy_decision``): nothing (ai-llm already serves this configuration, verified), or the
writes, the restart, the proof. Apart from the model's files, nothing on the host changes."""

from __future__ import annotations

import time

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_fetch import known_of
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_disk import desired_config
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_render import (
    RenderError,
    compose_values,
    env_values,
)
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_decision import (
    decide,
    first_snapshot,
    next_steps,
    unchanged,
)
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_prepare import (
    Refused,
    fetch_args,
    fetch_line,
    fetch_summary,
    piece_cut,
    prepare,
    role_api_key,
    service_args,
)
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_proof import parity_request
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_settings import given_or_checked
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_templates import (
    COMPOSE_TEMPLATE,
    ENV_TEMPLATE,
    files,
    render,
)

ANSIBLE_KEYS = ("changed", "failed", "invocation", "warnings", "deprecations", "_ansible_no_log")
# A download goes in pieces of this many seconds, with a line of progress after each.
PIECE_SECONDS = 10.0
# Pieces in a row that fetch no byte before the fetch fails.
STALLED_PIECES = 3

display = Display()


def _plain(result):
    """A module's or action's result without Ansible's own keys."""
    return {k: v for k, v in result.items() if k not in ANSIBLE_KEYS}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True

    def _fetch(self, settings, task_vars):
        """The model fetched (or in check mode, what would be fetched): the pieces of ``llm_server_model`` until
        every file is there, one line of progress after each. Returns ``fetch_summary``'s result (failed when a
        piece failed or STALLED_PIECES pieces in a row fetched nothing) and whether a piece changed the host."""
        host = task_vars.get("inventory_hostname", "?")
        headers = self._templar.template(task_vars.get("llm_server_model_headers") or {})
        args = fetch_args(settings, headers, PIECE_SECONDS)
        started, pieces, stalled = time.time(), [], 0
        while True:
            piece = self._execute_module("ai_llm.moe_offload.llm_server_model", module_args=args, task_vars=task_vars)
            piece.pop("invocation", None)
            pieces.append(piece)
            if piece.get("failed") or piece.get("done") or self._play_context.check_mode:
                break
            stalled = 0 if piece.get("bytes_fetched") else stalled + 1
            if stalled >= STALLED_PIECES:
                piece.update(failed=True, msg="llm_server: the model cannot be fetched: %d tries in a row fetched "
                             "nothing (%s)" % (stalled, piece_cut(piece) or "no byte arrived"))
                break
            display.display(fetch_line(host, piece, time.time() - started))
            args["known"] = known_of(piece)
        return fetch_summary(pieces, time.time() - started,
                             (task_vars.get("_llm_server_prepared") or {}).get("model_fetch")), \
            any(p.get("changed") for p in pieces)

    def _configuration(self, settings, result, api_key, task_vars):
        """What this run writes and does (``templates``, ``compose``, ``env``, ``config``, ``decision``, ``converge``,
        ``steps``): the values the templates place, checked and encoded, the configuration hash, whether the host
        already runs this configuration, verified, and otherwise whether ai-llm is recreated, verified or waited
        for. The compose template is rendered here as the template module renders it, to compare with the host's."""
        service, placement = result["service"], result["placement"]
        src = settings.get("compose_template") or COMPOSE_TEMPLATE
        try:
            templates = {"compose": self._find_needle("templates", src),
                         "env": self._find_needle("templates", ENV_TEMPLATE)}
        except AnsibleError as exc:
            raise Refused({"failed": True, "msg": "llm_server: llm_server_compose_template: %s" % exc}) from None
        try:
            values = env_values(settings, placement)
            compose = compose_values(settings, placement, service.get("engine"))
        except RenderError as exc:
            raise Refused({"failed": True, "msg": "llm_server: %s" % exc}) from None
        try:
            text = render(self._templar, src, templates["compose"], settings["paths"]["compose"],
                          dict(task_vars, llm_server_compose=compose))
        except AnsibleError as exc:
            raise Refused({"failed": True, "msg": "llm_server: the compose template %s cannot be rendered: %s"
                                                  % (templates["compose"], exc)}) from None
        sources = []
        for path in (templates["compose"], templates["env"]):
            with open(path, "rb") as f:
                sources.append(f.read())
        config = desired_config(service.get("disk") or {}, values, compose, text, sources, api_key)
        check_mode = bool(self._play_context.check_mode)
        converge = decide(service, config, bool(settings.get("verify_always")), settings["container_name"])
        return {"templates": templates, "compose": compose, "env": values, "config": config,
                "files": files(settings, service.get("compose_command"), "compose" in config["files"]),
                "parity_request": parity_request(settings),
                "decision": unchanged(service, settings, config), "converge": converge,
                "steps": next_steps(settings, service, config, converge, check_mode),
                "snapshot_serving": first_snapshot(settings, service, check_mode)}

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        settings, failure, warnings = given_or_checked(self._templar.template, task_vars,
                                                       self._task.args.get("settings"))
        if failure:
            result.update(failure, warnings=warnings)
            return result
        result.update(changed=False, settings=settings)
        if settings["model_url"] and self._task.args.get("settings"):
            # the read under the lock: the model was fetched (or found) by this run's first step
            result["model_fetch"] = (task_vars.get("_llm_server_prepared") or {}).get("model_fetch")
        elif settings["model_url"]:
            fetched, result["changed"] = self._fetch(settings, task_vars)
            result["model_fetch"] = fetched
            if fetched.get("failed"):
                result.update(failed=True, msg=fetched["msg"], warnings=warnings)
                return result
            if fetched.get("would_fetch"):
                # check mode: the plan needs the model's header, which is not on the host yet
                result["decision"] = {"unchanged": False, "fetch_first": True, "reason": fetched["msg"]}
                if warnings:
                    result["warnings"] = warnings
                return result
        api_key = role_api_key(self._templar, settings, task_vars)
        service = self._execute_module("ai_llm.moe_offload.llm_server_service_info",
                                       module_args=service_args(settings, api_key), task_vars=task_vars)
        warnings.extend(service.pop("warnings", None) or [])
        result["service"] = _plain(service)
        if settings.get("gpu_access") == "auto" and service.get("gpu_access"):
            settings["gpu_access"] = service["gpu_access"]  # the form this host's engine serves
        try:
            if service.get("failed"):
                raise Refused(service)
            prepared = prepare(settings, result["service"], task_vars.get("inventory_hostname", "?"))
            warnings.extend(prepared.pop("warnings"))
            result.update(prepared)
            result.update(self._configuration(settings, result, api_key, task_vars))
        except Refused as exc:
            warnings.extend(exc.parts.pop("warnings", None) or [])
            result.update(exc.parts)
            result.update((k, v) for k, v in exc.result.items() if k not in result)
            result["failed"] = True
        if warnings:
            result["warnings"] = warnings
        return result
