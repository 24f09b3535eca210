"""The speed check against a real llama-server on a generated tiny GGUF (with ``--api-key``: the benchmark sends
the key as ``Authorization: Bearer``), the medians of its timings, the ratios and the gate's message."""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._speed_check import (
    SpeedError,
    gate_problem,
    measure,
    post_json,
    prompt_ids,
    summary,
    timings_of,
    with_previous,
)
from tests.helpers.llama_server import SERVER, llama_server
from tools.gguf_models import write_tiny_qwen3moe

KEY = "speed-check-key"
needs_server = pytest.mark.skipif(SERVER is None, reason="llama-server is not on PATH (source scripts/env.sh)")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = write_tiny_qwen3moe(tmp_path_factory.mktemp("speed") / "model.gguf")
    with llama_server(["-m", model, "-c", "256", "-ngl", "0", "-t", "1", "--no-webui", "--api-key", KEY],
                      120) as running:
        assert running.healthy, running.stderr
        yield running


@needs_server
def test_the_benchmark_measures_what_the_server_counted(server):
    speed = measure(server.url, 8, 4, 3, api_key=KEY)
    assert set(speed) == {"decode_tokens_per_second", "prompt_tokens_per_second", "runs", "prompt_tokens",
                          "predicted_tokens"}
    # ignore_eos: every run generates n_predict tokens; cache_prompt false: the whole prompt of 8 ids is processed.
    assert (speed["runs"], speed["prompt_tokens"], speed["predicted_tokens"]) == (3, 8, 4)
    for key in ("decode_tokens_per_second", "prompt_tokens_per_second"):
        assert isinstance(speed[key], float) and speed[key] > 0


@needs_server
def test_the_prompt_is_exactly_the_asked_number_of_token_ids(server):
    ids = prompt_ids(server.url, 13, api_key=KEY)
    assert len(ids) == 13 and all(isinstance(i, int) for i in ids)
    answer = post_json(server.url, "/tokenize", {"content": "x"}, KEY)
    assert isinstance(answer["tokens"], list)


@needs_server
def test_without_the_key_the_server_refuses_and_the_error_names_the_request(server):
    with pytest.raises(SpeedError, match=r"POST http://127\.0\.0\.1:\d+/tokenize answered 401"):
        measure(server.url, 8, 4, 1)


def test_nothing_listening_is_an_error_naming_the_url():
    with pytest.raises(SpeedError, match=r"POST http://127\.0\.0\.1:9/completion"):
        post_json("http://127.0.0.1:9", "/completion", {}, timeout=2)


def test_the_figures_are_the_medians_of_the_runs():
    samples = [(8, 100.0, 4, 10.0), (8, 300.0, 4, 30.0), (8, 200.0, 4, 20.0)]
    assert summary(samples) == {"decode_tokens_per_second": 20.0, "prompt_tokens_per_second": 200.0, "runs": 3,
                                "prompt_tokens": 8, "predicted_tokens": 4}


@pytest.mark.parametrize("timings, field", [(None, "no timings"), ({"prompt_n": 8}, "timings.prompt_per_second"),
                                            ({"prompt_n": True, "prompt_per_second": 1.0}, "timings.prompt_n")])
def test_an_answer_without_its_timings_is_an_error_naming_the_field(timings, field):
    with pytest.raises(SpeedError, match=field):
        timings_of({"timings": timings}, "POST x/completion")


def test_the_ratios_against_the_previous_speed_and_none_without_one():
    speed = {"decode_tokens_per_second": 12.3, "prompt_tokens_per_second": 50.0}
    previous = {"decode_tokens_per_second": 20.1, "prompt_tokens_per_second": 40.0}
    assert with_previous(speed, previous) == dict(speed, previous=previous, decode_ratio=0.612, prompt_ratio=1.25)
    assert with_previous(speed, None) == dict(speed, previous=None, decode_ratio=None, prompt_ratio=None)
    assert with_previous(speed, {"decode_tokens_per_second": None})["previous"] is None
    # a previous record's own history and calibration stay in that record: one level, however many deploys
    chained = with_previous(speed, dict(previous, runs=3, previous=previous, decode_ratio=0.5, calibration={"x": 1}))
    assert chained["previous"] == dict(previous, runs=3)


def test_the_gate_names_the_speed_the_share_and_the_variable():
    speed = with_previous({"decode_tokens_per_second": 12.3, "prompt_tokens_per_second": 50.0},
                          {"decode_tokens_per_second": 20.1, "prompt_tokens_per_second": 40.0})
    assert gate_problem(speed, 0.9, None) == ("decode 12.3 tokens/s is 0.61 of the previous 20.1, below "
                                              "llm_server_min_decode_ratio 0.9")
    assert gate_problem(speed, 0.6, 1.0) == ""
    assert gate_problem(speed, None, 1.3).startswith("prompt 50.0 tokens/s is 1.25 of the previous 40.0, below "
                                                     "llm_server_min_prompt_ratio 1.3")
    assert gate_problem(with_previous(speed, None), 1.0, 1.0) == ""
