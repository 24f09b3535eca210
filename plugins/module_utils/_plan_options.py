# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The options of one plan: the llama-server settings that change what it allocates, and the planner's choices.

One frozen ``Options`` is built once (by ``_plan_request``, the module, the action plugin or a caller) and passed
from the top down, as gguf-parser-go passes its estimate options: ``_offload_plan.plan(facts, gpus, host, options)``
reads the planner's choices, ``_memory_estimate.estimate(facts, options, ...)`` and the KV cache and compute
buffer functions read the server settings. Standard library only: this runs on target hosts (Python >= 3.9).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# Free memory kept per GPU beyond the CUDA context (which the plan counts apart: _cuda_context): llama.cpp's --fit
# keeps 1024 MiB by default (common/common.h fit_params_target) out of the free memory it reads once its own
# context exists (common/fit.cpp common_get_device_memory_data_impl).
DEFAULT_MARGIN_MIB = 1024
DEFAULT_HOST_MARGIN_MIB = 1024  # the server process itself on the host: binary, libraries, CUDA runtime
DEFAULT_BATCH = 2048  # llama-server's -b (common/common.h n_batch)
MAX_PARALLEL = 256  # the most slots the planner's headroom search tries
# What the planner keeps among the placements that fit: the fewest expert bytes in host memory, or the highest
# predicted decode speed.
GOALS = ("fit", "speed")
FLASH_ATTN_ON = (True, "on", "auto", "true", "enabled")  # llama.cpp's auto turns it on where the backend has it


@dataclass(frozen=True)
class Options:
    """What a plan is made for. Server settings: ``ctx_size`` to ``batch`` (llama-server's ``-c``, ``-np``,
    ``-ctk``, ``-ctv``, ``-ub``, ``-fa``, ``--kv-unified``, ``--swa-full``, ``--no-mmap``, ``--no-op-offload``,
    ``-b``; ``n_gpu_layers`` is ``-ngl``, ``None`` for every layer), the free memory kept per GPU and on the host,
    and the backend. Planner choices: ``mode`` and ``cpu_expert_layers`` (what moves to host memory), a user's
    ``pattern`` instead, the GPUs (``gpu_index``, ``gpu_devices``, ``split``), whether experts may go to another GPU
    (``experts_per_gpu``), llama.cpp's ``device_names`` of the GPUs in plan order and the ``goal`` among the
    placements that fit (``GOALS``). The speed
    model's rates (``_speed_model``): ``gpu_bytes_per_second`` (``{GPU name: bytes/s}``), ``host_bytes_per_second``,
    ``gpu_flops_per_second`` (``{GPU name: FLOP/s}``), ``host_flops_per_second``, ``pcie_bytes_per_second`` and a
    ``calibration`` (``{host_bytes_per_second, split_seconds, token_seconds, host_flops_per_second, measured}``).
    ``cuda_context``: the CUDA context measured on this host's GPUs (``_cuda_context.measure``), taken off their
    free memory before the margin; a GPU without a measurement counts its card's figure."""

    ctx_size: int
    parallel: int = 1
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    ubatch: int = 512
    flash_attn: str = "auto"
    kv_unified: bool = False
    swa_full: bool = False
    mmap: bool = True
    op_offload: bool = True
    margin_mib: int = DEFAULT_MARGIN_MIB
    host_margin_mib: int = DEFAULT_HOST_MARGIN_MIB
    backend: str = "cuda"
    batch: int = DEFAULT_BATCH
    n_gpu_layers: int | None = None
    mode: str = "auto"
    cpu_expert_layers: int | list | None = None
    pattern: str | None = None
    gpu_index: int | None = None
    gpu_devices: list | None = None
    split: str | list | None = None
    experts_per_gpu: bool = True
    device_names: list | None = None
    goal: str = "fit"
    gpu_bytes_per_second: dict | None = None
    host_bytes_per_second: float | None = None
    gpu_flops_per_second: dict | None = None
    host_flops_per_second: float | None = None
    pcie_bytes_per_second: float | None = None
    calibration: dict | None = None
    cuda_context: list | None = None

    @property
    def flash(self):
        """Whether llama.cpp runs flash attention (``flash_attn`` on or auto; ``True`` also counts)."""
        return self.flash_attn in FLASH_ATTN_ON

    def at(self, ctx_size=None, parallel=None):
        """The same options for another context or slot count (``None``: this one's)."""
        return replace(self, ctx_size=ctx_size or self.ctx_size, parallel=parallel or self.parallel)
