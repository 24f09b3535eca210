# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Vendors' datasheet peak figures of the GPUs users run, keyed by the exact name ``nvidia-smi --query-gpu=name``
prints: the memory bandwidth (bytes/s) and the FP16 tensor throughput (FLOP/s) the speed model divides by.

A name matches only itself: a prefix would give an "NVIDIA GeForce RTX 3090 Ti" the figures of the 3090, an
"NVIDIA H100 NVL" those of another H100. A card whose one name covers models of different figures (the GeForce RTX
3080 of 10 and 12 GB, 3060 of 8 and 12 GB, 3060 Ti of GDDR6 and GDDR6X, 4070 of GDDR6X and GDDR6) is left out, and
so is a figure without a datasheet to cite: such a GPU gets the assumed figure, or the one a user gives.

Standard library only: this runs on target hosts (Python >= 3.9).
"""

from __future__ import annotations

GB = 10 ** 9  # bandwidths are quoted in decimal gigabytes per second
TFLOPS = 10 ** 12  # compute rates are quoted in decimal tera floating-point operations per second

# Peak memory bandwidth, bytes/s. Peak figures: kernels reach less, and the calibration puts what they do not explain
# into the split cost.
GPU_PEAK_BANDWIDTH = {
    # GeForce RTX 30: https://www.nvidia.com/en-us/geforce/graphics-cards/30-series/rtx-3090-3090ti/,
    # https://www.nvidia.com/en-us/geforce/graphics-cards/30-series/rtx-3080-3080ti/,
    # https://www.nvidia.com/en-us/geforce/graphics-cards/30-series/rtx-3070-3070ti/
    "NVIDIA GeForce RTX 3090 Ti": 1008 * GB,
    "NVIDIA GeForce RTX 3090": 936 * GB,
    "NVIDIA GeForce RTX 3080 Ti": 912 * GB,
    "NVIDIA GeForce RTX 3070 Ti": 608 * GB,
    "NVIDIA GeForce RTX 3070": 448 * GB,
    # GeForce RTX 40: https://www.nvidia.com/en-us/geforce/graphics-cards/40-series/rtx-4090/,
    # https://www.nvidia.com/en-us/geforce/graphics-cards/40-series/rtx-4080-family/,
    # https://www.nvidia.com/en-us/geforce/graphics-cards/40-series/rtx-4070-family/,
    # https://www.nvidia.com/en-us/geforce/graphics-cards/40-series/rtx-4060-4060ti/
    "NVIDIA GeForce RTX 4090": 1008 * GB,
    "NVIDIA GeForce RTX 4080 SUPER": 736 * GB,
    "NVIDIA GeForce RTX 4080": 716.8 * GB,
    "NVIDIA GeForce RTX 4070 Ti SUPER": 672 * GB,
    "NVIDIA GeForce RTX 4070 Ti": 504 * GB,
    "NVIDIA GeForce RTX 4070 SUPER": 504 * GB,
    "NVIDIA GeForce RTX 4060 Ti": 288 * GB,  # 8 and 16 GB alike
    "NVIDIA GeForce RTX 4060": 272 * GB,
    # GeForce RTX 50: https://www.nvidia.com/en-us/geforce/graphics-cards/50-series/rtx-5090/,
    # https://www.nvidia.com/en-us/geforce/graphics-cards/50-series/rtx-5080/,
    # https://www.nvidia.com/en-us/geforce/graphics-cards/50-series/rtx-5070-family/,
    # https://www.nvidia.com/en-us/geforce/graphics-cards/50-series/rtx-5060-family/
    "NVIDIA GeForce RTX 5090": 1792 * GB,
    "NVIDIA GeForce RTX 5080": 960 * GB,
    "NVIDIA GeForce RTX 5070 Ti": 896 * GB,
    "NVIDIA GeForce RTX 5070": 672 * GB,
    "NVIDIA GeForce RTX 5060 Ti": 448 * GB,  # 8 and 16 GB alike
    "NVIDIA GeForce RTX 5060": 448 * GB,
    # RTX A-series datasheets: https://www.nvidia.com/en-us/design-visualization/rtx-a6000/ (and rtx-a5500/,
    # rtx-a5000/, rtx-a4500/, rtx-a4000/, rtx-a2000/ beside it)
    "NVIDIA RTX A6000": 768 * GB,
    "NVIDIA RTX A5500": 768 * GB,
    "NVIDIA RTX A5000": 768 * GB,
    "NVIDIA RTX A4500": 640 * GB,
    "NVIDIA RTX A4000": 448 * GB,
    "NVIDIA RTX A2000": 288 * GB,
    "NVIDIA RTX A2000 12GB": 288 * GB,
    # Ada Generation workstation datasheets: https://www.nvidia.com/en-us/design-visualization/rtx-6000/ (and
    # rtx-5000/, rtx-4500/, rtx-4000/, rtx-2000/)
    "NVIDIA RTX 6000 Ada Generation": 960 * GB,
    "NVIDIA RTX 5000 Ada Generation": 576 * GB,
    "NVIDIA RTX 4500 Ada Generation": 432 * GB,
    "NVIDIA RTX 4000 Ada Generation": 360 * GB,
    "NVIDIA RTX 2000 Ada Generation": 224 * GB,
    # RTX PRO 6000 Blackwell, its three editions alike:
    # https://www.nvidia.com/en-us/products/workstations/professional-desktop-gpus/rtx-pro-6000/
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition": 1792 * GB,
    "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition": 1792 * GB,
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": 1792 * GB,
    # Data center: https://www.nvidia.com/en-us/data-center/l4/, .../l40/, .../l40s/, .../tesla-t4/, .../v100/
    "NVIDIA L4": 300 * GB,
    "NVIDIA L40": 864 * GB,
    "NVIDIA L40S": 864 * GB,
    "Tesla T4": 320 * GB,
    "Tesla V100-PCIE-16GB": 900 * GB,
    "Tesla V100-PCIE-32GB": 900 * GB,
    "Tesla V100-SXM2-16GB": 900 * GB,
    "Tesla V100-SXM2-32GB": 900 * GB,
    # A100 datasheet: https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
    "NVIDIA A100-PCIE-40GB": 1555 * GB,
    "NVIDIA A100-SXM4-40GB": 1555 * GB,
    "NVIDIA A100 80GB PCIe": 1935 * GB,
    "NVIDIA A100-SXM4-80GB": 2039 * GB,
    # H100 (SXM5 prints "H100 80GB HBM3") and H200: https://www.nvidia.com/en-us/data-center/h100/,
    # https://www.nvidia.com/en-us/data-center/h200/
    "NVIDIA H100 PCIe": 2000 * GB,
    "NVIDIA H100 80GB HBM3": 3350 * GB,
    "NVIDIA H100 NVL": 3900 * GB,
    "NVIDIA H200": 4800 * GB,
    "NVIDIA H200 NVL": 4800 * GB,
}
UNKNOWN_GPU_BANDWIDTH = 500 * GB  # assumed for a GPU the table does not name and no figure is given for

# Peak FP16 dense tensor-core throughput, FLOP/s, without structured sparsity (a datasheet's sparse figure halved).
# Professional and data-center cards: FP16 with FP32 accumulate, the same rate as FP16 accumulate on them. GeForce
# cards: FP16 accumulate, the figure their whitepapers print first; their FP32-accumulate rate is half of it. Peak
# figures: llama.cpp's kernels (cuBLAS for F16/BF16, MMQ integer kernels for quantized types) reach less; a given
# figure replaces them.
GPU_PEAK_FLOPS = {
    # GeForce, FP16 accumulate: GA102 whitepaper, https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf;
    # Ada whitepaper, https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf
    "NVIDIA GeForce RTX 3090": 142 * TFLOPS,
    "NVIDIA GeForce RTX 4090": 330.3 * TFLOPS,
    # RTX A-series: the GA102 whitepaper (A6000, 309.7 sparse) and the datasheets beside GPU_PEAK_BANDWIDTH's
    "NVIDIA RTX A6000": 154.8 * TFLOPS,
    "NVIDIA RTX A5500": 136.4 * TFLOPS,
    "NVIDIA RTX A4000": 76.7 * TFLOPS,  # 153.4 sparse
    # Ada workstation and data center, the datasheets of GPU_PEAK_BANDWIDTH
    "NVIDIA RTX 6000 Ada Generation": 364.2 * TFLOPS,
    "NVIDIA L4": 121 * TFLOPS,  # 242 sparse
    "NVIDIA L40": 181.05 * TFLOPS,  # 362.1 sparse
    "NVIDIA L40S": 362.05 * TFLOPS,  # 733 sparse
    "Tesla T4": 65 * TFLOPS,  # "Mixed Precision (FP16/FP32)"
    "Tesla V100-PCIE-16GB": 112 * TFLOPS,
    "Tesla V100-PCIE-32GB": 112 * TFLOPS,
    "Tesla V100-SXM2-16GB": 125 * TFLOPS,
    "Tesla V100-SXM2-32GB": 125 * TFLOPS,
    "NVIDIA A100-PCIE-40GB": 312 * TFLOPS,
    "NVIDIA A100-SXM4-40GB": 312 * TFLOPS,
    "NVIDIA A100 80GB PCIe": 312 * TFLOPS,
    "NVIDIA A100-SXM4-80GB": 312 * TFLOPS,
    "NVIDIA H100 PCIe": 756 * TFLOPS,
    "NVIDIA H100 80GB HBM3": 989.4 * TFLOPS,
    "NVIDIA H200": 989.4 * TFLOPS,
}
UNKNOWN_GPU_FLOPS = 50 * TFLOPS  # assumed for a GPU the table does not name and no figure is given for
