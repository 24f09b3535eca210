"""The files the llm_server role writes (plugins/module_utils/_deploy_render.py): its .env block, the compose file
and the configuration hash, read back by the real parsers (python-dotenv, PyYAML, podman-compose 1.6.0)."""
from __future__ import annotations

import hashlib
import io
import json
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
    env_lines,
    env_values,
    managed_block,
    merge_env,
    parse_env,
    render_compose,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_values import check_settings
from tests.helpers.role_vars import role_values

HOSTILE = {
    "llm_server_model_path": "/srv/mo dels/x$y.gguf",
    "llm_server_project_dir": "/srv/ai $llm",
    "llm_server_compose_project": "ai-llm",
    "llm_server_image": "localhost/ai-llm:cuda",
    "llm_server_extra_args": ["--alias", "a$b${HOME}`id`'\"", "--api-prefix", "$$"],
    "llm_server_log_verbosity": 5,
}
PLACEMENT = {"pattern": r"blk\.(3|4)\.ffn_.*_exps\.weight$", "device_overrides": [r"blk\.5\.ffn_.*_exps=CUDA1"],
             "gpu_devices": [0, 1], "tensor_split": "0.6,0.4", "topology": "dual"}


def settings(**values):
    return check_settings(role_values(HOSTILE, **values)).as_dict()


def test_the_env_block_reads_back_through_python_dotenv():
    s = settings()
    values = env_values(s, PLACEMENT)
    block = env_block(values, config_hash(values, "compose"))
    read = dotenv.dotenv_values(stream=io.StringIO(block))
    assert {k: read[k] for k in values} == values
    assert read["LLM_MOE_OFFLOAD_PATTERN"] == PLACEMENT["pattern"]
    assert read["LLM_DEVICE_OVERRIDES"] == PLACEMENT["device_overrides"][0]
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
    old = "\n".join(["OPERATOR=stays", BEGIN, "LLM_CTX_SIZE='1'", END, "LLM_CTX_SIZE=2",
                     "# a comment", ""])
    block = env_block(env_values(settings(), PLACEMENT), "h")
    new, dropped = merge_env(old, block)
    assert new.startswith("OPERATOR=stays\n" + BEGIN)
    assert new.endswith("# a comment\n")
    assert sorted(dropped) == ["LLM_CTX_SIZE"]
    assert "LLM_CTX_SIZE=2" not in new and managed_block(new) == block
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


# --- the whole contract of each file, value by value ---------------------------------------------------------

PLAIN = {
    "llm_server_model_path": "/srv/models/m.gguf",
    "llm_server_ctx_size": 4096,
    "llm_server_parallel": 2,
    "llm_server_n_gpu_layers": 40,
    "llm_server_port": 8081,
}
ROLE_KEYS = ["LLM_MOE_OFFLOAD_PATTERN", "LLM_DEVICE_OVERRIDES", "LLM_CTX_SIZE", "LLM_PARALLEL", "LLM_N_GPU_LAYERS",
             "LLM_MODEL_PATH", "LLM_BIND_ADDRESS", "LLM_PORT", "LLM_GPU_DEVICES", "LLM_TENSOR_SPLIT",
             "LLM_LOG_VERBOSITY"]


def plain(**values):
    return check_settings(role_values(PLAIN, **values)).as_dict()


def test_env_values_on_gpus_holds_every_key_in_order():
    values = env_values(plain(llm_server_log_verbosity=3), PLACEMENT)
    assert values == {
        "LLM_MOE_OFFLOAD_PATTERN": r"blk\.(3|4)\.ffn_.*_exps\.weight$",
        "LLM_DEVICE_OVERRIDES": r"blk\.5\.ffn_.*_exps=CUDA1",
        "LLM_CTX_SIZE": "4096",
        "LLM_PARALLEL": "2",
        "LLM_N_GPU_LAYERS": "40",
        "LLM_MODEL_PATH": "/models/m.gguf",
        "LLM_BIND_ADDRESS": "127.0.0.1",
        "LLM_PORT": "8081",
        "LLM_GPU_DEVICES": "0,1",
        "LLM_TENSOR_SPLIT": "0.6,0.4",
        "LLM_LOG_VERBOSITY": "3",
    }
    assert list(values) == ROLE_KEYS


def test_env_values_without_a_placement_are_empty_strings():
    """No pattern, no overrides, no GPU, no split, no verbosity: the keys are written empty, never 'None'."""
    values = env_values(plain(llm_server_log_verbosity=""), {"topology": "cpu"})
    assert values == {
        "LLM_MOE_OFFLOAD_PATTERN": "",
        "LLM_DEVICE_OVERRIDES": "",
        "LLM_CTX_SIZE": "4096",
        "LLM_PARALLEL": "2",
        "LLM_N_GPU_LAYERS": "40",
        "LLM_MODEL_PATH": "/models/m.gguf",
        "LLM_BIND_ADDRESS": "127.0.0.1",
        "LLM_PORT": "8081",
        "LLM_GPU_DEVICES": "",
        "LLM_TENSOR_SPLIT": "",
        "LLM_LOG_VERBOSITY": "",
    }
    none_given = {"pattern": None, "device_overrides": None, "gpu_devices": None, "tensor_split": None,
                  "topology": "cpu"}
    assert env_values(plain(llm_server_log_verbosity=""), none_given) == values


