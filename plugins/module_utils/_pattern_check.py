# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a given ``--override-tensor`` pattern (a user's, or one built here) moves of a model: the routed experts it
matches and misses, the other tensors it would move too (by class), and a verdict in words.

Standard library only: this runs on target hosts. The pattern is read as llama.cpp reads it (``_pattern_syntax``:
``pattern_problem`` says whether it can be deployed, ``matcher`` what ``std::regex_search`` finds).
"""

from __future__ import annotations

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._pattern_syntax import matcher, pattern_problem


def check_pattern(pattern, all_names, expert_names, tensor_class):
    """What a user's pattern would move: ``ok``, ``matched``, ``missed``, ``non_expert``, ``verdict``.

    ``non_expert`` lists ``{"tensor": name, "class": class}`` for every non-expert tensor it would move.
    Never raises for a bad pattern: ``ok`` is false and ``verdict`` says why.
    """
    names = set(all_names) | set(expert_names)
    experts = set(expert_names)
    result = {"pattern": pattern, "ok": False, "matched": [], "missed": sorted(experts), "non_expert": []}
    problem = pattern_problem(pattern) if pattern else "the pattern is empty"
    if problem:
        result["verdict"] = f"unusable: {problem}"
        return result
    found = matcher(pattern)
    moved = {n for n in names if found(n)}
    result["matched"] = sorted(moved & experts)
    result["missed"] = sorted(experts - moved)
    result["non_expert"] = [{"tensor": n, "class": tensor_class.get(n, "other")} for n in sorted(moved - experts)]
    result["ok"] = not result["missed"] and not result["non_expert"]
    result["verdict"] = _verdict(result, len(experts))
    return result


def _verdict(result, n_experts):
    if not n_experts:
        if not result["non_expert"]:
            return "ok: the model has no routed experts and the pattern moves nothing"
        return f"wrong: the model has no routed experts, yet the pattern moves {_describe(result['non_expert'])}"
    if result["ok"]:
        return f"ok: moves exactly the {n_experts} routed-expert tensors and nothing else"
    problems = []
    if result["missed"]:
        problems.append(f"misses {len(result['missed'])} of the {n_experts} routed-expert tensors "
                        f"(e.g. {result['missed'][0]})")
    if result["non_expert"]:
        problems.append(f"also moves {_describe(result['non_expert'])}")
    return "wrong: " + "; ".join(problems)


def _describe(non_expert):
    counts = {}
    for item in non_expert:
        counts[item["class"]] = counts.get(item["class"], 0) + 1
    parts = [f"{n} {cls.replace('_', ' ')}" for cls, n in sorted(counts.items())]
    return f"{len(non_expert)} non-expert tensor(s): {', '.join(parts)} (e.g. {non_expert[0]['tensor']})"
