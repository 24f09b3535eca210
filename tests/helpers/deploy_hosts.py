"""A host as ``llm_server_service_info`` reads it when it holds exactly the files the llm_server role writes for a
configuration, and ``llm_server_config``'s result for those files: what a run that has nothing to do finds."""
from __future__ import annotations

import hashlib

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_render import (
    config_hash, env_block, env_values, render_compose)


def holding(settings, placement, key=b"", container=None, **disk):
    """``llm_server_service_info``'s result for a host holding exactly the files of ``settings`` and ``placement``,
    no lock file, the container running that configuration (unless ``container``), verified and snapshotted.
    Returns it and the configuration hash."""
    values = env_values(settings, placement)
    compose = render_compose(settings, placement, "podman")
    digest = config_hash(values, compose, key)
    held = {"lock_file": False, "api_key_sha256": hashlib.sha256(key).hexdigest() if key else None,
            "env_settled": True, "secrets_dir": True, "leftovers": False, "model_outside_dir": None,
            "env_block": env_block(values, digest), "compose_sha256": hashlib.sha256(compose.encode()).hexdigest(),
            "verification": {"config_hash": digest, "status": "changed"}, "snapshot_hash": digest}
    held.update(disk)
    service = {"engine": "podman", "disk": held, "health": 200, "auth": {"checked": True, "enforced": True},
               "container": container or {"exists": True, "running": True, "status": "running", "config_hash": digest}}
    return service, digest


def proved(digest):
    """``llm_server_config``'s result when the files on disk are already those of the configuration ``digest``."""
    return {"changed": False, "config_hash": digest, "changed_keys": [], "files_changed": [], "dropped_keys": [],
            "diff": []}
