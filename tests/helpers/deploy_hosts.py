"""A host as ``llm_server_service_info`` reads it when it holds exactly the files the llm_server role writes for a
configuration, and the configuration a run writes against it (``_deploy_disk.desired_config``): what a run that has
nothing to do finds."""
from __future__ import annotations

import hashlib

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_disk import desired_config
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_render import (
    compose_body, compose_values, config_hash, env_block, env_values)
from tests.helpers.deploy_templates import render_compose, template_sources


def holding(settings, placement, key=b"", container=None, **disk):
    """``llm_server_service_info``'s result for a host holding exactly the files of ``settings`` and ``placement``,
    no lock file, the container running that configuration (unless ``container``), verified and snapshotted.
    Returns it and the configuration hash."""
    values = env_values(settings, placement)
    compose = render_compose(settings, placement, "podman")
    digest = config_hash(values, compose_values(settings, placement, "podman"), template_sources(), key)
    held = {"lock_file": False, "api_key_sha256": hashlib.sha256(key).hexdigest() if key else None,
            "env_settled": True, "secrets_dir": True, "model_outside_dir": None, "env_config_hash": digest,
            "env_block": env_block(values, digest), "compose_sha256": hashlib.sha256(compose.encode()).hexdigest(),
            "compose_body_sha256": hashlib.sha256(compose_body(compose).encode()).hexdigest(),
            "verification": {"config_hash": digest, "status": "changed"}, "snapshot_hash": digest}
    held.update(disk)
    service = {"engine": "podman", "disk": held, "health": 200, "auth": {"checked": True, "enforced": True},
               "container": container or {"exists": True, "running": True, "status": "running", "config_hash": digest}}
    return service, digest


def desired(settings, placement, service, api_key=""):
    """``desired_config`` for ``settings`` and ``placement`` (the role's templates) against ``service``'s disk."""
    return desired_config((service or {}).get("disk") or {}, env_values(settings, placement),
                          compose_values(settings, placement, "podman"), render_compose(settings, placement, "podman"),
                          template_sources(), api_key)


def proved(digest):
    """``desired_config``'s result when the files on disk are already those of the configuration ``digest``."""
    return {"config_hash": digest, "changed_keys": [], "key_changed": False, "compose_changed": False, "files": [],
            "first": False}
