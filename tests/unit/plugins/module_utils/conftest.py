"""Fixtures shared by the module utils' tests: the byte order of the GGUF reader's files, the planner's models, and
the HTTP server and target folders of a model's fetch."""
from __future__ import annotations

import urllib.request

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _model_fetch
from tests.helpers.http_server import FileServer
from tests.helpers.model_hosts import Host
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


@pytest.fixture
def www(tmp_path):
    """The folder the model server serves."""
    folder = tmp_path / "www"
    folder.mkdir()
    return folder


@pytest.fixture
def server(www, monkeypatch):
    """A real HTTP server on 127.0.0.1 serving ``www`` (tests/helpers/http_server.py). Proxies set in the environment
    would send the requests for 127.0.0.1 elsewhere: the fetch uses none then."""
    if urllib.request.getproxies():
        monkeypatch.setattr(_model_fetch, "_OPENER", urllib.request.build_opener(
            urllib.request.ProxyHandler({}), _model_fetch._NoRedirect))  # pylint: disable=protected-access
    with FileServer(www) as files:
        yield files


@pytest.fixture
def host(tmp_path):
    """The target's folders of a model's fetch (tests/helpers/model_hosts.py)."""
    return Host(tmp_path)
