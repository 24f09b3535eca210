# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every value the llm_server role writes (``.env``, the compose file, llama-server's argv), checked and
encoded in one place, with one message per variable.

Standard library only: the action plugin ``llm_server_inputs`` runs this on the controller and the module
``llm_server_config`` runs it again on the target before it renders anything.

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
* numbers are integers within the range the consumer accepts; paths are compared as paths.
"""

from __future__ import annotations

import ipaddress
import json
import posixpath
import re
from dataclasses import asdict, dataclass, field

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import MAX_BLOCKS, OFFLOAD_MODES
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_pattern import (
    MAX_PATTERN_BYTES,
    pattern_problem,
)

# llama-server crashes on longer --override-tensor patterns (std::regex recursion); see docs/deploy.md.

MODES = OFFLOAD_MODES
RESTART_POLICIES = ("no", "always", "on-failure", "unless-stopped")
NETWORK_MODES = ("", "host")
ROLLBACK_TO = ("previous", "none")
INT32_MAX = 2 ** 31 - 1
# llama.cpp's limit on sequences (src/llama-cparams.h LLAMA_MAX_SEQ): -np above it is refused.
LLAMA_MAX_SEQ = 256

# Container and compose names (docker's container name rule, the compose spec's service and project names).
_CONTAINER_NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,252}$")
_SERVICE_NAME_RE = re.compile(r"^[a-zA-Z0-9._-]{1,253}$")
_PROJECT_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,252}$")
_FILE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\.ya?ml$")
# An image reference (distribution/reference regexp.go, simplified to what it accepts): an optional registry
# host[:port], lower-case path components, an optional :tag and an optional @digest.
_IMAGE_RE = re.compile(
    r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]+)?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$")
_LOG_SIZE_RE = re.compile(r"^[1-9][0-9]{0,6}[kmgKMG]?$")
# llama-server's -ngl: a count, or auto / all (common/arg.cpp "--gpu-layers").
_NGL_WORDS = ("auto", "all")
# A device override of llama-server's -ot: PATTERN=BUFFER_TYPE, the buffer type a device name.
_DEVICE_OVERRIDE_RE = re.compile(r"^(?P<pattern>[^=,]+)=(?P<buft>[A-Za-z][A-Za-z0-9_]*)$")


class InputError(Exception):
    """Values that cannot be deployed: ``problems`` is a list of ``(variable, message)``."""

    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__("; ".join("%s: %s" % p for p in self.problems))

    def lines(self):
        return ["%s: %s" % p for p in self.problems]


# --- encoders -------------------------------------------------------------------------------------------


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


# --- checks of one value ----------------------------------------------------------------------------------


class _Checker:
    """Collects one message per variable."""

    def __init__(self, values):
        self.values = values
        self.problems = []

    def fail(self, name, message):
        if not any(n == name for n, _m in self.problems):
            self.problems.append((name, message))
        return None

    def raw(self, name, default=None):
        return self.values.get(name, default)

    def integer(self, name, low, high, default=None):
        value = self.raw(name, default)
        text = "%r" % (value,) if not isinstance(value, str) else json.dumps(value)
        if isinstance(value, bool) or value is None:
            return self.fail(name, "%s is not an integer from %d to %d" % (text, low, high))
        if isinstance(value, float):
            if not value.is_integer():
                return self.fail(name, "%s is not an integer from %d to %d" % (text, low, high))
            value = int(value)
        if isinstance(value, str):
            stripped = value.strip()
            if not re.fullmatch(r"[+-]?[0-9]{1,19}", stripped):
                shown = text if len(text) <= 40 else text[:37] + "..."
                return self.fail(name, "%s is not an integer from %d to %d" % (shown, low, high))
            value = int(stripped)
        if not isinstance(value, int):
            return self.fail(name, "%s is not an integer from %d to %d" % (text, low, high))
        if not low <= value <= high:
            shown = str(value) if len(str(value)) <= 40 else str(value)[:37] + "..."
            return self.fail(name, "%s is out of range: an integer from %d to %d" % (shown, low, high))
        return value

    def gpu_layers(self, name, default):
        """llama-server's -ngl: a count, or auto / all (common/arg.cpp ``--gpu-layers``)."""
        value = self.raw(name, default)
        if isinstance(value, str) and value.strip() in _NGL_WORDS:
            return value.strip()
        digits = str(value).strip() if isinstance(value, (int, str)) and not isinstance(value, bool) else ""
        if not re.fullmatch(r"[0-9]{1,6}", digits) or int(digits) > 100000:
            return self.fail(name, "%r is not a layer count (0 to 100000), auto or all" % (value,))
        return str(int(str(value).strip()))

    def boolean(self, name, default=False):
        value = self.raw(name, default)
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("yes", "true", "on", "1", "no", "false", "off", "0"):
            return value.strip().lower() in ("yes", "true", "on", "1")
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        return self.fail(name, "%r is not a boolean" % (value,))

    def string(self, name, default="", allow_control=False, max_len=4096):
        value = self.raw(name, default)
        if value is None:
            value = ""
        if not isinstance(value, str):
            return self.fail(name, "%r is not a string" % (value,))
        if len(value) > max_len:
            return self.fail(name, "%d characters is longer than the %d allowed" % (len(value), max_len))
        bad = control_chars(value)
        if bad and not allow_control:
            return self.fail(name, "%s holds control characters (%s)" % (json.dumps(value), ", ".join(bad)))
        return value

    def choice(self, name, choices, default=None):
        value = self.string(name, default)
        if value is None:
            return None
        if value not in choices:
            return self.fail(name, "%s is not one of %s" % (json.dumps(value), ", ".join(json.dumps(c) for c in choices)))
        return value

    def matching(self, name, regex, what, default=""):
        value = self.string(name, default)
        if value is None:
            return None
        if not regex.match(value):
            return self.fail(name, "%s is not %s" % (json.dumps(value), what))
        return value

    def path(self, name, default=None, mounted=False):
        """An absolute path, normalised; no '..' segment; with ``mounted`` no ':' or ',' (bind mounts)."""
        value = self.string(name, default)
        if value is None:
            return None
        if not value.startswith("/"):
            return self.fail(name, "%s is not an absolute path" % json.dumps(value))
        if ".." in value.split("/"):
            return self.fail(name, "%s holds a '..' segment: give the path itself" % json.dumps(value))
        if mounted and ("," in value or ":" in value):
            return self.fail(name, "%s holds ':' or ',', which a compose bind mount cannot carry" % json.dumps(value))
        return posixpath.normpath(value)

    def string_list(self, name, default=(), max_items=256):
        value = self.raw(name, list(default))
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            return self.fail(name, "%r is not a list of strings" % (value,))
        out = []
        for item in value:
            if isinstance(item, (dict, list, tuple)) or item is None:
                return self.fail(name, "%r is not a list of strings" % (value,))
            item = str(item) if not isinstance(item, bool) else ("true" if item else "false")
            bad = control_chars(item)
            if bad:
                return self.fail(name, "the item %s holds control characters (%s)" % (json.dumps(item), ", ".join(bad)))
            out.append(item)
        if len(out) > max_items:
            return self.fail(name, "%d items is more than the %d allowed" % (len(out), max_items))
        return out

    def int_list(self, name, low, high, default=()):
        value = self.raw(name, list(default))
        if isinstance(value, str) and re.fullmatch(r"\s*[0-9]+(\s*,\s*[0-9]+)*\s*", value):
            value = value.split(",")
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            return self.fail(name, "%r is not a list of integers" % (value,))
        out = []
        for item in value:
            if isinstance(item, bool) or not (isinstance(item, int) or (isinstance(item, str) and item.strip().isdigit())):
                return self.fail(name, "%r is not a list of integers from %d to %d" % (value, low, high))
            number = int(item)
            if not low <= number <= high:
                return self.fail(name, "%d is out of range: integers from %d to %d" % (number, low, high))
            if number not in out:
                out.append(number)
        return out


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


