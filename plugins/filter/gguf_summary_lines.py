# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
name: gguf_summary_lines
short_description: The text lines of a gguf_info result, as the inspect playbook prints them
version_added: 0.1.0
author:
  - ai_llm maintainers (@ai-llm)
description:
  - Takes the registered result of M(ai_llm.moe_offload.gguf_info) and returns the lines that the playbook
    C(ai_llm.moe_offload.inspect) prints, either the summary of the model or its tensor listing.
  - "The summary: the files and their size, the architecture, the blocks of each kind (V(attention),
    V(recurrent), V(moe), V(dense_ffn)), the routed experts with their size and the GPU weights left when they are
    offloaded (or that a dense model has nothing to offload), what RV(ai_llm.moe_offload.gguf_info#module:offload_pattern)
    matches, the verdict on a pattern of your own when
    RV(ai_llm.moe_offload.gguf_info#module:pattern_check) is there, and last the line
    C(LLM_MOE_OFFLOAD_PATTERN=...) to put in a C(.env) file."
  - "The tensor listing: one line C(name  type  shape  size  class) per tensor of
    RV(ai_llm.moe_offload.gguf_info#module:tensors), the size in MiB or C(size unknown) for a tensor of a ggml
    type the module does not know; a single line C(no routed-expert tensors) or C(no tensors) when there is none."
  - Sizes are in GiB and MiB (1024-based). A value that holds a line end makes two lines.
positional: _input
options:
  _input:
    description:
      - The registered result of M(ai_llm.moe_offload.gguf_info).
    type: dict
    required: true
  show:
    description:
      - V(summary) returns the summary lines.
      - V(experts) and V(all) return the tensor listing; use the value given to the module's
        O(ai_llm.moe_offload.gguf_info#module:tensors) option, which chooses the tensors listed. It only changes
        the line printed when there is none.
      - V(none) returns no line.
    type: str
    choices: [summary, none, experts, all]
    default: summary
seealso:
  - module: ai_llm.moe_offload.gguf_info
"""

EXAMPLES = r"""
- name: Read the model header
  ai_llm.moe_offload.gguf_info:
    path: /srv/models/model.gguf
    tensors: experts
  register: model_info

- name: Summary
  ansible.builtin.debug:
    msg: "{{ model_info | ai_llm.moe_offload.gguf_summary_lines }}"

- name: Routed-expert tensors
  ansible.builtin.debug:
    msg: "{{ model_info | ai_llm.moe_offload.gguf_summary_lines(show='experts') }}"
"""

RETURN = r"""
_value:
  description: The lines, without line ends.
  type: list
  elements: str
  sample:
    - "model (6 files, 22.83 GiB): /srv/models/Nemotron-3-Nano-30B-A3B-Q4_K_M-00001-of-00006.gguf"
    - "architecture: nemotron_h_moe, 52 blocks, 401 tensors (22.82 GiB)"
    - "attention layers (6): 5,12,19,26,33,42"
    - "recurrent layers (23): 0,2,4,7,9,11,14,16,18,21,23,25,28,30,32,35,37,39,41,44,46,48,50"
    - "moe layers (23): 1,3,6,8,10,13,15,17,20,22,24,27,29,31,34,36,38,40,43,45,47,49,51"
    - "dense_ffn layers (0): -"
    - "routed experts: 46 tensors, 21.26 GiB (128 experts, 6 used per token, 1 shared)"
    - "GPU weights with experts offloaded: 1.34 GiB (all but experts and token_embd)"
    - "pattern \\.ffn_.*_exps\\.weight matches 46 tensors: exactly the routed experts"
    - "LLM_MOE_OFFLOAD_PATTERN=\\.ffn_.*_exps\\.weight"
"""

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._inspection_text import summary_lines


def gguf_summary_lines(report, show="summary"):
    """The inspect playbook's lines of a gguf_info result: see DOCUMENTATION."""
    if not isinstance(report, Mapping):
        raise AnsibleFilterError(
            f"gguf_summary_lines: expects the registered result of gguf_info (a dict), got {type(report).__name__}")
    try:
        return summary_lines(report, show)
    except KeyError as exc:
        raise AnsibleFilterError(f"gguf_summary_lines: the gguf_info result has no {exc}") from exc
    except (TypeError, ValueError, IndexError) as exc:
        raise AnsibleFilterError(f"gguf_summary_lines: {exc}") from exc


class FilterModule:
    """The filter gguf_summary_lines of the inspect playbook."""

    def filters(self):
        return {"gguf_summary_lines": gguf_summary_lines}
