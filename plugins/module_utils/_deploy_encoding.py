# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How each value the llm_server role writes is encoded (``.env``, the compose file, llama-server's ``-ot`` and key
file), and why a value cannot be: the rules that ``_role_variables`` (controller) applies to the role's variables and
``_deploy_render`` to what it writes.

Standard library only (runs on the target hosts).

The encodings:

* ``.env`` values are single-quoted so that both dotenv parsers the role supports read them back byte for
  byte: python-dotenv (what podman-compose 1.6.0 reads ``.env`` with: ``dotenv/parser.py``
  ``parse_value``, ``_single_quote_escapes``, and ``dotenv/variables.py`` ``_posix_variable``, which it
  expands inside any quotes) and compose-go (docker compose v2: ``dotenv/parser.go``
  ``extractVarValue``, which keeps single-quoted text literally apart from ``\\'``). A quote inside a
  value is written ``\\'`` (both read it as ``'``). What the two cannot read alike is refused: ``${``
  (python-dotenv expands it), a double backslash (python-dotenv reads one, compose-go two), a backslash
  before a quote or at the end, and control characters.
* compose file values are JSON strings (a JSON string is a YAML double-quoted scalar) with ``$`` written
  ``$$``, compose's escape for a literal dollar; only the role's own ``${LLM_...:-}`` references stay
  unescaped.
* an ``--override-tensor`` pattern is at most ``MAX_PATTERN_BYTES`` long: llama-server crashes on longer ones
  (std::regex recursion; see docs/deploy.md).
"""

from __future__ import annotations

import json
import re

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_pattern import (
    MAX_PATTERN_BYTES,
    pattern_problem,
)

# A device override of llama-server's -ot: PATTERN=BUFFER_TYPE, the buffer type a device name.
_DEVICE_OVERRIDE_RE = re.compile(r"^(?P<pattern>[^=,]+)=(?P<buft>[A-Za-z][A-Za-z0-9_]*)$")

# --- .env and compose -------------------------------------------------------------------------------------


def control_chars(text):
    """The control characters (C0, DEL, C1) in ``text``, as escapes, sorted."""
    return sorted({repr(c)[1:-1] for c in text if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0})


def dotenv_problem(value):
    """Why ``value`` cannot be written into ``.env`` so that both dotenv parsers read it back unchanged."""
    bad = control_chars(value)
    if bad:
        return "it holds control characters (%s), which a .env line cannot carry" % ", ".join(bad)
    if "${" in value:
        return "it holds '${', which podman-compose's .env parser (python-dotenv) expands even inside quotes"
    if "\\\\" in value:
        return "it holds a double backslash, which python-dotenv reads as one backslash and docker compose as two"
    if "\\'" in value:
        return "it holds a backslash before a single quote, which the .env parsers read as an escaped quote"
    if value.endswith("\\"):
        return "it ends with a backslash, which would escape the closing quote in .env"
    return None


def dotenv_quote(value):
    """``value`` as a single-quoted ``.env`` value (call ``dotenv_problem`` first)."""
    return "'" + value.replace("'", "\\'") + "'"


def dotenv_unquote(text):
    """The value of a ``.env`` line's right-hand side as both parsers read the role's own encoding."""
    text = text.strip()
    if len(text) >= 2 and text[0] == "'" and text[-1] == "'":
        return text[1:-1].replace("\\'", "'")
    return text


# Characters a YAML double-quoted scalar may not hold raw: outside YAML's printable set, or line breaks (NEL, LS,
# PS) that a YAML parser folds, or the byte order mark. JSON leaves them raw; they are written as \uXXXX, which
# JSON and YAML read alike (all are in the Basic Multilingual Plane).
_YAML_RAW_UNSAFE_RE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff]")


def compose_literal(value):
    """A literal string for the compose file: ``$`` escaped as ``$$``, emitted as a JSON string that YAML parsers
    read back unchanged (line and paragraph separators, DEL, C1 controls and the BOM as ``\\uXXXX``)."""
    text = json.dumps(str(value).replace("$", "$$"), ensure_ascii=False)
    return _YAML_RAW_UNSAFE_RE.sub(lambda m: "\\u%04x" % ord(m.group(0)), text)


def compose_reference(key, default=""):
    """``${KEY:-default}`` as a compose value: the role's own reference to a ``.env`` key, not escaped."""
    return json.dumps("${%s:-%s}" % (key, default))


# --- the pattern and the API key ----------------------------------------------------------------------------


def offload_pattern_problem(pattern):
    """Why an ``--override-tensor`` pattern (without ``=CPU``) cannot be deployed, or ``None``."""
    size = len(pattern.encode("utf-8", "surrogatepass"))
    if size > MAX_PATTERN_BYTES:
        return ("it is %d bytes long; llama-server crashes on patterns this long, the most the role deploys "
                "is %d: move whole blocks with a shorter pattern (for example llm_server_moe_offload_mode=layers)"
                % (size, MAX_PATTERN_BYTES))
    problem = dotenv_problem(pattern)
    if problem:
        return problem
    return pattern_problem(pattern)


def device_overrides_problem(overrides):
    """Why a list of ``PATTERN=DEVICE`` items cannot be one ``-ot`` element before the CPU pattern, or ``None``."""
    for item in overrides:
        match = _DEVICE_OVERRIDE_RE.match(item)
        if not match:
            return "%s is not PATTERN=DEVICE (one '=', no ',')" % json.dumps(item)
        problem = offload_pattern_problem(match.group("pattern"))
        if problem:
            return "%s: %s" % (json.dumps(item), problem)
    size = len(",".join(overrides).encode("utf-8", "surrogatepass"))
    if size > MAX_PATTERN_BYTES:
        return "together %d bytes, more than the %d llama-server takes" % (size, MAX_PATTERN_BYTES)
    return None


def api_key_problem(key):
    """Why the API key cannot reach llama-server byte for byte, or ``None``. Never quotes the key.

    llama-server reads ``--api-key-file`` line by line and keeps every non-empty line as a key
    (common/arg.cpp, ``--api-key-file``); it compares the text after ``Bearer `` of the Authorization header
    (tools/server/server-http.cpp, ``middleware_validate_api_key``), and HTTP header values lose leading and
    trailing blanks. So a key is printable ASCII without a leading or trailing space.
    """
    if len(key) > 4096:
        return "it is %d characters long; the most is 4096" % len(key)
    if any(not 0x20 <= ord(c) <= 0x7E for c in key):
        return ("it holds a character outside printable ASCII (a control character, newline or non-ASCII letter), "
                "which an Authorization header or llama-server's key file cannot carry unchanged")
    if key != key.strip(" "):
        return "it starts or ends with a space, which HTTP drops from the Authorization header"
    return None
