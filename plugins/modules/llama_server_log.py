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
  - Understands the log lines of every llama.cpp era, from the C(llm_load_tensors:) prefix of 2024 to the leveled, timestamped lines
    (C(0.00.011.842 D ...)) of current builds, the old C(tensor ... buffer type overriden to CPU) line without a size, the current
    C(tensor ... buffer type overridden to CPU) line that gives the size and type in parentheses after the name, and the C(Tensor ... overriden)
    line of the fork ik_llama.cpp.
  - Reads the log as a stream, line by line, in time linear in its size and with bounded memory, whatever its size. Bytes that are not UTF-8
    are replaced, never fatal.
  - Only the last model load of the last server run counts. A log of a restarted container holds several runs,
    and C(-fit on) (the default of current builds) loads the model twice, printing the whole load block twice.
  - "Proves the placement with the best evidence the log holds: the per-tensor override lines (DEBUG lines, shown with C(-lv 5)) against
    O(expect_tensors), O(expect_pattern), O(expect_overrides) or O(expect_override_patterns); at the default verbosity, which hides them, the
    model buffer of every device against O(expect_model_buffers) (or the sum of the device buffers against O(expect_gpu_model_mib)).
    RV(evidence) says which proof was used."
  - Also checks, when given, the KV cache, recurrent-state and compute buffers per device, the number of offloaded layers and the devices used.
  - "Sees crashes for what they are, during or after the load, with a cause in plain words (RV(crash_cause)) - a C(GGML_ABORT) or failed
    C(GGML_ASSERT) line (C(file.cpp:123: message)), C(terminate called after throwing), a backtrace, a backend error such as C(CUDA error),
    and an exit by SIGILL, SIGABRT or SIGSEGV given as O(exit_code) (132, 134, 139)."
  - Never RV(verified=true) after a crash, a failed load, an exit before the server was ready, or without
    evidence; with O(fail_on_mismatch) the task then fails. It never passes silently.
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
      - The name or ID of a container whose logs (stdout and stderr, as one stream) are read with O(container_engine).
    type: str
  container_engine:
    description:
      - The engine that reads the logs of O(container). V(auto) takes C(podman) when it is installed, else C(docker).
    type: str
    choices: [auto, podman, docker]
    default: auto
  exit_code:
    description:
      - How the server process ended, when it has ended, for example the container's C(State.ExitCode) from C(podman inspect).
      - 128 plus a signal number is a crash, with its cause - 132 (SIGILL, an instruction the CPU does not have), 134 (SIGABRT), 135 (SIGBUS),
        136 (SIGFPE), 137 (SIGKILL, often the out-of-memory killer), 139 (SIGSEGV). A negative value -N (signal N, as Python reports it) is read
        the same way.
      - Any exit code with no ready line in the log means that the server never became ready.
    type: int
  require_ready:
    description:
      - Verify only when the log shows the server loaded and serving (C(model loaded), C(listening on http) or C(all slots are idle);
        llama-server prints them at its default verbosity).
      - Defaults to V(true) with O(container) and to V(false) with O(path) or O(content), which may hold an excerpt.
    type: bool
  expect_tensors:
    description:
      - The names of the tensors that must appear as overridden to a host buffer; no other may appear there.
      - An empty list expects that no tensor was overridden.
    type: list
    elements: str
  expect_pattern:
    description:
      - The override pattern that was deployed (the V(PATTERN) of C(-ot PATTERN=CPU)). The expected tensors are the
        names of O(gguf) that the pattern matches, read as llama.cpp's C(std::regex_search) reads it.
      - Requires O(gguf).
    type: str
  expect_overrides:
    description:
      - The expected overrides per buffer type - a dict of buffer type to the names of the tensors overridden to it.
      - The key V(CPU) stands for any host buffer (C(CPU), C(CPU_REPACK), C(CUDA_Host), C(AMX)...); any other key
        is a device buffer type, for example V(CUDA1) for experts placed on a chosen GPU.
      - Overrides in the log to a device that no key names are listed in RV(overridden) but are neither missing
        nor unexpected.
    type: dict
  expect_override_patterns:
    description:
      - The C(--override-tensor) items that were deployed, in the order llama-server got them, each
        C(PATTERN=BUFFER), for example V(blk\\.(1|2\)\\.ffn_.*_exps\\.weight=CUDA1) then
        V(\\.ffn_.*_exps\\.weight=CPU).
      - The expected overrides are computed from the tensor names of O(gguf) as llama.cpp does - the first item
        whose pattern matches a tensor decides its buffer.
      - Requires O(gguf).
    type: list
    elements: str
  gguf:
    description:
      - The GGUF model on the target host (any shard of a split model) that gives the tensor names for
        O(expect_pattern) or O(expect_override_patterns).
    type: path
  expect_model_buffers:
    description:
      - 'The model buffer the plan predicts for each device, in MiB, for example V({"CUDA0": 1369.43, "CUDA1": 800.0}).'
      - Each device's C(model buffer size) line must equal it within O(buffer_tolerance_mib), and no other device
        may have a model buffer. This is the proof at the default verbosity (RV(evidence=device_buffers)); with the
        per-tensor lines visible it is checked as well.
      - Host buffers (C(CPU_Mapped), C(CUDA_Host)) are compared only when given.
    type: dict
  expect_kv_buffers:
    description:
      - The KV cache buffer of each buffer type, in MiB; each must equal the log within O(buffer_tolerance_mib).
    type: dict
  expect_rs_buffers:
    description:
      - The recurrent-state (RS) buffer of each buffer type, in MiB; each must equal the log within
        O(buffer_tolerance_mib).
    type: dict
  expect_compute_buffers:
    description:
      - The compute buffer of each buffer type, in MiB, as an upper bound - the logged buffer must not be larger
        (plus O(buffer_tolerance_mib)).
    type: dict
  expect_offloaded_layers:
    description:
      - The N of the C(offloaded N/M layers to GPU) line.
    type: int
  buffer_tolerance_mib:
    description:
      - The allowed difference, in MiB, for O(expect_model_buffers), O(expect_kv_buffers), O(expect_rs_buffers)
        and O(expect_compute_buffers). llama.cpp prints buffers with two decimals.
    type: float
    default: 0.01
  expect_gpu_model_mib:
    description:
      - The GPU model buffer the planner predicts, in MiB (the sum of the device model buffers C(CUDA0), C(CUDA1), C(Vulkan0), C(ROCm0),
        C(Metal)...; host buffers such as C(CPU_Mapped) and C(CUDA_Host) are not counted).
      - Used only when the per-tensor lines are hidden, or when no tensor expectation is given, and O(expect_model_buffers) is not given.
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
  expect_devices:
    description:
      - The devices llama-server must use, as RV(ai_llm.moe_offload.moe_offload_plan#module:devices) lists them (C(device), C(pci_bus_id),
        C(name)); V([]) expects no CUDA device. Its C(using device) lines must name exactly these, each C(CUDA<n>) on the PCI bus id of its card.
    type: list
    elements: dict
  fail_on_mismatch:
    description:
      - Fail the task when the log shows a failed model load, a crash or an exit before the server was ready
        (RV(load_error), RV(crash), RV(failure)), or when an expectation is given and the log does not prove it
        (RV(verified=false)).
      - With V(false) the result is only returned.
    type: bool
    default: true
