# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The options of ``moe_offload_plan`` and one call of the planner with them.

The module runs it on the host; its action plugin runs the same code on the controller when the model comes as a
``gguf_info`` result (nothing on the host is read then). Standard library only, Python >= 3.9.
"""

from __future__ import annotations

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import CACHE_TYPES, OFFLOAD_MODES
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_plan import plan
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_inputs import PlanError, load_facts, normalize_gpus
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import (
    DEFAULT_HOST_MARGIN_MIB, DEFAULT_MARGIN_MIB, GOALS, Options)

ARGUMENT_SPEC = dict(
    gguf=dict(type="raw", required=True),
    gpus=dict(type="raw", required=True),
    gpu_devices=dict(type="list", elements="int"),
    host=dict(type="raw"),
    ctx_size=dict(type="int", required=True),
    parallel=dict(type="int", default=1),
    cache_type_k=dict(type="str", default="f16", choices=sorted(CACHE_TYPES)),
    cache_type_v=dict(type="str", default="f16", choices=sorted(CACHE_TYPES)),
    margin_mib=dict(type="int", default=DEFAULT_MARGIN_MIB),
    host_margin_mib=dict(type="int", default=DEFAULT_HOST_MARGIN_MIB),
    mode=dict(type="str", default="auto", choices=list(OFFLOAD_MODES)),
    cpu_expert_layers=dict(type="raw"),
    pattern=dict(type="str"),
    gpu_index=dict(type="int"),
    split=dict(type="raw"),
    experts_per_gpu=dict(type="bool", default=True),
    ubatch=dict(type="int", default=512),
    flash_attn=dict(type="str", default="auto", choices=["on", "off", "auto"]),
    kv_unified=dict(type="bool", default=False),
    swa_full=dict(type="bool", default=False),
    mmap=dict(type="bool", default=True),
    op_offload=dict(type="bool", default=True),
    n_gpu_layers=dict(type="int"),
    goal=dict(type="str", default="fit", choices=list(GOALS)),
    gpu_bytes_per_second=dict(type="dict"),
    host_bytes_per_second=dict(type="float"),
    gpu_flops_per_second=dict(type="dict"),
    host_flops_per_second=dict(type="float"),
    pcie_bytes_per_second=dict(type="float"),
    calibration=dict(type="dict"),
    cuda_context=dict(type="list", elements="dict"),
)
MUTUALLY_EXCLUSIVE = [("gpu_index", "gpu_devices")]

# What a failed plan returns besides msg.
FAILURE_KEYS = ("memory", "fits", "headroom", "reason", "pattern_check", "kv_cache")


def model_in_hand(gguf):
    """Whether ``gguf`` is a ``gguf_info`` result that holds the model's summary: planned without reading a file."""
    return isinstance(gguf, dict) and (isinstance(gguf.get("model"), dict) or ("tensors" in gguf and "version" in gguf))


def plan_inputs(params):
    """``(facts, gpus, host, options)`` of the planner for validated ``params`` (the module's options);
    ``PlanError`` when they cannot be planned."""
    params = dict(params)
    gguf, gpus, host = params.pop("gguf"), params.pop("gpus"), params.pop("host", None)
    layers = params.get("cpu_expert_layers")
    if isinstance(layers, str) and layers.strip().isdigit():
        params["cpu_expert_layers"] = int(layers)
    elif isinstance(layers, list):
        try:
            params["cpu_expert_layers"] = [int(b) for b in layers]
        except (TypeError, ValueError):
            raise PlanError("cpu_expert_layers must be a count or a list of block indices, got %r"
                            % (layers,)) from None
    return load_facts(gguf), gpus, host, Options(**params)


def run(params):
    """``(result, warnings)`` of the planner for validated ``params`` (the module's options); ``result`` has
    ``failed`` and ``msg`` when the input cannot be planned or the plan does not fit."""
    try:
        inputs = plan_inputs(params)
        result = plan(*inputs)
    except PlanError as exc:
        failed = dict((k, v) for k, v in exc.details.items() if k in FAILURE_KEYS)
        failed.update(failed=True, msg=str(exc))
        return failed, list(exc.details.get("warnings", []))
    with_context(result, inputs[1], inputs[3])
    return result, result.pop("warnings")


def with_context(result, gpus, options):
    """The CUDA context the plan took off each of its devices' free memory, in ``result["devices"]``:
    ``cuda_context_mib`` and ``cuda_context_source`` (measured, table, assumed; 0 and ``""`` off CUDA)."""
    known = dict((g.index, g) for g in normalize_gpus(gpus, options.gpu_devices, options))
    for device in result.get("devices") or []:
        gpu = known.get(device.get("index"))
        device["cuda_context_mib"] = gpu.context_mib if gpu else 0
        device["cuda_context_source"] = gpu.context_source if gpu else ""
