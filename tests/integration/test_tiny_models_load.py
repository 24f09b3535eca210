"""The tiny models of tools/gguf_models.py really load in llama-server and answer /completion."""
from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from tools.gguf_models import write_tiny_nemotron_h_moe, write_tiny_qwen3moe

SERVER = shutil.which("llama-server-vulkan")
pytestmark = pytest.mark.skipif(SERVER is None, reason="llama-server-vulkan is not on PATH (source scripts/env.sh)")
START_TIMEOUT = 60


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def llama_server(tmp_path):
    """Start llama-server on a model and a free loopback port; always stopped (by its own pid) afterwards."""
    started = []

    def start(model):
        port = _free_port()
        log = open(tmp_path / "server.log", "w+")
        proc = subprocess.Popen(
            [SERVER, "-m", str(model), "-c", "512", "-ngl", "99", "-ot", r"\.ffn_.*_exps\.weight=CPU",
             "-lv", "5", "--no-log-prefix", "--no-log-timestamps", "-fit", "off",
             "--host", "127.0.0.1", "--port", str(port)],
            stdout=log, stderr=subprocess.STDOUT)
        started.append((proc, log))
        url = "http://127.0.0.1:%d" % port
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            assert proc.poll() is None, "llama-server exited:\n" + (tmp_path / "server.log").read_text()
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return url, tmp_path / "server.log"
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        pytest.fail("llama-server not healthy in %ds" % START_TIMEOUT)

    yield start
    for proc, log in started:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


def _completion(url):
    body = json.dumps({"prompt": "Hello world", "n_predict": 8, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/completion", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.status, json.load(resp)


@pytest.mark.parametrize("writer,experts", [
    (write_tiny_nemotron_h_moe, {"blk.%d.ffn_%s_exps.weight" % (b, k) for b in (1, 4) for k in ("up", "down")}),
    (write_tiny_qwen3moe, {"blk.%d.ffn_%s_exps.weight" % (b, k) for b in (0, 1) for k in ("gate", "up", "down")}),
])
def test_tiny_model_loads_and_completes(tmp_path, llama_server, writer, experts):
    url, log = llama_server(writer(tmp_path / "model.gguf"))
    status, result = _completion(url)
    assert status == 200
    assert result["tokens_predicted"] > 0
    overridden = set(re.findall(r"tensor (\S+) \(\d+ MiB \w+\) buffer type overridden to CPU", log.read_text()))
    assert overridden == experts
