"""The GGUF reader's one exception (plugins/module_utils/gguf/error.py): what it keeps and how it reads."""
from __future__ import annotations

from pathlib import Path

from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.error import GGUFError


def test_gguf_error_keeps_path_offset_and_reason_as_text_int_text():
    err = GGUFError(Path("/models/m.gguf"), "12", 404)
    assert (err.path, err.offset, err.reason) == ("/models/m.gguf", 12, "404")
    assert err.args == ("/models/m.gguf", 12, "404")
    assert str(err) == "/models/m.gguf: at byte 12: 404"