# --- the settings ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """The role's variables, checked and normalised (the API key is not kept here: only whether it is set)."""

    project_dir: str
    compose_file: str
    compose_project: str
    compose_command: list
    service_name: str
    container_name: str
    image: str
    restart_policy: str
    network_mode: str
    bind_address: str
    port: int
    container_port: int
    log_max_size: str
    log_max_file: int
    log_verbosity: object
    extra_args: list
    api_key_set: bool
    allow_unauthenticated: bool
    model_path: str
    model_dir: str
    model_mount: str
    container_model_path: str
    ctx_size: int
    parallel: int
    n_gpu_layers: str
    gpu_devices: list
    moe_offload_mode: str
    moe_offload_layers: list
    moe_offload_pattern: str
    moe_offload_force: bool
    health_timeout: int
    verify_always: bool
    vram_check: bool
    vram_tolerance_mib: int
    parity_check: bool
    parity_prompt: str
    parity_n_predict: int
    parity_seed: int
    rollback: bool
    rollback_dir: str
    rollback_to: str
    lock_timeout: int
    lock_lease: int
    base_url: str = ""
    paths: dict = field(default_factory=dict)

    def as_dict(self):
        return asdict(self)


def base_url(bind_address, port):
    """The URL the role asks /health on: loopback for the wildcard addresses, brackets for IPv6."""
    address = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(bind_address, bind_address)
    host = "[%s]" % address if ":" in address else address
    return "http://%s:%d" % (host, port)


