"""The prefixes a log line picks up on its way to the reader (``_log_prefixes``), and that buffer tables behind them
are read (``_llama_log.parse_log``)."""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_log import parse_log
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._log_prefixes import strip_prefixes

# llama.cpp lines as real logs print them: the model buffer table of
# https://github.com/ollama/ollama/pull/16031 (load_tensors:, b7xxx era) and the INFO line of the real b10435 server
# (tests/data/llama_logs/b10435_rpc_server_killed_lv4.log).
TABLE = ("load_tensors:          CPU model buffer size =   304.28 MiB",
         "load_tensors:        CUDA0 model buffer size =   974.88 MiB",
         "load_tensors:        CUDA1 model buffer size =  1401.03 MiB")
BUFFERS = {"CPU": 304.28, "CUDA0": 974.88, "CUDA1": 1401.03}


@pytest.mark.parametrize("prefix", [
    "Sep 26 10:33:42 ollama[6664]: ",            # journald without the hostname (journalctl --no-hostname)
    "Jan 30 09:12:13 ollama-host ollama[5307]: ",  # journald with it (https://github.com/ollama/ollama/issues/2266)
    "2026-05-16 22:21:42.654 | ",               # a collector's timestamp and bar
    "2025-08-20T11:41:20.014123456Z ",          # docker logs -t
    "ai-llm-1  | ",                             # docker compose logs
])
def test_a_buffer_table_behind_an_export_prefix_is_read(prefix):
    assert strip_prefixes(prefix + TABLE[1]) == (None, TABLE[1])
    assert parse_log("\n".join(prefix + line for line in TABLE))["model_buffers"] == BUFFERS


def test_prefixes_nest_and_llamas_own_prefix_comes_last():
    line = "2026-05-16 22:21:42.654 | 0.00.177.484 I llama_prepare_model_devices: using device RPC0"
    assert strip_prefixes(line) == ("I", "llama_prepare_model_devices: using device RPC0")
    assert strip_prefixes("Sep 26 10:33:42 ollama[6664]: ai-llm | D load_tensors: x") == ("D", "load_tensors: x")


@pytest.mark.parametrize("line", [
    "Sep 26 10:33:42 llama_context: CUDA0 compute buffer size = 1.00 MiB",  # no "ident[pid]: " after the time
    "2026-05-16 22:21:42.654 load_tensors: x",                               # no bar: not this collector's form
    "Sep 26 10:33:42 a b ollama[6664]: x",                                   # two words before the ident
])
def test_what_only_looks_like_a_prefix_is_kept(line):
    assert strip_prefixes(line)[1] == line
