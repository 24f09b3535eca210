#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llm_server_model
short_description: Internal to the ai_llm.moe_offload.llm_server role - fetch a model onto the host, or remove old ones
version_added: 0.1.0
description:
  - Only the role M(ai_llm.moe_offload.llm_server) calls it; it is not meant to be called alone. The role's action
    C(llm_server_prepare) calls it in pieces of O(piece_seconds) and prints the bytes fetched between them.
  - With O(state=present), one piece of the fetch of the model at O(url) to O(path). Every file's size comes from a
    HEAD request first; the free disk is checked before anything is written, and a shortfall is refused with the
    MiB missing. Bytes go to C(<file>.part), appended with a C(Range) request from what is there, so a cut download
    goes on where it stopped. A complete part is checked against its sha256 and read as a GGUF (a shard's
    C(split.no) and C(split.count) too), then renamed; a part that fails the checks is removed.
  - One URL named as llama.cpp's gguf-split names shards (C(<name>-00001-of-00003.gguf)) stands for all of them;
    O(path) must then be named the same way, which is how llama.cpp finds the other shards.
  - The record O(record) holds every file with its size, mtime and sha256, and every model with when it was fetched
    and last deployed. A file whose size and mtime are those recorded is neither fetched nor hashed again.
    A file at a path the record does not know is checked (sha256 and header) and recorded, never overwritten.
  - With O(state=pruned), after a verified deploy of O(path), the models the role fetched beyond the O(keep) most
    recently deployed are removed, never O(path), a model a snapshot of O(rollback_dir) runs, a model the role did
    not fetch or a file that changed since it was recorded.
author:
  - ai_llm maintainers (@ai-llm)
options:
  state:
    description: V(present) fetches one piece, V(pruned) removes old models.
    type: str
    choices: [present, pruned]
    default: present
  path:
    description: Where the model's first file lives on the host (C(llm_server_model_path)).
    type: path
    required: true
  url:
    description: The http or https URL of the model's first file, or one per shard in order.
    type: list
    elements: str
    default: []
  sha256:
    description: One sha256 per file, or the URL of a C(SHA256SUMS) file; empty checks no checksum.
    type: list
    elements: str
    default: []
  headers:
    description: HTTP headers for the model's host (a token); sent only to the first URL's host, never logged.
    type: dict
    default: {}
  record:
    description: The record of the models on the host (the role uses C(<project dir>/.llm_server_models.json)).
    type: path
    required: true
  known:
    description:
      - Set by the role's action between two pieces (C(sizes) and C(sha256) per file, as the last piece found them),
        so that a piece asks for neither again; not for direct use.
    type: dict
    default: {}
  piece_seconds:
    description: How long one piece downloads before it returns, in seconds.
    type: float
    default: 10
  timeout:
    description: The timeout of one HTTP request, in seconds.
    type: float
    default: 30
  keep:
    description: With O(state=pruned), how many fetched models stay (the one deployed among them).
    type: int
    default: 2
  rollback_dir:
    description: With O(state=pruned), the snapshots' directory; the models its snapshots run are never removed.
    type: path
attributes:
  check_mode:
    support: full
    description: Sizes, checksums file and free disk are read; nothing is written.
  diff_mode:
    support: none
    description: A model has no diff.
  idempotent:
    support: full
    description: A model already present and recorded is neither fetched nor hashed again.
seealso:
  - module: ai_llm.moe_offload.gguf_info
"""

EXAMPLES = r"""
- name: Fetch one piece of a split model
  ai_llm.moe_offload.llm_server_model:
    url: https://models.example/nemotron/Nemotron-3-Nano-30B-A3B-Q4_K_M-00001-of-00002.gguf
    path: /srv/models/Nemotron-3-Nano-30B-A3B-Q4_K_M-00001-of-00002.gguf
    sha256: https://models.example/nemotron/SHA256SUMS
    record: /srv/ai-llm/.llm_server_models.json
"""

RETURN = r"""
done:
  description: Whether every file of the model is on the host, checked and recorded.
  returned: with O(state=present)
  type: bool
  sample: false
fetched:
  description: Whether this piece completed a fetch (files renamed into place).
  returned: when RV(done)
  type: bool
  sample: true
files:
  description: Per file its URL (without the query), host path, size, the bytes there and its state
    (V(present), V(check), V(fetch)), and C(cut) when the connection ended early.
  returned: with O(state=present)
  type: list
  elements: dict
bytes_total:
  description: The bytes of all files of the model.
  returned: with O(state=present)
  type: int
  sample: 19327352832
bytes_have:
  description: The bytes on the host now (complete files and parts).
  returned: with O(state=present)
  type: int
  sample: 5368709120
bytes_fetched:
  description: The bytes this piece fetched.
  returned: with O(state=present)
  type: int
  sample: 1073741824
would_fetch:
  description: In check mode, the bytes a run would fetch.
  returned: in check mode with files to fetch
  type: int
  sample: 19327352832
removed:
  description: The files O(state=pruned) removed.
  returned: with O(state=pruned)
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_cleanup import prune, snapshot_models
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_fetch import fetch
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_sources import FetchError


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["present", "pruned"], default="present"),
            path=dict(type="path", required=True),
            url=dict(type="list", elements="str", default=[]),
            sha256=dict(type="list", elements="str", default=[]),
            headers=dict(type="dict", default={}, no_log=True),
            record=dict(type="path", required=True),
            known=dict(type="dict", default={}),
            piece_seconds=dict(type="float", default=10),
            timeout=dict(type="float", default=30),
            keep=dict(type="int", default=2),
            rollback_dir=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        if p["state"] == "pruned":
            if module.check_mode:
                module.exit_json(changed=False, removed=[])
            protected = snapshot_models(p["rollback_dir"]) if p["rollback_dir"] else []
            removed = prune(p["record"], p["path"], p["keep"], protected)
            module.exit_json(changed=bool(removed), removed=removed)
        if not p["url"]:
            module.fail_json(msg="llm_server_model: url is empty")
        module.exit_json(**fetch(p, module.check_mode))
    except FetchError as exc:
        module.fail_json(msg="llm_server: the model cannot be fetched: %s" % exc)
    except OSError as exc:
        module.fail_json(msg="llm_server: the model cannot be fetched: %s: %s" % (
            getattr(exc, "filename", None) or p["path"], exc.strerror or exc))


if __name__ == "__main__":
    main()