extends_documentation_fragment:
  - ai_llm.moe_offload.info_module
notes:
  - "Production can run llama-server at its default verbosity - the per-device model buffer lines, the KV, recurrent-state and compute buffer
    lines, the offloaded layers, the C(using device) lines and the ready line are INFO lines, printed by default; give O(expect_model_buffers)
    (and the other buffer expectations) for the proof. The per-tensor lines need C(-lv 5) (with C(--no-log-prefix --no-log-timestamps -fit off)
    for a plain log) on builds since about b9208, C(-lv 4) on builds b7217 to b9208, C(-v) or C(--log-file) before; they cost about 1 KB of
    log per generated token at C(-lv 5)."
  - RV(per_tensor_lines_visible) is decided from the log itself. It is V(true) when an override line is present, or when a DEBUG line is present
    (a C(D) level letter, or the loader's C(layer N assigned to device) and C(create_tensor) lines, which llama.cpp prints at the same level, in
    the same function, as the override lines). Only then does an absent override line mean that the pattern matched nothing.
  - With O(expect_tensors) or O(expect_pattern), only an override to a host buffer (C(CPU*), C(*_Host), C(AMX)...) counts as moved off the GPUs;
    overrides to another device (C(-ot ...=CUDA1), C(RPC[...])) are listed in RV(overridden) with their buffer. Use O(expect_overrides) or
    O(expect_override_patterns) to expect them.
  - The log may come through C(docker logs -t), C(docker compose logs), C(journalctl) (with or without the hostname), a C(2026-05-16 22:21:42.654 | )
    timestamp, the llama-server router (C([port]) prefix), with ANSI colours or Windows line ends; those prefixes are removed before parsing.
  - The fork ik_llama.cpp prints its C(Tensor ... overriden) line at INFO level. When its pattern matched nothing the log holds no DEBUG line to
    prove the lines were visible, and the buffer evidence is used.
