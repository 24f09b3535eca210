"""Fixtures shared by the module utils' tests: the byte order of the GGUF reader's files and the planner's models."""
from __future__ import annotations

import pytest

from tests.helpers.plans import exact_moe, nemotron_nano_30b


@pytest.fixture(params=["little", "big"])
def endian(request):
    """Each GGUF test that takes ``endian`` runs on a little-endian and a big-endian file."""
    return request.param


@pytest.fixture(scope="module")
def nano(tmp_path_factory):
    """The Nemotron-3-Nano-30B-A3B header (tests/helpers/plans.py)."""
    return nemotron_nano_30b(tmp_path_factory)


@pytest.fixture(scope="module")
def moe():
    """The small qwen3moe of exact sizes (tests/helpers/plans.py)."""
    return exact_moe()
