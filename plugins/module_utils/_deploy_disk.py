# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the project directory of ai-llm holds, and whether it already holds a given configuration.

``read_disk`` runs on the host (``llm_server_service_info``): the configuration hash in ``.env``, the role's block of
``.env`` as it is, whether the rest of ``.env`` is as the role's .env template leaves it, the SHA-256 of the compose
file and of the API key file, the lock file, the last verification and snapshots, and whether the model resolves
inside the directory the container mounts.

``desired_config`` runs on the controller: given that reading and what this run writes, the configuration hash and
what changes. A run that changes nothing then needs no second call on the host.

Standard library only, Python >= 3.9.
"""

from __future__ import annotations

import json
import os

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import read_bytes, sha256_hex
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_files import snapshot_hash
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_render import (
    ENV_KEYS,
    HASH_KEY,
    compose_body,
    config_hash,
    managed_block,
    merge_env,
    parse_env,
)


def api_key_bytes(api_key):
    """The bytes of the API key file for ``api_key`` (``b""``: no file)."""
    return (api_key + "\n").encode("ascii") if api_key else b""


def model_outside_dir(model_dir, model_path):
    """The message when ``model_path`` resolves outside ``model_dir`` (a symlink out of the directory the container
    mounts is invisible in it), ``None`` when it is inside."""
    real_dir = os.path.realpath(model_dir)
    real_model = os.path.realpath(model_path)
    if os.path.commonpath([real_dir, real_model]) != real_dir:
        return ("llm_server_model_path: %s resolves to %s, outside llm_server_model_dir %s (%s), which is all the "
                "container sees" % (model_path, real_model, model_dir, real_dir))
    return None


def read_disk(project_dir, compose_file, rollback_dir, lock_path=None, model_dir=None, model_path=None):
    """What the project directory holds (``llm_server_service_info``'s ``disk``), without changing it.

    A file that is missing, or a directory or an unreadable file in its place, reads as ``None``: not a file the role
    wrote, so the proof fails and the writer, under the lock, says what is wrong."""
    env = read_bytes(os.path.join(project_dir, ".env"), missing=(OSError,))
    env_text = env.decode("utf-8", "replace") if env is not None else None
    verification = read_bytes(os.path.join(project_dir, "verification.json"), missing=(OSError,))
    try:
        verification = json.loads(verification.decode("utf-8")) if verification else None
    except (ValueError, UnicodeDecodeError):
        verification = {"unreadable": True}
    block = managed_block(env_text) if env_text is not None else ""
    compose = read_bytes(os.path.join(project_dir, compose_file), missing=(OSError,))
    api_key = read_bytes(os.path.join(project_dir, "secrets", "api-key"), missing=(OSError,))
    disk = {
        "env_config_hash": parse_env(env_text).get(HASH_KEY) if env else None,
        "env_block": block or None,
        # the rest of .env is as the role's template leaves it (one block, no key of the role outside it, LF ends,
        # UTF-8: the template writes text)
        "env_settled": bool(block) and env_text.encode("utf-8") == env and env_text == merge_env(env_text, block)[0],
        "compose_exists": os.path.isfile(os.path.join(project_dir, compose_file)),
        "compose_sha256": sha256_hex(compose),
        "compose_body_sha256": sha256_hex(compose_body(compose.decode("utf-8", "replace")).encode("utf-8"))
        if compose is not None else None,
        "api_key_file": api_key is not None,
        "api_key_sha256": sha256_hex(api_key),
        "secrets_dir": os.path.isdir(os.path.join(project_dir, "secrets")),
        "verification": verification if isinstance(verification, dict) else None,
        "snapshot_hash": snapshot_hash(rollback_dir, "last"),
        "previous_snapshot_hash": snapshot_hash(rollback_dir, "previous"),
    }
    if lock_path is not None:
        disk["lock_file"] = os.path.lexists(lock_path)
    if model_dir is not None and model_path is not None:
        disk["model_outside_dir"] = model_outside_dir(model_dir, model_path)
    return disk


def desired_config(disk, values, compose, compose_text, sources, api_key):
    """The configuration this run writes, against what the project directory holds (``read_disk``):
    ``config_hash`` (``config_hash`` of the values, the templates' sources and the key; the hash on disk when the
    files already are exactly those this run writes, so that they stay as they are), ``changed_keys``, ``key_changed``,
    ``compose_changed`` (what compose reads of the compose file changes, not only its comments), ``files`` (the files
    that change: ``env``, ``compose``) and ``first`` (no configuration of the role yet).

    ``values``: ``env_values``; ``compose``: ``compose_values``; ``compose_text``: the compose template rendered with
    them; ``sources``: the templates' bytes."""
    key = api_key_bytes(api_key)
    disk_hash = disk.get("env_config_hash")
    old = parse_env(disk.get("env_block") or "")
    key_changed = (sha256_hex(key) if key else None) != disk.get("api_key_sha256")
    changed_keys = [{"key": k, "old": old.get(k), "new": values[k]} for k, _c in ENV_KEYS if old.get(k) != values[k]]
    compose_same = disk.get("compose_sha256") == sha256_hex(compose_text.encode("utf-8"))
    body_same = disk.get("compose_body_sha256") == sha256_hex(compose_body(compose_text).encode("utf-8"))
    if disk_hash and compose_same and not changed_keys and not key_changed:
        digest = disk_hash
    else:
        digest = config_hash(values, compose, sources, key)
    env_same = bool(disk.get("env_settled")) and disk_hash == digest and not changed_keys
    files = [name for name, same in (("env", env_same), ("compose", compose_same)) if not same]
    return {"config_hash": digest, "changed_keys": changed_keys if disk.get("env_block") else [],
            "key_changed": key_changed, "compose_changed": not body_same, "files": files,
            "first": not disk.get("env_block")}
