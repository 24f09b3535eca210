"""The CUDA image's NVIDIA_REQUIRE_CUDA, and local images that carry it.

``REQUIRE_12_8_1`` is the requirement of nvidia/cuda:12.8.1-*-ubuntu24.04, the base of llama.cpp's
server-cuda-b10435 (llama.cpp's .devops/cuda.Dockerfile: CUDA_VERSION=12.8.1, UBUNTU_VERSION=24.04), as the image's
ENV layer prints it in public image histories (NVIDIA's container-images/cuda, dist/12.8.1/ubuntu2404): cuda>=12.8,
then for each driver branch 470, 535, 550, 560 and 565 one alternative per brand of ``BRANDS``.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from pathlib import Path

BRANDS = ("unknown", "grid", "tesla", "nvidia", "quadro", "quadrortx", "nvidiartx", "vapps", "vpc", "vcs", "vws",
          "cloudgaming")
REQUIRE_12_8_1 = "cuda>=12.8 " + " ".join("brand=%s,driver>=%d,driver<%d" % (brand, branch, branch + 1)
                                          for branch in (470, 535, 550, 560, 565) for brand in BRANDS)


@contextlib.contextmanager
def image_requiring(base="scratch", require=REQUIRE_12_8_1):
    """A podman image built here, ``FROM base`` with ``ENV NVIDIA_REQUIRE_CUDA=require``, under a unique tag that
    is removed afterwards; yields the tag."""
    tag = "localhost/ai-llm-require-test:%s" % os.urandom(4).hex()
    with tempfile.TemporaryDirectory() as context:
        (Path(context) / "Containerfile").write_text('FROM %s\nENV NVIDIA_REQUIRE_CUDA="%s"\n' % (base, require))
        built = subprocess.run(["podman", "build", "-q", "-t", tag, context], capture_output=True, text=True,
                               check=False, timeout=120)
    assert built.returncode == 0, built.stderr
    try:
        yield tag
    finally:
        subprocess.run(["podman", "rmi", "-f", tag], capture_output=True, check=False, timeout=120)
