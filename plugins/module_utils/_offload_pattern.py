# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``--override-tensor`` pattern that moves exactly the routed experts: built and proved.

Standard library only: this runs on target hosts. What llama.cpp accepts and how it reads a pattern is
``_pattern_syntax`` (``pattern_problem``, ``matcher``, ``escape``, ``MAX_PATTERN_BYTES``); what a given pattern
moves is ``_pattern_check``.

The proof: every pattern built here is deployable (``pattern_problem``) and is tried against every tensor name of
the model (all shards) before it is returned, with Python ``re`` on the UTF-8 bytes of the names and ``.`` / ``$``
given their ECMAScript meaning (``.`` matches any byte but ``\\n`` and ``\\r``; ``$`` only the end), which is how
``std::regex_search`` reads them. The builder is linear in the tensor count: a fixed number of candidates is tried,
and the last resort, the explicit list of names, is factored by common prefixes so that matching it costs the
length of a name.
"""

from __future__ import annotations

import re

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import BLOCK_RE, block_index
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._pattern_syntax import (
    MAX_PATTERN_BYTES,
    PatternError,
    compiled_search,
    escape,
    pattern_problem,
    utf8,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.types import GGML_MAX_NAME

# Readable, convention-based candidates, most readable first (the first one is llama.cpp's
# documented seed pattern).
CANONICAL_CANDIDATES = (
    r"\.ffn_.*_exps\.weight",
    r"\.ffn_.*_exps\.",
    r"\.ffn_.*_(ch)?exps\.weight",
    r"\.ffn_.*_(ch)?exps\.",
    r"_(ch)?exps\.",
)
# A head that names every block: "^blk\.[0-9]+" + a candidate tail that starts with "\.".
ALL_BLOCKS_HEAD = r"^blk\.[0-9]+"

# The longest name the explicit list spells out: llama.cpp does not load a longer one (ggml/src/gguf.cpp
# gguf_init_from_file_impl refuses names of GGML_MAX_NAME bytes or more).
_MAX_LISTED_NAME = 4 * GGML_MAX_NAME


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
            parts.append(f"{lo}-{hi}")
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
    for b in sorted({int(b) for b in blocks}):
        by_length.setdefault(len(str(b)), []).append(str(b))
    alternatives = []
    for length in sorted(by_length):
        alternatives.extend(_same_length_numbers(by_length[length]))
    return _alternation(alternatives)


def _factored(words):
    """A regex (no anchors) matching exactly the strings ``words``, common prefixes factored out.

    ``["blk.1.a", "blk.1.b", "blk.2.a"]`` -> ``blk\\.(1\\.(a|b)|2\\.a)``, and the suffix all words share is written
    once at the end. Matching it costs about the length of a name, whatever the number of words, which keeps the
    proof linear. Words are at most
    ``_MAX_LISTED_NAME`` characters, so the recursion is as deep as a name is long at most.
    """
    words = sorted(set(words))

    def build(lo, hi, depth):
        # words[lo:hi] share their first `depth` characters; the shortest (possibly ending here) sorts first
        first, last = words[lo], words[hi - 1]
        common = depth
        while common < len(first) and common < len(last) and first[common] == last[common]:
            common += 1
        head = escape(first[depth:common], exact=True)
        alternatives = []
        optional = False
        i = lo
        while i < hi:
            if len(words[i]) == common:
                optional = True
                i += 1
                continue
            char = words[i][common]
            j = i
            while j < hi and len(words[j]) > common and words[j][common] == char:
                j += 1
            alternatives.append(build(i, j, common))
            i = j
        if not alternatives:
            return head
        body = alternatives[0] if len(alternatives) == 1 and not optional else "(" + "|".join(alternatives) + ")"
        return head + body + ("?" if optional else "")

    if not words:
        return ""
    # the suffix all words share is written once, after the factored rest: blk\.(1|2[05])\.ffn_up_exps\.weight
    shortest = min(len(w) for w in words)
    common = 0
    while common < shortest and len({w[len(w) - common - 1] for w in words}) == 1:
        common += 1
    if common and len(words) > 1:
        suffix = words[0][len(words[0]) - common:]
        words = sorted({w[:len(w) - common] for w in words})
        return build(0, len(words), 0) + escape(suffix, exact=True) if any(words) else escape(suffix, exact=True)
    return build(0, len(words), 0)


def _names(all_names, expert_names):
    names = set(all_names)
    wanted = set(expert_names)
    unknown = wanted - names
    if unknown:
        raise PatternError(f"expert tensors not among the model's tensors: {', '.join(sorted(unknown)[:5])}")
    return names, wanted


class _Proof:
    """Tries candidates against every tensor name: each try costs one regex search per name."""

    def __init__(self, names, wanted):
        self.names = [(utf8(n), n in wanted) for n in sorted(names)]
        self.tried = set()

    def exact(self, pattern):
        if pattern in self.tried or pattern_problem(pattern) is not None:
            return False
        self.tried.add(pattern)
        search = compiled_search(pattern)
        return all((search(name) is not None) is want for name, want in self.names)


def _stem(name):
    """The part of a block tensor name after ``blk.N.`` (the whole name for global tensors)."""
    match = BLOCK_RE.match(name)
    return name[match.end():] if match else name


_STACKED_RE = re.compile(r"^ffn_(.+)_(ch)?exps\.(.+)$")
_PER_EXPERT_RE = re.compile(r"^ffn_([a-z_]+)\.[0-9]+\.(.+)$")


def _derived_candidates(wanted):
    """Candidates built from the wanted names themselves, from factored to explicit stems."""
    stems = sorted({_stem(n) for n in wanted})
    stacked = [_STACKED_RE.match(s) for s in stems]
    if all(stacked):
        parts = _alternation(sorted({escape(m.group(1)) for m in stacked}))
        ch = sorted({bool(m.group(2)) for m in stacked})
        ch_part = "(ch)?" if ch == [False, True] else ("ch" if ch == [True] else "")
        suffixes = _alternation(sorted({escape(m.group(3)) for m in stacked}))
        yield rf"\.ffn_{parts}_{ch_part}exps\."
        yield rf"\.ffn_{parts}_{ch_part}exps\.{suffixes}$"
    per_expert = [_PER_EXPERT_RE.match(s) for s in stems]
    if all(per_expert):
        parts = _alternation(sorted({escape(m.group(1)) for m in per_expert}))
        suffixes = _alternation(sorted({escape(m.group(2)) for m in per_expert}))
        yield rf"\.ffn_{parts}\.[0-9]+\.{suffixes}$"
    if sum(len(s) for s in stems) < MAX_PATTERN_BYTES:
        yield r"\.%s$" % _alternation(escape(s) for s in stems)


def _candidates(wanted):
    yield from CANONICAL_CANDIDATES
    yield from _derived_candidates(wanted)


def _listed(proof, wanted, what):
    """The last resort: the names themselves, prefix-factored and anchored; or why there is no pattern."""
    too_long = sorted(n for n in wanted if len(n) > _MAX_LISTED_NAME)
    if too_long:
        raise PatternError(
            f"no pattern matches exactly {what}: the tensor name {too_long[0]!r} is {len(too_long[0])} characters "
            f"long (llama.cpp loads names of fewer than {GGML_MAX_NAME} bytes)")
    pattern = f"^{_factored(wanted)}$"
    if proof.exact(pattern):
        return pattern
    size = len(utf8(pattern))
    if size > MAX_PATTERN_BYTES:
        raise PatternError(
            f"no pattern matches exactly {what}: no readable pattern is exact, and the list of their names would be "
            f"{size} bytes, more than the {MAX_PATTERN_BYTES} deployed (llama-server's std::regex crashes from "
            "about 31 KB)")
    raise PatternError(f"no pattern matches exactly {what}: the list of their names is refused: "
                       f"{pattern_problem(pattern) or 'it does not match them exactly'}")


def expert_pattern(all_names, expert_names):
    """The most readable regex whose ``std::regex_search`` matches exactly ``expert_names`` among ``all_names``.

    ``""`` when there are no experts. Raises ``PatternError`` when no deployable pattern is exact.
    """
    names, wanted = _names(all_names, expert_names)
    if not wanted:
        return ""
    proof = _Proof(names, wanted)
    tails = []
    for candidate in _candidates(wanted):
        if proof.exact(candidate):
            return candidate
        if candidate.startswith(r"\."):
            tails.append(candidate)
    for tail in tails:
        if proof.exact(ALL_BLOCKS_HEAD + tail):
            return ALL_BLOCKS_HEAD + tail
    return _listed(proof, wanted, f"the {len(wanted)} expert tensors")


def block_expert_pattern(all_names, expert_names, blocks):
    """A regex matching exactly the expert tensors of ``blocks`` among ``all_names``.

    The block number is always followed by ``\\.``, so block 1 never catches blocks 10..19.
    ``""`` when those blocks hold no experts.
    """
    names, experts = _names(all_names, expert_names)
    blocks = {int(b) for b in blocks}
    wanted = {n for n in experts if block_index(n) in blocks}
    if not wanted:
        return ""
    if wanted == experts:
        return expert_pattern(names, experts)
    proof = _Proof(names, wanted)
    numbers = block_numbers_regex({block_index(n) for n in wanted})
    for tail in _candidates(experts):
        if not tail.startswith(r"\."):
            continue
        for head in (rf"blk\.{numbers}", rf"^blk\.{numbers}"):
            if proof.exact(head + tail):
                return head + tail
    return _listed(proof, wanted, f"the {len(wanted)} expert tensors of blocks {block_numbers_regex(blocks)}")
