# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The record of the models the role fetched onto a host (``RECORD_NAME`` of ``_model_fetch``, in the project
directory): every file with its size, mtime and sha256, and every model with when it was fetched and last used.

Standard library only, Python >= 3.9; runs on the target hosts. A file whose size and mtime are still those recorded
is neither fetched nor hashed again (``_model_fetch``); the clean-up removes what the record says the role fetched
(``_model_cleanup``).
"""

from __future__ import annotations

import fcntl
import json
import os

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import read_bytes
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_files import atomic_write


def read_record(path):
    """The record (``{"files": {path: {...}}, "models": [...]}``); empty when there is none or it is unreadable."""
    try:
        data = json.loads((read_bytes(path, missing=(OSError,)) or b"null").decode("utf-8"))
    except ValueError:
        data = None
    files = data.get("files") if isinstance(data, dict) else None
    models = data.get("models") if isinstance(data, dict) else None
    return {"files": files if isinstance(files, dict) else {},
            "models": [m for m in models if isinstance(m, dict)] if isinstance(models, list) else []}


def write_record(path, record):
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o750, exist_ok=True)
    atomic_write(path, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode("utf-8"), 0o640)


def recorded(record, path, expected=None):
    """The record of ``path`` when the file still has the size and mtime recorded (and the sha256 ``expected``,
    when given), else None."""
    entry = record["files"].get(path)
    try:
        info = os.stat(path)
    except OSError:
        return None
    if not isinstance(entry, dict) or entry.get("size") != info.st_size or entry.get("mtime_ns") != info.st_mtime_ns:
        return None
    if expected and entry.get("sha256") != expected:
        return None
    return entry


class record_lock:
    """The record's lock (``<record>.lock``, its directory made when missing): one run at a time reads, changes
    and writes the record. A file of its own, not the project directory's flock (``_deploy_lock``): a run holds it
    while it hashes a whole model, which must not hold up another deploy's lock of the project."""

    def __init__(self, record_path):
        self.path = record_path + ".lock"
        self.f = None

    def __enter__(self):
        os.makedirs(os.path.dirname(self.path), mode=0o750, exist_ok=True)
        self.f = open(self.path, "a")
        fcntl.flock(self.f.fileno(), fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        self.f.close()
        return False
