# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``--override-tensor`` pattern that moves exactly the routed experts: built, proved, checked.

Standard library only: this runs on target hosts.

How llama.cpp reads a pattern: common/arg.cpp splits the ``-ot`` value on ``,`` and each item at its first
``=``; src/llama-model-loader.cpp (``create_tensor``) builds ``std::regex pattern(...)`` (ECMAScript grammar,
``char``: it reads bytes) and keeps the first override whose ``std::regex_search`` finds the tensor name.

``pattern_problem()`` is the one place that says why a pattern cannot be deployed, for a user's pattern and for
the ones built here alike:

* no ``,`` and no ``=`` (llama.cpp splits on them);
* no quote (``'``, ``"``, backtick), no ``${``, no ``\\\\``, no control character and nothing outside ASCII:
  the pattern travels through ``.env`` (python-dotenv and docker compose read ``${`` and the escapes of quoted
  values), the compose file and the container's start command; a character such as a newline is written
  ``\\x0a`` in the pattern instead;
* at most ``MAX_PATTERN_BYTES`` bytes (see below);
* only syntax that ECMAScript and Python read alike, so that the proof below says what llama.cpp will do.

The proof: every pattern built here is tried against every tensor name of the model (all shards) before it is
returned, with Python ``re`` on the UTF-8 bytes of the names and ``.`` / ``$`` given their ECMAScript meaning
(``.`` matches any byte but ``\\n`` and ``\\r``; ``$`` only the end), which is how ``std::regex_search`` reads
them. The builder is linear in the tensor count: a fixed number of candidates is tried, and the last resort,
the explicit list of names, is factored by common prefixes so that matching it costs the length of a name.

The length bound: libstdc++'s ``std::regex`` compiles a pattern recursively (bits/regex_compiler.tcc,
``_Compiler::_M_alternative`` recurses once per term, ``_M_atom`` once per group) and refuses more than
``_GLIBCXX_REGEX_STATE_LIMIT`` (100000) NFA states (bits/regex_automaton.h) by throwing ``regex_error``.
Measured with llama-server b10435 and its 8 MiB main-thread stack (``benchmarks/inspect_speed.py --only limit``):
nested groups overflow the stack (SIGSEGV) from 31,648 bytes, a literal from 86,080 bytes; an alternation of
single characters from 50,080 bytes and a list of names like the one built here from 103,360 bytes reach the
state limit, which llama.cpp reports as a load error ("Number of NFA states exceeds limit"). Independently, Linux
refuses any single argument or environment string longer than ``MAX_ARG_STRLEN`` (128 KiB,
include/uapi/linux/binfmts.h) with ``Argument list too long``. ``MAX_PATTERN_BYTES`` (16 KiB) is about half of
the smallest of these.
"""

from __future__ import annotations

import functools
import re
import warnings

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import BLOCK_RE, GGML_MAX_NAME, block_index

# The longest pattern deployed (see the module docstring for where the limits are).
MAX_PATTERN_BYTES = 16384
# Linux include/uapi/linux/binfmts.h: one argv element or environment string (PAGE_SIZE * 32).
MAX_ARG_STRLEN = 131072
# Groups nested deeper than this are refused: std::regex recurses once per level, and Python's re (the proof) stops
# at its recursion limit; real patterns nest a few levels.
MAX_GROUP_DEPTH = 64

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

_FORBIDDEN = (
    (",", "it contains ',' and llama.cpp splits --override-tensor on ',' (write ranges without {m,n}; "
          "a comma in a name is written \\x2c)"),
    ("=", "it contains '=' and llama.cpp splits each item at the first '=' (give the pattern without '=CPU'; "
          "an '=' in a name is written \\x3d)"),
    ("'", "it contains a single quote, which .env quoting and the start command do not carry unchanged "
          "(write \\x27)"),
    ('"', "it contains a double quote, which .env quoting and the start command do not carry unchanged "
          "(write \\x22)"),
    ("`", "it contains a backtick, which a shell may run as a command (write \\x60)"),
    ("${", "it contains '${', which compose and dotenv expand as a variable (write \\$\\{)"),
    ("\\\\", "it contains '\\\\', which dotenv reads as one backslash in a quoted value (write \\x5c)"),
)
# Python-only syntax that ECMAScript std::regex reads differently or rejects.
_PYTHON_ONLY = (
    ("(?<", "lookbehind and named groups are not ECMAScript std::regex syntax"),
    ("(?P", "named groups are not ECMAScript std::regex syntax"),
    ("(?#", "comments are not ECMAScript std::regex syntax"),
    ("(?>", "atomic groups are not ECMAScript std::regex syntax"),
    ("\\A", "\\A is not ECMAScript std::regex syntax (use ^)"),
    ("\\Z", "\\Z is not ECMAScript std::regex syntax (use $)"),
)
_INLINE_FLAGS_RE = re.compile(r"\(\?[aiLmsux]")
# Characters written as themselves in a pattern; the regex metacharacters get a backslash; everything else
# (quotes, backslash, control characters, bytes outside ASCII) is written as \xHH of its UTF-8 bytes.
_LITERAL = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-:/ !#%&;<>@~")
_META = frozenset(".()[]|*+?^$}{")
# The longest name the explicit list spells out: llama.cpp does not load a longer one (ggml/src/gguf.cpp
# gguf_init_from_file_impl refuses names of GGML_MAX_NAME bytes or more).
_MAX_LISTED_NAME = 4 * GGML_MAX_NAME


class PatternError(Exception):
    """No deployable pattern matches exactly the wanted tensors (or the inputs are inconsistent)."""


def _python_bytes(pattern):
    """The Python ``re`` bytes pattern that reads ``pattern`` as ECMAScript ``std::regex<char>`` does.

    ``.`` becomes ``[^\\n\\r]`` and ``$`` becomes ``\\Z`` outside classes; a class ``[]`` or ``[^]`` (empty or
    everything in ECMAScript, the start of a class in Python) and possessive quantifiers are refused.
    """
    out = []
    i, n = 0, len(pattern)
    in_class = False
    depth = 0
    while i < n:
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
            out.append(c)
        elif c == "[":
            if pattern.startswith("]", i + 1) or pattern.startswith("^]", i + 1):
                raise PatternError("'[]' and '[^]' match nothing and anything in ECMAScript but start a class in "
                                   "Python: write the class differently")
            in_class = True
            out.append(c)
        elif c == "+" and i > 0 and pattern[i - 1] in "*+?}" and (i < 2 or pattern[i - 2] != "\\"):
            raise PatternError("possessive quantifiers ('*+', '++', '?+') are not ECMAScript std::regex syntax")
        elif c in "()":
            depth += 1 if c == "(" else -1
            if depth > MAX_GROUP_DEPTH:
                raise PatternError(f"its groups are nested more than {MAX_GROUP_DEPTH} deep (std::regex compiles "
                                   "each level recursively)")
            out.append(c)
        elif c == ".":
            out.append("[^\\n\\r]")
        elif c == "$":
            out.append("\\Z")
        else:
            out.append(c)
        i += 1
    return "".join(out).encode("utf-8")


@functools.lru_cache(maxsize=256)
def _bytes_search(pattern):
    """The ``search`` of the compiled bytes pattern (see ``_python_bytes``), or ``PatternError`` with the reason."""
    with warnings.catch_warnings():
        # Python warns (FutureWarning) where its reading of a pattern may change, e.g. "[[" (nested sets):
        # such a pattern is not one that Python and ECMAScript are sure to read alike.
        warnings.simplefilter("error")
        try:
            return re.compile(_python_bytes(pattern)).search
        except re.error as exc:
            raise PatternError(f"it is not a valid regular expression: {exc}") from None
        except RecursionError:
            raise PatternError("it is too deeply nested for Python to read it (and for std::regex)") from None
        except (FutureWarning, DeprecationWarning) as exc:
            raise PatternError(f"Python and ECMAScript may read it differently: {exc}") from None


def _encoded(name):
    return name.encode("utf-8", "surrogateescape")


def matcher(pattern):
    """A function ``name -> bool`` that says what ``std::regex_search(name, std::regex(pattern))`` says.

    Raises ``PatternError`` (with Python's reason) when Python cannot read the pattern the way ECMAScript does.
    It does not apply the deployment rules: ``pattern_problem()`` does.
    """
    search = _bytes_search(pattern)
    return lambda name: search(_encoded(name)) is not None


def pattern_problem(pattern):
    """Why ``pattern`` cannot be deployed as llama.cpp's ``-ot PATTERN=...``, or ``None`` when it can."""
    size = len(_encoded(pattern))
    if size > MAX_PATTERN_BYTES:
        return (f"it is {size} bytes long and at most {MAX_PATTERN_BYTES} are deployed: llama-server's std::regex "
                "crashes from about 31 KB (libstdc++ compiles patterns recursively and caps them at 100000 states), "
                f"and Linux refuses arguments over {MAX_ARG_STRLEN} bytes")
    for char in pattern:
        if not " " <= char <= "~":
            return (f"it contains the character {char!r} (U+{ord(char):04X}): write a control character or a "
                    "character outside ASCII as \\xHH escapes of its UTF-8 bytes")
    for token, reason in _FORBIDDEN + _PYTHON_ONLY:
        if token in pattern:
            return reason
    if _INLINE_FLAGS_RE.search(pattern):
        return "inline flags such as (?i) are not ECMAScript std::regex syntax"
    try:
        _bytes_search(pattern)
    except PatternError as exc:
        return str(exc)
    return None


def escape(text, exact=False):
    """``text`` as a literal that Python ``re`` and ECMAScript read alike and that ``pattern_problem`` accepts.

    ``,`` and ``=`` become ``.`` (readable; the proof rejects a pattern that then matches too much), or with
    ``exact`` their ``\\xHH`` escapes, like every other character that cannot be written as itself.
    """
    out = []
    for char in text:
        if char in _LITERAL:
            out.append(char)
        elif char in _META:
            out.append("\\" + char)
        elif char in ",=" and not exact:
            out.append(".")
        else:
            out.extend(f"\\x{byte:02x}" for byte in _encoded(char))
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
        self.names = [(_encoded(n), n in wanted) for n in sorted(names)]
        self.tried = set()

    def exact(self, pattern):
        if pattern in self.tried or pattern_problem(pattern) is not None:
            return False
        self.tried.add(pattern)
        search = _bytes_search(pattern)
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
    size = len(_encoded(pattern))
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
