"""The patterns we build, read by llama.cpp itself: the real llama-server (b10435, CPU) with ``-ot PATTERN=CPU``.

llama.cpp matches with ECMAScript ``std::regex_search``; we prove patterns with Python ``re`` reading them as
ECMAScript does (``_offload_pattern.matcher``). Here the server's per-tensor "buffer type overridden" lines
(``-lv 5``) must name exactly the tensors that the proof matches; and patterns of the length bound, of the shapes
that cost std::regex the most, must load, while one far over it crashes the server.
"""
from __future__ import annotations

import errno
import re
import subprocess

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_log import parse_log
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_pattern import block_expert_pattern, expert_pattern
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._pattern_syntax import (
    MAX_GROUP_DEPTH,
    MAX_PATTERN_BYTES,
    matcher,
    pattern_problem,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._tensor_classes import classify_model
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.model import read_model
from tests.helpers.llama_server import SERVER, on_a_free_port, port_taken, run_until_healthy
from tools.gguf_models import write_tiny_qwen3moe

pytestmark = pytest.mark.skipif(SERVER is None, reason="llama-server is not on PATH (bash scripts/setup.sh; source scripts/env.sh)")
OVERRIDE = re.compile(r"^tensor (\S+) \(.*\) buffer type overridden to CPU")


def overridden_by_llama_server(model, pattern):
    """The tensor names llama-server moves to the CPU for ``-ot PATTERN=CPU`` (read until its buffer lines); a
    run that could not bind its port (taken since free_port()) is started again on another."""
    moved, lines = on_a_free_port(lambda port: _overridden(model, pattern, port),
                                  lambda result, port: port_taken("".join(result[1]), port))
    assert any("model buffer size" in line for line in lines), "".join(lines[-30:])
    return moved


def _overridden(model, pattern, port):
    cmd = [SERVER, "-m", str(model), "-c", "512", "-ngl", "99", "--host", "127.0.0.1", "--port", str(port),
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
    return moved, lines


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_tiny_qwen3moe(tmp_path_factory.mktemp("q") / "qwen3moe-12.gguf", n_blocks=12)
    gguf = read_model(path)
    layout = classify_model(gguf.architecture, gguf.metadata, gguf.tensors)
    return path, [t.name for t in gguf.tensors], layout.expert_tensors


@pytest.fixture(scope="module")
def one_block_model(tmp_path_factory):
    """The bound tests' model: llama.cpp compiles each ``-ot`` pattern again for every tensor it places, so a
    pattern of the bound costs its compile once per tensor; one block keeps that to a few tensors."""
    return write_tiny_qwen3moe(tmp_path_factory.mktemp("q1") / "qwen3moe-1.gguf", n_blocks=1)


def python_matches(pattern, names):
    found = {n for n in names if re.search(pattern, n)}
    assert found == {n for n in names if matcher(pattern)(n)}  # the proof's reading agrees on these names
    return found


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


# ---- the length bound, read by the real llama-server ----

def _shape(kind, size):
    """A pattern of ``size`` bytes that matches no tensor, of the shape that costs std::regex the most."""
    if kind == "nested groups":
        depth = (size - 3) // 2
        return "(" * depth + "zzz" + ")" * depth
    if kind == "alternation":
        return "(" + "|".join(["z"] * ((size - 1) // 2)) + ")"
    if kind == "literal":
        return "z" * size
    names = []
    i = 0
    while len("^(" + "|".join(names) + ")$") < size - 40:  # a listed pattern, as the builder spells names out
        names.append(r"blk\.%d\.ffn_up_exps\.weightz%d" % (i % 64, i))
        i += 1
    return "^(" + "|".join(names) + ")$"


def run_with_pattern(model, pattern, timeout=120):
    """Start llama-server with ``-ot PATTERN=CPU`` until /health answers 200: (None, stderr) when it is ready,
    (its exit code, stderr) when it ended, ("E2BIG", reason) when Linux refused to start it (too long an argument)."""
    try:
        exited, _healthy, err = run_until_healthy(["-m", model, "-c", "512", "-ngl", "99", "--no-webui", "-fit",
                                                   "off", "-ot", pattern + "=CPU"], timeout)
    except OSError as exc:
        if exc.errno != errno.E2BIG:
            raise
        return "E2BIG", exc.strerror
    return exited, err


@pytest.mark.parametrize("kind", ["nested groups", "alternation", "literal", "listed names"])
def test_a_pattern_at_the_bound_loads(one_block_model, kind):
    """Every shape at MAX_PATTERN_BYTES loads (even nested groups, which pattern_problem refuses for their depth)."""
    pattern = _shape(kind, MAX_PATTERN_BYTES)
    assert len(pattern) <= MAX_PATTERN_BYTES
    if kind == "nested groups":
        assert "nested more than %d deep" % MAX_GROUP_DEPTH in pattern_problem(pattern)
    else:
        assert pattern_problem(pattern) is None
    exited, err = run_with_pattern(one_block_model, pattern)
    assert exited is None, "llama-server ended (%s) on a %d-byte pattern:\n%s" % (exited, len(pattern), err[-2000:])


def test_a_pattern_far_over_the_bound_crashes_llama_server_and_is_refused(one_block_model):
    """Nested groups of 64 KiB overflow std::regex's recursive compiler: a real SIGSEGV (or SIGABRT), which the
    log parser reports from the exit code, and a pattern pattern_problem() refuses in the first place."""
    pattern = _shape("nested groups", 64 << 10)
    assert "bytes long and at most %d are deployed" % MAX_PATTERN_BYTES in pattern_problem(pattern)
    exited, err = run_with_pattern(one_block_model, pattern)
    assert exited is not None and exited < 0, "llama-server survived a 64 KiB pattern"
    p = parse_log(err, exit_code=exited)
    assert p["crash"].startswith("exit code %d (SIG" % exited) and p["failure"]