seealso:
  - module: ai_llm.moe_offload.gguf_info
  - module: ai_llm.moe_offload.moe_offload_plan
"""

EXAMPLES = r"""
- name: Prove that exactly the routed experts went to the CPU (per-tensor lines, -lv 5)
  ai_llm.moe_offload.llama_server_log:
    container: ai-llm
    expect_pattern: '\.ffn_.*_exps\.weight'
    gguf: /srv/models/Nemotron-3-Nano-30B-A3B-Q4_K_M-00001-of-00006.gguf
  register: placement

- name: Read the container's exit code when it is not running
  ansible.builtin.command:
    argv: [podman, inspect, --format, "{{ '{{' }}.State.ExitCode{{ '}}' }}", ai-llm]
  register: ai_llm_exit
  changed_when: false

- name: Prove a two-GPU placement at the default verbosity, from the per-device buffers
  ai_llm.moe_offload.llama_server_log:
    container: ai-llm
    exit_code: "{{ ai_llm_exit.stdout | int if ai_llm_exit.stdout | int != 0 else omit }}"
    expect_override_patterns:
      - 'blk\.(2[0-9])\.ffn_.*_exps\.weight=CUDA1'
      - '\.ffn_.*_exps\.weight=CPU'
    gguf: /srv/models/Nemotron-3-Nano-30B-A3B-Q4_K_M-00001-of-00006.gguf
    expect_model_buffers: {CUDA0: 1369.43, CUDA1: 9466.12}
    expect_kv_buffers: {CUDA0: 768.0}
    expect_compute_buffers: {CUDA0: 1100.0}
    expect_offloaded_layers: 53
  register: placement

- name: Show what the server did
  ansible.builtin.debug:
    msg: "{{ placement.msg }}; evidence {{ placement.evidence }}; model buffers {{ placement.model_buffers }}"

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
  sample: "the log shows exactly the 46 expected tensors overridden to host memory"
verified:
  description:
    - V(true) when the log proves every expectation given. Always V(false) without an expectation, with a load
      error, a crash, an exit before the server was ready, or without evidence.
  returned: always
  type: bool
  sample: true
evidence:
  description:
    - What the placement proof rests on - V(per_tensor) (the override lines), V(device_buffers) (the model buffer of
      every device against O(expect_model_buffers)), V(buffers) (the GPU model buffer against
      O(expect_gpu_model_mib)), V(host_buffers) (no tensor or model buffer expected; the KV, recurrent-state and
      compute buffers given, as on a host without GPU, where every tensor is in host memory whatever the pattern)
      or V(none).
  returned: always
  type: str
  sample: per_tensor
checks:
  description: One item per buffer or layer expectation that was checked.
  returned: always
  type: list
  elements: dict
  sample: [{"check": "model buffer CUDA0", "expected": 1369.43, "logged": 1369.43, "ok": true,
            "note": "1369.43 +/- 0.01"}]
  contains:
    check:
      description: What was compared (C(model buffer CUDA0), C(KV buffer CUDA0), C(compute buffer CUDA0),
        C(offloaded layers)...).
      type: str
    expected:
      description: The expected figure (MiB, or layers); V(null) for a device buffer that nothing was expected on.
      type: float
    logged:
      description: The figure in the log, V(null) when the log has no such line.
      type: float
    ok:
      description: Whether it matches.
      type: bool
    note:
      description: The rule applied (C(1369.43 +/- 0.01), C(at most 1100.00)...).
      type: str
