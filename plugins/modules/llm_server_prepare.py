#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llm_server_prepare
short_description: Internal to the ai_llm.moe_offload.llm_server role - check, read the host, plan and decide
version_added: 0.1.0
description:
  - Only the role M(ai_llm.moe_offload.llm_server) calls it; it is not meant to be called alone.
  - Checks the role's variables on the controller into its settings, before anything is read or written on the
    host. Types, choices and defaults come from the role's argument spec and defaults; this adds the formats, the
    ranges and the rules between variables (a port from 1 to 65535, image references compose accepts, absolute
    paths, the model inside the mounted model directory, values that C(.env) carries byte for byte). The API key
    is checked and never returned; an address other hosts reach needs a key or C(llm_server_allow_unauthenticated).
    A refusal lists every problem at once in RV(problems), each naming its variable.
  - Then reads the host once with
    M(ai_llm.moe_offload.llm_server_service_info) (the container, C(/health), the API key in force, the project
    directory, the GPUs, the host memory and the model's header).
  - Plans where the expert weights go (M(ai_llm.moe_offload.moe_offload_plan) on the controller, with the model's
    summary just read), chooses the pattern (the inventory's, the plan's or the model's) and refuses, before
    anything changes, a pattern that matches nothing or moves non-expert tensors, a plan that does not fit (unless
    C(llm_server_moe_offload_force)), chosen GPUs the host lacks, a context beyond the model's training context and
    values that cannot be deployed.
  - Checks and encodes the values the role's templates place (RV(compose), RV(env)), renders the compose template
    as M(ansible.builtin.template) would and computes the configuration hash (RV(config)).
  - Tells whether the host already runs this configuration, verified, with its snapshot kept (then the run changes
    nothing and takes no lock), and otherwise what the run does (RV(converge), RV(steps)).
  - This is an action plugin that runs on the controller; it changes nothing on the host.
author:
  - ai_llm maintainers (@ai-llm)
extends_documentation_fragment:
  - ai_llm.moe_offload.checked_settings
  - ai_llm.moe_offload.info_module
  - ai_llm.moe_offload.controller_module
seealso:
  - module: ai_llm.moe_offload.llm_server_service_info
  - module: ai_llm.moe_offload.moe_offload_plan
"""

EXAMPLES = r"""
- name: Check, read the host, plan and decide
  ai_llm.moe_offload.llm_server_prepare:
  register: prepared

- name: Read the host again under the lock
  ai_llm.moe_offload.llm_server_prepare:
    settings: "{{ prepared.settings }}"
  register: prepared
"""

RETURN = r"""
settings:
  description: The checked settings, one key per variable without the C(llm_server_) prefix, and C(paths).
  returned: always
  type: dict
  sample: {port: 8080, ctx_size: 4096, api_key_set: true, paths: {env: /srv/ai-llm/.env}}
service:
  description: What M(ai_llm.moe_offload.llm_server_service_info) found.
  returned: when the variables are valid
  type: dict
  sample: {engine: podman, health: 200, container: {exists: true, running: true}}
plan:
  description: The result of M(ai_llm.moe_offload.moe_offload_plan) (C(skipped) when a chosen GPU is missing).
  returned: when the host was read
  type: dict
  sample: {fits: true, pattern: 'blk\.(1|4)\.ffn_.*_exps\.weight', memory: {gpus: []}}
placement:
  description:
    - C(pattern), C(pattern_source) (V(inventory), V(plan), V(model) or V(none)), C(device_overrides) (the device
      overrides placed before the pattern), C(expected_tensors) (what the log must show moved), C(gpu_devices),
      C(tensor_split) and C(topology).
  returned: success
  type: dict
  sample: {pattern: 'blk\.1\.ffn_.*_exps\.weight', pattern_source: plan, gpu_devices: [0], topology: single}
problems:
  description: Every problem found in the variables, each as the variable, a colon and the message.
  returned: when the variables are refused
  type: list
  elements: str
  sample: ["llm_server_port: 99999 is out of range: an integer from 1 to 65535"]
snapshot_serving:
  description:
    - Whether to keep what serves now as the snapshot before the writes (with rollbacks, no
      snapshot yet, ai-llm answers with the role's files).
  returned: success
  type: bool
  sample: false
templates:
  description: The templates the role writes with, C(compose) (the role's or C(llm_server_compose_template)) and
    C(env), as paths on the controller.
  returned: success
  type: dict
compose:
  description: C(llm_server_compose), the values the compose template places, each encoded (the role's README,
    "Templates").
  returned: success
  type: dict
env:
  description: The role's C(.env) keys and their values, before quoting (the C(.env) template quotes them).
  returned: success
  type: dict
  sample: {LLM_MOE_OFFLOAD_PATTERN: "\\.ffn_.*_exps\\.weight", LLM_PORT: "8080"}
config:
  description:
    - C(config_hash), the configuration hash the run writes; C(changed_keys) (key, old, new), C(key_changed),
      C(compose_changed) (what compose reads of the compose file changes), C(files) (the files that change) and
      C(first) (no configuration of the role on the host yet).
  returned: success
  type: dict
converge:
  description:
    - C(recreate), C(verify), C(wait) (booleans) and C(reason) (one line, empty when nothing is done).
    - Recreates when the configuration changed, when the container is missing, stopped, paused or crash-looping,
      when it was created from another configuration, when the key is not in force, or when a verified
      configuration stopped answering. Verifies without a recreate a configuration that runs but was never verified.
  returned: success
  type: dict
  sample: {recreate: true, verify: true, wait: true, reason: "the configuration changed (LLM_CTX_SIZE ...)"}
steps:
  description: What follows the writes - C(parity_before), C(verify), C(snapshot), C(rollback) (a failure rolls back).
  returned: success
  type: dict
files:
  description: C(candidate), the compose file's candidate next to it when it changes (null when it stays), and
    C(validate_env), the compose tool's check of the new C(.env) with the candidate or, when the compose
    file stays, with the one in place (the C(validate) of the C(.env) template).
  returned: success
  type: dict
parity_request:
  description: The body of the parity prompt's C(/completion) request (greedy, the fixed seed).
  returned: success
  type: dict
decision:
  description:
    - C(unchanged) (the run has nothing to do); when false C(reason).
  returned: success
  type: dict
  sample: {unchanged: false, reason: the files on disk are not those of this configuration}
"""
