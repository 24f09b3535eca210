"""The datasheet figures of the GPUs users run (``_gpu_specs``), by the exact name nvidia-smi prints, as the speed
model reads them. Expected figures are the datasheets' and whitepapers' (the URLs beside each family in
``_gpu_specs.py``), written here again from them: bandwidth in GB/s, FP16 dense tensor TFLOP/s (a sparse figure
halved)."""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _gpu_specs as specs
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _speed_model as spm

GB = 1e9
TFLOPS = 1e12

BANDWIDTH_GB_S = {
    "NVIDIA GeForce RTX 3090 Ti": 1008, "NVIDIA GeForce RTX 3090": 936, "NVIDIA GeForce RTX 3080 Ti": 912,
    "NVIDIA GeForce RTX 3070 Ti": 608, "NVIDIA GeForce RTX 3070": 448,
    "NVIDIA GeForce RTX 4090": 1008, "NVIDIA GeForce RTX 4080 SUPER": 736, "NVIDIA GeForce RTX 4080": 716.8,
    "NVIDIA GeForce RTX 4070 Ti SUPER": 672, "NVIDIA GeForce RTX 4070 Ti": 504, "NVIDIA GeForce RTX 4070 SUPER": 504,
    "NVIDIA GeForce RTX 4060 Ti": 288, "NVIDIA GeForce RTX 4060": 272,
    "NVIDIA GeForce RTX 5090": 1792, "NVIDIA GeForce RTX 5080": 960, "NVIDIA GeForce RTX 5070 Ti": 896,
    "NVIDIA GeForce RTX 5070": 672, "NVIDIA GeForce RTX 5060 Ti": 448, "NVIDIA GeForce RTX 5060": 448,
    "NVIDIA RTX A6000": 768, "NVIDIA RTX A5500": 768, "NVIDIA RTX A5000": 768, "NVIDIA RTX A4500": 640,
    "NVIDIA RTX A4000": 448, "NVIDIA RTX A2000": 288, "NVIDIA RTX A2000 12GB": 288,
    "NVIDIA RTX 6000 Ada Generation": 960, "NVIDIA RTX 5000 Ada Generation": 576,
    "NVIDIA RTX 4500 Ada Generation": 432, "NVIDIA RTX 4000 Ada Generation": 360,
    "NVIDIA RTX 2000 Ada Generation": 224,
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition": 1792,
    "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition": 1792,
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": 1792,
    "NVIDIA L4": 300, "NVIDIA L40": 864, "NVIDIA L40S": 864, "Tesla T4": 320,
    "Tesla V100-PCIE-16GB": 900, "Tesla V100-PCIE-32GB": 900, "Tesla V100-SXM2-16GB": 900, "Tesla V100-SXM2-32GB": 900,
    "NVIDIA A100-PCIE-40GB": 1555, "NVIDIA A100-SXM4-40GB": 1555, "NVIDIA A100 80GB PCIe": 1935,
    "NVIDIA A100-SXM4-80GB": 2039,
    "NVIDIA H100 PCIe": 2000, "NVIDIA H100 80GB HBM3": 3350, "NVIDIA H100 NVL": 3900,
    "NVIDIA H200": 4800, "NVIDIA H200 NVL": 4800,
}
FLOPS_T = {
    "NVIDIA GeForce RTX 3090": 142, "NVIDIA GeForce RTX 4090": 330.3,
    "NVIDIA RTX A6000": 154.8, "NVIDIA RTX A5500": 272.8 / 2, "NVIDIA RTX A4000": 153.4 / 2,
    "NVIDIA RTX 6000 Ada Generation": 364.2, "NVIDIA L4": 242 / 2, "NVIDIA L40": 362.1 / 2, "NVIDIA L40S": 362.05,
    "Tesla T4": 65, "Tesla V100-PCIE-16GB": 112, "Tesla V100-PCIE-32GB": 112, "Tesla V100-SXM2-16GB": 125,
    "Tesla V100-SXM2-32GB": 125, "NVIDIA A100-PCIE-40GB": 312, "NVIDIA A100-SXM4-40GB": 312,
    "NVIDIA A100 80GB PCIe": 312, "NVIDIA A100-SXM4-80GB": 312,
    "NVIDIA H100 PCIe": 756, "NVIDIA H100 80GB HBM3": 989.4, "NVIDIA H200": 989.4,
}


@pytest.mark.parametrize("name", sorted(BANDWIDTH_GB_S))
def test_each_card_resolves_to_its_own_bandwidth(name):
    assert spm.gpu_bandwidth(name) == pytest.approx((BANDWIDTH_GB_S[name] * GB, "datasheet peak of %s" % name))


@pytest.mark.parametrize("name", sorted(FLOPS_T))
def test_each_card_resolves_to_its_own_compute_rate(name):
    assert spm.gpu_flops(name) == pytest.approx((FLOPS_T[name] * TFLOPS, "datasheet peak of %s" % name))


def test_the_tables_hold_exactly_the_cards_above():
    assert set(specs.GPU_PEAK_BANDWIDTH) == set(BANDWIDTH_GB_S)
    assert set(specs.GPU_PEAK_FLOPS) == set(FLOPS_T)


@pytest.mark.parametrize("name, other", [
    ("NVIDIA GeForce RTX 3090 Ti", "NVIDIA GeForce RTX 3090"),
    ("NVIDIA GeForce RTX 4070 Ti", "NVIDIA GeForce RTX 4070 Ti SUPER"),
    ("NVIDIA GeForce RTX 4080 SUPER", "NVIDIA GeForce RTX 4080"),
    ("NVIDIA H100 NVL", "NVIDIA H100 PCIe"),
    ("NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-40GB"),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB"),
])
def test_names_a_prefix_would_misread_get_their_own_figure(name, other):
    """Each of these names begins with, or is the start of, another card's name, of other figures."""
    assert spm.gpu_bandwidth(name)[0] == BANDWIDTH_GB_S[name] * GB != BANDWIDTH_GB_S[other] * GB


@pytest.mark.parametrize("name", [
    "NVIDIA GeForce RTX 4070",  # GDDR6X 504 GB/s and GDDR6 480 GB/s under one name: left out
    "NVIDIA GeForce RTX 3080",  # 10 GB 760 GB/s and 12 GB 912 GB/s under one name: left out
    "NVIDIA GeForce RTX 3090 Ti Founders",  # no prefix match: only exact names
    "NVIDIA H100",
    "GPU0",
])
def test_a_name_not_in_the_table_gets_the_assumed_figures(name):
    assert spm.gpu_bandwidth(name) == (500 * GB, "assumed: %s is not in the table" % name)
    assert spm.gpu_flops(name) == (50 * TFLOPS, "assumed: %s is not in the table" % name)
    assert spm.gpu_flops("NVIDIA H100 NVL")[1] == "assumed: NVIDIA H100 NVL is not in the table"  # no figure cited
