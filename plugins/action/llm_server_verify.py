# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The llm_server role's proof that ai-llm serves what was deployed: the wait for ``/health`` 200 on the host
(the module ``llm_server_health``), then, given the ``plan``, the log (``llama_server_log``), the GPU memory
(``gpu_info``) and the parity answer, judged by ``_deploy_proof``, then the speed and the calibration it gives
(``_deploy_prepare.calibration_of``). Without a plan (a rollback waits for what it restored), the wait only."""

from __future__ import annotations

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._cuda_context import measure
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._speed_check import gate_problem, with_previous
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_prepare import (
    calibration_of,
    role_api_key,
    verified_speed,
)
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_proof import (
    log_args,
    parity_answer,
    parity_note,
    parity_request,
    verification_problem,
    vram_rows,
)

# The options (the module's documentation, plugins/modules/llm_server_verify.py, says what each is).
ARGUMENT_SPEC = {
    "settings": {"type": "dict", "required": True},
    "engine": {"type": "str", "choices": ["podman", "docker"], "default": "podman"},
    "plan": {"type": "dict"},
    "placement": {"type": "dict"},
    "service": {"type": "dict"},
    "gpu_baseline": {"type": "dict"},
    "parity_before": {"type": "dict"},
}
# Seconds between two lines that say where a start of ai-llm is, while the wait lasts.
PROGRESS_SECONDS = 5.0

display = Display()


def speed_args(settings):
    """The speed check's options of the module for the role's ``settings``; None when it is off."""
    if not settings.get("speed_check"):
        return None
    return {"prompt_tokens": settings["speed_prompt_tokens"], "predict_tokens": settings["speed_predict_tokens"],
            "runs": settings["speed_runs"]}


def wait_args(settings, engine, api_key):
    """The options of the wait on the host for the role's ``settings``: it reports, the role fails."""
    args = {"container_name": settings["container_name"], "engine": engine, "base_url": settings["base_url"],
            "timeout": settings["health_timeout"], "fail": False}
    if api_key:
        args["api_key"] = api_key
    return args


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def _module(self, name, args, task_vars):
        return self._execute_module("ai_llm.moe_offload." + name, module_args=args, task_vars=task_vars)

    def _wait(self, args, task_vars):
        """The wait for /health on the host, in pieces of PROGRESS_SECONDS, with one line after each that says how
        long it has waited and where the start is (``wait_healthy``); the result of the last piece."""
        host = task_vars.get("inventory_hostname", "?")
        piece = dict(args, for_at_most=PROGRESS_SECONDS)
        while True:
            health = self._module("llm_server_health", piece, task_vars)
            if not health.get("waiting"):
                return health
            display.display("%s: waiting for /health, %d s of %s s: %s" % (
                host, health.get("seconds") or 0, args.get("timeout", 300), health.get("stage")))
            piece.update(waited=health.get("seconds") or 0, restarts=(health.get("container") or {}).get("restarts"))

    def _completion(self, settings, api_key, task_vars):
        """The parity prompt asked of the new configuration."""
        return self._execute_module("ansible.builtin.uri", module_args={
            "url": settings["base_url"] + "/completion", "method": "POST", "body_format": "json",
            "body": parity_request(settings),
            "headers": {"Authorization": "Bearer " + api_key} if api_key else {},
            "timeout": 120, "status_code": [200]}, task_vars=task_vars)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        _checked, proof = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        settings = proof["settings"]
        # the wait's options come from the settings, the key from the role's variable
        args = wait_args(settings, proof["engine"] or "podman", role_api_key(self._templar, settings, task_vars))
        health = self._wait(args, task_vars)
        health.pop("invocation", None)
        if not proof["plan"]:
            result.update(health)
            if not health.get("healthy") and not health.get("failed"):
                result.update(failed=True, msg=health.get("cause"))
            return result
        placement, plan = proof["placement"] or {}, proof["plan"]
        result.update(changed=False, health=health, parity_note=parity_note(proof["parity_before"]))
        if not health.get("healthy"):
            result.update(failed=True, msg=health.get("cause") or health.get("msg"), cause=health.get("cause"))
            return result
        log = self._module("llama_server_log", dict(log_args(plan, placement, settings),
                                                    container=settings["container_name"],
                                                    container_engine=args["engine"]), task_vars)
        result["log"] = log
        if log.get("build_warning"):
            result.setdefault("warnings", []).append("llm_server: " + log["build_warning"])
        if log.get("failed"):
            result.update(failed=True, msg=log.get("msg"))
            return result
        baseline = (proof["gpu_baseline"] or {}).get("gpus") or []
        if baseline:
            pid = (health.get("container") or {}).get("pid")
            after = self._module("gpu_info", {"pid": pid} if pid else {}, task_vars)
            if after.get("failed"):
                result.update(failed=True, msg=after.get("msg"))
                return result
            result["vram"] = vram_rows(placement.get("gpu_devices"), baseline, after.get("gpus"),
                                       plan.get("memory") or {}, settings["vram_tolerance_mib"], plan.get("devices"))
            # what the server's process holds beyond its buffers: the next plan of the host counts it
            result["cuda_context"] = measure(plan.get("devices"), after.get("gpus"), log)
        before = parity_answer(proof["parity_before"])
        if settings.get("parity_check") and before is not None:
            answer = self._completion(settings, args.get("api_key") or "", task_vars)
            if answer.get("failed"):
                result.update(failed=True, msg=answer.get("msg"))
                return result
            result["parity"] = {"before": before, "after": parity_answer(answer)}
        problem = verification_problem(log, placement.get("pattern"), result.get("vram") or [],
                                       result.get("parity") or {}, settings["vram_tolerance_mib"],
                                       settings["parity_seed"])
        speed = speed_args(settings)
        if not problem and speed:
            measured = self._module("llm_server_health", dict(args, speed=speed), task_vars)
            measured.pop("invocation", None)
            if not measured.get("healthy"):
                result.update(failed=True, msg=measured.get("cause") or measured.get("msg"))
                return result
            service = proof["service"] or {}
            result["speed"] = with_previous(measured["speed"], verified_speed(service))
            # The host's figures solved from this measurement: the next plan of the host predicts with them.
            result["speed"]["calibration"], unsolved = calibration_of(settings, service, plan, measured["speed"])
            if unsolved:
                result.setdefault("warnings", []).append("llm_server: the speed check gives no calibration: %s"
                                                         % unsolved)
            problem = gate_problem(result["speed"], settings.get("min_decode_ratio"), settings.get("min_prompt_ratio"))
        result["verified"] = not problem
        if problem:
            result.update(failed=True, msg=problem)
        return result
