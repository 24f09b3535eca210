"""A reserve replaces the compute buffers: src/llama-context.cpp ``sched_reserve`` has
``ggml_backend_sched_reserve`` allocate the compute buffer of every backend for the graph it reserves, then logs
``ggml_backend_sched_get_buffer_size`` of each, the size of the buffer the backend now holds. A context that
reserves again (a graph that changed) logs the new sizes: the last line of a buffer is what it holds, never the
sum of the lines. The log is the reserve block of a real llama-server b10435 run (RPC and CPU backends), the
second round with the sizes of another graph."""
from __future__ import annotations

from pathlib import Path

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_log import parse_log

DATA = Path(__file__).resolve().parents[3] / "data" / "llama_logs"


def test_a_second_reserve_replaces_the_compute_buffers():
    lines = (DATA / "b10435_rpc_server_killed_lv4.log").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "sched_reserve: reserving" in line)
    end = next(i for i, line in enumerate(lines) if "sched_reserve: reserve took" in line)
    first = lines[:end + 1]
    again = [line.replace("1.66 MiB", "3.25 MiB").replace("1.15 MiB", "0.50 MiB") for line in lines[start:end + 1]]
    assert parse_log("\n".join(first))["compute_buffers"] == {"RPC0[127.0.0.1:18850]": 1.66, "CPU": 1.15}
    assert parse_log("\n".join(first + again))["compute_buffers"] == {"RPC0[127.0.0.1:18850]": 3.25, "CPU": 0.5}
