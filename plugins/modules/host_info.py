#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_info
short_description: Report the memory a Linux host offers to llama-server
version_added: 0.1.0
description:
  - Reads C(/proc/meminfo) (C(MemTotal), C(MemAvailable), C(SwapTotal), C(SwapFree)) and the memory limit of the
    cgroup the module runs in (cgroup v2 C(memory.max), v1 C(memory.limit_in_bytes)).
  - The result feeds O(ai_llm.moe_offload.moe_offload_plan#module:host) of M(ai_llm.moe_offload.moe_offload_plan),
    which then checks that the host holds the experts and buffers that stay in host memory.
  - With O(pid) it also reports the resident memory of that process and its descendants. The planner counts their
    anonymous and shared memory as available, as a new configuration of the same server gets it back.
  - With O(bandwidth_probe) it also measures the memory bandwidth (RV(memory_bandwidth_mb_per_s)), which
    M(ai_llm.moe_offload.moe_offload_plan) uses for the experts the CPU reads from host memory.
author:
  - ai_llm maintainers (@ai-llm)
options:
  pid:
    description:
      - A process id in the host's PID namespace, such as the main process of the running server's container.
    type: int
  bandwidth_probe:
    description:
      - Measure the memory bandwidth by copying a 256 MiB buffer into another for about half a second, in one
        thread. This allocates 512 MiB for that time.
      - One thread reaches less than llama.cpp's threads do, so the figure is a lower bound. A calibration of the
        plan against a measured speed (O(ai_llm.moe_offload.moe_offload_plan#module:calibration)) replaces it.
    type: bool
    default: false
extends_documentation_fragment:
  - ai_llm.moe_offload.info_module
notes:
  - Memory figures are in MiB (2^20 bytes).
  - C(MemAvailable) already counts page cache the kernel can reclaim, such as a model file that was read once.
seealso:
  - module: ai_llm.moe_offload.moe_offload_plan
  - module: ai_llm.moe_offload.gpu_info
"""

EXAMPLES = r"""
- name: Read the host memory
  ai_llm.moe_offload.host_info:
  register: host

- name: Show what is available
  ansible.builtin.debug:
    msg: "{{ host.memory_available_mib }} of {{ host.memory_total_mib }} MiB available"

- name: Read the host memory and what the running server holds
  ai_llm.moe_offload.host_info:
    pid: "{{ container_pid }}"
  register: host_with_server
"""

RETURN = r"""
memory_total_mib:
  description: C(MemTotal) of C(/proc/meminfo).
  returned: always
  type: float
  sample: 64214.38
memory_available_mib:
  description: C(MemAvailable) of C(/proc/meminfo), the memory new allocations can get without swapping.
  returned: always
  type: float
  sample: 60211.4
swap_total_mib:
  description: C(SwapTotal) of C(/proc/meminfo).
  returned: always
  type: float
  sample: 0.0
swap_free_mib:
  description: C(SwapFree) of C(/proc/meminfo).
  returned: always
  type: float
  sample: 0.0
cgroup:
  description:
    - The memory limit and usage of the module's own cgroup, V(null) when it has no limit. A limit below
      RV(memory_available_mib) is what M(ai_llm.moe_offload.moe_offload_plan) counts.
  returned: always
  type: dict
  sample: {"version": 2, "path": "/user.slice", "limit_mib": 32768.0, "usage_mib": 1210.5}
process_tree:
  description: O(pid), its descendants and their resident memory together.
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
    rss_anon_mib:
      description: Their anonymous resident memory (C(RssAnon)).
      type: float
    rss_file_mib:
      description: Their file-backed resident memory (C(RssFile)), such as a mapped model (page cache).
      type: float
    rss_shmem_mib:
      description: Their shared resident memory (C(RssShmem)).
      type: float
  sample: {"pid": 48200, "pids": [48200, 48213], "rss_anon_mib": 2210.4, "rss_file_mib": 21800.1, "rss_shmem_mib": 0.0}
memory_held_by_pid_mib:
  description: C(rss_anon_mib + rss_shmem_mib) of RV(process_tree), what the host gets back when those processes stop.
  returned: when O(pid) is given
  type: float
  sample: 2210.4
memory_bandwidth_mb_per_s:
  description: The memory bandwidth the copy probe measured, in MB/s (10^6 bytes per second, reads and writes).
  returned: when O(bandwidth_probe) is true
  type: float
  sample: 11873.2
memory_bandwidth_probe:
  description: The probe's buffer, the copies it made and the seconds they took.
  returned: when O(bandwidth_probe) is true
  type: dict
  sample: {"buffer_mib": 256.0, "copies": 22, "seconds": 0.487}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._host_memory import (
    HostMemoryError,
    copy_bandwidth,
    gather,
)


def main():
    module = AnsibleModule(argument_spec=dict(pid=dict(type="int"), bandwidth_probe=dict(type="bool", default=False)),
                           supports_check_mode=True)
    pid = module.params["pid"]
    if pid is not None and pid < 1:
        module.fail_json(msg="pid must be a process id >= 1, got %d" % pid)
    try:
        result = gather(pid=pid)
    except HostMemoryError as exc:
        module.fail_json(msg=str(exc))
    if module.params["bandwidth_probe"]:
        probe = copy_bandwidth()
        result["memory_bandwidth_mb_per_s"] = probe.pop("memory_bandwidth_mb_per_s")
        result["memory_bandwidth_probe"] = probe
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
