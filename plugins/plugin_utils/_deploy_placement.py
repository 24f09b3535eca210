# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where the llm_server role puts the weights: the GPUs the plan may count, the pattern (the user's, the plan's
or the model's), what llama-server's log must then show, and the refusals that stop a deploy before anything
is written.

Standard library only. Runs on the controller (the action ``llm_server_prepare``, through ``_deploy_prepare``), on
the results of ``gpu_info``, ``gguf_info`` and ``moe_offload_plan``.
"""

from __future__ import annotations

import json
import re

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._role_variables import check_placement

FORCE = "llm_server_moe_offload_force=true"


class PlacementRefused(Exception):
    """The deploy must stop before anything changes; ``str()`` says why and what to change."""


def missing_gpus(gpu_info, chosen):
    """The chosen GPUs (``llm_server_gpu_devices``) the host does not have; none on a host without GPU."""
    gpu_info = gpu_info or {}
    if (gpu_info.get("topology") or "cpu") == "cpu":
        return []
    indices = [g.get("index") for g in gpu_info.get("gpus") or []]
    return [int(c) for c in chosen or [] if int(c) not in indices]


def device_overrides(items):
    """The plan's device overrides as ``PATTERN=DEVICE`` strings (given as strings or ``{pattern, device}``)."""
    out = []
    for item in items or []:
        if isinstance(item, dict):
            item = "%s=%s" % (item.get("pattern", ""), item.get("device") or item.get("buffer_type", ""))
        out.append(str(item))
    return out


def training_context(model):
    """The model's training context (``<arch>.context_length``) from gguf_info's result, None when not given."""
    if model.get("context_length"):
        return model["context_length"]
    metadata = (model.get("model") or {}).get("metadata") or {}
    value = metadata.get("%s.context_length" % model.get("architecture"))
    return value if isinstance(value, int) and value > 0 else None


def _tensors(check):
    """The routed-expert tensors a pattern check says the pattern moves (``tensors``, or ``matched`` as a list)."""
    for key in ("tensors", "matched"):
        if isinstance(check.get(key), list):
            return list(check[key])
    return []


def _matching(pattern, names):
    regex = re.compile(pattern)
    return sorted(n for n in names if regex.search(n))


def _uuids(gpu_info, devices):
    """The UUIDs of the GPUs ``devices`` (nvidia-smi indices); ``[]`` when one of them has none."""
    by_index = {g.get("index"): g.get("uuid") for g in (gpu_info or {}).get("gpus") or []}
    uuids = [by_index.get(d) for d in devices]
    return uuids if all(uuids) else []


def place(settings, model, plan, gpu_info, missing_gpus=(), host="?"):
    """The placement: ``pattern``, ``pattern_source`` (inventory, plan, model or none), ``device_overrides``
    (device overrides before the CPU pattern), ``expected_tensors`` (what the log must show moved),
    ``gpu_devices``, ``tensor_split``, ``n_gpu_layers`` (llama-server's ``-ngl``: the plan's count when it keeps
    fewer layers on the GPUs, else ``llm_server_n_gpu_layers``), ``topology``. ``PlacementRefused`` with the
    reason otherwise.

    ``plan`` is the registered result of ``moe_offload_plan`` (``None`` or skipped when it did not run, as when a
    chosen GPU is missing).
    """
    topology = (gpu_info or {}).get("topology") or "cpu"
    mode = settings["moe_offload_mode"]
    force = settings["moe_offload_force"]
    user_pattern = settings["moe_offload_pattern"]
    host_indices = [g.get("index") for g in (gpu_info or {}).get("gpus") or []]
    if missing_gpus:
        raise PlacementRefused(
            "llm_server: llm_server_gpu_devices %s names GPUs that %s does not have (nvidia-smi indices: %s). "
            "Nothing was changed." % (json.dumps(list(settings["gpu_devices"])), host, json.dumps(host_indices)))
    planned = bool(plan) and not plan.get("skipped")
    if planned and plan.get("fits") is False and (not force or (mode == "layers" and not user_pattern)):
        raise PlacementRefused(
            "llm_server: the plan does not fit %s's %s: %s Nothing was changed; lower llm_server_ctx_size / "
            "llm_server_parallel, change llm_server_moe_offload_mode, or set %s%s."
            % (host, "memory" if topology == "cpu" else "GPUs", plan.get("reason") or plan.get("msg"), FORCE,
               " with llm_server_moe_offload_pattern" if mode == "layers" else ""))
    if topology == "cpu" and not planned and mode == "layers" and not user_pattern:
        raise PlacementRefused(
            "llm_server: llm_server_moe_offload_mode=layers needs the plan, which did not run on %s. "
            "Give llm_server_moe_offload_pattern instead." % host)
    plan_ok = planned and not plan.get("failed")
    names_experts = list(model.get("expert_tensors") or [])
    if user_pattern:
        pattern, source = user_pattern, "inventory"
        check = (plan or {}).get("pattern_check") or model.get("pattern_check") or {}
        matched = _tensors(check)
        non_expert = [n.get("tensor") for n in check.get("non_expert") or []]
        if (not matched or non_expert) and not force:
            raise PlacementRefused(
                "llm_server: refused inventory pattern %s for %s: %s. %sNothing was changed; set %s to deploy it "
                "anyway." % (json.dumps(pattern), settings["model_path"], check.get("verdict", "it was not checked"),
                             "The pattern matched no tensors. " if not matched else "", FORCE))
        expected = sorted(matched + non_expert)
    elif plan_ok and "pattern" in plan:
        pattern, source = plan.get("pattern") or "", "plan"
        expected = (_tensors(plan.get("pattern_check") or {}) or _matching(pattern, names_experts)) if pattern else []
    elif mode != "none":
        pattern, source = model.get("offload_pattern") or "", "model"
        expected = list(model.get("offload_pattern_matches") or [])
    else:
        pattern, source, expected = "", "none", []
    if not pattern:
        source = "none" if source != "inventory" else source
    overrides = device_overrides((plan or {}).get("device_overrides")) if plan_ok else []
    ctx_limit = training_context(model) or (plan or {}).get("n_ctx_train")
    problems = check_placement(pattern, source, overrides, settings["ctx_size"], ctx_limit)
    if problems:
        raise PlacementRefused("llm_server: %s. Nothing was changed." % "; ".join("%s: %s" % p for p in problems))
    if plan_ok and plan.get("gpu_devices") is not None:
        devices = list(plan["gpu_devices"])
    elif settings["gpu_devices"]:
        devices = list(settings["gpu_devices"])
    else:
        devices = host_indices
    return {
        "pattern": pattern,
        "pattern_source": source,
        "device_overrides": overrides,
        "expected_tensors": expected,
        "gpu_devices": devices if topology != "cpu" else [],
        # the same GPUs by UUID, which the compose file names them by (_deploy_render.gpu_names)
        "gpu_uuids": _uuids(gpu_info, devices) if topology != "cpu" else [],
        "tensor_split": (plan or {}).get("tensor_split") or "" if plan_ok else "",
        "n_gpu_layers": (str(plan["n_gpu_layers"]) if plan_ok and plan.get("n_gpu_layers") is not None
                         else settings["n_gpu_layers"]),
        "topology": topology,
    }
