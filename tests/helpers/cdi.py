"""A CDI spec of a test's own for ``nvidia.com/gpu``: what podman 4.3.1 resolves CDI device names against on a
machine without a GPU (docs/development.md, "GPU access without a GPU")."""
from __future__ import annotations

import contextlib
import fcntl
import json
import uuid
from pathlib import Path


@contextlib.contextmanager
def cdi_spec(devices):
    """A CDI spec of this test's own, kind nvidia.com/gpu, in /var/run/cdi (podman 4.3.1 reads it and /etc/cdi):
    one device per name whose only edit is the variable ``AI_LLM_CDI_<n>=<name>``; removed after, with the folder
    when the test made it. One spec at a time on the machine (a lock file): two specs that name the same device
    make CDI refuse that name in both."""
    with open("/tmp/ai-llm-cdi.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with _spec(devices) as path:
            yield path


@contextlib.contextmanager
def _spec(devices):
    folder = Path("/var/run/cdi")
    made = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ("ai-llm-test-%s.json" % uuid.uuid4().hex[:12])
    spec = {"cdiVersion": "0.3.0", "kind": "nvidia.com/gpu",
            "devices": [{"name": d, "containerEdits": {"env": ["AI_LLM_CDI_%d=%s" % (n, d)]}}
                        for n, d in enumerate(devices)]}
    path.write_text(json.dumps(spec))
    try:
        yield path
    finally:
        path.unlink()
        if made:
            with contextlib.suppress(OSError):
                folder.rmdir()