@pytest.mark.parametrize("placement, devices", [
    ({"topology": "single", "gpu_devices": [2]}, "2"),
    ({"topology": "multi", "gpu_devices": [0, 1, 3]}, "0,1,3"),
    ({"topology": "dual"}, ""),
    ({"topology": "dual", "gpu_devices": []}, ""),
    ({"topology": "cpu", "gpu_devices": [0, 1]}, ""),
    ({"gpu_devices": [0, 1]}, ""),
])
def test_gpu_devices_are_written_only_for_a_gpu_topology(placement, devices):
    """A placement without ``topology`` is a CPU one: no GPU is handed to the container."""
    assert env_values(plain(), placement)["LLM_GPU_DEVICES"] == devices


@pytest.mark.parametrize("split, text", [
    ("0.6,0.4", "0.6,0.4"),
    ([0.6, 0.4], "0.6,0.4"),
    ((3, 1), "3,1"),
    ([], ""),
    ("", ""),
    (None, ""),
])
def test_the_tensor_split_is_written_comma_separated(split, text):
    placement = {"topology": "dual", "gpu_devices": [0, 1], "tensor_split": split}
    assert env_values(plain(), placement)["LLM_TENSOR_SPLIT"] == text


def test_a_missing_tensor_split_is_empty():
    assert env_values(plain(), {"topology": "dual", "gpu_devices": [0, 1]})["LLM_TENSOR_SPLIT"] == ""


@pytest.mark.parametrize("verbosity, text", [(None, ""), ("", ""), (0, "0"), (9, "9")])
def test_the_log_verbosity_is_empty_only_when_unset(verbosity, text):
    """Level 0 is a level (llama-server's -lv 0), not "unset"."""
    assert env_values(plain(llm_server_log_verbosity=verbosity), {"topology": "cpu"})["LLM_LOG_VERBOSITY"] == text


def test_n_gpu_layers_words_and_parallel_reach_env():
    values = env_values(plain(llm_server_n_gpu_layers="all", llm_server_parallel=256), {"topology": "cpu"})
    assert (values["LLM_N_GPU_LAYERS"], values["LLM_PARALLEL"]) == ("all", "256")


@pytest.mark.parametrize("key, placement", [
    ("LLM_DEVICE_OVERRIDES", {"device_overrides": ["a=CUDA0", "b${X}=CUDA1"]}),
    ("LLM_TENSOR_SPLIT", {"tensor_split": "1,\n2"}),
    ("LLM_MOE_OFFLOAD_PATTERN", {"pattern": "ends\\"}),
])
def test_render_error_names_the_key_and_the_value(key, placement):
    with pytest.raises(RenderError) as info:
        env_values(plain(), dict({"topology": "cpu"}, **placement))
    assert str(info.value).startswith(key + " ")
    assert " cannot go into .env: it " in str(info.value)


def reference_hash(values, compose_text, key_bytes):
    """The documented layout of the configuration hash: the sorted .env items as JSON, NUL, the compose text, NUL,
    the sha256 of the API key file's bytes."""
    digest = hashlib.sha256(json.dumps(sorted(values.items())).encode("utf-8"))
    digest.update(b"\0" + compose_text.encode("utf-8"))
    digest.update(b"\0" + hashlib.sha256(key_bytes).digest())
    return digest.hexdigest()


def test_the_config_hash_is_stable_across_versions():
    """Containers carry the hash as a label and snapshots record it: the same inputs give the same hex digest."""
    values = {"LLM_CTX_SIZE": "4096", "LLM_PORT": "8081"}
    assert config_hash(values, "services: {}\n", b"sk-1\n") == reference_hash(values, "services: {}\n", b"sk-1\n")
    assert config_hash(values, "c", b"") == reference_hash(values, "c", b"")
    assert len(config_hash(values, "c")) == 64


def test_no_api_key_hashes_as_an_empty_key_file():
    values = {"LLM_CTX_SIZE": "4096"}
    empty = reference_hash(values, "c", b"")
    assert config_hash(values, "c") == empty
    assert config_hash(values, "c", None) == empty
    assert config_hash(values, "c", b"") == empty
    assert config_hash(values, "c", b"k") != empty


