# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the llm_server role does with what it found: recreate ai-llm, verify it, or nothing, and why; and
whether a run has nothing to do at all (``unchanged``, read before the lock).

Standard library only. Runs on the controller (the action ``llm_server_prepare``) on the result of
``llm_server_service_info`` and the configuration this run writes (``_deploy_disk.desired_config``).

Converge, don't react: every run compares the configuration hash on disk with the one the container was created
from (its label) and with the last verification, so that a run killed at any moment (or a lost recreate)
cannot leave a container that runs something else, or a configuration that was never verified.
"""

from __future__ import annotations

import json

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import shorten

# Statuses of verification.json that mean "this configuration was proved to serve".
VERIFIED_STATUSES = ("changed", "unchanged", "rolled_back")


def _short(value, width=60):
    """``value`` as JSON, cut to ``width`` characters with the closing quote kept."""
    return shorten(json.dumps(value if value is not None else ""), width, '..."')


def describe_changes(config):
    """``LLM_CTX_SIZE "512" -> "1024"``, the API key, or the compose file, for a message."""
    parts = ["%s %s -> %s" % (c["key"], _short(c.get("old")), _short(c.get("new"))) for c in config.get("changed_keys") or []]
    if config.get("key_changed"):
        parts.append("the API key")
    if not parts and config.get("compose_changed"):
        parts.append("the compose file")
    return ", ".join(parts) or "the configuration files"


def decide(service, config, verify_always=False, container_name="ai-llm"):
    """``{"recreate", "verify", "wait", "reason"}`` for what the run found.

    ``service`` is the result of ``llm_server_service_info``, ``config`` the configuration this run writes
    (``_deploy_disk.desired_config``).
    """
    desired = config.get("config_hash")
    container = service.get("container") or {}
    disk = service.get("disk") or {}
    verification = disk.get("verification") or {}
    verified = verification.get("config_hash") == desired and verification.get("status") in VERIFIED_STATUSES
    if config.get("first"):
        reason = "the first deploy (.env holds no block of the role yet): ai-llm is created with this configuration"
        return {"recreate": True, "verify": True, "wait": True, "reason": reason}
    if desired != disk.get("env_config_hash") or config.get("changed_keys") or config.get("compose_changed"):
        reason = "the configuration changed (%s): ai-llm is recreated" % describe_changes(config)
        return {"recreate": True, "verify": True, "wait": True, "reason": reason}
    if not container.get("exists"):
        reason = "the ai-llm container %s does not exist: it is created from the configuration on disk" % container_name
        return {"recreate": True, "verify": True, "wait": True, "reason": reason}
    if not container.get("running"):
        reason = "ai-llm (%s) is %s%s: it is recreated with the configuration on disk" % (
            container_name, container.get("status"),
            " (exit code %s)" % container.get("exit_code") if container.get("status") == "exited" else "")
        return {"recreate": True, "verify": True, "wait": True, "reason": reason}
    if container.get("config_hash") != desired:
        was = container.get("config_hash")
        reason = ("ai-llm runs configuration %s but %s is on disk (an earlier run stopped before it recreated "
                  "ai-llm): it is recreated" % ((was or "")[:12] or "without the role's label", (desired or "")[:12]))
        return {"recreate": True, "verify": True, "wait": True, "reason": reason}
    auth = service.get("auth") or {}
    if auth.get("checked") and not auth.get("enforced"):
        reason = ("the API key is not in force (/props answered %s without it and %s with it): ai-llm is recreated"
                  % (auth.get("without_key"), auth.get("with_key")))
        return {"recreate": True, "verify": True, "wait": True, "reason": reason}
    if service.get("health") != 200 and verified:
        reason = "ai-llm runs the verified configuration but /health answers %s: it is recreated" % service.get("health")
        return {"recreate": True, "verify": True, "wait": True, "reason": reason}
    if not verified:
        reason = ("the configuration %s that ai-llm runs was never verified (an earlier run stopped before its "
                  "verification): it is verified now" % (desired or "")[:12])
        return {"recreate": False, "verify": True, "wait": service.get("health") != 200, "reason": reason}
    if verify_always:
        return {"recreate": False, "verify": True, "wait": False, "reason": ""}
    return {"recreate": False, "verify": False, "wait": False, "reason": ""}


def unchanged(service, settings, config):
    """Whether a run has nothing to do, from the host read without the lock (``llm_server_service_info``) and the
    configuration it writes (``config``): ``{"unchanged": True, "converge"}`` or ``{"unchanged": False, "reason"}``.

    Nothing to do: no lock file (no other deploy under way, none killed), no file to write, ``decide`` neither
    recreates, verifies nor waits, and with rollbacks the last snapshot is this configuration. Anything else goes the
    way of a change: the lock, a second read under it, the writes and the checks.
    """
    disk = (service or {}).get("disk") or {}
    if disk.get("lock_file", True):
        return {"unchanged": False, "reason": "the project directory's lock file exists"}
    if config["files"] or config["key_changed"] or not disk.get("secrets_dir"):
        return {"unchanged": False, "reason": "the files on disk are not those of this configuration"}
    converge = decide(service, config, bool(settings.get("verify_always")), settings.get("container_name") or "ai-llm")
    if converge["recreate"] or converge["verify"] or converge["wait"]:
        return {"unchanged": False, "reason": converge["reason"] or "a verification is asked for"}
    if settings.get("rollback") and disk.get("snapshot_hash") != config["config_hash"]:
        return {"unchanged": False, "reason": "the last snapshot is not this configuration"}
    return {"unchanged": True, "converge": converge}


def first_snapshot(settings, service, check_mode=False):
    """Whether to keep what serves now as the snapshot before the writes: with rollbacks, when
    there is no snapshot yet and ai-llm answers with the role's files (its label none or that of ``.env``)."""
    disk = service.get("disk") or {}
    return bool(not check_mode and settings.get("rollback") and service.get("health") == 200
                and disk.get("snapshot_hash") is None and disk.get("compose_exists")
                and (service.get("container") or {}).get("config_hash") in (None, disk.get("env_config_hash")))


def next_steps(settings, service, config, converge, check_mode=False):
    """What follows the writes besides the recreate: ask the old configuration the parity prompt (it serves and is
    recreated), verify, keep the snapshot (with rollbacks, after a verification or when the last snapshot is not
    this configuration). Nothing in check mode."""
    disk = service.get("disk") or {}
    return {
        "parity_before": bool(not check_mode and settings.get("parity_check") and converge["recreate"]
                              and service.get("health") == 200),
        "verify": bool(not check_mode and converge["verify"]),
        "snapshot": bool(not check_mode and settings.get("rollback")
                         and (converge["verify"] or disk.get("snapshot_hash") != config.get("config_hash"))),
        # a failure rolls back to the last verified configuration: the new one was being proved and is not
        "rollback": bool(not check_mode and converge["verify"] and settings.get("rollback")),
    }
