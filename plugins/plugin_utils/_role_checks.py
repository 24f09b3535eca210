# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The checks of one variable of the llm_server role, each with its message naming the value: ``_Checker.check``
picks the check from the variable's type, list elements and choices in the role's argument spec (``_role_spec``),
and takes what a spec cannot say (ranges, formats, lengths) from its caller (``_role_variables.RULES``)."""

from __future__ import annotations

import json
import posixpath
import re

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import shorten
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_encoding import control_chars
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._role_spec import OPTIONS

# llama-server's -ngl: a count, or auto / all (common/arg.cpp "--gpu-layers").
_NGL_WORDS = ("auto", "all")


class Checker:
    """Collects one message per variable. Every variable has a value (the role's defaults give each one): a missing
    one is a programming error (``KeyError``), not a default."""

    def __init__(self, values, options=None):
        self.values = values
        self.options = OPTIONS if options is None else options
        self.problems = []

    def check(self, name, **rule):
        """The value of ``name`` checked as its option in the spec declares it (type, list elements, choices), with
        ``rule``: ``low`` and ``high`` (integers and lists of integers), ``regex`` and ``what`` (a format),
        ``mounted`` (paths), ``allow_control`` and ``max_len`` (strings), ``max_items`` (lists of strings), ``empty``
        (an empty value stands for None) or ``check``, the name of the method that checks it instead."""
        option = self.options[name]
        kind = option["type"]
        if rule.pop("empty", False) and self.raw(name) in (None, ""):
            return None
        if "check" in rule:
            return getattr(self, rule.pop("check"))(name, **rule)
        if kind == "list":
            return (self.int_list if option.get("elements") == "int" else self.string_list)(name, **rule)
        if kind == "str" and "choices" in option:
            return self.choice(name, option["choices"])
        if kind == "str" and "regex" in rule:
            return self.matching(name, **rule)
        method = {"int": self.integer, "float": self.share, "bool": self.boolean, "path": self.path,
                  "str": self.string}[kind]
        return method(name, **rule)

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

    def share(self, name):
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
