# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The llm_server role's variables checked into its settings, one message per variable, on the controller before
anything is read or written on the host: ``check_settings`` is the one check of them (``_deploy_settings`` calls it
with the templated variables), and ``check_placement`` applies the same rules to what the plan or the model gives.

Each variable's type, list elements, choices and default are declared once, in the role's argument spec
(``_role_spec``): the check of each value follows its option there (``_role_checks``), ansible-core's own check of
the spec runs on every value too, and this file adds only what a spec cannot say: ranges, formats and the rules
between variables. The encodings and what each cannot carry are in ``_deploy_encoding``.
"""

from __future__ import annotations

import ipaddress
import json
import posixpath
import re
from dataclasses import asdict, field, make_dataclass

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import shorten
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_encoding import (
    api_key_problem,
    control_chars,
    device_overrides_problem,
    dotenv_problem,
    offload_pattern_problem,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import MAX_BLOCKS
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_fetch import RECORD_NAME
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_sources import (
    FetchError,
    sources,
    url_problem,
)
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._role_checks import Checker
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._role_spec import (
    OPTIONS,
    PREFIX,
    SECRETS,
    VARIABLES,
    short,
    spec_problems,
)

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
_PROJECT_NAME = ("a compose project name (lower-case letters, digits, '_' and '-', starting with a letter or digit; "
                 "the default is the basename of llm_server_project_dir)")
_MODEL_REQUIRED = "it is required: the GGUF on the host (the first shard of a split model)"

# What the argument spec cannot say, per variable (without the prefix): the arguments of ``Checker.check``. A
# variable not listed here is checked by its option alone; every integer has its range. ``empty``: an empty value
# (null or "") means what the variable's description says (no -lv, no gate, no download), where ansible-core's
# check of the spec's type would refuse it.
RULES = {
    "project_dir": {"mounted": True},
    "compose_file": {"regex": _FILE_NAME_RE, "what": "a file name ending in .yml or .yaml"},
    "compose_project": {"regex": _PROJECT_NAME_RE, "what": _PROJECT_NAME},
    "service_name": {"regex": _SERVICE_NAME_RE, "what": "a compose service name (letters, digits, '.', '_' and '-')"},
    "container_name": {"regex": _CONTAINER_NAME_RE, "what": "a container name (letters, digits, '_', '.' and '-', "
                       "starting with a letter or digit)"},
    "image": {"regex": _IMAGE_RE, "what": "an image reference ([registry/]name[:tag][@digest])"},
    "port": {"low": 1, "high": 65535},
    "container_port": {"low": 1, "high": 65535},
    "log_max_size": {"regex": _LOG_SIZE_RE, "what": "a size such as 50m (digits and k, m or g)"},
    "log_max_file": {"low": 1, "high": 100},
    # llama-server's -lv; empty leaves llama-server's own default
    "log_verbosity": {"low": 0, "high": 9, "empty": True},
    "model_dir": {"mounted": True},
    # a path in the container (a string in the spec: ansible-core would expand a "~" in a path on the controller)
    "model_mount": {"check": "path", "mounted": True},
    "model_url": {"empty": True},
    "model_sha256": {"empty": True},
    "model_keep": {"low": 1, "high": 1000},
    "ctx_size": {"low": 1, "high": INT32_MAX},
    "parallel": {"low": 1, "high": LLAMA_MAX_SEQ},
    "n_gpu_layers": {"check": "gpu_layers"},
    "gpu_devices": {"low": 0, "high": 1023},
    "cpu_expert_layers": {"low": 0, "high": MAX_BLOCKS - 1},
    "moe_offload_pattern": {"allow_control": True, "max_len": 10 ** 7},
    "health_timeout": {"low": 1, "high": 86400},
    "vram_tolerance_mib": {"low": 0, "high": 1048576},
    "parity_prompt": {"allow_control": True, "max_len": 65536},
    "parity_n_predict": {"low": 1, "high": 4096},
    "parity_seed": {"low": 0, "high": 2 ** 32 - 1},
    "speed_prompt_tokens": {"low": 1, "high": INT32_MAX},
    "speed_predict_tokens": {"low": 1, "high": INT32_MAX},
    "speed_runs": {"low": 1, "high": 100},
    # the share of the last verified configuration's speed a change must keep; empty: no gate
    "min_decode_ratio": {"empty": True},
    "min_prompt_ratio": {"empty": True},
    "lock_timeout": {"low": 0, "high": 86400},
    "lock_lease": {"low": 60, "high": 7 * 86400},
}
# The variables checked with the rules between variables (below), after all the others.
_LATER = ("compose_project", "compose_command", "bind_address", "model_path", "model_dir", "model_mount", "model_url",
          "model_sha256", "moe_offload_pattern", "rollback_dir")


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


# --- the settings ---------------------------------------------------------------------------------------------

# What the settings hold besides the variables that are not secrets: (the setting, the variable it follows).
_DERIVED = (("api_key_set", "api_key"), ("container_model_path", "model_mount"))


def _setting_names():
    """The settings' names in the spec's order: each variable that is not a secret, then what follows it."""
    names = []
    for name in OPTIONS:
        names += [] if name in SECRETS else [short(name)]
        names += [setting for setting, after in _DERIVED if after == short(name)]
    return names


Settings = make_dataclass(
    "Settings",
    [(name, object) for name in _setting_names()]
    + [("base_url", str, field(default="")), ("paths", dict, field(default_factory=dict))],
    frozen=True, namespace={
        "__module__": __name__, "as_dict": asdict,
        "__doc__": "The role's variables, checked and normalised, one field per variable of the argument spec (the "
                   "secrets apart: the API key is not kept here, only whether it is set), the model's path in the "
                   "container, the URL of /health and the project's paths (``project_paths``)."})


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


def _check(c, key):
    """The value of the variable ``key`` (without the prefix) checked as its option and ``RULES`` say."""
    return c.check(PREFIX + key, **RULES.get(key, {}))


def _or_derived(c, name, derived):
    """An empty ``name`` stands for ``derived`` (the default the role's defaults template from another variable)."""
    if c.raw(name) in (None, ""):
        c.values = dict(c.values, **{name: derived})


def _project(c, s):
    """The compose project (empty: the basename of the project directory) and the compose command's program."""
    _or_derived(c, PREFIX + "compose_project", posixpath.basename(s["project_dir"] or ""))
    s["compose_project"] = _check(c, "compose_project")
    command = _check(c, "compose_command")
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
    address = _check(c, "bind_address")
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
        s["model_path"] = _check(c, "model_path")
    if s["model_path"]:
        _or_derived(c, g + "model_dir", posixpath.dirname(s["model_path"]))
    s["model_dir"] = _check(c, "model_dir") if s["model_path"] else ""
    s["model_mount"] = _check(c, "model_mount")
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
    return _check(c, short(name))


def _model_source(c, s):
    """Where the model comes from (empty: it is on the host already): one URL, or one per shard; its sha256 (one
    per file, or a SHA256SUMS URL). The pairing of URLs and host files is ``_model_sources.sources``' rule."""
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
    pattern = _check(c, "moe_offload_pattern")
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
    s["rollback_dir"] = _check(c, "rollback_dir")
    if s["rollback_dir"] and s["project_dir"] and s["rollback_dir"] == s["project_dir"]:
        s["rollback_dir"] = c.fail(name, "it must not be llm_server_project_dir itself")
    held = 2 * (s["health_timeout"] or 0) + 300
    if s["lock_lease"] and s["health_timeout"] and s["lock_lease"] < held:
        c.fail(PREFIX + "lock_lease", "%d s is shorter than a deploy may hold the lock (twice "
               "llm_server_health_timeout plus 300 s: %d s)" % (s["lock_lease"], held))


def check_settings(values, api_key=None, entry="main", unknown=(), model_headers=None):
    """``Settings`` from the role's variables (``llm_server_*`` names), or ``SettingsError`` with every problem.

    The one check of the role's variables, for every action that reads them. ``values`` holds every variable of
    ``VARIABLES`` after the role's defaults applied (a missing one is a ``KeyError``, not a default). Each value is
    checked as its option in the argument spec declares it, with ``RULES`` (ranges and formats), then the rules
    between variables; ansible-core's check of the spec (``spec_problems``) runs on every value as well, and gives
    the message of a value only it refuses. ``api_key`` is the key itself (checked, never kept or quoted); ``None``
    means "not given". ``model_headers`` (the HTTP headers of ``llm_server_model_headers``) are checked and never kept
    the same way. The ``rollback`` entry point does not need the model: its variables are only checked when it is
    set. ``unknown`` holds ``(name, message)`` of the names that mean nothing to the role: problems when
    ``llm_server_strict_variables`` is true.
    """
    c = Checker(values)
    s = {short(name): _check(c, short(name)) for name in VARIABLES if short(name) not in _LATER}
    _project(c, s)
    _api_key(c, s, api_key)
    _bind_address(c, s)
    _model(c, s, entry)
    _model_source(c, s)
    _model_headers(c, model_headers)
    _offload(c, s)
    _rollback_and_lock(c, s)
    given = {name: value for name, value in values.items()
             if name in OPTIONS and not (RULES.get(short(name), {}).get("empty") and value in (None, ""))}
    given.update((PREFIX + key, value) for key, value in (("api_key", api_key), ("model_headers", model_headers))
                 if value is not None)
    for name, message in spec_problems(given):
        c.fail(name, message)
    if s["strict_variables"]:
        c.problems.extend(unknown)
    if c.problems:
        raise SettingsError(c.problems)
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
