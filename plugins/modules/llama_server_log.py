#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llama_server_log
short_description: Read a llama-server log and prove where the tensors were placed
version_added: 0.1.0
description:
  - Parses the log of C(llama-server) (llama.cpp) given as a file (O(path)), as text (O(content)) or read from a
    container (O(container)) with C(podman logs) or C(docker logs).
  - Understands the log lines of every llama.cpp era listed in the collection's reference, from the C(llm_load_tensors:)
    prefix of 2024 to the leveled, timestamped lines (C(0.00.011.842 D ...)) of current builds, the old
    C(tensor ... buffer type overriden to CPU) line without a size, the current
    C(tensor ... buffer type overridden to CPU) line that gives the size and type in parentheses after the name,
    and the C(Tensor ... overriden) line of the fork ik_llama.cpp.
  - Only the last model load of the last server run counts. A log of a restarted container holds several runs,
    and C(-fit on) (the default of current builds) loads the model twice, printing the whole load block twice.
  - With O(expect_tensors), or O(expect_pattern) plus the model O(gguf), it checks that the log shows exactly the
    expected tensors overridden to a host buffer (C(CPU), C(CPU_REPACK), C(CUDA_Host), C(AMX)...) and names the
    missing and the unexpected ones.
  - The per-tensor lines are DEBUG lines. When the log's verbosity hides them it says so and falls back to the
    buffer evidence, the GPU model buffer against O(expect_gpu_model_mib). Without either evidence the result is
    RV(verified=false) and, with O(fail_on_mismatch), the task fails. It never passes silently.
  - A log that shows a failed model load fails the task with the loader's message.
author:
  - ai_llm maintainers (@ai-llm)
