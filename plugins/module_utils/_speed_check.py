# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The speed of what serves, measured through llama-server's own HTTP API, and the gate against the last
verified configuration's speed.

One fixed benchmark: a prompt of exactly ``prompt_tokens`` token ids (``POST /completion`` takes a list of token
ids as ``prompt``: tools/server/server-common.cpp, ``tokenize_mixed``), ``n_predict`` tokens, greedy (temperature
0, top_k 1), ``cache_prompt: false`` (every run processes the whole prompt) and ``ignore_eos: true`` (every run
generates ``n_predict`` tokens). One warm-up, then ``runs`` runs; the figures are the medians of the answers'
``timings.prompt_per_second`` and ``timings.predicted_per_second``, the server's own clock per request
(tools/server/server-task.cpp, ``result_timings::to_json``).

Standard library only, Python 3.9+; runs on the host (the module ``llm_server_verify``).
"""

from __future__ import annotations

import json
import statistics

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_container import http_request

# The text whose token ids, repeated, make the prompt; any text the model's vocabulary tokenizes will do.
PROMPT_TEXT = "The capital of France is Paris, and the capital of Italy is Rome."


class SpeedError(Exception):
    """The server did not answer the benchmark as llama-server does; the message says which request and why."""


def post_json(base_url, path, body, api_key="", timeout=600.0):
    """The JSON answer of ``POST base_url + path``; SpeedError unless it answers 200 with a JSON object."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    status, text = http_request("POST", base_url + path, json.dumps(body), headers, timeout)
    if status == -1:
        raise SpeedError("POST %s%s: %s" % (base_url, path, text))
    if status != 200:
        raise SpeedError("POST %s%s answered %d: %s" % (base_url, path, status, text[:200]))
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SpeedError("POST %s%s answered no JSON: %s" % (base_url, path, text[:200])) from exc
    if not isinstance(data, dict):
        raise SpeedError("POST %s%s answered %s, not a JSON object" % (base_url, path, type(data).__name__))
    return data


def prompt_ids(base_url, count, api_key="", timeout=60.0):
    """``count`` token ids: those of PROMPT_TEXT (``POST /tokenize``, without special tokens), repeated."""
    tokens = post_json(base_url, "/tokenize", {"content": PROMPT_TEXT, "add_special": False}, api_key,
                       timeout).get("tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, int) for t in tokens):
        raise SpeedError("POST %s/tokenize answered no token ids: %r" % (base_url, tokens))
    return [tokens[i % len(tokens)] for i in range(count)]


def completion_body(prompt, predict_tokens):
    """The benchmark's ``/completion`` request for the token ids ``prompt``."""
    return {"prompt": prompt, "n_predict": predict_tokens, "temperature": 0, "top_k": 1, "seed": 0,
            "cache_prompt": False, "ignore_eos": True, "stream": False}


def timings_of(answer, where):
    """``(prompt_n, prompt_per_second, predicted_n, predicted_per_second)`` of one ``/completion`` answer."""
    timings = answer.get("timings")
    if not isinstance(timings, dict):
        raise SpeedError("%s answered no timings" % where)
    values = []
    for key in ("prompt_n", "prompt_per_second", "predicted_n", "predicted_per_second"):
        value = timings.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpeedError("%s answered timings.%s = %r, not a number" % (where, key, value))
        values.append(value)
    return tuple(values)


# The keys of one measurement (``summary``): what ``previous`` keeps of the last verified speed, so that a record
# holds one level of history, never its own chain
MEASURED_KEYS = ("decode_tokens_per_second", "prompt_tokens_per_second", "runs", "prompt_tokens", "predicted_tokens")


def summary(samples):
    """The medians of ``(prompt_n, prompt_per_second, predicted_n, predicted_per_second)`` samples."""
    return {
        "decode_tokens_per_second": round(statistics.median(s[3] for s in samples), 3),
        "prompt_tokens_per_second": round(statistics.median(s[1] for s in samples), 3),
        "runs": len(samples),
        "prompt_tokens": int(statistics.median(s[0] for s in samples)),
        "predicted_tokens": int(statistics.median(s[2] for s in samples)),
    }


def measure(base_url, prompt_tokens, predict_tokens, runs, api_key="", timeout=600.0):
    """The benchmark: one warm-up, then ``runs`` runs; their medians (``summary``)."""
    body = completion_body(prompt_ids(base_url, prompt_tokens, api_key), predict_tokens)
    where = "POST %s/completion" % base_url
    post_json(base_url, "/completion", body, api_key, timeout)
    return summary([timings_of(post_json(base_url, "/completion", body, api_key, timeout), where)
                    for _run in range(runs)])


def ratio(now, before):
    """``now / before`` rounded to 3 places; None without a positive ``before``."""
    if not isinstance(before, (int, float)) or isinstance(before, bool) or before <= 0 or now is None:
        return None
    return round(now / before, 3)


def with_previous(speed, previous):
    """``speed`` with ``previous`` (the measured figures of the last verified configuration's speed, its
    ``MEASURED_KEYS``, or None) and the two ratios."""
    previous = dict((k, previous[k]) for k in MEASURED_KEYS if k in previous) \
        if isinstance(previous, dict) and previous.get("decode_tokens_per_second") else None
    before = previous or {}
    return dict(speed, previous=previous,
                decode_ratio=ratio(speed.get("decode_tokens_per_second"), before.get("decode_tokens_per_second")),
                prompt_ratio=ratio(speed.get("prompt_tokens_per_second"), before.get("prompt_tokens_per_second")))


def gate_problem(speed, min_decode_ratio=None, min_prompt_ratio=None):
    """Why ``speed`` (with its ratios) is below a minimum share of the previous speed, or "" when it is not."""
    problems = []
    for key, minimum in (("decode", min_decode_ratio), ("prompt", min_prompt_ratio)):
        share = (speed or {}).get(key + "_ratio")
        if minimum is None or share is None or share >= minimum:
            continue
        problems.append("%s %.1f tokens/s is %.2f of the previous %.1f, below llm_server_min_%s_ratio %s" % (
            key, speed[key + "_tokens_per_second"], share, speed["previous"][key + "_tokens_per_second"],
            key, minimum))
    return "; ".join(problems)
