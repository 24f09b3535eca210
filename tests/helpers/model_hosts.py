"""Builders for the tests of a model fetched onto a host (``_model_fetch``, ``_model_sources``, ``_model_cleanup``):
real GGUF models written by gguf-py, the target's folders, and a fetch run piece after piece as the role's action
runs it. The fixtures ``www``, ``server`` and ``host`` of tests/unit/plugins/module_utils/conftest.py build on them.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import gguf

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_fetch import RECORD_NAME, fetch, known_of
from tests.helpers.gguf_files import write_gguf


def write_model(path, seed, tensors=4, floats=16384, split=0):
    """A GGUF of ``tensors`` f32 tensors, written by gguf-py, whose ``test.seed`` key makes it differ from every
    other model; with ``split`` tensors per shard, the shards ``<stem>-0000i-of-0000n.gguf`` with split.no,
    split.count and split.tensors.count in each, as gguf-split writes them. Returns the files written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_gguf(path, [("test.seed", seed, gguf.GGUFValueType.UINT32)],
                      [("blk.%d.ffn_up.weight" % i, (floats,), 0) for i in range(tensors)], arch="llama",
                      split_max_tensors=split)


def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def state(folder):
    """Every file under ``folder`` with its size, mtime and sha256: equal before and after means untouched."""
    found = {}
    for root, _dirs, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            info = os.stat(path)
            found[os.path.relpath(path, folder)] = (info.st_size, info.st_mtime_ns, sha(path))
    return found


def split_names(base, count):
    return ["%s-%05d-of-%05d.gguf" % (base, i, count) for i in range(1, count + 1)]


class Host:
    """The target's folders: ``models`` (``llm_server_model_dir``) and ``project`` (the record's folder)."""

    def __init__(self, tmp_path):
        self.root = tmp_path / "host"
        self.models = self.root / "models"
        self.project = self.root / "project"
        self.models.mkdir(parents=True)
        self.project.mkdir()
        self.record = self.project / RECORD_NAME

    def args(self, urls, name, **more):
        """The module's arguments for ``urls`` to ``models/name``, pieces of 5 s unless ``more`` says otherwise."""
        return dict({"url": list(urls), "path": str(self.models / name), "record": str(self.record), "sha256": [],
                     "headers": {}, "piece_seconds": 5, "timeout": 10}, **more)

    def read_record(self):
        return json.loads(self.record.read_text())


def fetch_all(args, limit=100):
    """Call ``fetch`` piece after piece until it is done, as the role's action does (each piece gets the sizes and
    sha256 the last one found); the result of every piece."""
    results, args = [], dict(args)
    while len(results) < limit:
        results.append(fetch(args))
        if results[-1]["done"]:
            return results
        args["known"] = known_of(results[-1])
    raise AssertionError("not done after %d pieces: %r" % (limit, results[-1]))