def container_model_path(model_path, model_dir, model_mount):
    """Where the container sees ``model_path`` (``model_dir`` is mounted at ``model_mount``); None if outside.

    Compared as paths: ``/srv/mod`` does not contain ``/srv/models/x.gguf``.
    """
    try:
        if posixpath.commonpath([model_dir, model_path]) != model_dir or model_dir == model_path:
            return None
    except ValueError:
        return None
    relative = posixpath.relpath(model_path, model_dir)
    return posixpath.join(model_mount, relative)


def check_settings(values, api_key=None, entry="main"):
    """``Settings`` from the role's variables (``llm_server_*`` names), or ``InputError`` with every problem.

    ``api_key`` is the key itself (checked, never kept or quoted); ``None`` means "not given". The ``rollback``
    entry point does not need the model: its variables are only checked when set.
    """
    c = _Checker(values)
    g = "llm_server_"
    s = {}
    s["project_dir"] = c.path(g + "project_dir", "/srv/ai-llm", mounted=True)
    s["compose_file"] = c.matching(g + "compose_file", _FILE_NAME_RE, "a file name ending in .yml or .yaml",
                                   "docker-compose.prod.yml")
    if not values.get(g + "compose_project"):
        c.values = dict(c.values, **{g + "compose_project": posixpath.basename(s["project_dir"] or "")})
    s["compose_project"] = c.matching(g + "compose_project", _PROJECT_NAME_RE, "a compose project name "
                                      "(lower-case letters, digits, '_' and '-', starting with a letter or digit; "
                                      "the default is the basename of llm_server_project_dir)")
    command = c.string_list(g + "compose_command", [])
    if command and (not command[0] or command[0].startswith("-")):
        command = c.fail(g + "compose_command", "%r does not start with a program" % (command,))
    s["compose_command"] = command
    s["service_name"] = c.matching(g + "service_name", _SERVICE_NAME_RE, "a compose service name "
                                   "(letters, digits, '.', '_' and '-')", "ai-llm")
    s["container_name"] = c.matching(g + "container_name", _CONTAINER_NAME_RE, "a container name (letters, "
                                     "digits, '_', '.' and '-', starting with a letter or digit)", "ai-llm")
    s["image"] = c.matching(g + "image", _IMAGE_RE, "an image reference ([registry/]name[:tag][@digest])",
                            "localhost/ai-llm:cuda")
    s["restart_policy"] = c.choice(g + "restart_policy", RESTART_POLICIES, "unless-stopped")
    s["network_mode"] = c.choice(g + "network_mode", NETWORK_MODES, "")
    s["port"] = c.integer(g + "port", 1, 65535, 8080)
    s["container_port"] = c.integer(g + "container_port", 1, 65535, 8080)
    s["log_max_size"] = c.matching(g + "log_max_size", _LOG_SIZE_RE, "a size such as 50m (digits and k, m or g)",
                                   "50m")
    s["log_max_file"] = c.integer(g + "log_max_file", 1, 100, 3)
    verbosity = c.raw(g + "log_verbosity")
    s["log_verbosity"] = None if verbosity in (None, "") else c.integer(g + "log_verbosity", 0, 9)
    s["extra_args"] = c.string_list(g + "extra_args", [])

    key_set = bool(api_key)
    if api_key is not None and not isinstance(api_key, str):
        c.fail(g + "api_key", "it is not a string")
        key_set = False
    elif api_key:
        problem = api_key_problem(api_key)
        if problem:
            c.fail(g + "api_key", "the key cannot be deployed: " + problem + " (the key itself is not shown)")
    s["api_key_set"] = key_set
    s["allow_unauthenticated"] = c.boolean(g + "allow_unauthenticated", False)

    address = c.string(g + "bind_address", "127.0.0.1")
    if address is not None:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            address = c.fail(g + "bind_address", "%s is not an IPv4 or IPv6 address" % json.dumps(address))
        else:
            address = str(ip)
            if ip.version == 6 and s["network_mode"] == "":
                address = c.fail(g + "bind_address", "%s is an IPv6 address: compose port publishing takes IPv4 "
                                 "here; use llm_server_network_mode=host for IPv6" % address)
            elif not ip.is_loopback and not key_set and not s["allow_unauthenticated"]:
                address = c.fail(g + "bind_address", "%s is reachable from other hosts and no llm_server_api_key "
                                 "is set: anyone on the network could use the server. Set llm_server_api_key, bind "
                                 "to 127.0.0.1, or set llm_server_allow_unauthenticated=true" % address)
    s["bind_address"] = address

    if values.get(g + "model_path") in (None, "") and entry == "rollback":
        values = {k: v for k, v in values.items() if not k.startswith(g + "model_")}
        c.values = values
        s["model_path"] = ""
    elif values.get(g + "model_path") in (None, ""):
        s["model_path"] = c.fail(g + "model_path", "it is required: the GGUF on the host (the first shard of a "
                                 "split model)")
    else:
        s["model_path"] = c.path(g + "model_path", "")
    model_dir = values.get(g + "model_dir")
    if model_dir in (None, "") and s["model_path"]:
        values = dict(values, **{g + "model_dir": posixpath.dirname(s["model_path"])})
        c.values = values
    s["model_dir"] = c.path(g + "model_dir", None, mounted=True) if s["model_path"] else ""
    s["model_mount"] = c.path(g + "model_mount", "/models", mounted=True)
    if s["model_mount"] == "/":
        s["model_mount"] = c.fail(g + "model_mount", "'/' would hide the image's own files: mount elsewhere")
    inside = None
    if s["model_path"] and s["model_dir"] and s["model_mount"]:
        inside = container_model_path(s["model_path"], s["model_dir"], s["model_mount"])
        if inside is None:
            c.fail(g + "model_path", "%s is not inside llm_server_model_dir %s (compared as paths), which is what "
                   "the container gets mounted at %s" % (s["model_path"], s["model_dir"], s["model_mount"]))
        else:
            problem = dotenv_problem(inside)
            if problem:
                inside = c.fail(g + "model_path", "the path in the container %s cannot go into .env: %s"
                                % (json.dumps(inside), problem))
    s["container_model_path"] = inside

    s["ctx_size"] = c.integer(g + "ctx_size", 1, INT32_MAX, 8192)
    s["parallel"] = c.integer(g + "parallel", 1, LLAMA_MAX_SEQ, 1)
    s["n_gpu_layers"] = c.gpu_layers(g + "n_gpu_layers", 99)
    s["gpu_devices"] = c.int_list(g + "gpu_devices", 0, 1023, [])
    s["moe_offload_mode"] = c.choice(g + "moe_offload_mode", MODES, "auto")
    s["moe_offload_layers"] = c.int_list(g + "moe_offload_layers", 0, MAX_BLOCKS - 1, [])
    pattern = c.string(g + "moe_offload_pattern", "", allow_control=True, max_len=10 ** 7)
    if pattern:
        problem = offload_pattern_problem(pattern)
        if problem:
            shown = json.dumps(pattern if len(pattern) <= 120 else pattern[:117] + "...")
            pattern = c.fail(g + "moe_offload_pattern", "%s cannot be deployed: %s" % (shown, problem))
    s["moe_offload_pattern"] = pattern
    s["moe_offload_force"] = c.boolean(g + "moe_offload_force", False)
    if s["moe_offload_mode"] == "layers" and not s["moe_offload_layers"] and not pattern:
        c.fail(g + "moe_offload_layers", "mode layers needs the block indices whose experts go to host RAM "
               "(or llm_server_moe_offload_pattern)")

    s["health_timeout"] = c.integer(g + "health_timeout", 1, 86400, 300)
    s["verify_always"] = c.boolean(g + "verify_always", False)
    s["vram_check"] = c.boolean(g + "vram_check", True)
    s["vram_tolerance_mib"] = c.integer(g + "vram_tolerance_mib", 0, 1048576, 1024)
    s["parity_check"] = c.boolean(g + "parity_check", False)
    s["parity_prompt"] = c.string(g + "parity_prompt", "The capital of France is", allow_control=True,
                                  max_len=65536)
    s["parity_n_predict"] = c.integer(g + "parity_n_predict", 1, 4096, 16)
    s["parity_seed"] = c.integer(g + "parity_seed", 0, 2 ** 32 - 1, 42)
    s["rollback"] = c.boolean(g + "rollback", True)
    rollback_dir = values.get(g + "rollback_dir") or posixpath.join(s["project_dir"] or "/", ".rollback")
    c.values = dict(c.values, **{g + "rollback_dir": rollback_dir})
    s["rollback_dir"] = c.path(g + "rollback_dir")
    if s["rollback_dir"] and s["project_dir"] and s["rollback_dir"] == s["project_dir"]:
        s["rollback_dir"] = c.fail(g + "rollback_dir", "it must not be llm_server_project_dir itself")
    s["rollback_to"] = c.choice(g + "rollback_to", ROLLBACK_TO, "previous")
    s["lock_timeout"] = c.integer(g + "lock_timeout", 0, 86400, 1800)
    s["lock_lease"] = c.integer(g + "lock_lease", 60, 7 * 86400, 3600)
    if s["lock_lease"] and s["health_timeout"] and s["lock_lease"] < 2 * s["health_timeout"] + 300:
        c.fail(g + "lock_lease", "%d s is shorter than a deploy may hold the lock (twice llm_server_health_timeout "
               "plus 300 s: %d s)" % (s["lock_lease"], 2 * s["health_timeout"] + 300))
    if c.problems:
        raise InputError(c.problems)
    s["base_url"] = base_url(s["bind_address"], s["port"])
    s["paths"] = project_paths(s["project_dir"], s["compose_file"], s["rollback_dir"])
    return Settings(**s)


