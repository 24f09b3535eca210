# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``--override-tensor`` regex as llama.cpp reads it: what can be deployed, what it matches, literals.

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
* only syntax that ECMAScript and Python read alike, so that the proof (``_offload_pattern``) says what llama.cpp will do.

``matcher()`` says what ``std::regex_search`` says for a name: Python ``re`` on the UTF-8 bytes of the name, with
``.`` / ``$`` given their ECMAScript meaning (``.`` matches any byte but ``\\n`` and ``\\r``; ``$`` only the end).
``escape()`` writes a text as a literal that both read alike and that ``pattern_problem()`` accepts.

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

# The longest pattern deployed (see the module docstring for where the limits are).
MAX_PATTERN_BYTES = 16384
# Linux include/uapi/linux/binfmts.h: one argv element or environment string (PAGE_SIZE * 32).
MAX_ARG_STRLEN = 131072
# Groups nested deeper than this are refused: std::regex recurses once per level, and Python's re (the proof) stops
# at its recursion limit; real patterns nest a few levels.
MAX_GROUP_DEPTH = 64

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
def compiled_search(pattern):
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


def utf8(name):
    return name.encode("utf-8", "surrogateescape")


def matcher(pattern):
    """A function ``name -> bool`` that says what ``std::regex_search(name, std::regex(pattern))`` says.

    Raises ``PatternError`` (with Python's reason) when Python cannot read the pattern the way ECMAScript does.
    It does not apply the deployment rules: ``pattern_problem()`` does.
    """
    search = compiled_search(pattern)
    return lambda name: search(utf8(name)) is not None


def pattern_problem(pattern):
    """Why ``pattern`` cannot be deployed as llama.cpp's ``-ot PATTERN=...``, or ``None`` when it can."""
    size = len(utf8(pattern))
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
        compiled_search(pattern)
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
            out.extend(f"\\x{byte:02x}" for byte in utf8(char))
    return "".join(out)
