"""A placement, sized (``_plan_placement``): what fits on the GPUs and the host, and the candidate placements in
the order they are preferred, on the small MoE model of exact sizes (tests/helpers/plans.py)."""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _common as common
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_inputs import PlanError
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_placement import Sizer, placements
from tests.helpers.plans import need, plan_gpu, sizer

SHARES = "split must give one share >= 0 per GPU (2 GPUs), got %r"
TWO = [plan_gpu(1, 0), plan_gpu(1, 1)]


def test_fits_is_free_after_at_least_zero_on_every_gpu_and_the_host_and_free_after_free_minus_total(moe):
    fits = Sizer.gpu_fits
    assert fits({"gpus": [{"free_after": 0}, {"free_after": 5}]}) is True
    assert fits({"gpus": [{"free_after": 5}, {"free_after": -1}]}) is False
    assert fits({"gpus": []}) is True
    host_fits = Sizer.host_fits
    assert [host_fits({"host": {"free_after": v}}) for v in (None, 0, 1, -1)] == [True, True, True, False]
    # On the GPU and on the host; block 0 holds no routed experts, so naming it moves nothing.
    result = sizer(moe, need(moe, [2]) / common.MIB + 3).estimate([2])
    assert result["gpus"][0]["free_after"] == 3 * common.MIB and result["gpus"][0]["free_after_mib"] == 3.0
    host_total = sizer(moe, 100000).estimate([1, 2, 3])["host"]["total"]
    for short, fits in ((0, True), (1, False)):
        host = sizer(moe, 100000, (host_total - short) / common.MIB)
        result = host.estimate([1, 2, 3])
        assert result["host"]["free_after"] == -short and host.fits(result) is fits
        assert result["host"]["available_mib"] == (host_total - short) / common.MIB
    unchecked = sizer(moe, 100000).estimate([])
    assert unchecked["host"]["free_after"] is None and unchecked["host"]["free_after_mib"] is None
    assert unchecked["host"]["available_mib"] is None
    assert sizer(moe, 100).estimate([0], {0: 0}) == sizer(moe, 100).estimate([])


def test_placements_in_the_order_they_are_preferred():
    a, b = plan_gpu(1000, 0), plan_gpu(3000, 1)
    assert placements([], None, None) == [("cpu", [], None)]
    assert placements([a], None, None) == [("single", [a], None)]
    assert placements([a, b], None, None) == [("single", [b], None), ("split", [a, b], [1000, 3000])]
    assert placements([a, b], None, "none") == [("single", [b], None)]
    assert placements([a, b], None, "auto") == [("split", [a, b], [1000, 3000])]
    assert placements([a, b], None, [1, 0]) == [("split", [a, b], [1, 0])]
    assert placements([a, b], 0, None) == [("single", [a], None)]
    assert placements([a, b], 0, "none") == [("single", [a], None)]


@pytest.mark.parametrize("gpus, index, split, message", [
    ([], 0, None, "gpu_index 0 is not among the GPUs (none: a CPU host)"),
    ([plan_gpu(1, 0), plan_gpu(1, 2)], 1, None, "gpu_index 1 is not among the GPUs (0, 2)"),
    (TWO, 0, "auto", "give either gpu_index (serve from one GPU) or split (spread over all), not both"),
    (TWO, None, [1], SHARES % [1]), (TWO, None, [1, -1], SHARES % [1, -1]), (TWO, None, [0, 0], SHARES % [0, 0]),
    (TWO, None, [True, 1], SHARES % [True, 1]),
    (TWO, None, "even", "split must be auto, none or a list of shares, got 'even'"),
])
def test_placement_errors(gpus, index, split, message):
    with pytest.raises(PlanError) as info:
        placements(gpus, index, split)
    assert str(info.value) == message