missing:
  description: Expected tensors the log does not show overridden to their buffer (only with V(per_tensor) evidence).
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
    log does not show it.
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
      description: The buffer type it was overridden to (V(CPU), V(CPU_REPACK), V(CUDA_Host), V(AMX), V(CUDA1)...).
      type: str
      sample: CPU
overridden_dropped:
  description: Override lines of the last load beyond the 65536 kept (V(0) for any real model); with any, the
    per-tensor evidence does not verify.
  returned: always
  type: int
  sample: 0
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
  description: The tolerance used for the V(buffers) evidence, V(null) when it was not used.
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
  sample: "error loading model architecture: unknown model architecture: 'foo'"
crash:
  description:
    - "The first fatal error of the last run, during or after the load, as the log prints it: a C(GGML_ABORT) line
      (C(ggml-rpc.cpp:519: Remote RPC server crashed or returned malformed response)), a failed C(GGML_ASSERT),
      C(terminate called after throwing an instance of ...), a backtrace line, C(CUDA error: ...),
      C(Segmentation fault); or, from O(exit_code), C(exit code 132 (SIGILL) after the line: ...). Else V(null)."
    - The server is gone; nothing is verified.
  returned: always
  type: str
  sample: "ggml-rpc.cpp:519: Remote RPC server crashed or returned malformed response"
crash_cause:
  description: What RV(crash) means, in plain words; V(null) without a crash.
  returned: always
  type: str
  sample: "an RPC server (rpc-server) that llama-server uses as a device died or answered garbage"
backtrace:
  description: Whether the last run printed a backtrace (ggml prints one when it aborts).
  returned: always
  type: bool
  sample: false
exit_code:
  description: O(exit_code) as given, V(null) without it.
  returned: always
  type: int
  sample: 139
failure:
  description: Why the last run failed, in one line (the crash and its cause, the load error, or an exit before the
    server was ready), V(null) when it did not.
  returned: always
  type: str
  sample: "llama-server died: exit code 132 (SIGILL) after the line: AMX is not ready to be used! (an instruction
    this CPU does not have: ...)"
server_ready:
  description: Whether the last run shows the server loaded and serving (C(model loaded), C(listening on http),
    C(all slots are idle)).
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
devices:
  description: The C(using device) lines of the last run, in order; C(pci_bus_id) is C(id) normalized (C(0000:01:00.0)), V(null) for C(unknown id)
    (an RPC device) or a build that prints no id.
  returned: always
  type: list
  elements: dict
  sample: [{"device": CUDA0, "description": NVIDIA RTX A5500, "id": "0000:01:00.0", "pci_bus_id": "0000:01:00.0", "free_mib": 23876}]
