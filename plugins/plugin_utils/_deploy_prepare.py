# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the llm_server role decides before it changes anything, from the checked settings and one read of the host
(``llm_server_service_info``): the options of the planner, the plan, the placement and whether the run has
anything to do; and, once the deploy's speed is measured, the calibration the next plan of the host reads back.

Runs on the controller (the action ``llm_server_prepare``). A refusal raises ``Refused`` with the failed step's
result, so that the role publishes that step's own words.
"""

from __future__ import annotations

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import mib, mib_text
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._cuda_requirement import VARIABLE, refusals
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_calibration import calibration
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_inputs import PlanError
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_request import (
    ARGUMENT_SPEC,
    MUTUALLY_EXCLUSIVE,
    plan_inputs,
    run,
)
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_decision import VERIFIED_STATUSES
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_placement import (
    PlacementRefused,
    missing_gpus,
    place,
)


class Refused(Exception):
    """A step before any change failed; ``result`` is that step's result (``msg`` and what it found), ``parts``
    what was decided before it (the plan, for a refused placement)."""

    def __init__(self, result, **parts):
        super().__init__(result.get("msg"))
        self.result = result
        self.parts = parts


def role_api_key(templar, settings, task_vars):
    """The API key the role deploys (``llm_server_api_key`` templated), ``""`` when none is set."""
    return str(templar.template(task_vars.get("llm_server_api_key", ""))) if settings.get("api_key_set") else ""


def service_args(settings, api_key, entry="main"):
    """The options of ``llm_server_service_info`` for ``settings``: the service and the project directory, and for
    a deploy also the GPUs, the host memory and the model's header (read in the same call)."""
    args = {
        "project_dir": settings["project_dir"],
        "compose_file": settings["compose_file"],
        "compose_command": settings["compose_command"],
        "container_name": settings["container_name"],
        "rollback_dir": settings["rollback_dir"],
        "base_url": settings["base_url"],
    }
    if api_key:
        args["api_key"] = api_key
    if entry != "rollback":
        args.update(lock_path=settings["paths"]["lock"], gpus=True, host_memory=True,
                    model_path=settings["model_path"], model_dir=settings["model_dir"], image=settings["image"],
                    gpu_access=settings["gpu_access"], gpu_devices=list(settings["gpu_devices"] or []))
    return args


def fetch_args(settings, headers, piece_seconds):
    """The options of ``llm_server_model`` (state present) for ``settings``; ``headers`` are the role's
    ``llm_server_model_headers`` (a token: never in the settings)."""
    return {"url": settings["model_url"], "path": settings["model_path"], "sha256": settings["model_sha256"],
            "headers": headers or {}, "record": settings["paths"]["models"], "piece_seconds": piece_seconds}


def piece_cut(piece):
    """How a piece of a download ended early (the first file's ``cut``: the connection ended or failed), or ``""``."""
    return next((f["cut"] for f in piece.get("files") or [] if f.get("cut")), "")


def fetch_line(host, piece, seconds):
    """The line of progress after one piece of a download: bytes there of the total, the seconds of this run."""
    have, total = piece.get("bytes_have") or 0, piece.get("bytes_total") or 0
    cut = piece_cut(piece)
    return "%s: fetching the model, %s of %s MiB (%d %%), %d s%s" % (
        host, mib_text(mib(have)), mib_text(mib(total)), 100 * have // total if total else 0, seconds,
        "; %s, resuming" % cut if cut else "")


def fetch_summary(pieces, seconds, earlier=None):
    """What the role keeps of a fetch (``model_fetch`` of the prepare step and of ``llm_server_result``): the
    bytes fetched this run over all pieces, the seconds, the files and, in check mode, the bytes a run would
    fetch; ``failed`` and ``msg`` of a piece that failed. ``earlier`` is the summary of this run's earlier prepare
    step on the host (the rollout's preflight fetches, its batch finds the model there): its bytes and seconds
    count too."""
    last = pieces[-1] if pieces else {}
    earlier = earlier if isinstance(earlier, dict) else {}
    fetched = sum(p.get("bytes_fetched") or 0 for p in pieces) + (earlier.get("bytes") or 0)
    seconds += earlier.get("seconds") or 0
    summary = {"bytes": fetched, "seconds": round(seconds, 3), "bytes_total": last.get("bytes_total"),
               "files": [f.get("path") for f in last.get("files") or []],
               "fetched": bool(last.get("fetched") or earlier.get("fetched")), "would_fetch": last.get("would_fetch") or 0}
    if last.get("failed"):
        summary.update(failed=True, msg=last.get("msg"))
    elif summary["would_fetch"]:
        summary["msg"] = "check mode: the model would be fetched first (%s MiB), and the plan made from its header" \
            % mib_text(mib(summary["would_fetch"]))
    return summary


def verified_speed(service):
    """The speed that ``verification.json`` (in the host read ``service``) recorded for the last verified
    configuration, or None: none recorded, or the last run was not verified."""
    verification = (service.get("disk") or {}).get("verification")
    verification = verification if isinstance(verification, dict) else {}
    speed = verification.get("speed")
    return speed if verification.get("status") in VERIFIED_STATUSES and isinstance(speed, dict) else None


def stored_calibration(service):
    """The calibration the last verification of the host recorded (``speed.calibration`` of
    ``verification.json``), or None: none recorded, or the last run was not verified."""
    found = (verified_speed(service) or {}).get("calibration")
    return found if isinstance(found, dict) else None


