"""The llm_server role's variables as a run hands them to ``check_settings``: the role's defaults
(roles/llm_server/defaults/main.yml) with a test's values over them, and the defaults templated from other
variables rendered as Ansible renders them (its ``basename`` and ``dirname`` filters are ``os.path``'s)."""
from __future__ import annotations

import posixpath
from pathlib import Path

import jinja2
import yaml

ROLE = Path(__file__).resolve().parents[2] / "roles" / "llm_server"
ROLE_DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text(encoding="utf-8"))
_JINJA = jinja2.Environment(undefined=jinja2.StrictUndefined)
_JINJA.filters.update(basename=posixpath.basename, dirname=posixpath.dirname)


def role_values(values=None, **more):
    """The role's defaults updated by ``values`` and ``more``; a templated default a test does not set is rendered
    with the resulting values (a value a test sets is kept as it is, braces included)."""
    given = dict(values or {}, **more)
    out = dict(ROLE_DEFAULTS, **given)
    for name, value in ROLE_DEFAULTS.items():
        if name not in given and isinstance(value, str) and "{{" in value:
            out[name] = _JINJA.from_string(value).render(out)
    return out
