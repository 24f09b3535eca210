#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_info
short_description: Report the NVIDIA GPUs of a host, their free memory and the topology
version_added: 0.1.0
description:
  - Runs C(nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.used,memory.free,driver_version,compute_cap
    --format=csv,noheader,nounits) and C(nvidia-smi -L) and returns one entry per GPU.
  - The result feeds O(ai_llm.moe_offload.moe_offload_plan#module:gpus) of M(ai_llm.moe_offload.moe_offload_plan).
  - A host without C(nvidia-smi) on its E(PATH) is a CPU host. That is not a failure, the module
    returns RV(gpus=[]) and RV(topology=cpu).
  - When C(nvidia-smi) exists but fails (driver and library version mismatch after an upgrade, no driver loaded),
    the module fails with C(nvidia-smi)'s own words and what they mean.
  - Fields a card does not report (V([N/A]), V([Not Supported])) are returned as V(null), with a warning.
  - Drivers before 510 do not know C(compute_cap). The module asks again without it.
author:
  - ai_llm maintainers (@ai-llm)
options:
  processes:
    description:
      - Also return the processes using GPU memory (C(nvidia-smi --query-compute-apps)).
    type: bool
    default: false
  pid:
    description:
      - A process id in the host's PID namespace, such as the main process of a container.
      - Every GPU then gets RV(gpus[].memory_held_by_pid_mib), the GPU memory held by that process and all its
        descendants (found through C(/proc/<pid>/task/*/children)). RV(process_tree) lists them.
      - M(ai_llm.moe_offload.moe_offload_plan) counts that memory as free, as a new configuration of the same
        server gets it back.
    type: int
extends_documentation_fragment:
  - ai_llm.moe_offload.info_module
notes:
  - Memory figures are in MiB (2^20 bytes), as C(nvidia-smi) prints them with C(nounits).
  - On a GPU in MIG mode, CUDA programs see the MIG devices listed in RV(gpus[].mig_devices), each with a
    slice of the memory, not the whole GPU.
  - A GPU whose RV(gpus[].mig_mode) is V(Enabled) but that has no MIG devices is no CUDA device at all; the module
    warns, and M(ai_llm.moe_offload.moe_offload_plan) and the C(llm_server) role refuse to plan it until GPU and
    compute instances exist (C(nvidia-smi mig -cgi ... -C)) or MIG mode is off (C(nvidia-smi -i N -mig 0)).
seealso:
  - module: ai_llm.moe_offload.moe_offload_plan
"""

EXAMPLES = r"""
- name: Read the GPUs
  ai_llm.moe_offload.gpu_info:
  register: gpu

- name: Show the free memory of the first GPU
  ansible.builtin.debug:
    msg: "{{ gpu.gpus[0].name }}: {{ gpu.gpus[0].memory_free_mib }} MiB free"
  when: gpu.topology != 'cpu'

- name: Read the GPUs and the processes using them
  ai_llm.moe_offload.gpu_info:
    processes: true
  register: gpu_with_processes

- name: Read the GPUs and what the running server (a container's main process) holds on them
  ai_llm.moe_offload.gpu_info:
    pid: "{{ container_pid }}"
  register: gpu_with_server
"""

RETURN = r"""
gpus:
  description: One entry per GPU, in the order of C(nvidia-smi)'s index. Empty on a host without C(nvidia-smi).
  returned: always
  type: list
  elements: dict
  contains:
    index:
      description: The GPU index of C(nvidia-smi) (the CUDA order when E(CUDA_DEVICE_ORDER=PCI_BUS_ID)).
      type: int
      sample: 0
    name:
      description: The product name.
      type: str
      sample: NVIDIA RTX A5500
    uuid:
      description: The GPU UUID, usable in E(CUDA_VISIBLE_DEVICES) and E(NVIDIA_VISIBLE_DEVICES).
      type: str
      sample: GPU-8d4f3c2a-61b7-4e0a-9f35-2c7e1d9a4b60
    pci_bus_id:
      description: The PCI bus id.
      type: str
      sample: "00000000:01:00.0"
    memory_total_mib:
      description: Total memory in MiB, V(null) where the card does not report it.
      type: int
      sample: 24564
    memory_used_mib:
      description: Used memory in MiB, V(null) where the card does not report it.
      type: int
      sample: 1
    memory_free_mib:
      description: Free memory in MiB, V(null) where the card does not report it.
      type: int
      sample: 24148
    driver_version:
      description: The driver version.
      type: str
      sample: 550.127.05
    compute_capability:
      description: The CUDA compute capability, V(null) with drivers before 510.
      type: str
      sample: "8.6"
    mig_mode:
      description: >-
        The GPU's current MIG mode as C(nvidia-smi --query-gpu=mig.mode.current) prints it, V(Enabled) or
        V(Disabled); V(null) on a GPU without MIG or with a driver that does not know the field.
      type: str
      sample: Disabled
    mig_devices:
      description: The MIG devices of a GPU in MIG mode (empty otherwise).
      type: list
      elements: dict
      sample: [{"index": 0, "profile": "3g.20gb", "uuid": "MIG-4a7f2c90-d1e8-5b36-a0c4-9e2f71b8d653"}]
    memory_held_by_pid_mib:
      description: The GPU memory O(pid) and its descendants hold on this GPU, in MiB.
      returned: when O(pid) is given
      type: int
      sample: 18342
topology:
  description: V(cpu) (no GPU), V(single), V(dual) or V(multi) (three or more).
  returned: always
  type: str
  sample: single
processes:
  description: The processes using GPU memory.
  returned: when O(processes=true)
  type: list
  elements: dict
  contains:
    gpu_uuid:
      description: The UUID of the GPU.
      type: str
    gpu_index:
      description: The index of the GPU.
      type: int
    pid:
      description: The process id (in the host's PID namespace).
      type: int
    process_name:
      description: The process name, V(null) where C(nvidia-smi) cannot see it (another PID namespace).
      type: str
    used_memory_mib:
      description: The GPU memory of the process in MiB, V(null) where it is not reported.
      type: int
  sample: [{"gpu_uuid": "GPU-8d4f3c2a-61b7-4e0a-9f35-2c7e1d9a4b60", "gpu_index": 0, "pid": 48213,
            "process_name": "/usr/local/bin/llama-server", "used_memory_mib": 18342}]
process_tree:
  description: O(pid) and its descendants, the processes whose GPU memory RV(gpus[].memory_held_by_pid_mib) counts.
  returned: when O(pid) is given
  type: dict
  contains:
    pid:
      description: O(pid).
      type: int
    pids:
      description: O(pid) and every descendant.
      type: list
      elements: int
  sample: {"pid": 48200, "pids": [48200, 48213]}
nvidia_smi:
  description: The path of the C(nvidia-smi) that was run, V(null) when there is none.
  returned: always
  type: str
  sample: /usr/bin/nvidia-smi
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._nvidia_smi import NvidiaSmiError, read


def main():
    module = AnsibleModule(argument_spec=dict(processes=dict(type="bool", default=False), pid=dict(type="int")),
                           supports_check_mode=True)
    pid = module.params["pid"]
    if pid is not None and pid < 1:
        module.fail_json(msg="pid must be a process id >= 1, got %d" % pid)
    try:
        result = read(module.get_bin_path, lambda argv: module.run_command(argv, environ_update={"LC_ALL": "C"}),
                      pid=pid, processes=module.params["processes"])
    except NvidiaSmiError as exc:
        module.fail_json(msg=str(exc), nvidia_smi=exc.binary)
    for warning in result.pop("warnings"):
        module.warn(warning)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
