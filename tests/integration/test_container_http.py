"""The HTTP probes of plugins/module_utils/_deploy_container.py against the real llama-server (llama.cpp b10435,
scripts/llama-cpp.sh): ``http_get`` and ``auth_check``, the proof that an API key is in force.

llama-server answers every path but /health, /v1/health, /models and /v1/models without the key with 401
(tools/server/server-http.cpp, middleware_validate_api_key), so /props is 401 without the key, 200 with it, and
200 to anyone on a server started without ``--api-key``.
"""
from __future__ import annotations

import json
import socket
import time
import urllib.request

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_container import (
    AUTH_PROBE_PATH,
    auth_check,
    http_get,
)
from tests.helpers.llama_server import SERVER, free_port, llama_server
from tools.gguf_models import write_tiny_nemotron_h_moe

pytestmark = pytest.mark.skipif(SERVER is None, reason="llama-server is not on PATH (bash scripts/setup.sh; source scripts/env.sh)")

KEY = "sk-test-key-0123456789"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_tiny_nemotron_h_moe(str(tmp_path_factory.mktemp("model") / "tiny.gguf"))


@pytest.fixture(scope="module")
def servers(model):
    """The URLs of a server started with ``--api-key KEY`` and of one started without."""
    args = ["-m", model, "-c", "256", "--no-webui"]
    with llama_server(args + ["--api-key", KEY], timeout=120) as keyed, llama_server(args, timeout=120) as open_server:
        assert keyed.healthy and open_server.healthy, keyed.stderr + open_server.stderr
        yield keyed.url, open_server.url


def test_the_key_is_in_force_only_on_a_server_that_demands_it(servers):
    keyed, open_server = servers
    assert AUTH_PROBE_PATH == "/props"
    assert auth_check(keyed, KEY) == {"enforced": True, "checked": True, "without_key": 401, "with_key": 200}
    assert auth_check(keyed, KEY + "x") == {"enforced": False, "checked": True, "without_key": 401,
                                            "with_key": 401}
    assert auth_check(open_server, KEY) == {"enforced": False, "checked": True, "without_key": 200, "with_key": 200}


def test_http_get_returns_the_status_and_the_body_up_to_4096_characters(servers):
    keyed = servers[0]
    status, body = http_get(keyed + "/health")
    assert status == 200 and json.loads(body) == {"status": "ok"}
    status, body = http_get(keyed + "/props", {"Authorization": "Bearer " + KEY})
    request = urllib.request.Request(keyed + "/props", headers={"Authorization": "Bearer " + KEY})
    with urllib.request.urlopen(request, timeout=10) as answer:
        whole = answer.read().decode("utf-8")
    assert status == 200 and body == whole[:4096]
    assert http_get(keyed + "/props")[0] == 401
    status, _body = http_get(keyed)  # no path asks for "/": the web UI, off here (--no-webui)
    assert status == 404


def test_nothing_listening_is_status_minus_one():
    status, message = http_get("http://127.0.0.1:%d/health" % free_port(), timeout=2)
    assert status == -1 and message  # the reason (connection refused) is kept
    assert auth_check("http://127.0.0.1:%d" % free_port(), KEY) == {
        "enforced": False, "checked": True, "without_key": -1, "with_key": -1}


def test_a_server_that_never_answers_is_given_up_after_the_timeout():
    """A socket that takes the connection (the kernel's backlog) but never answers: -1 once the timeout passed,
    not a wait without end."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        start = time.monotonic()
        status, message = http_get("http://127.0.0.1:%d/health" % silent.getsockname()[1], timeout=0.5)
        assert status == -1 and "timed out" in message
        assert time.monotonic() - start < 5