options:
  path:
    description:
      - A log file on the target host (C(--log-file), or the server's redirected stderr).
      - Exactly one of O(path), O(content) and O(container) is required.
    type: path
  content:
    description:
      - The log text itself, for example the RV(ansible.builtin.command#module:stderr) of a registered command.
    type: str
  container:
    description:
      - The name or ID of a container whose logs (stdout and stderr) are read with O(container_engine).
    type: str
  container_engine:
    description:
      - The engine that reads the logs of O(container).
      - V(auto) takes C(podman) when it is installed, else C(docker).
    type: str
    choices: [auto, podman, docker]
    default: auto
  expect_tensors:
    description:
      - The names of the tensors that must appear as overridden to a host buffer; no other may appear.
      - An empty list expects that no tensor was overridden.
      - Mutually exclusive with O(expect_pattern).
    type: list
    elements: str
  expect_pattern:
    description:
      - The override pattern that was deployed (the V(PATTERN) of C(-ot PATTERN=CPU)). The expected tensors are the
        names of O(gguf) that Python's C(re.search) matches, as C(std::regex_search) does in llama.cpp.
      - Requires O(gguf).
    type: str
  gguf:
    description:
      - The GGUF model on the target host (any shard of a split model) that gives the tensor names for
        O(expect_pattern).
    type: path
  expect_gpu_model_mib:
    description:
      - The GPU model buffer the planner predicts, in MiB (the sum of the device model buffers
        C(CUDA0), C(CUDA1), C(Vulkan0), C(ROCm0), C(Metal)...; host buffers such as C(CPU_Mapped) and C(CUDA_Host)
        are not counted).
      - Used only when the per-tensor lines are hidden, or when no tensor expectation is given.
    type: float
  gpu_model_tolerance_mib:
    description:
      - The allowed difference between the logged GPU model buffer and O(expect_gpu_model_mib), in MiB.
      - The tolerance used is the larger of this and O(gpu_model_tolerance_pct).
    type: float
    default: 1.0
  gpu_model_tolerance_pct:
    description:
      - The allowed difference as a percentage of O(expect_gpu_model_mib).
    type: float
    default: 1.0
  fail_on_mismatch:
    description:
      - Fail the task when the log shows a failed model load or a crash of the server (RV(load_error),
        RV(crash)), or when an expectation is given and the log does not prove it (RV(verified=false)).
      - With V(false) the result is only returned.
    type: bool
    default: true
extends_documentation_fragment:
  - ai_llm.moe_offload.info_module
notes:
  - "Make the evidence visible when starting the server: C(-lv 5 --no-log-prefix --no-log-timestamps -fit off) on
    builds since about b9208, C(-lv 4) on builds b7217 to b9208, C(-v) or C(--log-file) before. At the default
    verbosity of current builds (C(-lv 3)) neither the per-tensor lines nor the buffer lines are printed."
  - RV(per_tensor_lines_visible) is decided from the log itself. It is V(true) when an override line is present,
    or when a DEBUG line is present (a C(D) level letter, or the loader's C(layer N assigned to device) and
    C(create_tensor) lines, which llama.cpp prints at the same level, in the same function, as the override lines).
    Only then does an absent override line mean that the pattern matched nothing.
  - Only an override to a host buffer (C(CPU*), C(*_Host), C(AMX)...) counts as moved off the GPUs for the
    expectation; overrides to another device (C(-ot ...=CUDA1), C(RPC[...])) are listed in RV(overridden) with
    their buffer but are neither expected nor unexpected moves.
  - The log may come through C(docker logs -t), C(docker compose logs), C(journalctl), the llama-server router
    (C([port]) prefix), with ANSI colours or Windows line ends; those prefixes are removed before parsing.
  - The fork ik_llama.cpp prints its C(Tensor ... overriden) line at INFO level. When its pattern matched nothing
    the log holds no DEBUG line to prove the lines were visible, and the buffer evidence is used.
seealso:
  - module: ai_llm.moe_offload.gguf_info
  - module: ai_llm.moe_offload.moe_offload_plan
"""

EXAMPLES = r"""
- name: Prove that exactly the routed experts went to the CPU
  ai_llm.moe_offload.llama_server_log:
    container: ai-llm
    expect_pattern: '\.ffn_.*_exps\.weight'
    gguf: /srv/models/Nemotron-3-Nano-30B-A3B-Q4_K_M-00001-of-00006.gguf
    expect_gpu_model_mib: 1369
  register: placement

- name: Show what the server did
  ansible.builtin.debug:
    msg: "{{ placement.msg }}; GPU model buffer {{ placement.gpu_model_mib }} MiB, KV {{ placement.kv_buffers }}"

- name: Parse a log file without any expectation (read only, never fails on placement)
  ai_llm.moe_offload.llama_server_log:
    path: /var/log/llama-server.log
    fail_on_mismatch: false
  register: parsed

- name: Check a list of tensors in the output of a command
  ai_llm.moe_offload.llama_server_log:
    content: "{{ server_run.stderr }}"
    expect_tensors:
      - blk.1.ffn_up_exps.weight
      - blk.1.ffn_down_exps.weight
"""

RETURN = r"""
msg:
  description: What was proved, or why not.
  returned: always
  type: str
  sample: "the log shows exactly the 46 expected tensors overridden"
verified:
  description:
    - V(true) when the log proves the expectation. Always V(false) without an expectation, with a load error, or
      without evidence.
  returned: always
  type: bool
  sample: true
evidence:
  description:
    - What the verdict rests on. V(per_tensor) (the override lines), V(buffers) (the GPU model buffer against
      O(expect_gpu_model_mib)) or V(none).
  returned: always
  type: str
  sample: per_tensor
missing:
  description: Expected tensors the log does not show overridden (only with V(per_tensor) evidence).
  returned: always
  type: list
  elements: str
  sample: ["blk.51.ffn_down_exps.weight"]
unexpected:
  description: Tensors the log shows overridden that were not expected (only with V(per_tensor) evidence).
  returned: always
  type: list
  elements: str
  sample: ["blk.1.ffn_up_shexp.weight"]
expected_count:
  description: The number of expected tensors, V(null) without a tensor expectation.
  returned: always
  type: int
  sample: 46
build:
  description: The llama.cpp build as C(b<number>-<commit>) (the form of C(/props) C(build_info)), V(null) when the
    log does not show it (it is an INFO line, hidden at C(-lv 3)).
  returned: always
  type: str
  sample: b7500-1a2b3c4
build_number:
  description: The build number of RV(build).
  returned: always
  type: int
  sample: 7500
overridden:
  description:
    - The tensors of the last load that the log shows overridden, in log order.
    - RV(overridden[].mib) (integer-truncated MiB) and RV(overridden[].type) (lowercase ggml type) are V(null) in
      the old C(overriden) line that has no size.
  returned: always
  type: list
  elements: dict
  sample: [{"tensor": "blk.1.ffn_up_exps.weight", "mib": 418, "type": "q5_0", "buffer": "CPU"}]
  contains:
    tensor:
      description: The tensor name.
      type: str
      sample: blk.1.ffn_up_exps.weight
    mib:
      description: Its size in MiB, integer-truncated as llama.cpp prints it; V(null) in the old line.
      type: int
      sample: 418
    type:
      description: Its ggml type, lowercase; V(null) in the old line.
      type: str
      sample: q5_0
    buffer:
      description: The buffer type it was overridden to (V(CPU), V(CPU_REPACK), V(CUDA_Host), V(AMX)...).
      type: str
      sample: CPU
model_buffers:
  description: Model buffers of the last load, buffer name to MiB (lines of one buffer are summed; C(CPU_Mapped)
    appears once per shard and measures the mapped span of the file, not the CPU tensors).
  returned: always
  type: dict
  sample: {"CUDA0": 1369.43, "CPU_Mapped": 22003.21}
gpu_model_mib:
  description: The sum of the device model buffers (not CPU, not host-pinned), V(null) without model buffer lines.
  returned: always
  type: float
  sample: 1369.43
gpu_model_tolerance_mib:
  description: The tolerance used for the buffer evidence, V(null) when it was not used.
  returned: always
  type: float
  sample: 13.69
kv_buffers:
  description: KV cache buffers, buffer name to MiB.
  returned: always
  type: dict
  sample: {"CUDA0": 768.0}
rs_buffers:
  description: Recurrent-state buffers (Mamba layers), buffer name to MiB.
  returned: always
  type: dict
  sample: {"CUDA0": 47.62}
compute_buffers:
  description: Compute buffers, buffer name to MiB.
  returned: always
  type: dict
  sample: {"CUDA0": 1078.13, "CUDA_Host": 268.02}
offloaded_layers:
  description: The C(offloaded N/M layers to GPU) line as a dict, V(null) when absent (CPU-only builds, low verbosity).
  returned: always
  type: dict
  sample: {"offloaded": 53, "total": 53}
mmap_override_warning:
  description: Whether llama.cpp warned that tensor overrides to CPU are used with mmap enabled (builds since
    PR 20978 print it once when at least one tensor matched a CPU override).
  returned: always
  type: bool
  sample: true
load_error:
  description:
    - The loader's error message when the last run failed to load the model (or to create its context, or to
      start), else V(null).
    - When the log names the allocation that failed, it is appended in parentheses.
  returned: always
  type: str
  sample: "unable to allocate CUDA0 buffer (allocating 144817.04 MiB on device 0: cudaMalloc failed: out of memory)"
crash:
  description: "The first fatal error of the last run, during or after the load (C(CUDA error: ...),
    failed C(GGML_ASSERT), C(Segmentation fault)...), else V(null). The server is gone; nothing is verified."
  returned: always
  type: str
  sample: "CUDA error: an illegal memory access was encountered"