build_warning: {description: 'How the build of the log differs from the modelled one (b10435); V(null) when it does not.', returned: always, type: str}
"""

import os
import shutil

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_log import parse_command_log, parse_log
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._pattern_syntax import PatternError
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._placement_proof import (
    expected_from_overrides,
    build_warning,
    expected_from_pattern,
    verify_placement,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.error import GGUFError
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.model import read_model

_MIB_DICTS = ("expect_model_buffers", "expect_kv_buffers", "expect_rs_buffers", "expect_compute_buffers")


def read_log(module):
    """The parsed log of O(content), O(path) or O(container), read as a stream."""
    p = module.params
    if p["content"] is not None:
        return parse_log(p["content"], p["exit_code"])
    if p["path"] is not None:
        try:
            with open(p["path"], "rb") as f:
                return parse_log(f, p["exit_code"])
        except OSError as exc:
            module.fail_json(msg=f"cannot read {p['path']}: {exc}")
    engine = p["container_engine"]
    if engine == "auto":
        engine = "podman" if shutil.which("podman") else "docker"
    binary = module.get_bin_path(engine, required=True)
    parsed, rc, tail = parse_command_log([binary, "logs", p["container"]], p["exit_code"])
    if rc != 0:
        module.fail_json(msg=f"{engine} logs {p['container']} failed (rc={rc}): {' | '.join(tail)}")
    return parsed


def model_names(module):
    gguf = module.params["gguf"]
    if not os.path.isfile(gguf):
        module.fail_json(msg=f"{gguf}: no such file")
    try:
        return [t.name for t in read_model(gguf).tensors]
    except GGUFError as exc:
        return module.fail_json(msg=str(exc))


def expectations(module):
    """(host tensors or None, overrides per buffer or None), from whichever tensor option was given."""
    p = module.params
    if p["expect_tensors"] is not None:
        return list(p["expect_tensors"]), None
    if p["expect_overrides"] is not None:
        overrides = {}
        for buffer, names in p["expect_overrides"].items():
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                module.fail_json(msg=f"expect_overrides[{buffer!r}] must be a list of tensor names, not {names!r}")
            overrides[str(buffer)] = names
        return None, overrides
    try:
        if p["expect_pattern"] is not None:
            expected = expected_from_pattern(p["expect_pattern"], model_names(module))
            if not expected:
                module.warn(f"expect_pattern {p['expect_pattern']!r} matches no tensor of {p['gguf']}: the log must "
                            "show no override")
            return expected, None
        if p["expect_override_patterns"] is not None:
            return None, expected_from_overrides(p["expect_override_patterns"], model_names(module))
    except (PatternError, ValueError) as exc:
        option = "expect_pattern" if p["expect_pattern"] is not None else "expect_override_patterns"
        module.fail_json(msg=f"{option}: {exc}")
    return None, None


def mib_dict(module, option):
    value = module.params[option]
    if value is None:
        return None
    try:
        return {str(k): float(v) for k, v in value.items()}
    except (TypeError, ValueError):
        return module.fail_json(msg=f"{option} must map buffer names to MiB (numbers), not {value!r}")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path"),
            content=dict(type="str"),
            container=dict(type="str"),
            container_engine=dict(type="str", default="auto", choices=["auto", "podman", "docker"]),
            exit_code=dict(type="int"),
            require_ready=dict(type="bool"),
            expect_tensors=dict(type="list", elements="str"),
            expect_pattern=dict(type="str"),
            expect_overrides=dict(type="dict"),
            expect_override_patterns=dict(type="list", elements="str"),
            gguf=dict(type="path"),
            expect_model_buffers=dict(type="dict"),
            expect_kv_buffers=dict(type="dict"),
            expect_rs_buffers=dict(type="dict"),
            expect_compute_buffers=dict(type="dict"),
            expect_offloaded_layers=dict(type="int"),
            buffer_tolerance_mib=dict(type="float", default=0.01),
            expect_gpu_model_mib=dict(type="float"),
            gpu_model_tolerance_mib=dict(type="float", default=1.0),
            gpu_model_tolerance_pct=dict(type="float", default=1.0),
            expect_devices=dict(type="list", elements="dict"),
            fail_on_mismatch=dict(type="bool", default=True),
        ),
        mutually_exclusive=[("path", "content", "container"),
                            ("expect_tensors", "expect_pattern", "expect_overrides", "expect_override_patterns")],
        required_one_of=[("path", "content", "container")],
        required_by={"expect_pattern": "gguf", "expect_override_patterns": "gguf"},
        supports_check_mode=True,
    )
    p = module.params
    host, overrides = expectations(module)
    buffers = {option: mib_dict(module, option) for option in _MIB_DICTS}
    parsed = read_log(module)
    require_ready = p["require_ready"] if p["require_ready"] is not None else p["container"] is not None
    check = verify_placement(
        parsed, host, p["expect_gpu_model_mib"], p["gpu_model_tolerance_mib"], p["gpu_model_tolerance_pct"],
        expect_overrides=overrides, expect_offloaded_layers=p["expect_offloaded_layers"],
        buffer_tolerance_mib=p["buffer_tolerance_mib"], require_ready=require_ready, expect_devices=p["expect_devices"], **buffers)
    result = dict(parsed, build_warning=build_warning(parsed), **check)
    if result["build_warning"]:
        module.warn(result["build_warning"])
    expected = set(host or ()).union(*(overrides or {}).values())
    result["expected_count"] = None if host is None and overrides is None else len(expected)
    if p["expect_pattern"] is not None and not host:
        result["msg"] = "expect_pattern matches no tensor of the model; " + result["msg"]
    has_expectation = host is not None or overrides is not None or p["expect_gpu_model_mib"] is not None or any(
        v is not None for v in buffers.values()) or p["expect_offloaded_layers"] is not None or p["expect_devices"] is not None
    if p["fail_on_mismatch"] and (parsed["failure"] or (has_expectation and not check["verified"])):
        module.fail_json(changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
