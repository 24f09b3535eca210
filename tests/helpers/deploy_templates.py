"""The llm_server role's templates rendered as ``ansible.builtin.template`` renders them on the controller
(``_deploy_templates.render`` with ansible's own Templar and DataLoader), for tests that need the compose file or
``.env`` the role writes."""
from __future__ import annotations

from pathlib import Path

from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_render import (
    compose_values, env_template_values)
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_templates import (
    COMPOSE_TEMPLATE, ENV_TEMPLATE, render)

TEMPLATES = Path(__file__).resolve().parents[2] / "roles" / "llm_server" / "templates"


def render_template(name, variables, dest="/srv/ai-llm/file"):
    """The text the role's template ``name`` renders with ``variables``."""
    return render(Templar(loader=DataLoader()), name, str(TEMPLATES / name), dest, variables)


def render_compose(settings, placement, engine):
    """The compose file the role writes for ``settings`` (``Settings.as_dict()``), the placement and the engine."""
    return render_template(COMPOSE_TEMPLATE, {"llm_server_compose": compose_values(settings, placement, engine)},
                           "/srv/ai-llm/docker-compose.prod.yml")


def render_env(values, hash_value, env_text=""):
    """The ``.env`` the role writes for ``values`` (``env_values``) and the hash over ``env_text`` (``.env`` as it is)."""
    return render_template(ENV_TEMPLATE, {"llm_server_env": env_template_values(values, hash_value, env_text)},
                           "/srv/ai-llm/.env")


def template_sources():
    """The role's templates' bytes in the order ``config_hash`` takes them: the compose template, then ``.env``'s."""
    return [(TEMPLATES / COMPOSE_TEMPLATE).read_bytes(), (TEMPLATES / ENV_TEMPLATE).read_bytes()]
