# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The clean-up of the models the role fetched: after a verified deploy, the files of the models used longest ago
are removed, never those of the model deployed nor of the models the kept snapshots run.

Standard library only, Python >= 3.9; runs on the target hosts (the module ``llm_server_model``, state ``pruned``).
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import re
import time

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_files import LINKS, SnapshotError, read_snapshot
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_render import parse_env
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_record import read_record, record_lock, recorded, write_record

# The model directory's bind mount as the role's compose template writes it (its first volume; the values are JSON
# strings).
_MOUNT_RE = re.compile(r'^\s*source: ("(?:[^"\\]|\\.)*")\s*\n\s*target: ("(?:[^"\\]|\\.)*")', re.MULTILINE)


def snapshot_models(rollback_dir):
    """The host paths of the models the kept snapshots run: their ``.env``'s ``LLM_MODEL_PATH`` (a path in the
    container) through the model directory's bind mount of their compose file; a snapshot that cannot be read
    names none."""
    paths = []
    for which in LINKS:
        try:
            files, _manifest, _path = read_snapshot(rollback_dir, which)
        except SnapshotError:
            continue
        inside = parse_env(files.get(".env", b"").decode("utf-8", "replace")).get("LLM_MODEL_PATH") or ""
        if not inside.startswith("/"):
            continue
        for name, data in files.items():
            match = _MOUNT_RE.search(data.decode("utf-8", "replace")) if name.endswith((".yml", ".yaml")) else None
            if not match or not inside:
                continue
            try:
                source, target = json.loads(match.group(1)), json.loads(match.group(2))
            except ValueError:
                continue
            if posixpath.commonpath([target, inside]) == target:
                paths.append(posixpath.normpath(posixpath.join(source, posixpath.relpath(inside, target))))
    return paths


def prune(record_path, current, keep, protected=()):
    """After a verified deploy of ``current`` (a model path): mark it used, then remove the files of the models the
    role fetched beyond the ``keep`` most recently used, never ``current`` nor the ``protected`` paths (the models
    of the snapshots) nor a file changed since it was recorded (only the record of it goes). Returns the paths
    removed."""
    removed = []
    with record_lock(record_path):
        record = read_record(record_path)
        now = time.time()
        for model in record["models"]:
            if model.get("path") == current:
                model["used_at"] = now
        order = sorted((m for m in record["models"] if m.get("fetched")),
                       key=lambda m: (m.get("used_at") or m.get("fetched_at") or 0), reverse=True)
        kept = {m.get("path") for m in order[:max(keep, 1)]} | {current} | set(protected)
        models = []
        for model in record["models"]:
            if model.get("path") in kept or not model.get("fetched"):
                models.append(model)
                continue
            for path in model.get("files") or []:
                entry = record["files"].pop(path, None)
                if entry and entry.get("fetched") and recorded({"files": {path: entry}}, path) is not None:
                    try:
                        os.unlink(path)
                        removed.append(path)
                    except OSError as exc:
                        if exc.errno != errno.ENOENT:
                            raise
        record["models"] = models
        write_record(record_path, record)
    return removed
