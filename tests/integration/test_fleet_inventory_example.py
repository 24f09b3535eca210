"""inventory/examples/fleet: its groups as Ansible reads them, and what its group_vars say about offloading.

The comments of group_vars/single_gpu.yml and dual_gpu.yml say when each topology moves experts to host RAM;
here the planner (ai_llm.moe_offload.moe_offload_plan, run through ansible) answers for the same settings, on
the Nemotron-3-Nano-30B-A3B Q4_K_M header and the RTX A5500 that nvidia-smi reports in tests/data/nvidia_smi.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._nvidia_smi import parse_gpus
from tests.helpers.collection_run import ansible_env
from tools.gguf_models import write_nemotron_nano_30b

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "inventory" / "examples" / "fleet"
BIN = Path(sys.executable).parent
ENV = ansible_env(BIN, ROOT / "ansible.cfg", ROOT / ".collections")


@pytest.fixture(scope="module")
def hostvars():
    out = subprocess.run([str(BIN / "ansible-inventory"), "-i", str(EXAMPLE), "--list"], capture_output=True,
                         text=True, env=ENV, timeout=120, check=True).stdout
    return json.loads(out)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_nemotron_nano_30b(tmp_path_factory.mktemp("nano"), shards=6)[0]


@pytest.fixture(scope="module")
def a5500():
    (card,), _warnings = parse_gpus((ROOT / "tests" / "data" / "nvidia_smi" / "rtx_a5500.txt").read_text())
    return card


def settings(inventory, host):
    return inventory["_meta"]["hostvars"][host]


def test_the_groups(hostvars):
    assert sorted(hostvars["llm_servers"]["children"]) == ["dual_gpu", "single_gpu"]
    assert hostvars["single_gpu"]["hosts"] == ["gpu-box-1", "gpu-box-2", "gpu-box-3"]
    assert hostvars["dual_gpu"]["hosts"] == ["a5500-box-1", "a5500-box-2"]
    single, dual = settings(hostvars, "gpu-box-2"), settings(hostvars, "a5500-box-1")
    for host in (single, dual):
        assert host["llm_server_moe_offload_mode"] == "auto" and host["llm_rollout_report_dir"] == "rollout-report"
    assert (single["llm_server_ctx_size"], single["llm_server_parallel"]) == (32768, 2)
    assert (dual["llm_server_ctx_size"], dual["llm_server_parallel"], dual["llm_server_gpu_devices"]) == (131072, 4, [0, 1])


PLANS = """
- name: Plan every case
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Plan
      ai_llm.moe_offload.moe_offload_plan:
        gguf: "{{ model }}"
        gpus: "{{ item.gpus }}"
        ctx_size: "{{ item.ctx_size }}"
        parallel: "{{ item.parallel }}"
        mode: auto
      loop: "{{ cases }}"
      register: plans
    - name: Keep the answers
      ansible.builtin.copy:
        content: "{{ plans.results | to_json }}"
        dest: "{{ out }}"
        mode: "0644"
"""


@pytest.fixture(scope="module")
def plans(tmp_path_factory, hostvars, model, a5500):
    """The planner's answer for each group's own settings and for the other cases their comments name."""
    tmp = tmp_path_factory.mktemp("plans")
    single, dual = settings(hostvars, "gpu-box-1"), settings(hostvars, "a5500-box-2")
    cards = [dict(a5500, index=i, uuid="GPU-a5500-%d" % i) for i in dual["llm_server_gpu_devices"]]
    cases = {
        "single": ([a5500], single["llm_server_ctx_size"], single["llm_server_parallel"]),
        "single 4K": ([a5500], 4096, 1),
        "single 64K x4": ([a5500], 65536, 4),
        "single 128K x4": ([a5500], 131072, 4),
        "single 256K": ([a5500], 262144, 1),
        "single busy": ([dict(a5500, memory_free_mib=5 * 1024)], 32768, 2),
        "dual": (cards, dual["llm_server_ctx_size"], dual["llm_server_parallel"]),
        "dual 256K x4": (cards, 262144, 4),
        "dual busy": ([dict(card, memory_free_mib=8 * 1024) for card in cards], dual["llm_server_ctx_size"],
                      dual["llm_server_parallel"]),
    }
    (tmp / "plans.yml").write_text(PLANS)
    extra = {"model": model, "out": str(tmp / "plans.json"),
             "cases": [{"gpus": g, "ctx_size": c, "parallel": p} for g, c, p in cases.values()]}
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", "ansible_python_interpreter=" + sys.executable, "-e", json.dumps(extra),
                           str(tmp / "plans.yml")], capture_output=True, text=True, env=ENV, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    return dict(zip(cases, json.loads((tmp / "plans.json").read_text())))


def test_single_gpu_hosts_offload_as_their_group_vars_say(plans):
    ours = plans["single"]
    assert ours["offload"] and ours["cpu_expert_layers"] == [1, 3]
    assert 2300 < ours["memory"]["host"]["model_mib"] < 2400                      # "about 2,360 MiB"
    for case, blocks in (("single 4K", [1, 3]), ("single 64K x4", [1, 3, 6]), ("single 128K x4", [1, 3, 6]),
                         ("single 256K", [1, 3, 6, 8])):
        assert plans[case]["cpu_expert_layers"] == blocks, case
    assert len(plans["single busy"]["cpu_expert_layers"]) >= 20      # most of the 23 MoE blocks


def test_dual_gpu_hosts_split_and_do_not_offload(plans):
    ours = plans["dual"]
    assert not ours["offload"] and ours["placement"] == "split"
    # "about 12,800 + 13,900 MiB": within 5% of what the planner says
    for gpu, about in zip(ours["memory"]["gpus"], (12800, 13900)):
        assert abs(gpu["total_mib"] - about) < 0.05 * about, ours["memory"]["gpus"]
    assert not plans["dual 256K x4"]["offload"]
    assert plans["dual busy"]["offload"]