def stored_cuda_context(service):
    """The CUDA context per GPU the last verification of the host measured (``cuda_context`` of
    ``verification.json``, ``_cuda_context.measure``), or None: none recorded, or the last run was not verified."""
    verification = (service.get("disk") or {}).get("verification")
    verification = verification if isinstance(verification, dict) else {}
    found = verification.get("cuda_context")
    return found if verification.get("status") in VERIFIED_STATUSES and isinstance(found, list) and found else None


def plan_args(settings, service):
    """The options of ``moe_offload_plan`` for ``settings`` and the host read: the chosen GPUs when given, the mode
    (an inventory pattern is checked in mode auto), the goal, a count of GPU layers (``-ngl``; auto and all are
    every layer), the blocks of mode layers, the inventory pattern and the calibration the host's last verification
    recorded, and the CUDA context it measured on each GPU."""
    pattern = settings["moe_offload_pattern"]
    args = {
        "gguf": service.get("model_info") or {},
        "gpus": service.get("gpu_info") or {},
        "host": service.get("host_info"),
        "ctx_size": settings["ctx_size"],
        "parallel": settings["parallel"],
        "mode": "auto" if pattern else settings["moe_offload_mode"],
        "goal": settings["moe_offload_goal"],
    }
    if settings["gpu_devices"]:
        args["gpu_devices"] = list(settings["gpu_devices"])
    if str(settings["n_gpu_layers"]).isdigit():
        args["n_gpu_layers"] = int(settings["n_gpu_layers"])
    if settings["moe_offload_mode"] == "layers":
        args["cpu_expert_layers"] = settings["cpu_expert_layers"]
    if pattern:
        args["pattern"] = pattern
    found = stored_calibration(service)
    if found:
        args["calibration"] = found
    measured = stored_cuda_context(service)
    if measured:
        args["cuda_context"] = measured
    return args


def validated_plan_args(settings, service):
    """``plan_args`` checked by the planner's argument spec; ``Refused`` in its words when they fail it."""
    checked = ArgumentSpecValidator(ARGUMENT_SPEC, mutually_exclusive=MUTUALLY_EXCLUSIVE).validate(
        plan_args(settings, service))
    if checked.error_messages:
        raise Refused({"failed": True, "msg": " ".join(checked.error_messages)})
    return checked.validated_parameters


def calibration_of(settings, service, plan, measured):
    """``(calibration, problem)``: the ``calibration`` a later plan of this host accepts, solved from the speed
    ``_speed_check`` measured (``measured``) of the placement of ``plan`` (the plan this deploy used, made from
    ``settings`` and the host read ``service``), or ``(None, why)`` when it cannot be solved (no plan, or a
    measurement the speed model cannot explain)."""
    if not isinstance(plan, dict) or plan.get("skipped") or "devices" not in plan:
        return None, "no plan to calibrate"
    try:
        facts, _gpus, host, options = plan_inputs(validated_plan_args(settings, service))
        return calibration(facts, plan, options, measured, host), ""
    except (PlanError, Refused) as exc:
        return None, str(exc)


def make_plan(settings, service):
    """``(plan, missing, warnings)``: the planner's result as a task registers it (``{"skipped": True}`` when a
    chosen GPU is missing: nothing to plan for), the chosen GPUs the host lacks, and the planner's warnings.

    A plan that does not fit comes back with ``fits`` false and the missing MiB: the placement refuses it with what
    to change, or deploys it when forced. Any other failure of the planner is a refusal here."""
    missing = missing_gpus(service.get("gpu_info"), settings["gpu_devices"])
    if missing:
        return {"skipped": True, "changed": False}, missing, []
    planned, warnings = run(validated_plan_args(settings, service))
    planned.setdefault("failed", False)
    planned["changed"] = False
    if planned["failed"] and planned.get("fits", True):
        raise Refused(planned, plan=planned)
    return planned, missing, warnings


def prepare(settings, service, host="?"):
    """``{"plan", "placement", "warnings"}`` for a host read by ``llm_server_service_info``. ``Refused`` when the
    plan or the placement cannot be deployed (the model outside the directory the container mounts among them)."""
    outside = (service.get("disk") or {}).get("model_outside_dir")
    if outside:
        raise Refused({"failed": True, "msg": outside})
    plan, missing, warnings = make_plan(settings, service)
    try:
        placement = place(settings, service.get("model_info") or {}, plan, service.get("gpu_info") or {}, missing,
                          host)
    except PlacementRefused as exc:
        raise Refused({"failed": True, "msg": str(exc)}, plan=plan, warnings=warnings) from None
    warnings.extend(check_requirement(service.get("cuda_requirement"), placement["gpu_devices"], plan, warnings,
                                      host))
    return {"plan": plan, "placement": placement, "warnings": warnings}


def check_requirement(found, chosen, plan=None, warnings=(), host="?"):
    """The warnings of the image's ``NVIDIA_REQUIRE_CUDA`` check for the chosen GPUs (``found``: ``cuda_requirement``
    of the host read); ``Refused`` when NVIDIA's container hook would refuse to start the container on one of them,
    which it does at ``up``, after the old container is removed (``_cuda_requirement``)."""
    found = found or {}
    if not chosen or not found:
        return []
    problems = refusals(found, chosen)
    if problems:
        raise Refused({"failed": True, "msg": "llm_server: %s on %s. Nothing was changed." % ("; ".join(problems), host),
                       "cuda_requirement": found}, plan=plan, warnings=list(warnings))
    if not found.get("found"):
        return ["the image %s is not on %s (%s): its %s is checked against the GPUs only once the image is there"
                % (found.get("image"), host, found.get("error") or "not found", VARIABLE)]
    return []
