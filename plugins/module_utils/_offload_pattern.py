# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``--override-tensor`` pattern that moves exactly the routed experts: built, proved, checked.

Standard library only: this runs on target hosts.

llama.cpp splits ``-ot`` on ``,`` and then at the first ``=``, and matches with ECMAScript
``std::regex_search``. So every pattern built here

* holds neither ``,`` nor ``=``;
* uses only what Python ``re`` and ECMAScript read the same way: literals, ``\\.``, ``.``, ``*``,
  ``+``, ``?``, ``|``, groups ``( )``, digit classes such as ``[0-9]``, and the anchors ``^``/``$``;
* is tried with ``re.search`` against every tensor name of the model (all shards) and only
  returned when it matches exactly the wanted tensors.
"""

from __future__ import annotations

import re
import warnings

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import BLOCK_RE, block_index

# Readable, convention-based candidates, most readable first (the first one is llama.cpp's
# documented seed pattern).
CANONICAL_CANDIDATES = (
    r"\.ffn_.*_exps\.weight",
    r"\.ffn_.*_exps\.",
    r"\.ffn_.*_(ch)?exps\.weight",
    r"\.ffn_.*_(ch)?exps\.",
    r"_(ch)?exps\.",
)

_FORBIDDEN = {
    ",": "it contains ',' and llama.cpp splits --override-tensor on ',' (write ranges without {m,n})",
    "=": "it contains '=' and llama.cpp splits each item at the first '=' (give the pattern without '=CPU')",
}
# Python-only syntax that ECMAScript std::regex reads differently or rejects.
_PYTHON_ONLY = (
    ("(?<", "lookbehind and named groups are not ECMAScript std::regex syntax"),
    ("(?P", "named groups are not ECMAScript std::regex syntax"),
    ("(?#", "comments are not ECMAScript std::regex syntax"),
    ("\\A", "\\A is not ECMAScript std::regex syntax (use ^)"),
    ("\\Z", "\\Z is not ECMAScript std::regex syntax (use $)"),
)
_INLINE_FLAGS_RE = re.compile(r"\(\?[aiLmsux]")


class PatternError(Exception):
    """No pattern matches exactly the wanted tensors (or the inputs are inconsistent)."""


def pattern_problem(pattern):
    """Why ``pattern`` cannot be given to llama.cpp's ``-ot`` as is, or ``None`` when it can."""
    for char, reason in _FORBIDDEN.items():
        if char in pattern:
            return reason
    for token, reason in _PYTHON_ONLY:
        if token in pattern:
            return reason
    if _INLINE_FLAGS_RE.search(pattern):
        return "inline flags such as (?i) are not ECMAScript std::regex syntax"
    with warnings.catch_warnings():
        # Python warns (FutureWarning) where its reading of a pattern may change, e.g. "[[" (nested sets):
        # such a pattern is not one that Python and ECMAScript are sure to read alike.
        warnings.simplefilter("error")
        try:
            re.compile(pattern)
        except re.error as exc:
            return "it is not a valid regular expression: %s" % exc
        except (FutureWarning, DeprecationWarning) as exc:
            return "Python and ECMAScript may read it differently: %s" % exc
    return None


def _matching(pattern, names):
    regex = re.compile(pattern)
    return set(n for n in names if regex.search(n))


def _is_exact(pattern, names, wanted):
    return pattern_problem(pattern) is None and _matching(pattern, names) == wanted


def escape(text):
    """``text`` as a literal for both Python ``re`` and ECMAScript; ``,`` and ``=`` become ``.``."""
    out = []
    for char in text:
        if char in ",=":
            out.append(".")
        elif char.isalnum() or char in "_-:/ ":
            out.append(char)
        else:
            out.append("\\" + char)
    return "".join(out)


def _alternation(items):
    items = list(items)
    return items[0] if len(items) == 1 else "(" + "|".join(items) + ")"


def _digit_class(digits):
    """``{0,1,2,3,5}`` -> ``[0-35]``; one digit -> that digit."""
    digits = sorted(set(digits))
    if len(digits) == 1:
        return str(digits[0])
    runs = []
    for d in digits:
        if runs and d == runs[-1][1] + 1:
            runs[-1][1] = d
        else:
            runs.append([d, d])
    parts = []
    for lo, hi in runs:
        if hi - lo >= 2:
            parts.append("%d-%d" % (lo, hi))
        else:
            parts.append("".join(str(d) for d in range(lo, hi + 1)))
    return "[" + "".join(parts) + "]"


def _same_length_numbers(strings):
    """Alternatives (regex strings) matching exactly the given same-length digit strings."""
    if len(strings[0]) == 1:
        return [_digit_class(int(s) for s in strings)]
    last_by_prefix = {}
    for s in strings:
        last_by_prefix.setdefault(s[:-1], set()).add(int(s[-1]))
    # Prefixes sharing the same set of last digits compress together: 20..49 -> [2-4][0-9].
    prefixes_by_last = {}
    for prefix, last in last_by_prefix.items():
        prefixes_by_last.setdefault(_digit_class(last), []).append(prefix)
    result = []
    for last_class, prefixes in prefixes_by_last.items():
        for head in _same_length_numbers(sorted(prefixes)):
            result.append((min(prefixes), head + last_class))
    return [pair[1] for pair in sorted(result)]


