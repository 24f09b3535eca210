"""The bounded fuzz campaigns of benchmarks/fuzz.py, run with hypothesis: every registered target (the GGUF reader,
the llama-server log parser, the offload pattern builder, the role's .env and compose encoders) on a few hundred
drawn inputs raises nothing but its documented errors, keeps its invariants, and stays within its time and memory bounds per input.
The long campaign (100,000 inputs and more per target) is ``python benchmarks/fuzz.py``."""
from __future__ import annotations

import random

import pytest

from benchmarks import fuzz


@pytest.mark.parametrize("name", sorted(fuzz.TARGETS))
def test_bounded_fuzz_campaign(name):
    target = fuzz.TARGETS[name]
    report = fuzz.hypothesis_campaign(target, target.ci_inputs, seed=20260530)
    assert report.inputs == target.ci_inputs
    assert report.failures == {}, report.failures
    assert report.slow == [] and report.big == [], (report.slow, report.big)


def test_a_failure_is_counted_not_raised_and_the_campaign_goes_on():
    """The campaign itself: an exception that is not allowed, and a broken invariant, are distinct failures."""
    def run(_context, drawn):
        if drawn % 3 == 0:
            raise KeyError(drawn)
        if drawn % 3 == 1:
            raise fuzz.Broken("odd")

    target = fuzz.Target("demo", lambda rnd: rnd.randrange(1000), run, allowed=(ValueError,))
    report = fuzz.campaign(target, 60, seed=1, memory="all")
    keys = set(report.failures)
    assert report.inputs == 60 and len(keys) == 2 and "broken: odd" in keys
    assert any(k.startswith("KeyError at test_fuzz_campaigns.py:") for k in keys)
    drawn = [random.Random(2 ** 32 + i).randrange(1000) for i in range(60)]
    assert sum(f["count"] for f in report.failures.values()) == sum(1 for d in drawn if d % 3 != 2)
    assert not report.ok()