def test_the_config_hash_does_not_depend_on_key_order():
    assert config_hash({"A": "1", "B": "2"}, "c") == config_hash({"B": "2", "A": "1"}, "c")
    assert config_hash({"A": "1", "B": "2"}, "c") != config_hash({"A": "2", "B": "1"}, "c")


def test_the_env_block_is_markers_quoted_keys_and_the_hash_last():
    values = dict((k, "v%d" % i) for i, k in enumerate(ROLE_KEYS))
    values["LLM_MODEL_PATH"] = "/models/it's.gguf"
    expected = "\n".join(
        ["# BEGIN ai_llm.moe_offload.llm_server: managed keys (edit the inventory, not these lines)"]
        + ["%s='v%d'" % (k, i) if k != "LLM_MODEL_PATH" else "LLM_MODEL_PATH='/models/it\\'s.gguf'"
           for i, k in enumerate(ROLE_KEYS)]
        + ["LLM_CONFIG_HASH='abc'",
           "# END ai_llm.moe_offload.llm_server: managed keys (edit the inventory, not these lines)", ""])
    assert env_block(values, "abc") == expected
    assert parse_env(expected) == dict(values, LLM_CONFIG_HASH="abc")


def test_merge_env_appends_the_block_after_the_other_lines():
    block = env_block(env_values(plain(), {"topology": "cpu"}), "h")
    assert merge_env("A=1\r\nB=2", block) == ("A=1\nB=2\n" + block, [])
    assert merge_env("A=1\nLLM_PORT=9\nexport LLM_CTX_SIZE=1\n", block) == (
        "A=1\n" + block, ["LLM_PORT", "LLM_CTX_SIZE"])


def test_merge_env_replaces_the_block_in_place():
    block = env_block(env_values(plain(), {"topology": "cpu"}), "new")
    old = "A=1\n" + env_block(env_values(plain(llm_server_ctx_size=1), {"topology": "cpu"}), "old") + "B=2\n"
    assert merge_env(old, block) == ("A=1\n" + block + "B=2\n", [])


HEAD = """\
# Written by the ai_llm.moe_offload.llm_server role; edit the inventory, not this file.
# ai-llm: llama-server with the MoE expert weights placed by LLM_MOE_OFFLOAD_PATTERN (.env, next to this
# file); the image's start command turns the variables below into llama-server's argv.
services:
"""
ENVIRONMENT = """\
    environment:
      MOE_OFFLOAD_PATTERN: "${LLM_MOE_OFFLOAD_PATTERN:-}"
      DEVICE_OVERRIDES: "${LLM_DEVICE_OVERRIDES:-}"
      CTX_SIZE: "${LLM_CTX_SIZE:-}"
      PARALLEL: "${LLM_PARALLEL:-}"
      N_GPU_LAYERS: "${LLM_N_GPU_LAYERS:-}"
      MODEL_PATH: "${LLM_MODEL_PATH:-}"
      TENSOR_SPLIT: "${LLM_TENSOR_SPLIT:-}"
      LOG_VERBOSITY: "${LLM_LOG_VERBOSITY:-}"
      API_KEY_FILE: "/run/secrets/ai-llm/api-key"
"""
VOLUMES = """\
    volumes:
      - type: "bind"
        source: "/srv/models"
        target: "/models"
        read_only: true
      - type: "bind"
        source: "/srv/ai-llm/secrets"
        target: "/run/secrets/ai-llm"
        read_only: true
"""


def test_the_compose_file_for_podman_on_gpus_with_published_ports():
    s = plain(llm_server_service_name="llm", llm_server_container_name="llm-1", llm_server_restart_policy="always",
              llm_server_image="registry.example/llm:v1", llm_server_container_port=9000,
              llm_server_log_max_size="10m", llm_server_extra_args=["--alias", "x"])
    expected = HEAD + """\
  "llm":
    image: "registry.example/llm:v1"
    container_name: "llm-1"
    init: true
    restart: "always"
    labels:
      "ai_llm.moe_offload.config_hash": "${LLM_CONFIG_HASH:-}"
    ports:
      - "${LLM_BIND_ADDRESS:-127.0.0.1}:${LLM_PORT:-8080}:9000"
""" + ENVIRONMENT + """\
      LLAMA_HOST: "0.0.0.0"
      LLAMA_PORT: "9000"
      NVIDIA_VISIBLE_DEVICES: "${LLM_GPU_DEVICES:-}"
    command: ["--alias", "x"]
""" + VOLUMES + """\
    devices:
      - "nvidia.com/gpu=0"
      - "nvidia.com/gpu=1"
    logging:
      driver: "k8s-file"
      options:
        max-size: "10m"
"""
    assert render_compose(s, PLACEMENT, "podman") == expected