def block_numbers_regex(blocks):
    """A regex (no anchors) matching exactly the decimal numbers in ``blocks``: {20..29} -> ``2[0-9]``."""
    by_length = {}
    for b in sorted(set(int(b) for b in blocks)):
        by_length.setdefault(len(str(b)), []).append(str(b))
    alternatives = []
    for length in sorted(by_length):
        alternatives.extend(_same_length_numbers(by_length[length]))
    return _alternation(alternatives)


def _names(all_names, expert_names):
    names = set(all_names)
    wanted = set(expert_names)
    unknown = wanted - names
    if unknown:
        raise PatternError("expert tensors not among the model's tensors: %s" % ", ".join(sorted(unknown)[:5]))
    return names, wanted


def _stem(name):
    """The part of a block tensor name after ``blk.N.`` (the whole name for global tensors)."""
    match = BLOCK_RE.match(name)
    return name[match.end():] if match else name


_STACKED_RE = re.compile(r"^ffn_(.+)_(ch)?exps\.(.+)$")
_PER_EXPERT_RE = re.compile(r"^ffn_([a-z_]+)\.[0-9]+\.(.+)$")


def _derived_candidates(wanted):
    """Candidates built from the wanted names themselves, from factored to fully explicit."""
    stems = sorted(set(_stem(n) for n in wanted))
    stacked = [_STACKED_RE.match(s) for s in stems]
    if all(stacked):
        parts = _alternation(sorted(set(escape(m.group(1)) for m in stacked)))
        ch = sorted(set(bool(m.group(2)) for m in stacked))
        ch_part = "(ch)?" if ch == [False, True] else ("ch" if ch == [True] else "")
        suffixes = _alternation(sorted(set(escape(m.group(3)) for m in stacked)))
        yield r"\.ffn_%s_%sexps\." % (parts, ch_part)
        yield r"\.ffn_%s_%sexps\.%s$" % (parts, ch_part, suffixes)
    per_expert = [_PER_EXPERT_RE.match(s) for s in stems]
    if all(per_expert):
        parts = _alternation(sorted(set(escape(m.group(1)) for m in per_expert)))
        suffixes = _alternation(sorted(set(escape(m.group(2)) for m in per_expert)))
        yield r"\.ffn_%s\.[0-9]+\.%s$" % (parts, suffixes)
    yield r"\.%s$" % _alternation(escape(s) for s in stems)
    yield r"^%s$" % _alternation(escape(n) for n in sorted(wanted))


def expert_pattern(all_names, expert_names):
    """The most readable regex whose ``re.search`` matches exactly ``expert_names`` among ``all_names``.

    ``""`` when there are no experts. Raises ``PatternError`` when no candidate is exact.
    """
    names, wanted = _names(all_names, expert_names)
    if not wanted:
        return ""
    for candidate in _candidates(wanted):
        if _is_exact(candidate, names, wanted):
            return candidate
    raise PatternError("no pattern matches exactly the %d expert tensors" % len(wanted))


def _candidates(wanted):
    yield from CANONICAL_CANDIDATES
    yield from _derived_candidates(wanted)


def block_expert_pattern(all_names, expert_names, blocks):
    """A regex matching exactly the expert tensors of ``blocks`` among ``all_names``.

    The block number is always followed by ``\\.``, so block 1 never catches blocks 10..19.
    ``""`` when those blocks hold no experts.
    """
    names, experts = _names(all_names, expert_names)
    blocks = set(int(b) for b in blocks)
    wanted = set(n for n in experts if block_index(n) in blocks)
    if not wanted:
        return ""
    if wanted == experts:
        return expert_pattern(names, experts)
    numbers = block_numbers_regex(set(block_index(n) for n in wanted))
    for tail in _candidates(experts):
        if not tail.startswith(r"\."):
            continue
        for head in (r"blk\.%s" % numbers, r"^blk\.%s" % numbers):
            candidate = head + tail
            if _is_exact(candidate, names, wanted):
                return candidate
    fallback = r"^%s$" % _alternation(escape(n) for n in sorted(wanted))
    if _is_exact(fallback, names, wanted):
        return fallback
    raise PatternError("no pattern matches exactly the %d expert tensors of blocks %s" % (
        len(wanted), block_numbers_regex(blocks)))


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
        result["verdict"] = "unusable: %s" % problem
        return result
    moved = _matching(pattern, names)
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
        return "wrong: the model has no routed experts, yet the pattern moves %s" % _describe(result["non_expert"])
    if result["ok"]:
        return "ok: moves exactly the %d routed-expert tensors and nothing else" % n_experts
    problems = []
    if result["missed"]:
        problems.append("misses %d of the %d routed-expert tensors (e.g. %s)" % (
            len(result["missed"]), n_experts, result["missed"][0]))
    if result["non_expert"]:
        problems.append("also moves %s" % _describe(result["non_expert"]))
    return "wrong: " + "; ".join(problems)


def _describe(non_expert):
    counts = {}
    for item in non_expert:
        counts[item["class"]] = counts.get(item["class"], 0) + 1
    parts = ["%d %s" % (n, cls.replace("_", " ")) for cls, n in sorted(counts.items())]
    return "%d non-expert tensor(s): %s (e.g. %s)" % (len(non_expert), ", ".join(parts), non_expert[0]["tensor"])
