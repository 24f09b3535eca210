# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The files the llm_server role writes: its block of ``.env``, the compose file, and the configuration hash
that the container carries as a label.

Standard library only (runs on target hosts). Every value goes through ``_deploy_encoding``.

The compose file never holds a deployment value itself: it maps the ``.env`` keys into the container
(``MOE_OFFLOAD_PATTERN: "${LLM_MOE_OFFLOAD_PATTERN:-}"``), and the image's start command builds
llama-server's argv from them. The label ``ai_llm.moe_offload.config_hash`` comes from ``LLM_CONFIG_HASH``
the same way, so a container says which configuration it was created from.
"""

from __future__ import annotations

import hashlib
import json
import re

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_encoding import (
    compose_literal,
    compose_reference,
    dotenv_problem,
    dotenv_quote,
    dotenv_unquote,
)

MARKER = "# {} ai_llm.moe_offload.llm_server: managed keys (edit the inventory, not these lines)"
BEGIN = MARKER.format("BEGIN")
END = MARKER.format("END")
HASH_KEY = "LLM_CONFIG_HASH"
HASH_LABEL = "ai_llm.moe_offload.config_hash"
# Keys of the role in .env, in the order written; each maps to the container variable next to it.
ENV_KEYS = (
    ("LLM_MOE_OFFLOAD_PATTERN", "MOE_OFFLOAD_PATTERN"),
    ("LLM_DEVICE_OVERRIDES", "DEVICE_OVERRIDES"),
    ("LLM_CTX_SIZE", "CTX_SIZE"),
    ("LLM_PARALLEL", "PARALLEL"),
    ("LLM_N_GPU_LAYERS", "N_GPU_LAYERS"),
    ("LLM_MODEL_PATH", "MODEL_PATH"),
    ("LLM_BIND_ADDRESS", None),
    ("LLM_PORT", None),
    ("LLM_GPU_DEVICES", None),
    ("LLM_TENSOR_SPLIT", "TENSOR_SPLIT"),
    ("LLM_LOG_VERBOSITY", "LOG_VERBOSITY"),
)
OWNED_KEYS = tuple(k for k, _v in ENV_KEYS) + (HASH_KEY,)
SECRETS_MOUNT = "/run/secrets/ai-llm"
API_KEY_FILE = SECRETS_MOUNT + "/api-key"
_NEWLINE_RE = re.compile(r"\r\n|\n|\r")
_ENV_LINE_RE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_.-]*)\s*=(.*)$")
# A GPU's UUID as nvidia-smi prints it (``GPU-8d4f3c2a-61b7-4e0a-9f35-2c7e1d9a4b60``).
_GPU_UUID_RE = re.compile(r"^GPU-[0-9A-Fa-f]{8}(?:-[0-9A-Fa-f]{4}){3}-[0-9A-Fa-f]{12}$")
# The probe of the compose healthcheck: start-llama-server asks llama-server's /health on LLAMA_HOST:LLAMA_PORT with
# the curl or wget its image has (images/ai-llm/start-llama-server).
HEALTH_PROBE = ("/usr/local/bin/start-llama-server", "--health")


class RenderError(Exception):
    """A value the placement produced cannot be written (the settings were checked before)."""


def env_values(settings, placement):
    """The role's ``.env`` keys (without the hash) as plain strings, in order.

    ``settings`` is ``Settings.as_dict()``; ``placement`` has ``pattern``, ``device_overrides`` (list),
    ``gpu_devices`` (list), ``tensor_split`` (str), ``n_gpu_layers`` (str; ``settings``' when not given) and
    ``topology``.
    """
    gpu = placement.get("topology", "cpu") != "cpu"
    verbosity = settings.get("log_verbosity")
    values = {
        "LLM_MOE_OFFLOAD_PATTERN": placement.get("pattern") or "",
        "LLM_DEVICE_OVERRIDES": ",".join(placement.get("device_overrides") or []),
        "LLM_CTX_SIZE": str(settings["ctx_size"]),
        "LLM_PARALLEL": str(settings["parallel"]),
        "LLM_N_GPU_LAYERS": str(placement.get("n_gpu_layers") or settings["n_gpu_layers"]),
        "LLM_MODEL_PATH": settings["container_model_path"],
        "LLM_BIND_ADDRESS": settings["bind_address"],
        "LLM_PORT": str(settings["port"]),
        "LLM_GPU_DEVICES": ",".join(str(d) for d in placement.get("gpu_devices") or []) if gpu else "",
        "LLM_TENSOR_SPLIT": _split_text(placement.get("tensor_split")),
        "LLM_LOG_VERBOSITY": "" if verbosity in (None, "") else str(verbosity),
    }
    for key, value in values.items():
        problem = dotenv_problem(value)
        if problem:
            raise RenderError("%s %s cannot go into .env: %s" % (key, json.dumps(value), problem))
    return values


def _split_text(split):
    if isinstance(split, (list, tuple)):
        return ",".join(str(s) for s in split)
    return str(split or "")


def config_hash(values, compose, sources, api_key=b""):
    """The hash of a configuration: the ``.env`` keys (``env_values``), the compose template's encoded values
    (``compose_values``), the sources of the templates (their bytes, in order) and the API key file's bytes. Not the
    rendered text: a line a template renders from the controller (``ansible_managed``) does not change it."""
    digest = hashlib.sha256()
    digest.update(json.dumps(sorted(values.items())).encode("utf-8"))
    digest.update(b"\0" + json.dumps(compose, sort_keys=True).encode("utf-8"))
    for source in sources:
        digest.update(b"\0" + hashlib.sha256(source).digest())
    digest.update(b"\0" + hashlib.sha256(api_key or b"").digest())
    return digest.hexdigest()


def env_block(values, hash_value):
    """The managed block of ``.env``: markers, one single-quoted line per key, the hash last."""
    lines = [BEGIN]
    lines += ["%s=%s" % (key, dotenv_quote(values[key])) for key, _c in ENV_KEYS]
    lines += ["%s=%s" % (HASH_KEY, dotenv_quote(hash_value)), END]
    return "\n".join(lines) + "\n"


def compose_body(text):
    """The compose file's text without its comment and blank lines: what compose reads of it. A line a template
    renders from the controller into a comment (``# {{ ansible_managed }}``) changes the file, not the service."""
    return "\n".join(line for line in (text or "").splitlines() if line.strip() and not line.lstrip().startswith("#"))


def env_lines(text):
    """The lines of ``.env`` text as the dotenv parsers cut them: at ``\\r\\n``, ``\\n`` or ``\\r`` only.

    Not ``str.splitlines()``, which also cuts at U+2028, U+2029, U+0085 and other separators that a value may hold
    (python-dotenv's ``_newline`` and compose-go's dotenv parser know only these three).
    """
    lines = _NEWLINE_RE.split(text)
    return lines[:-1] if lines and lines[-1] == "" else lines


def parse_env(text):
    """``{key: value}`` of the role's keys in ``.env`` text (the last line that sets a key wins)."""
    found = {}
    for line in env_lines(text):
        match = _ENV_LINE_RE.match(line)
        if match and match.group(1) in OWNED_KEYS:
            found[match.group(1)] = dotenv_unquote(match.group(2))
    return found


def managed_block(text):
    """The role's block of ``.env`` text, markers included; ``""`` when there is none."""
    lines = env_lines(text)
    stripped = [line.strip() for line in lines]
    if BEGIN not in stripped or END not in stripped[stripped.index(BEGIN):]:
        return ""
    start = stripped.index(BEGIN)
    end = stripped.index(END, start)
    return "\n".join(lines[start:end + 1]) + "\n"


def merge_env(text, block):
    """``.env`` text with the role's block replaced by ``block``; other lines stay.

    Lines outside the block that set one of the role's keys are dropped: a later line would win over the block. Returns ``(new_text, dropped_keys)``.
    """
    before, after, dropped = split_env(text)
    return "\n".join(before + [block.rstrip("\n")] + after) + "\n", dropped


def split_env(text):
    """``(before, after, dropped)``: the lines of ``.env`` text before and after the role's block (after the first
    block that ends; all before when there is none), without the block's own lines and without the lines outside it
    that set one of the role's keys, whose keys are ``dropped``."""
    before, after, dropped, inside, placed = [], [], [], False, False
    for line in env_lines(text or ""):
        if line.strip() == BEGIN:
            inside = True
            continue
        if line.strip() == END:
            placed = placed or inside
            inside = False
            continue
        if inside:
            continue
        match = _ENV_LINE_RE.match(line)
        if match and match.group(1) in OWNED_KEYS:
            dropped.append(match.group(1))
            continue
        (after if placed else before).append(line)
    return before, after, dropped


def gpu_names(placement):
    """The planned GPUs as the engine is to name them: their UUIDs (``placement["gpu_uuids"]``, one per entry of
    ``gpu_devices``), which name the same card whatever order CUDA or the driver enumerates in, else their indices.

    NVIDIA's ``nvidia-ctk cdi generate`` names every GPU by index and by UUID by default (``--device-name-strategy``,
    default ``index`` and ``uuid``: github.com/NVIDIA/nvidia-container-toolkit, cmd/nvidia-ctk/cdi/generate), and
    ``NVIDIA_VISIBLE_DEVICES`` and compose's ``device_ids`` take either (docs.nvidia.com/datacenter/cloud-native/
    container-toolkit/latest/docker-specialized.html, "GPU Enumeration")."""
    devices = [str(d) for d in placement.get("gpu_devices") or []]
    uuids = [str(u) for u in placement.get("gpu_uuids") or []]
    if not uuids:
        return devices
    if len(uuids) != len(devices):
        raise RenderError("gpu_uuids %s do not match gpu_devices %s one to one" % (json.dumps(uuids), json.dumps(devices)))
    for uuid in uuids:
        if not _GPU_UUID_RE.match(uuid):
            raise RenderError("GPU UUID %s is not a UUID as nvidia-smi prints it (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)"
                              % json.dumps(uuid))
    return uuids


def compose_values(settings, placement, engine):
    """What the compose template places (``llm_server_compose``, the role's README, "Templates"), every value
    encoded for the compose file: literals by ``compose_literal``, the role's own ``.env`` references by
    ``compose_reference``. ``settings`` is ``Settings.as_dict()``."""
    gpu = placement.get("topology", "cpu") != "cpu"
    lit = compose_literal
    ref = compose_reference
    host_network = settings["network_mode"] == "host"
    environment = [[container_key, ref(key)] for key, container_key in ENV_KEYS if container_key]
    environment.append(["API_KEY_FILE", lit(API_KEY_FILE)])
    if host_network:
        environment += [["LLAMA_HOST", ref("LLM_BIND_ADDRESS", "127.0.0.1")], ["LLAMA_PORT", ref("LLM_PORT", "8080")]]
    else:
        environment += [["LLAMA_HOST", lit("0.0.0.0")], ["LLAMA_PORT", lit(str(settings["container_port"]))]]
    devices = gpu_names(placement) if gpu else []
    # CUDA numbers devices fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID (docs.nvidia.com/cuda/
    # cuda-c-programming-guide/#cuda-environment-variables): the device overrides' CUDA<n> follow the PCI order.
    environment.append(["CUDA_DEVICE_ORDER", lit("PCI_BUS_ID")])
    # The CUDA image sets NVIDIA_VISIBLE_DEVICES=all: a CPU deploy says void, which the NVIDIA runtime reads as no GPU
    # at all, also where nvidia is docker's default runtime (docs.nvidia.com/datacenter/cloud-native/container-toolkit/
    # latest/docker-specialized.html, "GPU Enumeration").
    environment.append(["NVIDIA_VISIBLE_DEVICES", lit(",".join(devices) if gpu else "void")])
    # (auto is the engine's own form, resolved from the host's read: llm_server_service_info's gpu_access)
    access = settings["gpu_access"]
    if gpu and access not in ("cdi", "reservations"):
        raise RenderError("llm_server_gpu_access %s: the compose file needs cdi or reservations" % json.dumps(access))
    cdi = gpu and access == "cdi"
    if engine == "podman":
        logging = {"driver": lit("k8s-file"), "options": [["max-size", lit(settings["log_max_size"])]]}
    else:
        logging = {"driver": lit("json-file"), "options": [["max-size", lit(settings["log_max_size"])],
                                                           ["max-file", lit(str(settings["log_max_file"]))]]}
    return {
        "service": lit(settings["service_name"]),
        "image": lit(settings["image"]),
        "container_name": lit(settings["container_name"]),
        "restart": lit(settings["restart_policy"]),
        "labels": [[json.dumps(HASH_LABEL), ref(HASH_KEY)]],
        "network_mode": lit("host") if host_network else "",
        "ports": [] if host_network else [json.dumps("${LLM_BIND_ADDRESS:-127.0.0.1}:${LLM_PORT:-8080}:%d"
                                                     % settings["container_port"])],
        "environment": environment,
        "command": [lit(a) for a in settings["extra_args"]],
        # The healthcheck replaces the image's own (upstream's CUDA image probes localhost:8080 with no start
        # period): the probe asks the address and port llama-server listens on, and the start period covers the
        # longest load the role waits for (llm_server_health_timeout).
        "healthcheck": {"test": [lit(a) for a in ("CMD",) + HEALTH_PROBE], "interval": lit("10s"),
                        "timeout": lit("5s"), "retries": "3", "start_period": lit("%ds" % settings["health_timeout"])},
        # SELinux hosts: the container reads the bind mounts only once relabelled (podman-run(1) and
        # docs.docker.com/engine/storage/bind-mounts/#configure-the-selinux-label; compose's bind.selinux:
        # docs.docker.com/reference/compose-file/services/#volumes). The model directory may be shared with other
        # containers: z, the shared label. The secrets directory is this container's alone: Z, a label private to
        # it. On a host without SELinux both do nothing. docker compose passes the relabel on only in the "-v"
        # form, which it uses when create_host_path is true (the template's); with the mount API (its choice
        # otherwise) docker gets no SELinux option (compose 2.40.3 on docker 20.10: HostConfig.Binds "src:dst:ro,z"
        # with it, HostConfig.Mounts without any label without it).
        "volumes": [{"source": lit(settings["model_dir"]), "target": lit(settings["model_mount"]), "selinux": lit("z")},
                    {"source": lit(settings["paths"]["secrets"]), "target": lit(SECRETS_MOUNT), "selinux": lit("Z")}],
        # CDI device names: podman, and docker 25 or newer with CDI enabled
        # (docs.docker.com/reference/cli/dockerd/#enable-cdi-devices)
        "cdi_devices": [lit("nvidia.com/gpu=" + d) for d in devices] if cdi else [],
        # NVIDIA's CDI instructions run podman's GPU containers with label=disable (docs.nvidia.com/datacenter/
        # cloud-native/container-toolkit/latest/cdi-support.html, "Running a Workload with CDI")
        "security_opt": [lit("label=disable")] if cdi and engine == "podman" else [],
        # docs.docker.com/compose/how-tos/gpu-support/
        "device_ids": [lit(d) for d in devices] if gpu and not cdi else [],
        "logging": logging,
    }


def env_template_values(values, hash_value, env_text):
    """What the ``.env`` template places (``llm_server_env``): the lines of ``env_text`` (``.env`` as it is) before
    and after the role's block, without the lines outside it that set one of the role's keys (a later line would
    win over the block), and the block's lines, each value single-quoted by ``dotenv_quote``. Also ``dropped``:
    the keys of those lines."""
    before, after, dropped = split_env(env_text)
    keys = [[key, dotenv_quote(values[key])] for key, _c in ENV_KEYS] + [[HASH_KEY, dotenv_quote(hash_value)]]
    return {"before": before, "after": after, "begin": BEGIN, "end": END, "block": keys, "dropped": dropped}
