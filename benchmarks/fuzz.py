"""Fuzz campaigns for the collection's parsers: many random and mutated inputs, each bounded in time and memory.

Every target is registered with ``@target(...)``: a generator that draws one input from a ``random.Random``, the
function that runs it, the exception types it may raise (its documented errors) and its bounds per input. A
campaign runs one target on N inputs and never stops at a failure: it counts the distinct failures (exception
type and the line that raised it, or a broken invariant), the inputs over the time bound and those over the
memory bound, and keeps one example of each.

Registered targets:

* ``gguf_reader``: valid GGUF files written by gguf-py, mutated (bit flips, bytes, huge counts, removed type ids,
  zeroed runs, truncation, a sparse tail that makes the file 1 or 64 GiB) or random bytes; ``read_model``, then the
  tensor classes and the offload pattern of what it read. Allowed: ``GGUFError``, ``PatternError``;
* ``llama_log``: llama-server logs assembled from every line form the parser knows (malformed numbers, names with
  odd bytes, wrappers, ANSI, very long lines, bytes that are not UTF-8), with an exit code; ``parse_log`` and
  ``verify_placement`` with drawn expectations. Allowed: nothing; the result must be valid JSON text;
* ``offload_pattern``: tensor names with newlines, quotes, ``${``, backticks, ``,``, ``=`` and non-ASCII
  characters; ``expert_pattern`` and ``block_expert_pattern``. Allowed: ``PatternError``; a pattern returned
  must pass ``pattern_problem`` and match exactly the wanted tensors.

* ``deploy_encoders``: the role's ``.env`` and compose encoders on values of odd characters (quotes, backslashes,
  ``$``, ``${``, ``#``, control, non-ASCII, line and paragraph separators): a value ``dotenv_problem`` accepts is
  written by ``env_block``, merged into an ``.env`` with other lines, and read back byte for byte by python-dotenv
  (the parser of podman-compose) and by the role's ``parse_env``; a value it refuses makes ``env_values`` raise
  ``RenderError`` naming the key; ``compose_literal`` reads back through a YAML parser as the value with ``$``
  doubled. Allowed: nothing.

More targets register the same way, in this file or in a module imported by it.

Two engines run the same generators: ``hypothesis`` (the CI's bounded campaign,
tests/unit/plugins/module_utils/test_fuzz_campaigns.py, draws the ``random.Random`` through hypothesis) and
``random`` (the long campaign: ``python benchmarks/fuzz.py --inputs 100000``, one seeded ``random.Random`` per
input, reproducible with ``--seed``). It prints, per target, the inputs run, the distinct failures, the inputs over
the bounds, the slowest input, the largest peak of traced memory and the time taken.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import struct
import sys
import tempfile
import time
import tracemalloc
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for entry in (str(ROOT), str(ROOT / ".collections")):
    if entry not in sys.path:
        sys.path.insert(0, entry)

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_encoding import (  # noqa: E402
    compose_literal,
    dotenv_problem,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_render import (  # noqa: E402
    ENV_KEYS,
    RenderError,
    env_block,
    env_values,
    merge_env,
    parse_env,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import block_index  # noqa: E402
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_log import parse_log  # noqa: E402
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._offload_pattern import (  # noqa: E402
    block_expert_pattern,
    expert_pattern,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._pattern_syntax import (  # noqa: E402
    PatternError,
    matcher,
    pattern_problem,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._placement_proof import (  # noqa: E402
    verify_placement,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._tensor_classes import classify_model  # noqa: E402
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.error import GGUFError  # noqa: E402
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.model import read_model  # noqa: E402

TARGETS = {}


class Broken(AssertionError):
    """An invariant of a target that does not hold (always a failure, whatever the allowed errors)."""


@dataclass
class Target:
    name: str
    generate: object              # generate(random.Random) -> one input
    run: object                   # run(context, input)
    allowed: tuple = ()
    max_seconds: float = 2.0      # per input
    max_mib: float = 64.0         # peak traced memory per input
    ci_inputs: int = 200          # inputs of the campaign the CI runs
    setup: object = None          # called once before a campaign, returns the context given to run


def target(name, generate, allowed=(), max_seconds=2.0, max_mib=64.0, ci_inputs=200, setup=None):
    """Register ``run(context, drawn_input)`` as the fuzz target ``name``, fed by ``generate(rnd)``."""
    def register(run):
        TARGETS[name] = Target(name, generate, run, tuple(allowed), max_seconds, max_mib, ci_inputs, setup)
        return run
    return register


@dataclass
class Report:
    name: str
    inputs: int = 0
    seconds: float = 0.0
    failures: dict = field(default_factory=dict)   # key -> {"count", "error", "example"}
    slow: list = field(default_factory=list)       # (seconds, example)
    big: list = field(default_factory=list)        # (MiB, example)
    slowest: float = 0.0
    largest_mib: float = 0.0

    def ok(self):
        return not self.failures and not self.slow and not self.big

    def line(self):
        return (f"{self.name:16} {self.inputs:8d} inputs  {len(self.failures):3d} distinct failures  "
                f"{len(self.slow):3d} over time  {len(self.big):3d} over memory  slowest {self.slowest:6.3f} s  "
                f"largest {self.largest_mib:6.1f} MiB  {self.seconds:8.1f} s")


def _example(value):
    text = repr(value)
    return text if len(text) < 400 else text[:400] + "..."


def _failure_key(exc):
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
    return f"{type(exc).__name__} at {where}"


class Campaign:
    """Runs one target on inputs, one at a time, and keeps the figures (see ``Report``).

    ``memory``: ``"all"`` traces the memory of every input (tracemalloc: several times slower); ``"sampled"`` runs
    each input untraced for its time, then again traced when it took over ``SLOW_TO_TRACE`` seconds or for one in
    ``SAMPLE`` of the others (an input that allocates a lot also takes time).
    """

    SLOW_TO_TRACE = 0.05
    SAMPLE = 50

    def __init__(self, tgt, memory="all"):
        self.tgt = tgt
        self.report = Report(tgt.name)
        self.memory = memory
        self.context = None
        self.started = 0.0

    def __enter__(self):
        self.context = self.tgt.setup() if self.tgt.setup else None
        self.started = time.perf_counter()
        if self.memory == "all":
            tracemalloc.start()
        return self

    def __exit__(self, *_exc):
        if tracemalloc.is_tracing():
            tracemalloc.stop()
        if self.context is not None and hasattr(self.context, "close"):
            self.context.close()
        self.report.seconds = time.perf_counter() - self.started
        return False

    def one(self, rnd):
        tgt, report = self.tgt, self.report
        drawn = tgt.generate(rnd)
        report.inputs += 1
        if self.memory == "all":
            tracemalloc.reset_peak()
        t0 = time.perf_counter()
        self._run(drawn)
        took = time.perf_counter() - t0
        report.slowest = max(report.slowest, took)
        if took > tgt.max_seconds:
            report.slow.append((round(took, 3), _example(drawn)))
        if self.memory == "sampled" and (took > self.SLOW_TO_TRACE or report.inputs % self.SAMPLE == 0):
            tracemalloc.start()
            try:
                self._run(drawn)
            finally:
                mib = tracemalloc.get_traced_memory()[1] / (1 << 20)
                tracemalloc.stop()
        elif self.memory == "all":
            mib = tracemalloc.get_traced_memory()[1] / (1 << 20)
        else:
            return
        report.largest_mib = max(report.largest_mib, mib)
        if mib > tgt.max_mib:
            report.big.append((round(mib, 1), _example(drawn)))

    def _run(self, drawn):
        tgt, report = self.tgt, self.report
        try:
            tgt.run(self.context, drawn)
        except Broken as exc:
            entry = report.failures.setdefault(f"broken: {exc}"[:200], {"count": 0, "error": str(exc)[:400],
                                                                        "example": _example(drawn)})
            entry["count"] += 1
        except tgt.allowed:
            pass
        except Exception as exc:  # pylint: disable=broad-except
            # (every other exception is what a campaign looks for)
            entry = report.failures.setdefault(_failure_key(exc), {
                "count": 0, "error": "".join(traceback.format_exception_only(type(exc), exc)).strip()[:400],
                "example": _example(drawn)})
            entry["count"] += 1


def campaign(tgt, inputs, seed=0, memory="sampled"):
    """The long campaign: ``inputs`` inputs of ``tgt``, input i drawn from ``random.Random(seed * 2**32 + i)``."""
    with Campaign(tgt, memory) as run:
        for i in range(inputs):
            run.one(random.Random(seed * 2 ** 32 + i))
    return run.report


def hypothesis_campaign(tgt, inputs, seed=0, memory="all"):
    """The same with hypothesis drawing the ``random.Random`` of each input (the CI's campaign)."""
    from hypothesis import HealthCheck, Phase, given, seed as hypothesis_seed, settings  # noqa: E402
    from hypothesis import strategies as st  # noqa: E402
    with Campaign(tgt, memory) as run:
        test = settings(max_examples=inputs, database=None, deadline=None, phases=[Phase.generate],
                        suppress_health_check=list(HealthCheck))(given(st.randoms(use_true_random=False))(run.one))
        hypothesis_seed(seed)(test)()
    return run.report


def _pick(rnd, items):
    return items[rnd.randrange(len(items))]


# --------------------------------------------------------------------------- the GGUF reader


class GGUFSeeds:
    """Small valid models written by gguf-py (tools/gguf_models.py), and a scratch file for the inputs."""

    def __init__(self):
        from tools.gguf_models import write_model  # pylint: disable=import-outside-toplevel
        self.folder = tempfile.mkdtemp(prefix="fuzz-gguf-")
        self.seeds = []
        for kind, endian in (("qwen3moe", "little"), ("gpt-oss", "big"), ("nemotron_h_moe", "little"),
                             ("deepseek2", "little")):
            path = os.path.join(self.folder, f"{kind}-{endian}.gguf")
            written = write_model(kind, path, endian=endian)
            first = written[0] if isinstance(written, list) else written
            model = read_model(first)
            with open(first, "rb") as f:
                self.seeds.append((f.read(), model.shards[0].data_offset))
        self.path = os.path.join(self.folder, "input.gguf")

    def close(self):
        shutil.rmtree(self.folder, ignore_errors=True)


HUGE = (2 ** 60, 2 ** 63, 2 ** 64 - 1, 2 ** 32 - 1, 2 ** 31, 10 ** 6, 4097, 65, 5, 0, 1)


def gguf_input(rnd):
    """("random", bytes) or ("mutated", seed index, mutations, sparse tail size)."""
    if rnd.randrange(20) == 0:
        return ("random", rnd.randbytes(rnd.randrange(513)) if hasattr(rnd, "randbytes")
                else bytes(rnd.randrange(256) for _i in range(rnd.randrange(513))))
    mutations = []
    for _i in range(rnd.randint(1, 6)):
        kind = _pick(rnd, ("flip", "byte", "u64", "u32", "zeros", "truncate", "type_id"))
        mutations.append((kind, rnd.random(), _pick(rnd, HUGE), rnd.randrange(256)))
    return ("mutated", rnd.randrange(4), mutations, _pick(rnd, (0, 0, 0, 1 << 30, 64 << 30)))


def _mutate(data, header_end, mutations, order):
    data = bytearray(data)
    for kind, where, value, byte in mutations:
        at = int(where * max(min(header_end, len(data)) - 1, 1))
        if kind == "flip":
            data[at] ^= 1 << (byte % 8)
        elif kind == "byte":
            data[at] = byte
        elif kind == "u64":
            data[at:at + 8] = struct.pack(order + "Q", value & (2 ** 64 - 1))
        elif kind == "u32":
            data[at:at + 4] = struct.pack(order + "I", value & 0xFFFFFFFF)
        elif kind == "zeros":
            data[at:at + 64] = bytes(len(data[at:at + 64]))
        elif kind == "type_id":  # a removed or unknown ggml type where a u32 may be a tensor type
            data[at:at + 4] = struct.pack(order + "I", (4, 5, 31, 36, 38, 99, 2 ** 31)[byte % 7])
        else:
            del data[at:]
            break
    return bytes(data)


@target("gguf_reader", gguf_input, allowed=(GGUFError, PatternError), setup=GGUFSeeds, ci_inputs=300)
def run_gguf_reader(seeds, drawn):
    if drawn[0] == "random":
        data, tail = drawn[1], 0
    else:
        _kind, index, mutations, tail = drawn
        data, header_end = seeds.seeds[index]
        order = ">" if data[4:8] == b"\0\0\0\3" else "<"
        data = _mutate(data, header_end, mutations, order)
    with open(seeds.path, "wb") as f:
        f.write(data)
        if tail:
            f.truncate(len(data) + tail)
    model = read_model(seeds.path)
    layout = classify_model(model.architecture, model.metadata, model.tensors)
    pattern = expert_pattern(model.tensor_names, layout.expert_tensors)
    if pattern and pattern_problem(pattern) is not None:
        raise Broken(f"a built pattern is refused: {pattern_problem(pattern)}")


# --------------------------------------------------------------------------- the llama-server log parser

NAMES = ("blk.1.ffn_up_exps.weight", "blk.10.ffn_down_exps.weight", "output.weight", "x",
         "blk.2.ffn_gate_exps.weight\udcff", "blk.\u00e9.a", "blk.3.ffn_up_exps.weight" + "w" * 300)
BUFFERS = ("CPU", "CPU_REPACK", "CUDA0", "CUDA1", "CUDA_Host", "RPC0", "RPC[127.0.0.1:50052]", "Vulkan0", "AMX",
           "Metal", "")
ODD_NUMBERS = ("0.00", "1369.43", "1.2.3", "1e400", "-5", "", "99999999999999999999999999", "nan", "0." + "0" * 2000)
ODD_INTS = ("9" * 5000, "-1", "", "1.5")
TEXTS = ("", "x", "out of memory", "tensor 'blk.0.x' has wrong shape", "\u00e9\u4e16\ufffd", "a" * 100,
         "unknown model architecture: 'foo'", "\x00\x1b[0m", "what(): ", "  ", "error: x")
SOURCES = ("ggml-rpc.cpp", "/a/b/ggml.c", "x.cu", "weird", "ggml-cuda.cu")
ABORTS = ("Remote RPC server crashed or returned malformed response", "GGML_ASSERT(x) failed", "fatal error", "")
FIXED_LINES = (
    "srv  llama_server: model loaded", "main: server is listening on http://127.0.0.1:8080",
    "srv  update_slots: all slots are idle", "Segmentation fault (core dumped)", "Killed",
    "llama_model_loader: loaded meta data with 3 key-value pairs",
    "load_tensors: loading model tensors, this can take a while... (mmap = true)",
    "load_tensors: layer   0 assigned to device CPU, is_swa = 0",
    "common_params_print_info: verbosity = 5 (adjust with the `-lv N` CLI arg)",
    "srv    load_model: loading model 'm.gguf'", "exiting due to model loading error",
    "llama_model_loader: tensor overrides to CPU are used with mmap enabled", "....", "")
WRAPS = ("", "0.00.011.842 D ", "0.00.011.842 I ", "ai-llm-1  | ", "2025-08-20T11:41:20.014Z ",
         "Apr 17 23:09:42 host ollama[1]: ", "[47161] ", "\x1b[32m", "\t", "E cmn  ")
LONG = ("a", ". ", "x.cpp:1: ", "tensor ", "GGML_ASSERT(", "a | ", "\x1b[1;")


def _number(rnd):
    return _pick(rnd, ODD_NUMBERS) if rnd.randrange(3) == 0 else "%.2f" % (rnd.random() * 1e5)


def _int(rnd):
    return _pick(rnd, ODD_INTS) if rnd.randrange(4) == 0 else str(rnd.randrange(10 ** 6))


def _text(rnd):
    if rnd.randrange(3):
        return _pick(rnd, TEXTS)
    return "".join(chr(rnd.randrange(0x20, 0x3000)) for _i in range(rnd.randrange(20)))


LINE_FORMS = (
    lambda r: "tensor %s (%s MiB %s) buffer type overridden to %s" % (_pick(r, NAMES), _int(r), _pick(r, ("f32", "q5_0")),
                                                                      _pick(r, BUFFERS)),
    lambda r: "tensor %s buffer type overriden to %s" % (_pick(r, NAMES), _pick(r, BUFFERS)),
    lambda r: "Tensor %s (size = %s MiB) buffer type overriden to %s" % (_pick(r, NAMES), _number(r), _pick(r, BUFFERS)),
    lambda r: "load_tensors: %12s model buffer size = %8s MiB" % (_pick(r, BUFFERS), _number(r)),
    lambda r: "llama_kv_cache: %10s KV buffer size = %8s MiB" % (_pick(r, BUFFERS), _number(r)),
    lambda r: "llama_memory_recurrent: %10s RS buffer size = %8s MiB" % (_pick(r, BUFFERS), _number(r)),
    lambda r: "sched_reserve: %10s compute buffer size = %8s MiB" % (_pick(r, BUFFERS), _number(r)),
    lambda r: "load_tensors: offloaded %s/%s layers to GPU" % (_int(r), _int(r)),
    lambda r: "build: %s (%s) with cc" % (_int(r), _pick(r, ("1a2b3c4", "zz", ""))),
    lambda r: "version: 0.1.0-dev (build %s, commit %s)" % (_int(r), _pick(r, ("7e4c0a9", "g"))),
    lambda r: "llama_model_load: error loading model: " + _text(r),
    lambda r: "failed to initialize the context: " + _text(r),
    lambda r: "%s:%s: %s" % (_pick(r, SOURCES), _int(r), _pick(r, ABORTS)),
    lambda r: "terminate called after throwing an instance of '%s'" % _text(r),
    lambda r: "  what():  " + _text(r),
    lambda r: "%s(+0x%s)[0x%s]" % (_text(r), _int(r), _int(r)),
    lambda r: "#%s  0x%s in %s" % (_int(r), _int(r), _text(r)),
    lambda r: "allocating %s MiB on device %s: cudaMalloc failed: out of memory" % (_number(r), _int(r)),
    lambda r: "CUDA error: " + _text(r),
    lambda r: _pick(r, FIXED_LINES),
    _text,
)


def log_input(rnd):
    lines = [_pick(rnd, WRAPS) + _pick(rnd, WRAPS) + _pick(rnd, LINE_FORMS)(rnd) for _i in range(rnd.randrange(41))]
    if rnd.randrange(10) == 0:
        lines.insert(rnd.randint(0, len(lines)), _pick(rnd, LONG) * rnd.randrange(1000, 100000))
    text = "\n".join(lines).encode("utf-8", "surrogateescape")
    if rnd.randrange(2):
        text += bytes(rnd.randrange(256) for _i in range(rnd.randrange(65)))
    exit_code = _pick(rnd, (None, None, 0, 1, 132, 134, 139, -11, 255))
    expected = None if rnd.randrange(3) == 0 else [_pick(rnd, NAMES) for _i in range(rnd.randrange(5))]
    buffers = None if rnd.randrange(3) == 0 else {_pick(rnd, BUFFERS): rnd.random() * 1e5 for _i in range(3)}
    gpu = None if rnd.randrange(2) else rnd.random() * 1e4
    return text, exit_code, expected, buffers, gpu


@target("llama_log", log_input, ci_inputs=300)
def run_llama_log(_context, drawn):
    text, exit_code, expected, buffers, gpu = drawn
    parsed = parse_log(text, exit_code)
    result = verify_placement(parsed, expected, gpu, expect_model_buffers=buffers, expect_kv_buffers=buffers,
                              expect_compute_buffers=buffers, expect_overrides={"CUDA1": expected or []})
    try:
        json.dumps(dict(parsed, **result)).encode("utf-8")
    except (UnicodeEncodeError, TypeError, ValueError) as exc:
        raise Broken(f"the result is not valid JSON text: {exc}") from None
    if result["verified"] and (parsed["crash"] or parsed["load_error"]):
        raise Broken("verified after a crash or a load error")


# --------------------------------------------------------------------------- the offload pattern builder

ODD = ("\n", "'", '"', "${", "`", ",", "=", "\\", "$", "{", "}", "\u00e9", "\u4e16", "\r", "\x00", " ", "*", ".",
       "[", "|", "(", "\x7f")
PARTS = ("ffn_up_exps", "ffn_down_exps", "weight", "bias", "attn_q", "x")


def _stem(rnd):
    return "".join(_pick(rnd, PARTS) if rnd.randrange(2) else _pick(rnd, ODD) for _i in range(rnd.randint(1, 5)))


def pattern_input(rnd):
    names = set()
    for _i in range(rnd.randint(1, 24)):
        names.add("blk.%d.%s" % (rnd.randrange(31), _stem(rnd)) if rnd.randrange(4) else _stem(rnd))
    names = sorted(names)
    wanted = [n for n in names if rnd.randrange(2)]
    blocks = {rnd.randrange(31) for _i in range(rnd.randrange(11))}
    return names, wanted, blocks


def _proved(pattern, names, wanted):
    if not pattern:
        if wanted:
            raise Broken("an empty pattern for wanted tensors")
        return
    problem = pattern_problem(pattern)
    if problem is not None:
        raise Broken(f"a built pattern is refused: {problem}")
    found = matcher(pattern)
    if {n for n in names if found(n)} != set(wanted):
        raise Broken("a built pattern does not match exactly the wanted tensors")


@target("offload_pattern", pattern_input, allowed=(PatternError,), ci_inputs=200)
def run_offload_pattern(_context, drawn):
    names, wanted, blocks = drawn
    _proved(expert_pattern(names, wanted), names, wanted)
    in_blocks = [n for n in wanted if block_index(n) in blocks]
    _proved(block_expert_pattern(names, wanted, blocks), names, in_blocks)


# --------------------------------------------------------------------------- the role's .env and compose encoders

ENCODER_ODD = ("'", '"', "\\", "\\'", "$", "${", "$$", "{", "}", "#", " #", "=", " ", "\t", "\n", "\r", "\x00", "\x1b",
               "\x7f", "\x85", "\u2028", "\u2029", "\ufeff", "\u00e9", "\U0001f600", "`", ",", "blk\\.", "export ")
ENV_LINES = ("# a comment", "OTHER=1", "export OTHER='a b'", "LLM_PORT=1", "LLM_API_KEY=old", "", "  ", "X=\"q\"")


def _encoder_value(rnd):
    if rnd.randrange(4) == 0:
        return "".join(chr(rnd.choice((rnd.randrange(0x20, 0x7f), rnd.randrange(0xa0, 0xd800),
                                       rnd.randrange(0xe000, 0x110000)))) for _i in range(rnd.randrange(12)))
    return "".join(_pick(rnd, ENCODER_ODD) if rnd.randrange(2) else _pick(rnd, PARTS) for _i in range(rnd.randrange(8)))


def encoder_input(rnd):
    pattern, path = _encoder_value(rnd), "/models/" + _encoder_value(rnd)
    before = [_pick(rnd, ENV_LINES) for _i in range(rnd.randrange(5))]
    after = [_pick(rnd, ENV_LINES) for _i in range(rnd.randrange(3))]
    return pattern, path, before, after


def _encoder_context():
    # the venv's python-dotenv (podman-compose's .env parser) and PyYAML, only for this target
    from dotenv import dotenv_values  # pylint: disable=import-outside-toplevel
    import yaml  # pylint: disable=import-outside-toplevel

    return dotenv_values, yaml


@target("deploy_encoders", encoder_input, setup=_encoder_context, ci_inputs=200)
def run_deploy_encoders(context, drawn):
    dotenv_values, yaml = context
    pattern, path, before, after = drawn
    settings = {"ctx_size": 4096, "parallel": 2, "n_gpu_layers": 99, "container_model_path": path,
                "bind_address": "127.0.0.1", "port": 8080, "log_verbosity": None}
    placement = {"pattern": pattern, "topology": "cpu"}
    for value in (pattern, path):
        loaded = yaml.safe_load("x: " + compose_literal(value))["x"]
        if loaded != value.replace("$", "$$"):
            raise Broken(f"compose_literal({value!r}) reads back as {loaded!r}")
    written = (("LLM_MOE_OFFLOAD_PATTERN", pattern), ("LLM_MODEL_PATH", path))
    refused = [(key, dotenv_problem(value)) for key, value in written]
    refused = [(key, why) for key, why in refused if why]
    try:
        values = env_values(settings, placement)
    except RenderError as exc:
        if not refused:
            raise Broken(f"a value dotenv_problem accepts is refused: {exc}") from None
        if not any(str(exc).startswith(key + " ") for key, _why in refused):
            raise Broken(f"the refusal does not name the key: {exc}") from None
        return
    if refused:
        raise Broken(f"a value dotenv_problem refuses was accepted: {refused}")
    text, _dropped = merge_env("\n".join(before + ["# BEGIN x"] + after) + "\n", env_block(values, "0" * 64))
    read = dotenv_values(stream=io.StringIO(text))
    ours = parse_env(text)
    for key, _comment in ENV_KEYS:
        if read.get(key) != values[key]:
            raise Broken(f"python-dotenv reads {key} as {read.get(key)!r}, written {values[key]!r}")
        if ours.get(key) != values[key]:
            raise Broken(f"parse_env reads {key} as {ours.get(key)!r}, written {values[key]!r}")


# --------------------------------------------------------------------------- command line


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--target", action="append", choices=sorted(TARGETS), help="a target (default: all)")
    parser.add_argument("--inputs", type=int, default=100_000, help="inputs per target")
    parser.add_argument("--seed", type=int, default=random.randrange(1 << 30), help="hypothesis seed")
    parser.add_argument("--memory", choices=["sampled", "all"], default="sampled",
                        help="trace the memory of every input, or of the slow ones and one in 50 (default)")
    parser.add_argument("--engine", choices=["random", "hypothesis"], default="random")
    args = parser.parse_args()
    run = campaign if args.engine == "random" else hypothesis_campaign
    print(f"seed {args.seed}, engine {args.engine}, memory traced: {args.memory}; bounds per input: " + ", ".join(
        f"{t.name} {t.max_seconds:g} s / {t.max_mib:g} MiB" for t in TARGETS.values()))
    failed = False
    for name in args.target or sorted(TARGETS):
        report = run(TARGETS[name], args.inputs, args.seed, memory=args.memory)
        print(report.line(), flush=True)
        for key, entry in report.failures.items():
            print(f"  failure {key} x{entry['count']}: {entry['error']}\n    example: {entry['example']}")
        for took, example in report.slow[:3]:
            print(f"  over time {took} s: {example}")
        for mib, example in report.big[:3]:
            print(f"  over memory {mib} MiB: {example}")
        failed = failed or not report.ok()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
