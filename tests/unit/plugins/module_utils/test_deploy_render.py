"""The files the llm_server role writes (plugins/module_utils/_deploy_render.py): its .env block, the values of the
compose template (the role's template rendered as ansible.builtin.template renders it) and the configuration hash,
read back by the real parsers (python-dotenv, PyYAML, podman-compose 1.6.0)."""
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
    compose_body,
    compose_values,
    config_hash,
    env_block,
    env_lines,
    env_template_values,
    env_values,
    managed_block,
    merge_env,
    parse_env,
)
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._role_variables import check_settings
from tests.helpers.deploy_templates import render_compose, render_env, template_sources
from tests.helpers.role_vars import role_values

HOSTILE = {"llm_server_model_path": "/srv/mo dels/x$y.gguf", "llm_server_project_dir": "/srv/ai $llm",
           "llm_server_compose_project": "ai-llm", "llm_server_image": "localhost/ai-llm:cuda",
           "llm_server_log_verbosity": 5, "llm_server_gpu_access": "cdi",
           "llm_server_extra_args": ["--alias", "a$b${HOME}`id`'\"", "--api-prefix", "$$"]}
PLAIN = {"llm_server_model_path": "/srv/models/m.gguf", "llm_server_ctx_size": 4096, "llm_server_parallel": 2,
         "llm_server_n_gpu_layers": 40, "llm_server_port": 8081, "llm_server_gpu_access": "cdi"}
PLACEMENT = {"pattern": r"blk\.(3|4)\.ffn_.*_exps\.weight$", "device_overrides": [r"blk\.5\.ffn_.*_exps=CUDA1"],
             "gpu_devices": [0, 1], "tensor_split": "0.6,0.4", "topology": "dual"}


def settings(base=None, **values):
    return check_settings(role_values(PLAIN if base is None else base, **values)).as_dict()


@pytest.mark.parametrize("separator", ["\u2028", "\u2029"])
def test_a_value_with_a_unicode_line_separator_reads_back_whole(separator):
    """python-dotenv cuts .env lines at \\r\\n, \\n and \\r only; the role reads its block back the same way (not
    with str.splitlines(), which also cuts at U+2028 and U+2029 and read the value as two lines)."""
    path = "/models/a%sb #c.gguf" % separator
    values = env_values(settings(HOSTILE, llm_server_model_path="/srv/models/a%sb #c.gguf" % separator), PLACEMENT)
    assert values["LLM_MODEL_PATH"] == path
    text, _dropped = merge_env("OTHER=1\n", env_block(values, "h"))
    assert dotenv.dotenv_values(stream=io.StringIO(text)) == dict(values, OTHER="1", LLM_CONFIG_HASH="h")
    assert parse_env(text)["LLM_MODEL_PATH"] == path
    assert managed_block(text) == env_block(values, "h")
    assert merge_env(text, env_block(values, "h")) == (text, [])


def test_the_compose_file_holds_every_value_encoded():
    """Read by PyYAML; the whole text of each kind of compose file is in the test further down."""
    compose = render_compose(settings(HOSTILE), PLACEMENT, "podman")
    service = yaml.safe_load(compose)["services"]["ai-llm"]
    # $ is doubled for compose: after compose's own unescaping the values are the literal ones
    assert service["command"] == ["--alias", "a$$b$${HOME}`id`'\"", "--api-prefix", "$$$$"]
    assert service["volumes"][1]["source"] == "/srv/ai $$llm/secrets"


@pytest.mark.skipif(not shutil.which("podman-compose"), reason="podman-compose is not installed")
def test_podman_compose_reads_every_value_back(tmp_path):
    """podman-compose 1.6.0's own reading (.env through python-dotenv, then compose interpolation)."""
    s = settings(HOSTILE)
    values = env_values(s, PLACEMENT)
    compose = render_compose(s, PLACEMENT, "podman")
    digest = config_hash(values, compose_values(s, PLACEMENT, "podman"), template_sources())
    (tmp_path / ".env").write_text(env_block(values, digest))
    (tmp_path / "c.yml").write_text(compose)
    out = subprocess.run(["podman-compose", "-f", str(tmp_path / "c.yml"), "config"], capture_output=True,
                         text=True, check=True, timeout=120).stdout
    service = yaml.safe_load(out)["services"]["ai-llm"]
    assert service["environment"]["MOE_OFFLOAD_PATTERN"] == PLACEMENT["pattern"]
    assert service["environment"]["MODEL_PATH"] == "/models/x$y.gguf"
    assert service["command"] == HOSTILE["llm_server_extra_args"]
    assert service["volumes"][1]["source"] == "/srv/ai $llm/secrets"
    assert service["labels"][HASH_LABEL] == digest