def project_paths(project_dir, compose_file, rollback_dir):
    """The files of a deployment, all under ``project_dir`` (the snapshots under ``rollback_dir``)."""
    return {
        "env": posixpath.join(project_dir, ".env"),
        "compose": posixpath.join(project_dir, compose_file),
        "verification": posixpath.join(project_dir, "verification.json"),
        "secrets": posixpath.join(project_dir, "secrets"),
        "api_key": posixpath.join(project_dir, "secrets", "api-key"),
        "lock": posixpath.join(project_dir, ".llm_server.lock"),
        "rollback": rollback_dir,
    }


# --- what the placement puts into .env ------------------------------------------------------------------------


def check_placement(pattern, source, device_overrides, ctx_size, ctx_limit):
    """Problems of the placement the plan or the model gave (the same rules as a user's pattern)."""
    problems = []
    if pattern:
        problem = offload_pattern_problem(pattern)
        if problem:
            shown = json.dumps(pattern if len(pattern) <= 120 else pattern[:117] + "...")
            what = {"plan": "the pattern the plan built from the model's tensor names",
                    "model": "the pattern gguf_info built from the model's tensor names"}.get(
                source, "the pattern")
            problems.append(("llm_server_moe_offload_pattern", "%s %s cannot be deployed: %s" % (what, shown, problem)))
    if device_overrides:
        problem = device_overrides_problem(device_overrides)
        if problem:
            problems.append(("llm_server_moe_offload_pattern", "the plan's device overrides cannot be deployed: "
                             + problem))
    if ctx_limit and ctx_size and ctx_size > ctx_limit:
        problems.append(("llm_server_ctx_size", "%d is more than the model's training context %d" % (ctx_size, ctx_limit)))
    return problems
