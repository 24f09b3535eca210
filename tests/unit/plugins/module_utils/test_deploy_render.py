"""The files the llm_server role writes (plugins/module_utils/_deploy_render.py): its .env block, the compose file
and the configuration hash, read back by the real parsers (python-dotenv, PyYAML, podman-compose 1.6.0)."""
from __future__ import annotations

import io
import shutil
import subprocess

import dotenv
import pytest
import yaml

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_render import (
    BEGIN,
    END,
    HASH_LABEL,
    RenderError,
    config_hash,
    env_block,
    env_values,
    managed_block,
    merge_env,
    parse_env,
    render_compose,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_values import check_settings

HOSTILE = {
    "llm_server_model_path": "/srv/mo dels/x$y.gguf",
    "llm_server_project_dir": "/srv/ai $llm",
    "llm_server_compose_project": "ai-llm",
    "llm_server_image": "localhost/ai-llm:cuda",
    "llm_server_extra_args": ["--alias", "a$b${HOME}`id`'\"", "--api-prefix", "$$"],
    "llm_server_log_verbosity": 5,
}
PLACEMENT = {"pattern": r"blk\.(3|4)\.ffn_.*_exps\.weight$", "tensor_overrides": [r"blk\.5\.ffn_.*_exps=CUDA1"],
             "gpu_devices": [0, 1], "tensor_split": "0.6,0.4", "topology": "dual"}


def settings(**values):
    return check_settings(dict(HOSTILE, **values)).as_dict()


def test_the_env_block_reads_back_through_python_dotenv():
    s = settings()
    values = env_values(s, PLACEMENT)
    block = env_block(values, config_hash(values, "compose"))
    read = dotenv.dotenv_values(stream=io.StringIO(block))
    assert {k: read[k] for k in values} == values
    assert read["LLM_MOE_OFFLOAD_PATTERN"] == PLACEMENT["pattern"]
    assert read["LLM_TENSOR_OVERRIDES"] == PLACEMENT["tensor_overrides"][0]
    assert read["LLM_MODEL_PATH"] == "/models/x$y.gguf"
    assert parse_env(block) == dict(values, LLM_CONFIG_HASH=read["LLM_CONFIG_HASH"])


@pytest.mark.parametrize("separator", ["\u2028", "\u2029"])
def test_a_value_with_a_unicode_line_separator_reads_back_whole(separator):
    """python-dotenv cuts .env lines at \\r\\n, \\n and \\r only; the role reads its block back the same way (not
    with str.splitlines(), which also cuts at U+2028 and U+2029 and read the value as two lines)."""
    path = "/models/a%sb #c.gguf" % separator
    values = env_values(settings(llm_server_model_path="/srv/models/a%sb #c.gguf" % separator), PLACEMENT)
    assert values["LLM_MODEL_PATH"] == path
    text, _dropped = merge_env("OTHER=1\n", env_block(values, "h"))
    assert dotenv.dotenv_values(stream=io.StringIO(text))["LLM_MODEL_PATH"] == path
    assert parse_env(text)["LLM_MODEL_PATH"] == path
    assert managed_block(text) == env_block(values, "h")
    assert merge_env(text, env_block(values, "h")) == (text, [])


def test_a_value_the_placement_cannot_write_is_refused():
    with pytest.raises(RenderError, match="LLM_MOE_OFFLOAD_PATTERN"):
        env_values(settings(), dict(PLACEMENT, pattern="blk\n${X}"))


def test_the_compose_file_holds_every_value_encoded():
    s = settings()
    service = yaml.safe_load(render_compose(s, PLACEMENT, "podman"))["services"]["ai-llm"]
    # $ is doubled for compose: after compose's own unescaping the values are the literal ones
    assert service["command"] == ["--alias", "a$$b$${HOME}`id`'\"", "--api-prefix", "$$$$"]
    assert service["volumes"][0] == {"type": "bind", "source": "/srv/mo dels", "target": "/models", "read_only": True}
    assert service["volumes"][1]["source"] == "/srv/ai $$llm/secrets"
    assert service["labels"] == {HASH_LABEL: "${LLM_CONFIG_HASH:-}"}
    assert service["environment"]["MOE_OFFLOAD_PATTERN"] == "${LLM_MOE_OFFLOAD_PATTERN:-}"
    assert service["environment"]["API_KEY_FILE"] == "/run/secrets/ai-llm/api-key"
    assert "API_KEY" not in service["environment"]
    assert service["devices"] == ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]
    assert service["restart"] == "unless-stopped"
    docker = yaml.safe_load(render_compose(s, PLACEMENT, "docker"))["services"]["ai-llm"]
    assert docker["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "device_ids": ["0", "1"], "capabilities": ["gpu"]}]
    assert docker["logging"] == {"driver": "json-file", "options": {"max-size": "50m", "max-file": "3"}}


def test_restart_no_stays_a_string():
    service = yaml.safe_load(render_compose(settings(llm_server_restart_policy="no"), PLACEMENT, "podman"))
    assert service["services"]["ai-llm"]["restart"] == "no"


def test_the_hash_follows_env_compose_and_key():
    s = settings()
    values = env_values(s, PLACEMENT)
    compose = render_compose(s, PLACEMENT, "podman")
    digest = config_hash(values, compose, b"sk-1\n")
    assert digest == config_hash(dict(values), compose, b"sk-1\n")
    assert digest != config_hash(values, compose, b"sk-2\n")
    assert digest != config_hash(values, compose + "#", b"sk-1\n")
    assert digest != config_hash(dict(values, LLM_CTX_SIZE="1024"), compose, b"sk-1\n")


def test_merge_keeps_other_lines_and_drops_the_role_keys_outside_its_block():
    old = "\n".join(["OPERATOR=stays", BEGIN, "LLM_CTX_SIZE='1'", END, "LLM_CTX_SIZE=2", "LLM_API_KEY='sk-old'",
                     "# a comment", ""])
    block = env_block(env_values(settings(), PLACEMENT), "h")
    new, dropped = merge_env(old, block)
    assert new.startswith("OPERATOR=stays\n" + BEGIN)
    assert new.endswith("# a comment\n")
    assert sorted(dropped) == ["LLM_API_KEY", "LLM_CTX_SIZE"]
    assert "sk-old" not in new and managed_block(new) == block
    assert merge_env(new, block) == (new, [])
    assert merge_env("", block) == (block, [])


@pytest.mark.skipif(not shutil.which("podman-compose"), reason="podman-compose is not installed")
def test_podman_compose_reads_every_value_back(tmp_path):
    """podman-compose 1.6.0's own reading (.env through python-dotenv, then compose interpolation)."""
    s = settings()
    values = env_values(s, PLACEMENT)
    compose = render_compose(s, PLACEMENT, "podman")
    (tmp_path / ".env").write_text(env_block(values, config_hash(values, compose)))
    (tmp_path / "c.yml").write_text(compose)
    out = subprocess.run(["podman-compose", "-f", str(tmp_path / "c.yml"), "config"], capture_output=True,
                         text=True, check=True, timeout=120).stdout
    service = yaml.safe_load(out)["services"]["ai-llm"]
    assert service["environment"]["MOE_OFFLOAD_PATTERN"] == PLACEMENT["pattern"]
    assert service["environment"]["MODEL_PATH"] == "/models/x$y.gguf"
    assert service["command"] == HOSTILE["llm_server_extra_args"]
    assert service["volumes"][1]["source"] == "/srv/ai $llm/secrets"
    assert service["labels"][HASH_LABEL] == config_hash(values, compose)
