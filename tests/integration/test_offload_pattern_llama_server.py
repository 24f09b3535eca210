"""The patterns we build, read by llama.cpp itself: the real llama-server (b10435, CPU) with ``-ot PATTERN=CPU``.

llama.cpp matches with ECMAScript ``std::regex_search``; we prove patterns with Python ``re.search``. Here the
server's per-tensor "buffer type overridden" lines (``-lv 5``) must name exactly the tensors that Python matches.
"""
from __future__ import annotations

import re
import subprocess

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._gguf import read_model
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_pattern import (
    block_expert_pattern,
    expert_pattern,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._tensor_classes import classify_model
from tests.integration._llama_server import SERVER, free_port
from tools.gguf_models import write_tiny_qwen3moe

pytestmark = pytest.mark.skipif(SERVER is None, reason="llama-server is not on PATH (bash scripts/setup.sh; source scripts/env.sh)")
OVERRIDE = re.compile(r"^tensor (\S+) \(.*\) buffer type overridden to CPU")


def overridden_by_llama_server(model, pattern):
    """The tensor names llama-server moves to the CPU for ``-ot PATTERN=CPU`` (read until its buffer lines)."""
    cmd = [SERVER, "-m", str(model), "-c", "512", "-ngl", "99", "--host", "127.0.0.1", "--port", str(free_port()),
           "--no-webui", "-fit", "off", "-lv", "5", "--no-log-prefix", "--no-log-timestamps",
           "-ot", pattern + "=CPU"]
    moved, lines = set(), []
    with subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as proc:
        try:
            for line in proc.stderr:
                lines.append(line)
                match = OVERRIDE.match(line)
                if match:
                    moved.add(match.group(1))
                if "model buffer size" in line:
                    break
        finally:
            proc.kill()
    assert any("model buffer size" in line for line in lines), "".join(lines[-30:])
    return moved


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_tiny_qwen3moe(tmp_path_factory.mktemp("q") / "qwen3moe-12.gguf", n_blocks=12)
    gguf = read_model(path)
    layout = classify_model(gguf.architecture, gguf.metadata, gguf.tensors)
    return path, [t.name for t in gguf.tensors], layout.expert_tensors


def python_matches(pattern, names):
    return {n for n in names if re.search(pattern, n)}


@pytest.mark.parametrize("blocks", [None, {1, 10, 11}, set(range(2, 12)), {0, 3, 4, 5, 9}])
def test_llama_server_moves_exactly_what_python_proved(model, blocks):
    path, names, experts = model
    if blocks is None:
        pattern = expert_pattern(names, experts)
        assert pattern == r"\.ffn_.*_exps\.weight"
    else:
        pattern = block_expert_pattern(names, experts, blocks)
    wanted = {n for n in experts if blocks is None or int(n.split(".")[1]) in blocks}
    assert python_matches(pattern, names) == wanted
    assert overridden_by_llama_server(path, pattern) == wanted


def test_the_derived_forms_read_the_same_in_ecmascript(model):
    """Groups, ``(ch)?``, ``[0-9]`` classes and ``$``: the constructs the fallbacks use."""
    path, names, experts = model
    pattern = r"^blk\.([02-9]|1[01])\.ffn_(down|gate|up)_(ch)?exps\.(weight)$"
    wanted = python_matches(pattern, names)
    assert wanted and wanted < set(experts)
    assert overridden_by_llama_server(path, pattern) == wanted
