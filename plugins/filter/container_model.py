# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: container_model
short_description: Find the host file of the GGUF model that a llama-server container loads
version_added: 0.1.0
author:
  - ai_llm maintainers (@ai-llm)
description:
  - Takes one container as C(podman inspect) or C(docker inspect) describes it and works out which model
    llama-server loads and where that file is on the host.
  - The model path is read the way llama.cpp reads it (C(common_params_parse_ex) in C(common/arg.cpp)). The
    command line wins over the environment, and of several C(-m)/C(--model) arguments the last one wins.
  - "The sources, in this order: the last C(-m) or C(--model) argument of the container's command line (also
    inside a C(sh -c) string; a value such as V($MODEL) or V(${MODEL}) is taken from the container's
    environment); E(MODEL_PATH) when the container runs C(start-llama-server), the start command of this
    collection's image, which passes it as C(--model); E(LLAMA_ARG_MODEL), llama.cpp's own variable; E(MODEL),
    which wrapper scripts around the upstream image use."
  - A relative model path is taken from the container's working directory.
  - The path is then mapped to the host through the container's mounts (the longest matching destination wins).
    A model that is not on a mount of the host (it is inside the image, or downloaded into the container) has no
    host path; RV(_value.error) says why.
positional: _input
options:
  _input:
    description:
      - One container as C(podman inspect --type container NAME) or C(docker inspect NAME) prints it, that is one
        element of the list they print. Only C(Name), C(Path), C(Args), C(Config.Env), C(Config.WorkingDir)
        and C(Mounts) are read.
    type: dict
    required: true
seealso:
  - name: llama.cpp common/arg.cpp
    description: How llama.cpp reads C(-m)/C(--model) and E(LLAMA_ARG_MODEL).
    link: https://github.com/ggml-org/llama.cpp/blob/master/common/arg.cpp
  - module: ai_llm.moe_offload.gguf_info
"""

EXAMPLES = r"""
- name: Inspect the container
  ansible.builtin.command:
    argv: [podman, inspect, --type, container, ai-llm]
  register: inspected
  changed_when: false

- name: Find its model on the host
  ansible.builtin.set_fact:
    model: "{{ (inspected.stdout | from_json | first) | ai_llm.moe_offload.container_model }}"

- name: Read the model's header
  ai_llm.moe_offload.gguf_info:
    path: "{{ model.host_path }}"
  when: not model.error
"""

RETURN = r"""
_value:
  description: The model of the container.
  type: dict
  contains:
    container:
      description: The container's name.
      type: str
      sample: ai-llm
    container_path:
      description: The model path as llama-server sees it inside the container; V('') when none was found.
      type: str
      sample: /models/Nemotron-3-Nano-30B-A3B-Q4_K_M-00001-of-00006.gguf
    source:
      description:
        - Where the path came from, V(-m) or V(--model) (the command line), V(MODEL_PATH), V(LLAMA_ARG_MODEL) or V(MODEL)
          (the environment), or V('').
      type: str
      sample: MODEL_PATH
    host_path:
      description: The same file on the host, through the container's mounts; V('') when it is not on a mount.
      type: str
      sample: /srv/models/Nemotron-3-Nano-30B-A3B-Q4_K_M-00001-of-00006.gguf
    error:
      description: V('') when RV(_value.host_path) was found, else why not.
      type: str
      sample: the model /inside/the/image.gguf is not on a mount of the host (it is inside the image)
"""

import posixpath
import re
import shlex

from ansible.errors import AnsibleFilterError

# llama.cpp common/arg.cpp, common_params_parser_init: {"-m", "--model"} with .set_env("LLAMA_ARG_MODEL").
MODEL_FLAGS = ("-m", "--model")
# Arguments that make llama-server download its model instead of reading a file (same file).
DOWNLOAD_FLAGS = ("-hf", "-hfr", "--hf-repo", "-mu", "--model-url", "-dr", "--docker-repo")
DOWNLOAD_ENV = ("LLAMA_ARG_HF_REPO", "LLAMA_ARG_MODEL_URL")
START_COMMAND = "start-llama-server"
VARIABLE = re.compile(r"^\$(?:([A-Za-z_][A-Za-z0-9_]*)|\{([A-Za-z_][A-Za-z0-9_]*)\})$")


def _words(container):
    """The command line as words: C(Path) and C(Args), with C(sh -c '...') strings split as a shell would."""
    words = []
    for element in [container.get("Path") or ""] + list(container.get("Args") or []):
        if not isinstance(element, str):
            raise AnsibleFilterError(f"container_model: Args holds {element!r}, not a string")
        if any(c.isspace() for c in element):
            try:
                words.extend(shlex.split(element))
            except ValueError:
                words.extend(element.split())
        elif element:
            words.append(element)
    return words


def _environment(container):
    env = {}
    for item in (container.get("Config") or {}).get("Env") or []:
        key, sep, value = str(item).partition("=")
        if sep:
            env[key] = value
    return env


def _model_argument(words, env):
    """(flag, value) of the last -m/--model on the command line, or ('', '')."""
    found = ("", "")
    for i, word in enumerate(words[:-1]):
        if word in MODEL_FLAGS:
            found = (word, words[i + 1])
    flag, value = found
    match = VARIABLE.match(value)
    if match:
        value = env.get(match.group(1) or match.group(2), "")
    return flag, value


def _on_host(path, mounts):
    """The host path of ``path`` through the mounts (the longest matching destination), or ''."""
    best, host = "", ""
    for mount in mounts or []:
        source = (mount.get("Source") or "").rstrip("/")
        destination = posixpath.normpath(mount.get("Destination") or "/")
        if not source or mount.get("Type") == "tmpfs":
            continue
        inside = path == destination or path.startswith(destination.rstrip("/") + "/")
        if inside and len(destination) >= len(best):
            best = destination
            host = source + path[len(destination.rstrip("/")):]
    return host


def container_model(container):
    """The model of a container (``podman inspect`` / ``docker inspect`` element): see DOCUMENTATION."""
    if not isinstance(container, dict):
        raise AnsibleFilterError(
            f"container_model: expects one container of podman/docker inspect (a dict), got {type(container).__name__}")
    name = (container.get("Name") or "").lstrip("/")
    words = _words(container)
    env = _environment(container)
    source, path = _model_argument(words, env)
    ours = any(posixpath.basename(word) == START_COMMAND for word in words)
    if not path:
        candidates = (["MODEL_PATH"] if ours else []) + ["LLAMA_ARG_MODEL", "MODEL"]
        source, path = next(((key, env[key]) for key in candidates if env.get(key)), ("", ""))
    result = {"container": name, "container_path": "", "source": source, "host_path": "", "error": ""}
    if not path:
        downloads = [w for w in words if w in DOWNLOAD_FLAGS] + [k for k in DOWNLOAD_ENV if env.get(k)]
        result["error"] = "no -m/--model argument and no %s variable" % (
            "MODEL_PATH, LLAMA_ARG_MODEL or MODEL" if ours else "LLAMA_ARG_MODEL or MODEL")
        if downloads:
            result["error"] += f" (llama-server downloads its model: {downloads[0]})"
        return result
    workdir = (container.get("Config") or {}).get("WorkingDir") or "/"
    path = posixpath.normpath(posixpath.join(workdir, path))
    result["container_path"] = path
    result["host_path"] = _on_host(path, container.get("Mounts"))
    if not result["host_path"]:
        result["error"] = f"the model {path} is not on a mount of the host (it is inside the image)"
    return result


class FilterModule:
    """ai_llm.moe_offload filters."""

    def filters(self):
        return {"container_model": container_model}
