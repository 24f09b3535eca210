"""The compute buffer of a host without GPU (``cpu_compute_bytes``) against the real llama-server.

The figures are llama-server b10435 (scripts/llama-cpp.sh, CPU backend) at ``-lv 4 -ngl 0``: the line
``sched_reserve:        CPU compute buffer size =     1.77 MiB`` for the tiny Nemotron-H MoE models of
tools/gguf_models.py (model A: the defaults; model B: n_embd 128, n_ff_exp 64, 16 experts, 4 used; model C:
n_embd 64, n_ff_exp 512, 16 experts, 8 used, where the routed experts' matrices are the biggest node), with
``-c CTX -np PARALLEL -ub UBATCH -b BATCH -fa on|off``. The estimate is what the role verifies the server
against (a logged buffer above it fails the deploy), so it must never be under, and it stays within 1 MiB of it
(llama.cpp prints two decimals).
"""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _compute_buffers as cbuf
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _memory_estimate as mest
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _model_facts as mfacts
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import Options
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._gguf import read_model
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._tensor_classes import classify_model
from tools.gguf_models import write_tiny_nemotron_h_moe

MIB = 1 << 20
MODELS = {"A": {}, "B": {"n_embd": 128, "n_ff_exp": 64, "n_expert": 16, "n_expert_used": 4},
          "C": {"n_embd": 64, "n_ff_exp": 512, "n_expert": 16, "n_expert_used": 8}}


@pytest.fixture(scope="module")
def facts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cpu-compute")
    found = {}
    for label, shape in MODELS.items():
        model = read_model(write_tiny_nemotron_h_moe(str(folder / (label + ".gguf")), **shape))
        found[label] = mfacts.model_facts(model.metadata, model.tensors,
                                      classify_model(model.architecture, model.metadata, model.tensors))
    return found


# model, -c, -np, -ub, -b, -fa on, the CPU compute buffer llama-server logged (MiB)
MEASURED = [
    ("A", 512, 1, 512, 2048, True, 1.77),
    ("A", 4096, 1, 512, 2048, True, 5.27),
    ("A", 4096, 1, 512, 2048, False, 40.63),
    ("A", 1024, 2, 256, 256, True, 0.89),
    ("A", 256, 1, 32, 32, False, 0.20),
    ("A", 2048, 4, 512, 512, False, 5.63),
    ("A", 1536, 3, 100, 300, True, 0.36),
    ("B", 512, 1, 512, 2048, True, 2.85),
    ("B", 4096, 1, 512, 2048, True, 6.35),
    ("B", 4096, 1, 512, 2048, False, 41.26),
    ("B", 1024, 2, 256, 256, True, 1.43),
    ("B", 256, 1, 32, 32, False, 0.23),
    ("B", 2048, 4, 512, 512, False, 6.26),
    ("B", 1536, 3, 100, 300, True, 0.57),
    ("C", 512, 1, 512, 2048, True, 9.98),
    ("C", 4096, 1, 512, 2048, True, 13.48),
    ("C", 1024, 2, 256, 256, True, 4.99),
]


@pytest.mark.parametrize("model, ctx, parallel, ubatch, batch, flash_attn, logged", MEASURED)
def test_the_cpu_compute_estimate_is_never_under_the_server_and_within_1_mib(
        facts, model, ctx, parallel, ubatch, batch, flash_attn, logged):
    estimate = cbuf.cpu_compute_bytes(facts[model], Options(ctx, parallel, ubatch=ubatch, batch=batch, flash_attn=flash_attn)) / MIB
    assert logged - 0.005 <= estimate <= logged + 1.0, (estimate, logged)


@pytest.mark.parametrize("model", ["A", "B"])
def test_the_defaults_are_llama_server_s_one_slot_ubatch_512_batch_2048_flash_attention_on(facts, model):
    """Called with the context only, the estimate is that of ``-np 1 -ub 512 -b 2048 -fa on`` and covers what the
    server logged for it; with flash attention off the KQ matrix is materialized and the buffer grows."""
    explicit = cbuf.cpu_compute_bytes(facts[model], Options(4096, 1, ubatch=512, batch=2048, flash_attn=True))
    assert cbuf.cpu_compute_bytes(facts[model], Options(4096)) == explicit
    logged = {"A": 5.27, "B": 6.35}[model]
    assert logged - 0.005 <= explicit / MIB <= logged + 1.0
    assert cbuf.cpu_compute_bytes(facts[model], Options(4096, flash_attn=False)) / MIB > 40.0  # 40.63 / 41.26 logged


def test_the_host_estimate_carries_the_cpu_compute_buffer(facts):
    """``estimate`` on a host without GPU (no device) puts this buffer in ``host.compute``."""
    result = mest.estimate(facts["A"], Options(4096, 1, flash_attn=True), n_devices=0)
    assert result["host"]["compute"] == cbuf.cpu_compute_bytes(facts["A"], Options(4096, 1, ubatch=512, flash_attn=True))
