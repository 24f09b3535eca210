# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The calibration of the planner's speed model from a speed measured on a deployed placement: the host's effective
bandwidth (and, from placements that differ in splits, the cost of a split), as a later plan's ``calibration``.

Standard library only: this runs on target hosts (Python >= 3.9). ``answer_terms`` gives the speed terms of a plan's
placement, ``calibration`` solves the figures with ``_speed_model.calibrate``.
"""

from __future__ import annotations

from dataclasses import replace

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_inputs import PlanError, normalize_host
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._speed_model import bandwidths, calibrate, speed_terms


def answer_terms(facts, answer, options, context_tokens=None, prompt_tokens=None):
    """``(SpeedTerms, GPU names)`` of the placement of ``answer`` (this planner's result for ``facts`` and
    ``options``) at ``context_tokens`` and ``prompt_tokens`` (``_speed_model.speed_terms``' defaults when None)."""
    names = [d["name"] for d in answer["devices"]]
    options = replace(options, n_gpu_layers=answer.get("n_gpu_layers", options.n_gpu_layers))
    positions = dict((d["index"], p) for p, d in enumerate(answer["devices"]))
    check = answer["pattern_check"]
    cpu = list(check["tensors"]) + list(check["non_expert"]) if answer["pattern"] else []
    device_tensors = dict((n, positions[o["gpu_index"]]) for o in answer["device_overrides"] for n in o["tensors"])
    shares = [float(x) for x in answer["tensor_split"].split(",")] if answer["tensor_split"] else None
    return speed_terms(facts, options, cpu, shares, len(names), device_tensors, context_tokens, prompt_tokens), names


def _measured_terms(facts, answer, options, measured):
    """``(terms, GPU names)`` of ``answer``'s placement at ``measured``'s context (the prompt and half the generated
    tokens, the mean a decoded token attends to) and prompt."""
    prompt, predicted = int(measured["prompt_tokens"]), int(measured["predicted_tokens"])
    return answer_terms(facts, answer, options, prompt + predicted // 2, prompt)


def calibration(facts, answer, options, measured, host=None, more=()):
    """The ``calibration`` input of a later plan, from the speed ``_speed_check`` measured (``measured``:
    ``decode_tokens_per_second``, ``prompt_tokens_per_second``, ``prompt_tokens``, ``predicted_tokens``) of the
    placement of ``answer`` (this planner's result for ``facts`` and ``options``; ``host``: ``host_info``'s result)
    and of the ``more`` placements (``(answer, options, measured)`` each, on the same host and model).

    Each placement's terms are taken at its measured context and prompt and ``_speed_model.calibrate`` solves the
    host's effective bandwidth (one measurement: the split cost and the overhead held, at ``options.calibration``'s
    when it has them; two placements that differ in splits: the split cost too), then the host's compute rate from
    the prompt figures. ``PlanError`` when the measurements cannot be used."""
    host_memory = normalize_host(host)
    probe = host_memory.bandwidth_bytes_per_second if host_memory else None
    try:
        rows = []
        for one_answer, one_options, one_measured in [(answer, options, measured)] + list(more):
            terms, names = _measured_terms(facts, one_answer, one_options, one_measured)
            rows.append((terms, one_measured["decode_tokens_per_second"],
                         one_measured.get("prompt_tokens_per_second"), bandwidths(names, one_options, probe)))
        rates = rows[0][3]
        solved = calibrate(rows, rates)
    except (KeyError, TypeError, ValueError) as exc:  # (SpeedModelError is a ValueError)
        raise PlanError("cannot calibrate on %r: %s" % (measured, exc)) from None
    held = {"split_seconds": (rates.sources["split"], rates.split_seconds),
            "token_seconds": (rates.sources["token"], rates.token_seconds),
            "host_flops_per_second": (rates.sources["host_flops"], rates.host_flops)}
    for key, (source, value) in held.items():
        if solved[key] is None and source == "calibrated":
            solved[key] = value
    solved = dict((k, v) for k, v in solved.items() if v is not None)
    prompt, predicted = int(measured["prompt_tokens"]), int(measured["predicted_tokens"])
    solved["measured"] = {"decode_tokens_per_second": measured["decode_tokens_per_second"],
                          "prompt_tokens_per_second": measured.get("prompt_tokens_per_second"),
                          "prompt_tokens": prompt, "predicted_tokens": predicted, "placement": answer["placement"],
                          "gpu_devices": list(answer["gpu_devices"]),
                          "cpu_expert_layers": list(answer["cpu_expert_layers"]), "ctx_size": options.ctx_size,
                          "parallel": options.parallel, "placements": 1 + len(more)}
    return solved
