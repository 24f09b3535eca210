"""benchmarks/gpu_check.sh on this machine: the CPU path (no nvidia-smi: the CPU build, every load on the CPU), and
its GPU path's plan and flags with the nvidia-smi test double of a dual RTX A5500 + A4000 (the CPU build of
llama-server has no CUDA device, so -ngl 99 and --fit on load on the CPU; the double's memory does not move).
The real llama-server serves every load (five: none, plan, fit, and the first or the last blocks' experts on the host);
a small model and a short speed check keep it to seconds."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.llama_server import SERVER
from tests.helpers.llm_deploy import ROOT

sys.path.insert(0, str(ROOT))
from benchmarks import gpu_check as benchmark  # noqa: E402  (the benchmark's own functions)

SCRIPT = str(ROOT / "benchmarks" / "gpu_check.sh")
DOUBLES = str(ROOT / "tests" / "doubles")
SMALL = ["--model-mib", "60", "--runs", "1", "--prompt-tokens", "32", "--predict-tokens", "8", "--ctx-size", "512"]
pytestmark = pytest.mark.skipif(SERVER is None, reason="llama-server is not on PATH (source scripts/env.sh)")


def gpu_check(*args, env=None):
    proc = subprocess.run(["bash", SCRIPT] + list(args), capture_output=True, text=True, check=False, timeout=600,
                          env=dict(os.environ, **(env or {})))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def built():
    return gpu_check("build")


def results(out):
    with open(os.path.join(out, "results.json")) as handle:
        return json.load(handle)


def test_the_cpu_path_builds_nothing_new_and_measures_three_loads_on_the_cpu(built, tmp_path):
    assert "gpu_check: no nvidia-smi: the CPU build (the CPU path)" in built
    printed = gpu_check("measure", "--out", str(tmp_path), *SMALL)
    got = results(tmp_path)
    assert sorted(got["loads"]) == ["first", "fit", "last", "none", "plan"]
    for name, load in got["loads"].items():
        assert load["args"] == ["-c", "512", "-lv", "4", "-ngl", "0", "-fit", "off"], name
        assert load["devices"] == [] and load["cuda_context"] == []   # the CPU backend prints no 'using device' line
        assert load["speed"]["decode_tokens_per_second"] > 0 and load["speed"]["prompt_tokens_per_second"] > 0
        assert load["speed"]["predicted_tokens"] == 8 and load["nvidia_smi_mib"] is None
        assert "model loaded" in (tmp_path / ("%s.log" % name)).read_text()
    assert got["gpus"] == [] and got["planned_mib"] == []
    assert "planned MiB per GPU:     none (a CPU plan)" in printed


def test_the_gpu_path_plans_for_the_cards_nvidia_smi_names_and_loads_each_placement(built, tmp_path):
    env = {"PATH": DOUBLES + os.pathsep + os.environ["PATH"], "NVIDIA_SMI_FIXTURE": "dual_a5500_a4000"}
    gpu_check("measure", "--out", str(tmp_path), *SMALL, env=env)
    got = results(tmp_path)
    assert [g["name"] for g in got["gpus"]] == ["NVIDIA RTX A5500", "NVIDIA RTX A4000"]
    plan = got["plan"]
    assert len(got["planned_mib"]) == len(plan["devices"]) >= 1
    assert got["loads"]["none"]["args"] == ["-c", "512", "-lv", "4", "-ngl", "99", "-fit", "off"]
    assert got["loads"]["fit"]["args"] == ["-c", "512", "-lv", "4", "-fit", "on"]
    split = ["-ts", plan["tensor_split"]] if plan["tensor_split"] else []
    expected = ["-c", "512", "-lv", "4", "-ngl", "99", "-fit", "off"] + split
    assert got["loads"]["plan"]["args"][:len(expected)] == expected
    # 60 MiB of f32 qwen3moe: round(60 / 96) = 1, so 2 expert blocks (write_model's least), and the default
    # --host-blocks is one of them: block 0 for the first load, block 1 for the last
    assert got["ends"] == {"first": r"blk\.0\.ffn_.*_exps\.weight", "last": r"blk\.1\.ffn_.*_exps\.weight"}
    for name in ("first", "last"):
        assert got["loads"][name]["args"] == ["-c", "512", "-lv", "4", "-ngl", "99", "-fit", "off", "-ot",
                                              got["ends"][name] + "=CPU"]
        assert got["loads"][name]["speed"]["decode_tokens_per_second"] > 0
    # the double prints the same memory before and during each load
    assert [load["nvidia_smi_mib"] for load in got["loads"].values()] == [[0, 0]] * 5


def test_each_cuda_device_of_a_real_log_is_matched_to_its_card_by_bus_id_and_gets_its_context():
    """A real CUDA log (llama-server b7500 on an RTX 4090, -lv 4): ``using device CUDA0 (NVIDIA GeForce RTX 4090)
    (0000:01:00.0)``, and CUDA0's model 1369.43, KV 768.00, RS 47.62 and compute 1078.13 MiB buffers (3263.18 MiB).
    nvidia-smi names the card 00000000:01:00.0; with 3731 MiB held by the server's process the context is
    3731 - 3263.18 = 467.82, 468 MiB; a card at another bus id is not that device."""
    log = (ROOT / "tests" / "data" / "llama_logs" / "b7500_nemotron_cuda_lv4_overridden_cuda_host.log").read_text()
    card = {"index": 0, "uuid": "GPU-3b9e1f07-c2d4-58a6-7e10-94f2ab6c8d31", "name": "NVIDIA GeForce RTX 4090",
            "pci_bus_id": "00000000:01:00.0", "memory_held_by_pid_mib": 3731}
    devices, context = benchmark.devices_and_context(log, [card])
    assert [(d["device"], d["description"], d["pci_bus_id"]) for d in devices] == [
        ("CUDA0", "NVIDIA GeForce RTX 4090", "0000:01:00.0")]
    assert [(r["device"], r["index"], r["buffers_mib"], r["context_mib"]) for r in context] == [("CUDA0", 0, 3263.18, 468)]
    assert benchmark.devices_and_context(log, [dict(card, pci_bus_id="00000000:02:00.0")])[1] == []


def test_the_device_run_without_the_cuda_carry_says_what_makes_it(tmp_path):
    """``device`` needs the carry of benchmarks/cuda_build.sh; without one it stops before anything runs."""
    proc = subprocess.run(["bash", SCRIPT, "device"], capture_output=True, text=True, check=False, timeout=60,
                          env=dict(os.environ, GPU_CHECK_STATE=str(tmp_path)))
    assert proc.returncode == 1 and "bash benchmarks/cuda_build.sh makes it" in proc.stderr, proc.stderr