server_ready:
  description: Whether the last run shows the server loaded and serving (C(model loaded), C(server is listening on),
    C(all slots are idle)). These are INFO lines, hidden at low verbosity, so V(false) alone fails nothing.
  returned: always
  type: bool
  sample: true
per_tensor_lines_visible:
  description: Whether the log's verbosity shows the per-tensor override lines (see the notes).
  returned: always
  type: bool
  sample: true
runs:
  description: How many server runs the log holds (a restarted container has several); only the last is reported.
  returned: always
  type: int
  sample: 1
loads:
  description: How many model loads the last run holds (V(2) with C(-fit on)); only the last is reported.
  returned: always
  type: int
  sample: 1
"""

import os
import re
import shutil

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._gguf import GGUFError, read_model
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_log import (
    expected_from_pattern,
    parse_log,
    verify_placement,
)


def read_text(module):
    p = module.params
    if p["content"] is not None:
        return p["content"]
    if p["path"] is not None:
        try:
            with open(p["path"], "rb") as f:
                return f.read().decode("utf-8", "replace")
        except (IOError, OSError) as exc:
            module.fail_json(msg="cannot read %s: %s" % (p["path"], exc))
    engine = p["container_engine"]
    if engine == "auto":
        engine = "podman" if shutil.which("podman") else "docker"
    binary = module.get_bin_path(engine, required=True)
    rc, out, err = module.run_command([binary, "logs", p["container"]])
    if rc != 0:
        module.fail_json(msg="%s logs %s failed (rc=%d): %s" % (engine, p["container"], rc, err.strip()))
    # llama-server writes its log to stderr; a container with a TTY has everything on stdout.
    return err + "\n" + out if err.strip() else out


def expected_tensors(module):
    p = module.params
    if p["expect_tensors"] is not None:
        return list(p["expect_tensors"])
    if p["expect_pattern"] is None:
        return None
    if not os.path.isfile(p["gguf"]):
        module.fail_json(msg="%s: no such file" % p["gguf"])
    try:
        names = [t.name for t in read_model(p["gguf"]).tensors]
        expected = expected_from_pattern(p["expect_pattern"], names)
    except GGUFError as exc:
        module.fail_json(msg=str(exc))
    except re.error as exc:
        module.fail_json(msg="expect_pattern %r is not a valid regular expression: %s" % (p["expect_pattern"], exc))
    if not expected:
        module.warn("expect_pattern %r matches no tensor of %s: the log must show no override"
                    % (p["expect_pattern"], p["gguf"]))
    return expected


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path"),
            content=dict(type="str"),
            container=dict(type="str"),
            container_engine=dict(type="str", default="auto", choices=["auto", "podman", "docker"]),
            expect_tensors=dict(type="list", elements="str"),
            expect_pattern=dict(type="str"),
            gguf=dict(type="path"),
            expect_gpu_model_mib=dict(type="float"),
            gpu_model_tolerance_mib=dict(type="float", default=1.0),
            gpu_model_tolerance_pct=dict(type="float", default=1.0),
            fail_on_mismatch=dict(type="bool", default=True),
        ),
        mutually_exclusive=[("path", "content", "container"), ("expect_tensors", "expect_pattern")],
        required_one_of=[("path", "content", "container")],
        required_together=[("expect_pattern", "gguf")],
        supports_check_mode=True,
    )
    p = module.params
    expected = expected_tensors(module)
    parsed = parse_log(read_text(module))
    check = verify_placement(parsed, expected, p["expect_gpu_model_mib"],
                             p["gpu_model_tolerance_mib"], p["gpu_model_tolerance_pct"])
    result = dict(parsed, **check)
    result["expected_count"] = None if expected is None else len(expected)
    if p["expect_pattern"] is not None and not expected:
        result["msg"] = "expect_pattern matches no tensor of the model; " + result["msg"]
    has_expectation = expected is not None or p["expect_gpu_model_mib"] is not None
    failed_run = parsed["load_error"] or parsed["crash"]
    if p["fail_on_mismatch"] and (failed_run or (has_expectation and not check["verified"])):
        module.fail_json(changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