def test_the_compose_file_for_docker_on_the_host_network_without_gpu():
    """Host networking: no ports, and llama-server listens on the .env address and port itself."""
    s = plain(llm_server_network_mode="host", llm_server_log_max_file=7)
    expected = HEAD + """\
  "ai-llm":
    image: "localhost/ai-llm:cuda"
    container_name: "ai-llm"
    init: true
    restart: "unless-stopped"
    labels:
      "ai_llm.moe_offload.config_hash": "${LLM_CONFIG_HASH:-}"
    network_mode: "host"
""" + ENVIRONMENT + """\
      LLAMA_HOST: "${LLM_BIND_ADDRESS:-127.0.0.1}"
      LLAMA_PORT: "${LLM_PORT:-8080}"
""" + VOLUMES + """\
    logging:
      driver: "json-file"
      options:
        max-size: "50m"
        max-file: "7"
"""
    assert render_compose(s, {"topology": "cpu", "gpu_devices": [0]}, "docker") == expected
    assert render_compose(s, {}, "docker") == expected


def test_the_compose_file_for_docker_reserves_the_gpus():
    text = render_compose(plain(), {"topology": "single", "gpu_devices": [3]}, "docker")
    assert text.endswith("""\
      NVIDIA_VISIBLE_DEVICES: "${LLM_GPU_DEVICES:-}"
""" + VOLUMES + """\
    deploy:
      resources:
        reservations:
          devices:
            - driver: "nvidia"
              device_ids: ["3"]
              capabilities: ["gpu"]
    logging:
      driver: "json-file"
      options:
        max-size: "50m"
        max-file: "3"
""")
    assert "    ports:\n" in text and "network_mode" not in text


@pytest.mark.parametrize("text, lines", [
    ("", []),
    ("A=1", ["A=1"]),
    ("A=1\n", ["A=1"]),
    ("A=1\r\nB=2\rC=3\nD=4\n", ["A=1", "B=2", "C=3", "D=4"]),
    ("A=1\n\nB=2\n", ["A=1", "", "B=2"]),
    ("A=1\n\n", ["A=1", ""]),
    ("A='x\u2028y\u2029z\x85'\n", ["A='x\u2028y\u2029z\x85'"]),
])
def test_env_lines_cut_at_the_three_dotenv_line_ends_only(text, lines):
    assert env_lines(text) == lines


def test_parse_env_reads_the_role_keys_only_and_the_last_line_wins():
    text = "\n".join([
        "OTHER='x'",
        "LLM_PORT='1'",
        "  export LLM_PORT = '2'",
        "LLM_CTX_SIZE=4096",
        "# LLM_PARALLEL='3'",
        "LLM_CONFIG_HASH='it\\'s'",
        "LLM_PORTS='9'",
        "",
    ])
    assert parse_env(text) == {"LLM_PORT": "2", "LLM_CTX_SIZE": "4096", "LLM_CONFIG_HASH": "it's"}
    assert parse_env("") == {}


def test_managed_block_is_the_text_between_the_markers():
    block = env_block(env_values(plain(), {"topology": "cpu"}), "h")
    assert managed_block("A=1\n" + block + "B=2\n") == block
    assert managed_block("A=1\r\n" + block.replace("\n", "\r\n")) == block
    indented = "  " + BEGIN + "\nLLM_PORT='1'\n" + END + "  \n"
    assert managed_block(indented) == indented


@pytest.mark.parametrize("text", [
    "",
    "A=1\n",
    BEGIN + "\nLLM_PORT='1'\n",
    "LLM_PORT='1'\n" + END + "\n",
    END + "\nLLM_PORT='1'\n" + BEGIN + "\n",
])
def test_managed_block_without_both_markers_in_order_is_empty(text):
    assert managed_block(text) == ""


def test_merge_env_keeps_one_block_where_the_first_one_was():
    block = env_block(env_values(plain(), {"topology": "cpu"}), "h")
    old = "\n".join(["A=1", BEGIN, "LLM_PORT='1'", END, "B=2", BEGIN, "LLM_PORT='2'", END, "C=3", ""])
    assert merge_env(old, block) == ("A=1\n" + block + "B=2\nC=3\n", [])


def test_device_overrides_are_one_comma_separated_value():
    """llama-server's --override-tensor takes ``<pattern>=<buffer type>,...``."""
    placement = {"topology": "dual", "gpu_devices": [0, 1], "device_overrides": ["a=CUDA0", "b=CUDA1"]}
    assert env_values(plain(), placement)["LLM_DEVICE_OVERRIDES"] == "a=CUDA0,b=CUDA1"


def test_merge_env_finds_markers_with_surrounding_blanks():
    block = env_block(env_values(plain(), {"topology": "cpu"}), "h")
    old = "A=1\n  " + BEGIN + "\t\nLLM_PORT='1'\n " + END + " \nB=2\n"
    assert merge_env(old, block) == ("A=1\n" + block + "B=2\n", [])
