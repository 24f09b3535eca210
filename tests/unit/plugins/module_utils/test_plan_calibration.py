"""The calibration of the speed model from a measured speed (``_plan_calibration``): speeds made from known
bandwidths and split costs at the speed check's shape give those figures back, and a later plan with them is
calibrated."""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_plan import plan
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_calibration import answer_terms, calibration
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_inputs import PlanError
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import Options
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._speed_model import speed_terms
from tests.helpers.plans import SIZING, gpu


def test_a_calibration_from_a_measured_speed_gives_back_the_host_bandwidth_it_was_measured_at(moe):
    """A speed made from a host of 25 GB/s at the speed check's shape (64 prompt tokens, 32 generated: the cache
    holds 64 + 16 tokens on average): ``calibration`` solves 25 GB/s, and the next plan with it is calibrated."""
    options = Options(4096, mode="all", **SIZING)
    answer = plan(moe, [gpu(100, name="NVIDIA H200")], None, options)
    cpu = [n for b in (1, 2, 3) for n in moe.expert_tensors_by_block[b]]
    terms = speed_terms(moe, options, cpu, None, 1, None, 64 + 16, 64)
    rate = 1 / (terms.decode_gpu_bytes[0] / 4800e9 + terms.decode_host_bytes / 25e9 + terms.decode_splits * 100e-6)
    solved = calibration(moe, answer, options, {"decode_tokens_per_second": rate, "prompt_tokens": 64,
                                                "predicted_tokens": 32, "prompt_tokens_per_second": 900.0})
    assert solved["host_bytes_per_second"] == pytest.approx(25e9, rel=1e-6) and "split_seconds" not in solved
    assert solved["measured"]["cpu_expert_layers"] == [1, 2, 3] and solved["measured"]["prompt_tokens"] == 64
    again = plan(moe, [gpu(100, name="NVIDIA H200")], None, Options(4096, mode="all", calibration=solved, **SIZING))
    assert again["speed"]["calibrated"] is True and "(calibrated)" in again["speed"]["from"]
    with pytest.raises(PlanError, match="cannot calibrate"):
        calibration(moe, answer, options, {"decode_tokens_per_second": 1e9, "prompt_tokens": 64,
                                           "predicted_tokens": 32})


def test_a_calibration_from_two_placements_that_differ_in_splits_gives_back_the_split_cost_too(moe):
    """Speeds made from 25 GB/s and 300 us a split: every block's experts in host memory (10 splits) and none
    (4 splits), each at its own terms; ``calibration`` with the second as ``more`` solves both figures."""
    gpus = [gpu(100, name="NVIDIA H200")]
    every, none = Options(4096, mode="all", **SIZING), Options(4096, mode="none", **SIZING)
    measured = []
    for options in (every, none):
        answer = plan(moe, gpus, None, options)
        terms, _names = answer_terms(moe, answer, options, 64 + 16, 64)
        rate = 1 / (terms.decode_gpu_bytes[0] / 4800e9 + terms.decode_host_bytes / 25e9 + terms.decode_splits * 300e-6)
        measured.append((answer, options, {"decode_tokens_per_second": rate, "prompt_tokens": 64,
                                           "predicted_tokens": 32}))
        assert terms.decode_splits == (10 if options is every else 4)
    solved = calibration(moe, *measured[0], more=measured[1:])
    assert solved["host_bytes_per_second"] == pytest.approx(25e9, rel=1e-6)
    assert solved["split_seconds"] == pytest.approx(300e-6, rel=1e-6) and solved["measured"]["placements"] == 2
    with pytest.raises(PlanError, match="degenerate"):
        calibration(moe, *measured[0], more=measured[:1])
