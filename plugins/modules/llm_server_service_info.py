#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llm_server_service_info
short_description: Internal to the ai_llm.moe_offload.llm_server role - report what ai-llm runs and its project directory
version_added: 0.1.0
description:
  - Only the role M(ai_llm.moe_offload.llm_server) calls it; it is not meant to be called alone.
  - Finds the compose tool (O(compose_command), or the first of C(podman compose), C(podman-compose),
    C(docker compose), C(docker-compose) that works; docker's must be compose v2 or newer, compose v1 is refused)
    and the container engine it drives.
  - Reads the container O(container_name) (state, restarts, pid and the processes below it, the configuration hash
    it was created with, from its label C(ai_llm.moe_offload.config_hash)), asks C(/health) once, and with
    O(api_key) proves that the key is in force (C(/props) answers 401 without it and 200 with it).
  - Reads the project directory without changing it, the configuration hash in C(.env), whether the API key
    file exists, the last verification (C(verification.json)) and the hash of the last snapshot.
  - With O(gpus), O(host_memory) and O(model_path), it also reads the GPUs, the host memory and the model's header
    in the same call, with the same code as M(ai_llm.moe_offload.gpu_info), M(ai_llm.moe_offload.host_info) and
    M(ai_llm.moe_offload.gguf_info), so that the role M(ai_llm.moe_offload.llm_server) reads a host in one call.
  - When one of these reads fails, the module fails with that read's message (and returns what it read before).
  - Used by the role M(ai_llm.moe_offload.llm_server) to decide whether ai-llm runs the configuration on disk.
author:
  - ai_llm maintainers (@ai-llm)
options:
  project_dir:
    description: The project directory (C(llm_server_project_dir)).
    type: path
    required: true
  compose_file:
    description: The compose file's name in O(project_dir).
    type: str
    default: docker-compose.prod.yml
  compose_command:
    description: The compose tool as an argv list; empty to find one.
    type: list
    elements: str
    default: []
  container_name:
    description: The container to read.
    type: str
    required: true
  rollback_dir:
    description: Where the snapshots are kept; default C(<project_dir>/.rollback).
    type: path
  base_url:
    description: The server's URL (C(http://127.0.0.1:8080)); C(/health) is asked when the container runs.
    type: str
  api_key:
    description: The API key; when given and C(/health) answers 200, the module checks that the key is in force.
    type: str
  lock_path:
    description: The lock file of the project directory; C(lock_file) of RV(disk) says whether it exists.
    type: path
  gpus:
    description:
      - Also read the GPUs, as M(ai_llm.moe_offload.gpu_info) with the running container's pid does, into
        RV(gpu_info), and how the engine gives a container GPUs into RV(gpu_access).
    type: bool
    default: false
  image:
    description:
      - The image ai-llm runs (C(llm_server_image)). With O(gpus) on a host with GPUs, two checks use it before
        anything changes.
      - The GPU access - a container of it with the planned CDI devices is created (on podman also initialised, never
        started) and removed, so that a CDI device the engine cannot resolve is refused here rather than after the old
        container stopped.
      - The image's C(NVIDIA_REQUIRE_CUDA) (C(image inspect) of the engine) and, when the image sets it, each GPU's
        driver, CUDA version and brand (C(nvidia-smi -q)), into RV(cuda_requirement).
    type: str
  gpu_access:
    description:
      - C(llm_server_gpu_access) - V(auto), V(cdi) or V(reservations); checked with O(image).
    type: str
    choices: [auto, cdi, reservations]
    default: auto
  gpu_devices:
    description:
      - The GPUs the deploy may use (nvidia-smi indices, C(llm_server_gpu_devices)); empty for every GPU. Their UUIDs
        are the CDI names the check asks for.
    type: list
    elements: int
    default: []
  host_memory:
    description:
      - Also read the host memory, as M(ai_llm.moe_offload.host_info) with the running container's pid does, into
        RV(host_info).
    type: bool
    default: false
  model_path:
    description:
      - Also read this model's header, as M(ai_llm.moe_offload.gguf_info) with O(ai_llm.moe_offload.gguf_info#module:tensors=none)
        does, into RV(model_info).
    type: path
  model_dir:
    description:
      - The directory the container mounts; with O(model_path), C(model_outside_dir) of RV(disk) says whether the
        model resolves outside it.
    type: path
extends_documentation_fragment:
  - ai_llm.moe_offload.info_module
seealso:
  - module: ai_llm.moe_offload.llm_server_verify
"""

EXAMPLES = r"""
- name: Read what ai-llm runs
  ai_llm.moe_offload.llm_server_service_info:
    project_dir: /srv/ai-llm
    container_name: ai-llm
    base_url: http://127.0.0.1:8080
  register: service
"""

RETURN = r"""
compose_command:
  description: The compose tool as an argv list.
  returned: always
  type: list
  elements: str
  sample: [podman-compose]
engine:
  description: The container engine, V(podman) or V(docker).
  returned: always
  type: str
  sample: podman
gpu_access:
  description:
    - How the engine gives the container its GPUs, what the role's C(llm_server_gpu_access=auto) becomes - V(cdi) (CDI device
      names) with podman, and with docker 25 or newer with CDI enabled; V(reservations) with any other docker.
    - With O(image), V(cdi) only where the compose tool passes CDI devices on (not C(podman compose) running docker-compose;
      docker compose 2.30 or newer) and the engine resolves the GPUs' CDI names; else docker falls back to
      V(reservations) (for V(auto)) and the module fails naming C(nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml)
      or podman-compose.
    - With O(image), docker's compose tool whose docker endpoint podman serves (C(docker version) names the
      C(Podman Engine), as with C(DOCKER_HOST) at C(podman system service)) fails the module whatever O(gpu_access)
      says, naming podman-compose - podman's docker API drops CDI names and device reservations alike.
  returned: when O(gpus) is set and the host has GPUs
  type: str
  sample: cdi
