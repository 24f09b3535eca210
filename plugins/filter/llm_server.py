# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the llm_server role: the decisions it takes on what its phases registered. The logic lives in
``plugins/module_utils/_deploy_*.py`` (unit-tested there); these are the names the role's tasks use."""

from __future__ import annotations

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_converge import (
    decide,
    failure_cause,
    verification_problem,
    vram_rows,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_placement import missing_gpus
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_result import build


def llm_server_missing_gpus(gpu_info, chosen=None):
    """The chosen GPUs (llm_server_gpu_devices) the host does not have."""
    return missing_gpus(gpu_info, chosen or [])


def llm_server_converge(service, config, key_changed=False, verify_always=False, container_name="ai-llm"):
    """Whether ai-llm must be recreated, verified or waited for, and why."""
    return decide(service or {}, config or {}, bool(key_changed), bool(verify_always), container_name)


def llm_server_vram_rows(devices, baseline, after, plan_memory, tolerance_mib=1024):
    """Per GPU: the memory ai-llm took against the plan."""
    return vram_rows(devices, baseline, after, plan_memory, tolerance_mib)


def llm_server_verify_problem(log, pattern="", vram=None, parity=None, tolerance_mib=0, seed=None):
    """Why the recreated server does not prove the deploy, ``""`` when it does."""
    return verification_problem(log, pattern, vram, parity, tolerance_mib, seed)


def llm_server_failure(failed, failed_task=None):
    """The cause of a failed task in one line; of a list of registered results, the first that failed (``""``
    when none did)."""
    if isinstance(failed, list):
        for result in failed:
            if isinstance(result, dict) and result.get("failed"):
                return failure_cause(result)
        return ""
    return failure_cause(failed, failed_task)


def llm_server_result(parts):
    """``llm_server_result`` from what the phases registered."""
    return build(parts)


class FilterModule:
    def filters(self):
        return {
            "llm_server_missing_gpus": llm_server_missing_gpus,
            "llm_server_converge": llm_server_converge,
            "llm_server_vram_rows": llm_server_vram_rows,
            "llm_server_verify_problem": llm_server_verify_problem,
            "llm_server_failure": llm_server_failure,
            "llm_server_result": llm_server_result,
        }
