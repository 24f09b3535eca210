"""The tiny models of tools/gguf_models.py really load in llama-server and answer /completion."""
from __future__ import annotations

import json
import re
import urllib.request

import pytest

from tests.helpers.llama_server import SERVER, llama_server
from tools.gguf_models import write_tiny_nemotron_h_moe, write_tiny_qwen3moe

pytestmark = pytest.mark.skipif(SERVER is None, reason="llama-server is not on PATH (bash scripts/setup.sh; source scripts/env.sh)")
START_TIMEOUT = 60


@pytest.mark.parametrize("writer,experts", [
    (write_tiny_nemotron_h_moe, {"blk.%d.ffn_%s_exps.weight" % (b, k) for b in (1, 4) for k in ("up", "down")}),
    (write_tiny_qwen3moe, {"blk.%d.ffn_%s_exps.weight" % (b, k) for b in (0, 1) for k in ("gate", "up", "down")}),
])
def test_tiny_model_loads_and_completes(tmp_path, writer, experts):
    log = tmp_path / "server.log"
    body = json.dumps({"prompt": "Hello world", "n_predict": 8, "temperature": 0}).encode()
    with llama_server(["-m", writer(tmp_path / "model.gguf"), "-c", "512", "-ngl", "99", "-ot",
                       r"\.ffn_.*_exps\.weight=CPU", "-lv", "5", "--no-log-prefix", "--no-log-timestamps", "-fit",
                       "off"], START_TIMEOUT, log=log, with_stdout=True) as server:
        assert server.exited is None, "llama-server exited:\n" + log.read_text()
        assert server.healthy, "llama-server not healthy in %ds" % START_TIMEOUT
        req = urllib.request.Request(server.url + "/completion", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            status, result = resp.status, json.load(resp)
        overridden = set(re.findall(r"tensor (\S+) \(\d+ MiB \w+\) buffer type overridden to CPU", log.read_text()))
    assert status == 200
    assert result["tokens_predicted"] > 0
    assert overridden == experts