container:
  description: The container's state.
  returned: always
  type: dict
  sample: {exists: true, id: 3f2a..., status: running, running: true, pid: 4242, exit_code: 0, restarts: 0,
           started_at: "2026-05-04T10:11:12Z", image: "localhost/ai-llm:cuda", config_hash: "9b1e..."}
pids:
  description: The container's processes (its pid and every process below it), in the host's pid namespace.
  returned: always
  type: list
  elements: int
  sample: [4242, 4250]
health:
  description: The status C(/health) answered, V(-1) when nothing answered, V(null) when not asked.
  returned: always
  type: int
  sample: 200
auth:
  description: Whether the API key is in force (V(checked=false) when it was not checked).
  returned: always
  type: dict
  sample: {enforced: true, checked: true, without_key: 401, with_key: 200}
disk:
  description:
    - What the project directory holds, the SHA-256 of its compose and API key files, whether the role's block is
      the only place C(.env) sets the role's keys (C(env_settled)), leftovers of a killed write, the lock file.
  returned: always
  type: dict
  sample: {env_config_hash: "9b1e...", env_settled: true, compose_exists: true, compose_sha256: "5d0c...",
           api_key_file: false, api_key_sha256: null, secrets_dir: true, leftovers: false, lock_file: false,
           verification: {config_hash: "9b1e...", status: changed}, snapshot_hash: "9b1e...",
           previous_snapshot_hash: null, model_outside_dir: null}
