# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The llm_server role's variables checked, one message per variable: ``check_settings`` is the one check of them
(the role's action plugins call it on the controller, before anything is read or written on the host), and
``check_placement`` applies the same rules to what the plan or the model gives. The encodings and what each cannot
carry are in ``_deploy_encoding``.

Standard library only, Python >= 3.9.
"""

from __future__ import annotations

import ipaddress
import json
import posixpath
import re
from dataclasses import asdict, dataclass, field

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import shorten
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_encoding import (
    api_key_problem,
    control_chars,
    device_overrides_problem,
    dotenv_problem,
    offload_pattern_problem,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import MAX_BLOCKS, OFFLOAD_MODES
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_fetch import (
    RECORD_NAME,
    FetchError,
    sources,
    url_problem,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import GOALS

MODES = OFFLOAD_MODES
RESTART_POLICIES = ("no", "always", "on-failure", "unless-stopped")
NETWORK_MODES = ("", "host")
# How the container gets its GPUs: "auto" is CDI devices on podman, device reservations on docker
GPU_ACCESS = ("auto", "reservations", "cdi")
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


class SettingsError(Exception):
    """Values that cannot be deployed: ``problems`` is a list of ``(variable, message)``."""

    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__("; ".join("%s: %s" % p for p in self.problems))

    def lines(self):
        return ["%s: %s" % p for p in self.problems]

    def refusal(self, host):
        """The failure message of a host whose values cannot be deployed."""
        lines = self.lines()
        return "llm_server: %s cannot be deployed on %s: %s. Nothing was changed." % (
            "this value" if len(lines) == 1 else "these values", host, "; ".join(lines))


# --- checks of one value ----------------------------------------------------------------------------------


class _Checker:
    """Collects one message per variable. Every variable has a value (the role's defaults give each one): a missing
    one is a programming error (``KeyError``), not a default."""

    def __init__(self, values):
        self.values = values
        self.problems = []

    def fail(self, name, message):
        if not any(n == name for n, _m in self.problems):
            self.problems.append((name, message))
        return None

    def raw(self, name):
        if name not in self.values:
            raise KeyError("%s has no value: the role's defaults (defaults/main.yml) give every variable one" % name)
        return self.values[name]

    def integer(self, name, low, high):
        value = self.raw(name)
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
                return self.fail(name, "%s is not an integer from %d to %d" % (shorten(text, 40), low, high))
            value = int(stripped)
        if not isinstance(value, int):
            return self.fail(name, "%s is not an integer from %d to %d" % (text, low, high))
        if not low <= value <= high:
            return self.fail(name, "%s is out of range: an integer from %d to %d" % (shorten(value, 40), low, high))
        return value

    def optional_integer(self, name, low, high):
        """``integer``, or ``None`` for an empty value."""
        return None if self.raw(name) in (None, "") else self.integer(name, low, high)

    def optional_ratio(self, name):
        """A share in (0, 1], or ``None`` for an empty value."""
        value = self.raw(name)
        if value in (None, ""):
            return None
        try:
            share = float(value) if not isinstance(value, bool) else None
        except (TypeError, ValueError):
            share = None
        if share is None or not 0 < share <= 1:
            return self.fail(name, "%s is not a share above 0 and at most 1 (for example 0.9), or empty"
                             % shorten(repr(value), 40))
        return share

    def gpu_layers(self, name):
        """llama-server's -ngl: a count, or auto / all (common/arg.cpp ``--gpu-layers``)."""
        value = self.raw(name)
        if isinstance(value, str) and value.strip() in _NGL_WORDS:
            return value.strip()
        digits = str(value).strip() if isinstance(value, (int, str)) and not isinstance(value, bool) else ""
        if not re.fullmatch(r"[0-9]{1,6}", digits) or int(digits) > 100000:
            return self.fail(name, "%r is not a layer count (0 to 100000), auto or all" % (value,))
        return str(int(str(value).strip()))

    def boolean(self, name):
        value = self.raw(name)
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("yes", "true", "on", "1", "no", "false", "off", "0"):
            return value.strip().lower() in ("yes", "true", "on", "1")
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        return self.fail(name, "%r is not a boolean" % (value,))

    def string(self, name, allow_control=False, max_len=4096):
        """A string; ``None`` (YAML's empty value) is ``""``."""
        value = self.raw(name)
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

    def choice(self, name, choices):
        value = self.string(name)
        if value is None:
            return None
        if value not in choices:
            return self.fail(name, "%s is not one of %s" % (json.dumps(value), ", ".join(json.dumps(c) for c in choices)))
        return value

    def matching(self, name, regex, what):
        value = self.string(name)
        if value is None:
            return None
        if not regex.match(value):
            return self.fail(name, "%s is not %s" % (json.dumps(value), what))
        return value

    def path(self, name, mounted=False):
        """An absolute path, normalised; no '..' segment; with ``mounted`` no ':' or ',' (bind mounts)."""
        value = self.string(name)
        if value is None:
            return None
        if not value.startswith("/"):
            return self.fail(name, "%s is not an absolute path" % json.dumps(value))
        if ".." in value.split("/"):
            return self.fail(name, "%s holds a '..' segment: give the path itself" % json.dumps(value))
        if mounted and ("," in value or ":" in value):
            return self.fail(name, "%s holds ':' or ',', which a compose bind mount cannot carry" % json.dumps(value))
        return posixpath.normpath(value)

    def string_list(self, name, max_items=256):
        value = self.raw(name)
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

    def int_list(self, name, low, high):
        value = self.raw(name)
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
    gpu_access: str
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
    model_url: list
    model_sha256: list
    model_keep: int
    ctx_size: int
    parallel: int
    n_gpu_layers: str
    gpu_devices: list
    moe_offload_mode: str
    moe_offload_goal: str
    cpu_expert_layers: list
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
    speed_check: bool
    speed_prompt_tokens: int
    speed_predict_tokens: int
    speed_runs: int
    min_decode_ratio: object
    min_prompt_ratio: object
    rollback: bool
    rollback_dir: str
    rollback_to: str
    lock_timeout: int
    lock_lease: int
    strict_variables: bool
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


PREFIX = "llm_server_"
_PROJECT_NAME = ("a compose project name (lower-case letters, digits, '_' and '-', starting with a letter or digit; "
                 "the default is the basename of llm_server_project_dir)")
_MODEL_REQUIRED = "it is required: the GGUF on the host (the first shard of a split model)"


# The values checked one by one, in the order their problems are listed: variable (without the prefix), the
# ``_Checker`` method that checks it, and that method's arguments. The argument spec (meta/argument_specs.yml)
# gives the types and defaults; these add the formats and ranges. The rules between variables follow in
# check_settings.
_VALUES = (
    ("project_dir", "path", {"mounted": True}),
    ("compose_file", "matching", {"regex": _FILE_NAME_RE, "what": "a file name ending in .yml or .yaml"}),
    ("service_name", "matching", {"regex": _SERVICE_NAME_RE,
                                  "what": "a compose service name (letters, digits, '.', '_' and '-')"}),
    ("container_name", "matching", {"regex": _CONTAINER_NAME_RE, "what": "a container name (letters, digits, '_', "
                                    "'.' and '-', starting with a letter or digit)"}),
    ("image", "matching", {"regex": _IMAGE_RE, "what": "an image reference ([registry/]name[:tag][@digest])"}),
    ("restart_policy", "choice", {"choices": RESTART_POLICIES}),
    ("network_mode", "choice", {"choices": NETWORK_MODES}),
    ("gpu_access", "choice", {"choices": GPU_ACCESS}),
    ("port", "integer", {"low": 1, "high": 65535}),
    ("container_port", "integer", {"low": 1, "high": 65535}),
    ("log_max_size", "matching", {"regex": _LOG_SIZE_RE, "what": "a size such as 50m (digits and k, m or g)"}),
    ("log_max_file", "integer", {"low": 1, "high": 100}),
    # llama-server's -lv; empty leaves llama-server's own default
    ("log_verbosity", "optional_integer", {"low": 0, "high": 9}),
    ("extra_args", "string_list", {}),
    ("allow_unauthenticated", "boolean", {}),
    ("ctx_size", "integer", {"low": 1, "high": INT32_MAX}),
    ("parallel", "integer", {"low": 1, "high": LLAMA_MAX_SEQ}),
    ("n_gpu_layers", "gpu_layers", {}),
    ("gpu_devices", "int_list", {"low": 0, "high": 1023}),
    ("model_keep", "integer", {"low": 1, "high": 1000}),
    ("moe_offload_mode", "choice", {"choices": MODES}),
    ("moe_offload_goal", "choice", {"choices": GOALS}),
    ("cpu_expert_layers", "int_list", {"low": 0, "high": MAX_BLOCKS - 1}),
    ("moe_offload_force", "boolean", {}),
    ("health_timeout", "integer", {"low": 1, "high": 86400}),
    ("verify_always", "boolean", {}),
    ("vram_check", "boolean", {}),
    ("vram_tolerance_mib", "integer", {"low": 0, "high": 1048576}),
    ("parity_check", "boolean", {}),
    ("parity_prompt", "string", {"allow_control": True, "max_len": 65536}),
    ("parity_n_predict", "integer", {"low": 1, "high": 4096}),
    ("parity_seed", "integer", {"low": 0, "high": 2 ** 32 - 1}),
    ("speed_check", "boolean", {}),
    ("speed_prompt_tokens", "integer", {"low": 1, "high": INT32_MAX}),
    ("speed_predict_tokens", "integer", {"low": 1, "high": INT32_MAX}),
    ("speed_runs", "integer", {"low": 1, "high": 100}),
    # the share of the last verified configuration's speed a change must keep; empty: no gate
    ("min_decode_ratio", "optional_ratio", {}),
    ("min_prompt_ratio", "optional_ratio", {}),
    ("rollback", "boolean", {}),
    ("rollback_to", "choice", {"choices": ROLLBACK_TO}),
    ("lock_timeout", "integer", {"low": 0, "high": 86400}),
    ("lock_lease", "integer", {"low": 60, "high": 7 * 86400}),
    ("strict_variables", "boolean", {}),
)


def _or_derived(c, name, derived):
    """An empty ``name`` stands for ``derived`` (the default the role's defaults template from another variable)."""
    if c.raw(name) in (None, ""):
        c.values = dict(c.values, **{name: derived})


def _project(c, s):
    """The compose project (empty: the basename of the project directory) and the compose command's program."""
    _or_derived(c, PREFIX + "compose_project", posixpath.basename(s["project_dir"] or ""))
    s["compose_project"] = c.matching(PREFIX + "compose_project", _PROJECT_NAME_RE, _PROJECT_NAME)
    command = c.string_list(PREFIX + "compose_command")
    if command and (not command[0] or command[0].startswith("-")):
        command = c.fail(PREFIX + "compose_command", "%r does not start with a program" % (command,))
    s["compose_command"] = command


def _api_key(c, s, api_key):
    """Whether a key is set; a key llama-server cannot read back byte for byte is refused (never shown)."""
    name = PREFIX + "api_key"
    s["api_key_set"] = bool(api_key)
    if api_key is not None and not isinstance(api_key, str):
        c.fail(name, "it is not a string")
        s["api_key_set"] = False
    elif api_key:
        problem = api_key_problem(api_key)
        if problem:
            c.fail(name, "the key cannot be deployed: " + problem + " (the key itself is not shown)")


def _bind_address(c, s):
    """An IP address; IPv6 only in the host's network, and one other hosts reach only with a key or a permission."""
    name = PREFIX + "bind_address"
    address = c.string(name)
    if address is not None:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            address = c.fail(name, "%s is not an IPv4 or IPv6 address" % json.dumps(address))
        else:
            address = str(ip)
            if ip.version == 6 and s["network_mode"] == "":
                address = c.fail(name, "%s is an IPv6 address: compose port publishing takes IPv4 here; use "
                                 "llm_server_network_mode=host for IPv6" % address)
            elif not ip.is_loopback and not s["api_key_set"] and not s["allow_unauthenticated"]:
                address = c.fail(name, "%s is reachable from other hosts and no llm_server_api_key is set: anyone "
                                 "on the network could use the server. Set llm_server_api_key, bind to 127.0.0.1, or "
                                 "set llm_server_allow_unauthenticated=true" % address)
    s["bind_address"] = address


def _model(c, s, entry):
    """The model, its mounted directory (empty: the model's directory) and where the container sees it. The
    ``rollback`` entry point without a model checks none of them."""
    g = PREFIX
    if c.raw(g + "model_path") in (None, "") and entry == "rollback":
        s.update(model_path="", model_dir="", model_mount="", container_model_path=None)
        return
    if c.raw(g + "model_path") in (None, ""):
        s["model_path"] = c.fail(g + "model_path", _MODEL_REQUIRED)
    else:
        s["model_path"] = c.path(g + "model_path")
    if s["model_path"]:
        _or_derived(c, g + "model_dir", posixpath.dirname(s["model_path"]))
    s["model_dir"] = c.path(g + "model_dir", mounted=True) if s["model_path"] else ""
    s["model_mount"] = c.path(g + "model_mount", mounted=True)
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


def _one_or_list(c, name):
    """``string_list`` of ``name``, where one non-empty string stands for a list of it and an empty value for
    none."""
    raw = c.raw(name)
    c.values = dict(c.values, **{name: [raw] if isinstance(raw, str) and raw else raw or []})
    return c.string_list(name)


def _model_source(c, s):
    """Where the model comes from (empty: it is on the host already): one URL, or one per shard; its sha256 (one
    per file, or a SHA256SUMS URL). The pairing of URLs and host files is ``_model_fetch.sources``' rule."""
    name = PREFIX + "model_url"
    urls = _one_or_list(c, name)
    for url in urls or []:
        problem = url_problem(url)
        if problem:
            urls = c.fail(name, problem)
            break
    if urls and s["model_path"]:
        try:
            sources(urls, s["model_path"])
        except FetchError as exc:
            variable, _sep, message = str(exc).partition(": ")
            urls = c.fail(variable if variable.startswith(PREFIX) else name, message)
    s["model_url"] = urls or []
    name = PREFIX + "model_sha256"
    sums = [v.strip() for v in _one_or_list(c, name) or []]
    bad = [v for v in sums if not (re.fullmatch(r"[0-9a-fA-F]{64}", v) or (len(sums) == 1 and not url_problem(v)))]
    if bad:
        sums = c.fail(name, "%s is neither a sha256 (64 hex digits) nor, alone, the URL of a SHA256SUMS file"
                      % json.dumps(shorten(bad[0], 80)))
    elif sums and not s["model_url"] and not c.problems:
        sums = c.fail(name, "it checks a model fetched from llm_server_model_url, which is empty")
    s["model_sha256"] = [v.lower() if len(v) == 64 else v for v in sums or []]


def _model_headers(c, headers):
    """The HTTP headers of the model's host (checked, never kept): names and values that HTTP carries as given."""
    name = PREFIX + "model_headers"
    if headers is None:
        return
    if not isinstance(headers, dict):
        c.fail(name, "it is not a dict of header names and values")
        return
    for key, value in headers.items():
        if not isinstance(key, str) or not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", key):
            c.fail(name, "%s is not an HTTP header name" % json.dumps(shorten(str(key), 40)))
            return
        if not isinstance(value, (str, int)) or isinstance(value, bool) or control_chars(str(value)):
            c.fail(name, "the value of %s is not one line of text (not shown: it may be a token)" % key)
            return


def _offload(c, s):
    """The user's pattern (the rules of any deployed pattern) and mode ``layers``, which needs layers or a pattern."""
    name = PREFIX + "moe_offload_pattern"
    pattern = c.string(name, allow_control=True, max_len=10 ** 7)
    if pattern:
        problem = offload_pattern_problem(pattern)
        if problem:
            pattern = c.fail(name, "%s cannot be deployed: %s" % (json.dumps(shorten(pattern, 120)), problem))
    s["moe_offload_pattern"] = pattern
    if s["moe_offload_mode"] == "layers" and not s["cpu_expert_layers"] and not pattern:
        c.fail(PREFIX + "cpu_expert_layers", "mode layers needs the block indices whose experts go to host RAM "
               "(or llm_server_moe_offload_pattern)")


def _rollback_and_lock(c, s):
    """The snapshots' directory (empty: ``.rollback`` in the project directory), not the project directory itself;
    a lock lease long enough for a deploy."""
    name = PREFIX + "rollback_dir"
    _or_derived(c, name, posixpath.join(s["project_dir"] or "/", ".rollback"))
    s["rollback_dir"] = c.path(name)
    if s["rollback_dir"] and s["project_dir"] and s["rollback_dir"] == s["project_dir"]:
        s["rollback_dir"] = c.fail(name, "it must not be llm_server_project_dir itself")
    held = 2 * (s["health_timeout"] or 0) + 300
    if s["lock_lease"] and s["health_timeout"] and s["lock_lease"] < held:
        c.fail(PREFIX + "lock_lease", "%d s is shorter than a deploy may hold the lock (twice "
               "llm_server_health_timeout plus 300 s: %d s)" % (s["lock_lease"], held))


def check_settings(values, api_key=None, entry="main", unknown=(), model_headers=None):
    """``Settings`` from the role's variables (``llm_server_*`` names), or ``SettingsError`` with every problem.

    The one check of the role's variables, for every action that reads them. ``values`` holds every variable
    (``VARIABLES``) after the argument spec and the role's defaults applied: types, choices and defaults come
    from there; this adds formats, ranges and the rules between variables. ``api_key`` is the key itself
    (checked, never kept or quoted); ``None`` means "not given". ``model_headers`` (the HTTP headers of
    ``llm_server_model_headers``) are checked and never kept the same way. The ``rollback`` entry point does not need the
    model: its variables are only checked when it is set. ``unknown`` holds ``(name, message)`` of the names that
    mean nothing to the role: problems when ``llm_server_strict_variables`` is true.
    """
    c = _Checker(values)
    s = {key: getattr(c, check)(PREFIX + key, **args) for key, check, args in _VALUES}
    _project(c, s)
    _api_key(c, s, api_key)
    _bind_address(c, s)
    _model(c, s, entry)
    _model_source(c, s)
    _model_headers(c, model_headers)
    _offload(c, s)
    _rollback_and_lock(c, s)
    if s["strict_variables"]:
        c.problems.extend(unknown)
    if c.problems:
        raise SettingsError(c.problems)
    s["base_url"] = base_url(s["bind_address"], s["port"])
    s["paths"] = project_paths(s["project_dir"], s["compose_file"], s["rollback_dir"])
    return Settings(**s)


# Every variable check_settings reads (the API key and the model's HTTP headers apart: they are passed on their own).
VARIABLES = tuple(PREFIX + key for key, _check, _args in _VALUES) + tuple(
    PREFIX + key for key in ("compose_project", "compose_command", "bind_address", "model_path", "model_dir",
                             "model_mount", "model_url", "model_sha256", "moe_offload_pattern", "rollback_dir"))


def project_paths(project_dir, compose_file, rollback_dir):
    """The files of a deployment, all under ``project_dir`` (the snapshots under ``rollback_dir``)."""
    return {
        "env": posixpath.join(project_dir, ".env"),
        "compose": posixpath.join(project_dir, compose_file),
        "verification": posixpath.join(project_dir, "verification.json"),
        "secrets": posixpath.join(project_dir, "secrets"),
        "api_key": posixpath.join(project_dir, "secrets", "api-key"),
        "lock": posixpath.join(project_dir, ".llm_server.lock"),
        "models": posixpath.join(project_dir, RECORD_NAME),
        "rollback": rollback_dir,
    }


# --- what the placement puts into .env ------------------------------------------------------------------------


def check_placement(pattern, source, device_overrides, ctx_size, ctx_limit):
    """Problems of the placement the plan or the model gave (the same rules as a user's pattern)."""
    problems = []
    if pattern:
        problem = offload_pattern_problem(pattern)
        if problem:
            shown = json.dumps(shorten(pattern, 120))
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
