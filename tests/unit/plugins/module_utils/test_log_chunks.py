"""A log read in chunks of whole lines (``_log_chunks.iter_chunks``). Every kind of source, bytes that are not
UTF-8 and lone surrogates, read through the log parser: tests/unit/plugins/module_utils/test_llama_log.py."""
from __future__ import annotations

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._log_chunks import MAX_LINE, iter_chunks


def test_a_line_longer_than_max_line_comes_in_pieces_each_ended_by_a_newline():
    assert "".join(iter_chunks("a" * (2 * MAX_LINE + 10))) == "a" * MAX_LINE + "\n" + "a" * MAX_LINE + "\n" + "a" * 10 + "\n"
    text = "b" * (MAX_LINE + 5) + "\n" + "c" * 3
    assert "".join(iter_chunks(text)) == "b" * MAX_LINE + "\n" + "b" * 5 + "\n" + "c" * 3 + "\n"