DOCKER_COMPOSE_V2 = shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True,
                                                              check=False).returncode == 0


@pytest.mark.skipif(not DOCKER_COMPOSE_V2, reason="docker compose v2 is not installed (bash scripts/setup.sh)")
@pytest.mark.parametrize("access, devices, reservations", [
    ("reservations", None, [{"driver": "nvidia", "device_ids": ["3", "1"], "capabilities": ["gpu"]}]),
    ("cdi", ["nvidia.com/gpu=3", "nvidia.com/gpu=1"], None),
])
def test_docker_compose_v2_reads_every_value_and_the_gpu_access_back(tmp_path, access, devices, reservations):
    """compose v2's own reading (compose-go: .env, then interpolation) of both GPU forms docker documents."""
    placement = dict(PLACEMENT, topology="dual", gpu_devices=[3, 1])
    s = settings(HOSTILE, llm_server_gpu_access=access)
    values = env_values(s, placement)
    compose = render_compose(s, placement, "docker")
    digest = config_hash(values, compose_values(s, placement, "docker"), template_sources())
    (tmp_path / ".env").write_text(env_block(values, digest))
    (tmp_path / "c.yml").write_text(compose)
    out = subprocess.run(["docker", "compose", "-f", str(tmp_path / "c.yml"), "config", "--format", "json"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    # `config` prints a compose file again, with every "$" of a value written "$$"
    service = json.loads(out.replace("$$", "$"))["services"]["ai-llm"]
    assert service["environment"]["MOE_OFFLOAD_PATTERN"] == PLACEMENT["pattern"]
    assert service["environment"]["MODEL_PATH"] == "/models/x$y.gguf"
    assert service["command"] == HOSTILE["llm_server_extra_args"]
    assert service["volumes"][1]["source"] == "/srv/ai $llm/secrets"
    assert service["labels"][HASH_LABEL] == digest
    assert [d.get("source") for d in service.get("devices") or []] == (devices or [])
    got = (service.get("deploy") or {}).get("resources", {}).get("reservations", {}).get("devices")
    assert got == reservations


ROLE_KEYS = ["LLM_MOE_OFFLOAD_PATTERN", "LLM_DEVICE_OVERRIDES", "LLM_CTX_SIZE", "LLM_PARALLEL", "LLM_N_GPU_LAYERS",
             "LLM_MODEL_PATH", "LLM_BIND_ADDRESS", "LLM_PORT", "LLM_GPU_DEVICES", "LLM_TENSOR_SPLIT",
             "LLM_LOG_VERBOSITY"]
CPU = {"topology": "cpu"}


def cpu_block():
    return env_block(env_values(settings(), CPU), "h")


@pytest.mark.parametrize("verbosity, placement, placed", [
    (3, PLACEMENT, {"LLM_MOE_OFFLOAD_PATTERN": r"blk\.(3|4)\.ffn_.*_exps\.weight$",
                    "LLM_DEVICE_OVERRIDES": r"blk\.5\.ffn_.*_exps=CUDA1", "LLM_GPU_DEVICES": "0,1",
                    "LLM_TENSOR_SPLIT": "0.6,0.4", "LLM_LOG_VERBOSITY": "3"}),
    # no pattern, no overrides, no GPU, no split, no verbosity: the keys are written empty, never 'None'
    ("", CPU, {}),
    ("", {"pattern": None, "device_overrides": None, "gpu_devices": None, "tensor_split": None, "topology": "cpu"},
     {}),
])
def test_env_values_hold_every_key_in_order(verbosity, placement, placed):
    values = env_values(settings(llm_server_log_verbosity=verbosity), placement)
    expected = dict.fromkeys(ROLE_KEYS, "")
    expected.update({"LLM_CTX_SIZE": "4096", "LLM_PARALLEL": "2", "LLM_N_GPU_LAYERS": "40",
                     "LLM_MODEL_PATH": "/models/m.gguf", "LLM_BIND_ADDRESS": "127.0.0.1", "LLM_PORT": "8081"}, **placed)
    assert values == expected
    assert list(values) == ROLE_KEYS


@pytest.mark.parametrize("placement, values, key, text", [
    # GPU devices are written only for a GPU topology; a placement without ``topology`` is a CPU one
    *[(placement, {}, "LLM_GPU_DEVICES", text) for placement, text in [
        ({"topology": "single", "gpu_devices": [2]}, "2"), ({"topology": "multi", "gpu_devices": [0, 1, 3]}, "0,1,3"),
        ({"topology": "dual"}, ""), ({"topology": "dual", "gpu_devices": []}, ""),
        ({"topology": "cpu", "gpu_devices": [0, 1]}, ""), ({"gpu_devices": [0, 1]}, "")]],
    # the tensor split, comma-separated
    *[({"topology": "dual", "tensor_split": split}, {}, "LLM_TENSOR_SPLIT", text)
      for split, text in [([0.6, 0.4], "0.6,0.4"), ((3, 1), "3,1"), ([], ""), ("", "")]],
    # llama-server's --override-tensor takes ``<pattern>=<buffer type>,...``: one comma-separated value
    ({"topology": "dual", "device_overrides": ["a=CUDA0", "b=CUDA1"]}, {}, "LLM_DEVICE_OVERRIDES", "a=CUDA0,b=CUDA1"),
    # level 0 is a level (llama-server's -lv 0), not "unset"
    *[(CPU, {"llm_server_log_verbosity": level}, "LLM_LOG_VERBOSITY", text)
      for level, text in [(None, ""), (0, "0"), (9, "9")]],
    (CPU, {"llm_server_n_gpu_layers": "all"}, "LLM_N_GPU_LAYERS", "all"),
])
def test_a_value_in_env(placement, values, key, text):
    assert env_values(settings(**values), placement)[key] == text


CONTROL = "it holds control characters (\\n), which a .env line cannot carry"


@pytest.mark.parametrize("placement, message", [
    ({"pattern": "blk\n${X}"}, 'LLM_MOE_OFFLOAD_PATTERN "blk\\n${X}" cannot go into .env: ' + CONTROL),
    ({"device_overrides": ["a=CUDA0", "b${X}=CUDA1"]},
     'LLM_DEVICE_OVERRIDES "a=CUDA0,b${X}=CUDA1" cannot go into .env: it holds \'${\', which podman-compose\'s '
     '.env parser (python-dotenv) expands even inside quotes'),
    ({"tensor_split": "1,\n2"}, 'LLM_TENSOR_SPLIT "1,\\n2" cannot go into .env: ' + CONTROL),
    ({"pattern": "ends\\"},
     'LLM_MOE_OFFLOAD_PATTERN "ends\\\\" cannot go into .env: it ends with a backslash, which would escape the '
     'closing quote in .env'),
])
def test_a_value_the_placement_cannot_write_is_refused_with_its_key_and_value(placement, message):
    with pytest.raises(RenderError) as info:
        env_values(settings(), dict(CPU, **placement))
    assert str(info.value) == message


def reference_hash(values, compose, sources, key_bytes):
    """The documented layout of the configuration hash: the sorted .env items as JSON, NUL, the compose template's
    values as JSON with sorted keys, NUL and the sha256 of each template's source, NUL, the sha256 of the API key
    file's bytes."""
    digest = hashlib.sha256(json.dumps(sorted(values.items())).encode("utf-8"))
    digest.update(b"\0" + json.dumps(compose, sort_keys=True).encode("utf-8"))
    for source in sources:
        digest.update(b"\0" + hashlib.sha256(source).digest())
    digest.update(b"\0" + hashlib.sha256(key_bytes).digest())
    return digest.hexdigest()


@pytest.mark.parametrize("values, compose, sources, key, key_bytes", [
    ({"LLM_CTX_SIZE": "4096", "LLM_PORT": "8081"}, {"image": '"i"'}, [b"services:\n", b"{{ x }}\n"], b"sk-1\n",
     b"sk-1\n"),
    ({"B": "2", "A": "1"}, {"b": "2", "a": "1"}, [b"c"], b"k", b"k"),  # sorted: the order of the keys does not count
    ({"LLM_CTX_SIZE": "4096"}, {}, [], None, b""),  # no API key hashes as an empty key file
])
def test_the_config_hash_is_stable_across_versions(values, compose, sources, key, key_bytes):
    """Containers carry the hash as a label and snapshots record it: the same inputs give the same hex digest."""
    assert config_hash(values, compose, sources, key) == reference_hash(values, compose, sources, key_bytes)
    assert config_hash(values, compose, sources) == reference_hash(values, compose, sources, b"")


def test_the_config_hash_follows_the_template_sources_not_a_rendered_line():
    """A template's source counts (its bytes, in order); the compose text rendered from it does not."""
    values, compose = {"LLM_CTX_SIZE": "1"}, {"image": '"i"'}
    assert config_hash(values, compose, [b"a", b"b"]) != config_hash(values, compose, [b"b", b"a"])
    assert config_hash(values, compose, [b"a"]) != config_hash(values, dict(compose, image='"j"'), [b"a"])


@pytest.mark.parametrize("engine", ["podman", "docker"])
def test_the_compose_body_is_what_compose_reads_without_comments_and_blank_lines(engine):
    """The body of a compose file the role writes parses as the whole file does; a comment or a blank line (a line
    rendered from the controller, ansible_managed) leaves it as it is, a value does not."""
    text = render_compose(settings(HOSTILE), PLACEMENT, engine)
    body = compose_body(text)
    assert yaml.safe_load(body) == yaml.safe_load(text) and body.startswith("services:\n")
    assert all(line.strip() and not line.lstrip().startswith("#") for line in body.splitlines())
    commented = "# Ansible managed: written on host1\n\n" + text.replace("    healthcheck:", "    # checked\n\n    healthcheck:")
    assert compose_body(commented) == body
    assert compose_body(text.replace('"unless-stopped"', '"always"')) != body
    assert compose_body("# a\nservices:\n\n  # b\n  x:  \n    image: i\n") == "services:\n  x:  \n    image: i"
    assert compose_body("") == compose_body(None) == ""


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


@pytest.mark.parametrize("old, new, dropped", [
    ("", "{block}", []),
    ("A=1\r\nB=2", "A=1\nB=2\n{block}", []),  # appended after the other lines
    ("A=1\nLLM_PORT=9\nexport LLM_CTX_SIZE=1\n", "A=1\n{block}", ["LLM_PORT", "LLM_CTX_SIZE"]),
    # the role's keys outside its block are dropped (a later line would win over the block), comments stay
    ("\n".join(["OPERATOR=stays", BEGIN, "LLM_CTX_SIZE='1'", END, "LLM_CTX_SIZE=2", "# a comment", ""]),
     "OPERATOR=stays\n{block}# a comment\n", ["LLM_CTX_SIZE"]),
    ("A=1\n" + BEGIN + "\nLLM_CTX_SIZE='1'\nLLM_CONFIG_HASH='old'\n" + END + "\nB=2\n", "A=1\n{block}B=2\n", []),
    # one block, where the first one was
    ("\n".join(["A=1", BEGIN, "LLM_PORT='1'", END, "B=2", BEGIN, "LLM_PORT='2'", END, "C=3", ""]),
     "A=1\n{block}B=2\nC=3\n", []),
    ("A=1\n  " + BEGIN + "\t\nLLM_PORT='1'\n " + END + " \nB=2\n", "A=1\n{block}B=2\n", []),  # blanks around markers
])
def test_merge_env_and_the_env_template_replace_the_block_and_keep_the_other_lines(old, new, dropped):
    """merge_env (how the role reads .env back) and the role's .env template with env_template_values write the
    same text for the same .env."""
    block = cpu_block()
    new = new.format(block=block)
    assert merge_env(old, block) == (new, dropped)
    assert merge_env(new, block) == (new, [])
    values = env_values(settings(), CPU)
    assert render_env(values, "h", old) == new
    assert env_template_values(values, "h", old)["dropped"] == dropped
    assert render_env(values, "h", new) == new


def test_the_env_template_values_are_the_lines_around_the_block_and_the_quoted_keys():
    values = env_values(settings(), CPU)
    old = "\n".join(["A=1", "export LLM_PORT=9", BEGIN, "LLM_CTX_SIZE='1'", END, "# kept", "LLM_CTX_SIZE=2", "B=2", ""])
    found = env_template_values(values, "it's", old)
    assert (found["before"], found["after"], found["dropped"]) == (["A=1"], ["# kept", "B=2"], ["LLM_PORT", "LLM_CTX_SIZE"])
    assert (found["begin"], found["end"]) == (BEGIN, END)
    assert found["block"][-1] == ["LLM_CONFIG_HASH", "'it\\'s'"]
    assert [k for k, _v in found["block"]] == list(values) + ["LLM_CONFIG_HASH"]
    assert env_template_values(values, "h", "")["before"] == []


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
UUID_A, UUID_B = "GPU-8d4f3c2a-61b7-4e0a-9f35-2c7e1d9a4b60", "GPU-2b9e7f14-c3a8-4d56-8e01-7f4a2c9d3e85"
VOLUMES = """\
    healthcheck:
      test: ["CMD", "/usr/local/bin/start-llama-server", "--health"]
      interval: "10s"
      timeout: "5s"
      retries: 3
      start_period: "%ds"
    volumes:
      - type: "bind"
        source: "/srv/models"
        target: "/models"
        read_only: true
        bind:
          selinux: "z"
          create_host_path: true
      - type: "bind"
        source: "/srv/ai-llm/secrets"
        target: "/run/secrets/ai-llm"
        read_only: true
        bind:
          selinux: "Z"
          create_host_path: true
"""
DOCKER_LOGGING = """\
    logging:
      driver: "json-file"
      options:
        max-size: "50m"
        max-file: "%d"
"""


def test_the_whole_compose_file_for_podman_and_for_docker_on_gpus_or_the_host_network():
    # podman on GPUs with published ports
    s = settings(llm_server_service_name="llm", llm_server_container_name="llm-1", llm_server_restart_policy="always",
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
      CUDA_DEVICE_ORDER: "PCI_BUS_ID"
      NVIDIA_VISIBLE_DEVICES: "%s,%s"
    command: ["--alias", "x"]
""" % (UUID_A, UUID_B) + VOLUMES % 300 + """\
    devices:
      - "nvidia.com/gpu=%s"
      - "nvidia.com/gpu=%s"
    security_opt:
      - "label=disable"
    logging:
      driver: "k8s-file"
      options:
        max-size: "10m"
""" % (UUID_A, UUID_B)
    assert render_compose(s, dict(PLACEMENT, gpu_uuids=[UUID_A, UUID_B]), "podman") == expected
    # docker on the host network without GPU: no ports, and llama-server listens on the .env address and port itself
    s = settings(llm_server_network_mode="host", llm_server_log_max_file=7, llm_server_health_timeout=1500)
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
      CUDA_DEVICE_ORDER: "PCI_BUS_ID"
      NVIDIA_VISIBLE_DEVICES: "void"
""" + VOLUMES % 1500 + DOCKER_LOGGING % 7
    assert render_compose(s, {"topology": "cpu", "gpu_devices": [0]}, "docker") == expected
    assert render_compose(s, {}, "docker") == expected
    # docker reserves the GPUs
    text = render_compose(settings(llm_server_gpu_access="reservations"),
                          {"topology": "dual", "gpu_devices": [3, 1], "gpu_uuids": [UUID_B, UUID_A]}, "docker")
    assert text.endswith("""\
      CUDA_DEVICE_ORDER: "PCI_BUS_ID"
      NVIDIA_VISIBLE_DEVICES: "%s,%s"
""" % (UUID_B, UUID_A) + VOLUMES % 300 + """\
    deploy:
      resources:
        reservations:
          devices:
            - driver: "nvidia"
              device_ids: ["%s", "%s"]
              capabilities: ["gpu"]
""" % (UUID_B, UUID_A) + DOCKER_LOGGING % 3)
    # docker with CDI: the devices by UUID, and no label=disable (NVIDIA's instructions use it for podman)
    text = render_compose(settings(), {"topology": "dual", "gpu_devices": [1], "gpu_uuids": [UUID_A]}, "docker")
    assert '    devices:\n      - "nvidia.com/gpu=%s"\n    logging:' % UUID_A in text and "security_opt" not in text
    # without the UUIDs (a placement of an older read), the indices
    text = render_compose(settings(), {"topology": "dual", "gpu_devices": [1, 0]}, "podman")
    assert 'NVIDIA_VISIBLE_DEVICES: "1,0"' in text and '"nvidia.com/gpu=1"\n      - "nvidia.com/gpu=0"' in text


@pytest.mark.parametrize("uuids, problem", [
    (["GPU-8d4f3c2a-61b7-4e0a-9f35-2c7e1d9a4b60"], "do not match gpu_devices"),
    (["GPU-1", "GPU-2"], 'GPU UUID "GPU-1" is not a UUID'),
    (["GPU-8d4f3c2a-61b7-4e0a-9f35-2c7e1d9a4b60", 'GPU-2b9e7f14-c3a8-4d56-8e01-7f4a2c9d3e8"\nx: "'], "is not a UUID"),
    (["MIG-4a7f2c90-d1e8-5b36-a0c4-9e2f71b8d653", "GPU-2b9e7f14-c3a8-4d56-8e01-7f4a2c9d3e85"], "is not a UUID"),
])
def test_a_gpu_uuid_that_is_not_one_is_refused_by_name(uuids, problem):
    with pytest.raises(RenderError, match=problem):
        compose_values(settings(), dict(PLACEMENT, gpu_uuids=uuids), "podman")


def test_a_gpu_placement_without_a_gpu_access_the_compose_file_can_say_is_refused():
    """``auto`` is resolved from the host's read before the values are encoded; on a CPU placement it is unused."""
    with pytest.raises(RenderError, match='llm_server_gpu_access "auto": the compose file needs cdi or reservations'):
        compose_values(settings(llm_server_gpu_access="auto"), PLACEMENT, "podman")
    assert compose_values(settings(llm_server_gpu_access="auto"), CPU, "podman")["cdi_devices"] == []


@pytest.mark.parametrize("text, lines", [
    ("", []), ("A=1", ["A=1"]), ("A=1\n", ["A=1"]), ("A=1\r\nB=2\rC=3\nD=4\n", ["A=1", "B=2", "C=3", "D=4"]),
    ("A=1\n\nB=2\n", ["A=1", "", "B=2"]), ("A=1\n\n", ["A=1", ""]),
    ("A='x\u2028y\u2029z\x85'\n", ["A='x\u2028y\u2029z\x85'"]),
])
def test_env_lines_cut_at_the_three_dotenv_line_ends_only(text, lines):
    assert env_lines(text) == lines


def test_parse_env_reads_the_role_keys_only_and_the_last_line_wins():
    text = ("OTHER='x'\nLLM_PORT='1'\n  export LLM_PORT = '2'\nLLM_CTX_SIZE=4096\n# LLM_PARALLEL='3'\n"
            "LLM_CONFIG_HASH='it\\'s'\nLLM_PORTS='9'\n")
    assert parse_env(text) == {"LLM_PORT": "2", "LLM_CTX_SIZE": "4096", "LLM_CONFIG_HASH": "it's"}
    assert parse_env("") == {}


INDENTED = "  " + BEGIN + "\nLLM_PORT='1'\n" + END + "  \n"


@pytest.mark.parametrize("text, block", [
    ("A=1\n{block}B=2\n", "{block}"), ("A=1\r\n{crlf_block}", "{block}"), (INDENTED, INDENTED),
    # without both markers, in order, there is no block
    ("", ""), ("A=1\n", ""), (BEGIN + "\nLLM_PORT='1'\n", ""), ("LLM_PORT='1'\n" + END + "\n", ""),
    (END + "\nLLM_PORT='1'\n" + BEGIN + "\n", ""),
])
def test_managed_block_is_the_text_between_the_markers(text, block):
    cpu = cpu_block()
    text = text.format(block=cpu, crlf_block=cpu.replace("\n", "\r\n"))
    assert managed_block(text) == block.format(block=cpu)


def test_the_placement_s_gpu_layers_go_to_env_else_the_setting_s():
    s = settings()
    assert env_values(s, PLACEMENT)["LLM_N_GPU_LAYERS"] == "40"
    assert env_values(s, dict(PLACEMENT, n_gpu_layers="31"))["LLM_N_GPU_LAYERS"] == "31"