gpu_info:
  description: What M(ai_llm.moe_offload.gpu_info) returns (with the container's pid when it runs).
  returned: with O(gpus)
  type: dict
  sample: {gpus: [], topology: cpu, nvidia_smi: null}
host_info:
  description: What M(ai_llm.moe_offload.host_info) returns (with the container's pid when it runs).
  returned: with O(host_memory)
  type: dict
  sample: {memory_total_mib: 64214.38, memory_available_mib: 60211.4, cgroup: null}
cuda_requirement:
  description:
    - The image's C(NVIDIA_REQUIRE_CUDA) (C(require), V(null) when it sets none; C(found) false when the image is not
      on the host) and, when it sets one, per GPU the facts NVIDIA's container hook checks it against - C(driver),
      C(cuda) (the driver's CUDA version), C(arch), C(product_brand) as nvidia-smi prints it and C(brand) as the hook
      names it. A fact nvidia-smi does not give is V(null), which the hook counts as met.
  returned: with O(gpus) and O(image) on a host with GPUs
  type: dict
  sample: {image: "localhost/ai-llm:cuda-b10435", found: true, require: "cuda>=12.8 brand=unknown,driver>=550,driver<551",
           gpus: [{index: 0, name: NVIDIA RTX A5500, driver: 550.127.05, cuda: "12.4", arch: "8.6",
                   product_brand: NVIDIA RTX, brand: Unknown}]}
model_info:
  description: What M(ai_llm.moe_offload.gguf_info) returns for O(model_path), without the tensor list.
  returned: with O(model_path)
  type: dict
  sample: {architecture: nemotron_h_moe, offload_pattern: "\\.ffn_(up|down)_exps\\.", model: {}}
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._cuda_requirement import read as read_requirement
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_container import (
    auth_check,
    container_state,
    engine_gpu_access,
    engine_of,
    gpu_access_check,
    find_compose,
    http_get,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_disk import read_disk
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._host_memory import HostMemoryError, gather, process_tree
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_inspection import ReportError, report
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._nvidia_smi import NvidiaSmiError, read


def main():
    module = AnsibleModule(
        argument_spec=dict(
            project_dir=dict(type="path", required=True),
            compose_file=dict(type="str", default="docker-compose.prod.yml"),
            compose_command=dict(type="list", elements="str", default=[]),
            container_name=dict(type="str", required=True),
            rollback_dir=dict(type="path"),
            base_url=dict(type="str"),
            api_key=dict(type="str", no_log=True),
            lock_path=dict(type="path"),
            gpus=dict(type="bool", default=False),
            host_memory=dict(type="bool", default=False),
            image=dict(type="str"),
            gpu_access=dict(type="str", default="auto", choices=["auto", "cdi", "reservations"]),
            gpu_devices=dict(type="list", elements="int", default=[]),
            model_path=dict(type="path"),
            model_dir=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    p = module.params

    def run(argv):
        return module.run_command(argv, environ_update={"LC_ALL": "C"}, errors="replace")

    compose, problem = find_compose(run, module.get_bin_path, p["compose_command"])
    if not compose:
        module.fail_json(msg="llm_server: %s" % problem)
    engine = engine_of(compose)
    if not module.get_bin_path(engine):
        module.fail_json(msg="llm_server: the compose tool %s drives %s, which is not installed" % (compose, engine))
    container = container_state(run, engine, p["container_name"])
    health, auth = None, {"enforced": False, "checked": False}
    if container.get("running") and p["base_url"]:
        health, _body = http_get(p["base_url"] + "/health")
        if health == 200 and p["api_key"]:
            auth = auth_check(p["base_url"], p["api_key"])
    pid = container["pid"] if container.get("running") and container.get("pid") else None
    pids = process_tree(pid) if pid else []  # walked once, for the GPU and the host memory reads too
    rollback_dir = p["rollback_dir"] or os.path.join(p["project_dir"], ".rollback")
    result = dict(changed=False, compose_command=compose, engine=engine, container=container,
                  pids=pids, health=health, auth=auth,
                  disk=read_disk(p["project_dir"], p["compose_file"], rollback_dir, p["lock_path"], p["model_dir"],
                                 p["model_path"]))
    # The reads of the host that a deploy needs besides the service, in the order the role reads them.
    try:
        if p["gpus"]:
            result["gpu_info"] = read(module.get_bin_path, run, pid=pid, pids=pids)
            gpus = result["gpu_info"]["gpus"]
            if gpus and p["image"]:  # (a host without GPUs renders no GPU access: nothing asked)
                result["cuda_requirement"] = read_requirement(run, engine, p["image"], result["gpu_info"])
                chosen = [g for g in gpus if not p["gpu_devices"] or g.get("index") in p["gpu_devices"]]
                names = [str(g.get("uuid") or g.get("index")) for g in chosen]
                result["gpu_access"], problem = gpu_access_check(run, compose, engine, p["gpu_access"], p["image"], names)
                if problem:
                    module.fail_json(msg=problem, **result)
            elif gpus:
                result["gpu_access"] = engine_gpu_access(run, engine)
            for warning in result["gpu_info"].pop("warnings"):
                module.warn(warning)
        if p["host_memory"]:
            result["host_info"] = gather(pid=pid, pids=pids)
        if p["model_path"]:
            result["model_info"], warnings = report(p["model_path"], "none")
            for warning in warnings:
                module.warn(warning)
    except NvidiaSmiError as exc:
        module.fail_json(msg=str(exc), nvidia_smi=exc.binary, **result)
    except HostMemoryError as exc:
        module.fail_json(msg=str(exc), **result)
    except ReportError as exc:
        module.fail_json(msg=str(exc), **dict(result, **exc.fields))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
