#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llm_server_health
short_description: Internal to the ai_llm.moe_offload.llm_server role - wait for /health 200, measure the speed
version_added: 0.1.0
description:
  - Only the role M(ai_llm.moe_offload.llm_server) calls it; it is not meant to be called alone.
  - On the host, asks C(<base_url>/health) about twice a second until it answers 200 or O(timeout) seconds pass.
  - Between the questions it reads the container O(container_name). When it exits, restarts (a crash loop) or
    disappears, the wait stops at once and the module returns the container's last log lines and a plain cause,
    the first error line llama-server printed (for example the loader's C(check_tensor_dims) message).
  - With O(api_key), once C(/health) is 200, it proves the key is in force, C(/props) answers 401 without the key
    and 200 with it.
  - Fails with RV(cause) unless O(fail=false).
  - With O(speed), once it serves, it measures the speed through C(POST <base_url>/completion) (RV(speed)).
author:
  - ai_llm maintainers (@ai-llm)
options:
  container_name:
    description: The container to watch.
    type: str
    required: true
  engine:
    description: The container engine.
    type: str
    choices: [podman, docker]
    default: podman
  base_url:
    description: The server's URL, for example C(http://127.0.0.1:8080).
    type: str
    required: true
  timeout:
    description: Seconds to wait for C(/health) 200.
    type: int
    default: 300
  api_key:
    description: The API key to prove; no check without it.
    type: str
  log_lines:
    description: How many of the container's last log lines to return when it stopped.
    type: int
    default: 40
  for_at_most:
    description:
      - Wait in pieces - return after this many seconds with RV(waiting) and RV(stage) when ai-llm is still
        starting, so that the caller can say where it is and call again (the role's action does, every few
        seconds).
      - Unset, the wait lasts until O(timeout).
    type: float
  waited:
    description: Seconds that the pieces before this one waited; they count against O(timeout).
    type: float
    default: 0.0
  restarts:
    description: The container's restart count when the first piece began (from RV(container)), so that a restart
      between two pieces still ends the wait.
    type: int
  fail:
    description: Fail when the server does not serve (or the key is not in force); else only report it.
    type: bool
    default: true
  speed:
    description:
      - Once C(/health) is 200, measure the speed - a prompt of exactly O(speed.prompt_tokens) token ids,
        O(speed.predict_tokens) generated (C(ignore_eos)), greedy, C(cache_prompt=false); one warm-up, then
        O(speed.runs) runs, the medians of their C(timings). A failed measurement is a RV(cause).
    type: dict
    suboptions:
      prompt_tokens:
        description: The prompt's length in tokens.
        type: int
        required: true
      predict_tokens:
        description: The tokens generated per run.
        type: int
        required: true
      runs:
        description: The measured runs after the warm-up.
        type: int
        required: true
extends_documentation_fragment:
  - ai_llm.moe_offload.info_module
seealso:
  - module: ai_llm.moe_offload.llm_server_service_info
  - module: ai_llm.moe_offload.llama_server_log
"""

EXAMPLES = r"""
- name: Wait for ai-llm to serve
  ai_llm.moe_offload.llm_server_health:
    container_name: ai-llm
    engine: podman
    base_url: http://127.0.0.1:8080
    timeout: 300
  register: health
"""

RETURN = r"""
healthy:
  description: Whether C(/health) answered 200 (and, with O(api_key), the key is in force).
  returned: always
  type: bool
  sample: true
seconds:
  description: How long the wait took.
  returned: always
  type: float
  sample: 3.21
status:
  description: The last status of C(/health), V(-1) when nothing answered.
  returned: always
  type: int
  sample: 200
waiting:
  description: With O(for_at_most), whether ai-llm is still starting, neither serving nor stopped, after it.
  returned: always
  type: bool
stage:
  description: With RV(waiting), where the start is, from llama-server's log - C(reading the model's header),
    C(loading the tensors) (with the tensors created so far at C(-lv 5)), C(making the context (KV cache, compute
    buffers)), C(warming up), C(making the slots), C(model loaded), C(listening), or C(starting) before the first.
  returned: when RV(waiting)
  type: str
  sample: loading the tensors (61 created)
cause:
  description: Why it does not serve, in one line; V(null) when it serves.
  returned: always
  type: str
  sample: "llama-server exited: llama_model_load: error loading model: check_tensor_dims: tensor 'token_embd.weight' has wrong shape"
log_tail:
  description: The container's last log lines when it stopped or did not answer in time.
  returned: always
  type: list
  elements: str
container:
  description: The container's state at the end (see M(ai_llm.moe_offload.llm_server_service_info)).
  returned: always
  type: dict
auth:
  description: The API key check, V(checked=false) without O(api_key).
  returned: always
  type: dict
  sample: {enforced: true, checked: true, without_key: 401, with_key: 200}
speed:
  description:
    - With O(speed), the benchmark's medians C(decode_tokens_per_second) and C(prompt_tokens_per_second), C(runs),
      and C(prompt_tokens) and C(predicted_tokens) as the server counted them (C(timings.prompt_n),
      C(timings.predicted_n)).
  returned: with O(speed), once ai-llm serves
  type: dict
  sample: {decode_tokens_per_second: 20.1, prompt_tokens_per_second: 410.5, runs: 3, prompt_tokens: 512,
           predicted_tokens: 128}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_container import auth_check, wait_healthy
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._speed_check import SpeedError, measure


def main():
    module = AnsibleModule(
        argument_spec=dict(
            container_name=dict(type="str", required=True),
            engine=dict(type="str", choices=["podman", "docker"], default="podman"),
            base_url=dict(type="str", required=True),
            timeout=dict(type="int", default=300),
            api_key=dict(type="str", no_log=True),
            log_lines=dict(type="int", default=40),
            for_at_most=dict(type="float"),
            waited=dict(type="float", default=0.0),
            restarts=dict(type="int"),
            fail=dict(type="bool", default=True),
            speed=dict(type="dict", options=dict(prompt_tokens=dict(type="int", required=True, no_log=False),
                                                 predict_tokens=dict(type="int", required=True, no_log=False),
                                                 runs=dict(type="int", required=True))),
        ),
        supports_check_mode=True,
    )
    p = module.params

    def run(argv):
        return module.run_command(argv, environ_update={"LC_ALL": "C"}, errors="replace")

    result = wait_healthy(run, p["engine"], p["container_name"], p["base_url"] + "/health", p["timeout"],
                          log_lines=p["log_lines"], waited=p["waited"], for_at_most=p["for_at_most"],
                          restarts=p["restarts"])
    result["auth"] = {"enforced": False, "checked": False}
    if result["healthy"] and p["api_key"]:
        result["auth"] = auth_check(p["base_url"], p["api_key"])
        if not result["auth"]["enforced"]:
            result["healthy"] = False
            result["cause"] = ("the API key is not in force: /props answered %(without_key)s without the key and "
                               "%(with_key)s with it (401 and 200 expected)" % result["auth"])
    if result["healthy"] and p["speed"]:
        try:
            result["speed"] = measure(p["base_url"], api_key=p["api_key"] or "", **p["speed"])
        except SpeedError as exc:
            result.update(healthy=False, cause="the speed check failed: %s" % exc)
    if p["fail"] and not result["healthy"] and not result["waiting"]:
        module.fail_json(msg=result["cause"], changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
