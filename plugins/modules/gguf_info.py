#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gguf_info
short_description: Read a GGUF model's header and give the proved expert offload pattern
version_added: 0.1.0
description:
  - Reads only the header of a GGUF model file (llama.cpp's format) on the target host, never the tensor data,
    so it takes a fraction of a second even for a model of tens of GB.
  - Given any shard of a split model (C(<base>-00001-of-00006.gguf)), it reads every shard.
  - Classifies every tensor (routed experts, shared experts, router, attention, recurrent, dense FFN,
    token embedding, output, norm, other) and every block (attention, recurrent, MoE, dense FFN).
  - Returns RV(offload_pattern), the most readable regular expression for C(llama-server --override-tensor)
    (C(-ot PATTERN=CPU)) that matches exactly the routed-expert tensors, weights and biases, of all shards and
    nothing else. The pattern is tried against every tensor name before it is returned, read as llama.cpp's
    ECMAScript C(std::regex_search) reads it (bytes; C(.) does not match a line end, C($) only the end).
  - The pattern passes the same deployment check as a pattern of your own (O(pattern)) - it holds neither V(,)
    nor V(=) (llama.cpp splits on them), no quote, backtick, V(${), double backslash, control character or
    character outside ASCII (a tensor name that holds one is matched with C(\xHH) escapes), and it is at most
    16384 bytes long (llama-server's C(std::regex) crashes on patterns from about 31 KB). When no such pattern
    matches exactly the experts (only crafted tensor names get there), the module fails and says why.
  - A dense model (no routed experts) gets an empty RV(offload_pattern) and a RV(msg) saying that there is
    nothing to offload.
  - With O(pattern), checks a pattern of your own the same way and says which experts it moves, which it misses
    and which other tensors (router, shared experts, attention...) it would move as well.
  - A malformed file fails with a message naming the file, the byte offset and the reason. So does a tensor of a
    ggml type that ggml removed (such as 4, C(Q4_2)), which llama.cpp refuses to load.
  - The time taken depends on the bytes the header holds, not on the size of the files - a sparse file of 64 GiB
    whose header is a few KB is read in milliseconds.
author:
  - ai_llm maintainers (@ai-llm)
options:
  path:
    description:
      - The GGUF file on the target host. For a split model, any of its shards.
    type: path
    required: true
  tensors:
    description:
      - Which tensors to list in RV(tensors).
      - V(none) lists none, V(experts) the routed-expert tensors, V(all) every tensor of every shard.
    type: str
    choices: [none, experts, all]
    default: experts
  pattern:
    description:
      - A regular expression to check, as it would be given to C(-ot PATTERN=CPU) (without V(=CPU)).
      - The result is in RV(pattern_check). A pattern that cannot be deployed as it is (see the description) is
        reported as unusable, with the reason.
    type: str
extends_documentation_fragment:
  - ai_llm.moe_offload.info_module
notes:
  - Sizes are in bytes, computed from the tensor shapes and ggml types. A tensor of a ggml type this module does
    not know counts 0 bytes, with a warning.
  - llama.cpp matches override patterns with C(std::regex_search), anywhere in the name, like Python's
    C(re.search). End a block number with V(\\.) so that V(blk\\.1\\.) does not catch V(blk.10).
seealso:
  - module: ai_llm.moe_offload.moe_offload_plan
  - name: llama.cpp server options
    description: The C(--override-tensor), C(--cpu-moe) and C(--n-cpu-moe) options of llama-server.
    link: https://github.com/ggml-org/llama.cpp/tree/master/tools/server
"""

EXAMPLES = r"""
- name: Read the model and its offload pattern
  ai_llm.moe_offload.gguf_info:
    path: /srv/models/Nemotron-3-Nano-30B-A3B-Q4_K_M-00001-of-00006.gguf
  register: model

- name: Show the line for the .env file
  ansible.builtin.debug:
    msg: "LLM_MOE_OFFLOAD_PATTERN={{ model.offload_pattern }}"
  when: model.offload_pattern | length > 0

- name: List every tensor
  ai_llm.moe_offload.gguf_info:
    path: /srv/models/model.gguf
    tensors: all
  register: model_all

- name: Check a hand-written pattern
  ai_llm.moe_offload.gguf_info:
    path: /srv/models/model.gguf
    tensors: none
    pattern: 'exps'
  register: checked

- name: Refuse a pattern that moves more than the routed experts
  ansible.builtin.assert:
    that: checked.pattern_check.ok
    fail_msg: "{{ checked.pattern_check.verdict }}"
"""

RETURN = r"""
msg:
  description: One line on what was found and what to offload.
  returned: always
  type: str
  sample: "nemotron_h_moe: 46 routed-expert tensors (21.26 GiB) in 23 MoE blocks; offload pattern \\.ffn_.*_exps\\.weight"
architecture:
  description: The model's C(general.architecture), V(null) when the file has none.
  returned: always
  type: str
  sample: nemotron_h_moe
files:
  description: Every file of the model, shards in order.
  returned: always
  type: list
  elements: str
  sample: ["/srv/models/Nemotron-3-Nano-30B-A3B-Q4_K_M-00001-of-00006.gguf",
           "/srv/models/Nemotron-3-Nano-30B-A3B-Q4_K_M-00002-of-00006.gguf"]
file_bytes:
  description: The size of all files together, in bytes.
  returned: always
  type: int
  sample: 24515130336
tensor_count:
  description: The number of tensors in all shards.
  returned: always
  type: int
  sample: 401
tensor_bytes:
  description: The bytes of all tensors together (the sum of RV(bytes)).
  returned: always
  type: int
  sample: 24455737344
block_count:
  description: The number of blocks (layers).
  returned: always
  type: int
  sample: 52
layer_kinds:
  description:
    - For each block kind (V(attention), V(recurrent), V(moe), V(dense_ffn)), the sorted block indices of that kind.
    - A block can be of several kinds (a transformer block is attention and MoE).
  returned: always
  type: dict
  sample: {"attention": [5, 12, 19, 26, 33, 42], "recurrent": [0, 2, 4], "moe": [1, 3, 6], "dense_ffn": []}
expert_count:
  description: The number of routed experts per MoE block, V(0) for a dense model.
  returned: always
  type: int
  sample: 128
expert_used_count:
  description: The number of routed experts used per token.
  returned: always
  type: int
  sample: 6
expert_shared_count:
  description: The number of shared experts (always on the GPU side of an offload).
  returned: always
  type: int
  sample: 1
bytes:
  description:
    - Bytes per tensor class. The classes are V(routed_experts), V(shared_experts), V(router), V(attention),
      V(recurrent), V(dense_ffn), V(token_embd), V(output), V(norm) and V(other); they sum to RV(tensor_bytes).
  returned: always
  type: dict
  sample: {"routed_experts": 22829916160, "shared_experts": 360677376, "router": 15903744, "attention": 60948480,
           "recurrent": 657063936, "dense_ffn": 0, "token_embd": 242221056, "output": 288358400, "norm": 1003520,
           "other": 0}
expert_tensors:
  description: The names of the routed-expert tensors, sorted.
  returned: always
  type: list
  elements: str
  sample: ["blk.1.ffn_down_exps.weight", "blk.1.ffn_up_exps.weight"]
offload_pattern:
  description:
    - The regular expression that matches exactly RV(expert_tensors) among all tensor names. Use it as
      C(-ot PATTERN=CPU) or in E(LLM_MOE_OFFLOAD_PATTERN).
    - Empty for a model without routed experts.
  returned: always
  type: str
  sample: \.ffn_.*_exps\.weight
offload_pattern_matches:
  description: The tensors that RV(offload_pattern) matches, sorted (the same names as RV(expert_tensors)).
  returned: always
  type: list
  elements: str
  sample: ["blk.1.ffn_down_exps.weight", "blk.1.ffn_up_exps.weight"]
tensors:
  description: The tensors asked for with O(tensors), in file order.
  returned: when O(tensors) is not V(none)
  type: list
  elements: dict
  contains:
    name:
      description: The tensor name.
      type: str
    type:
      description: The ggml type, lower case (V(q5_0), V(mxfp4), V(f32)); V(unknown(N)) for an unknown type id.
      type: str
    shape:
      description: The shape in ggml order (fastest dimension first).
      type: list
      elements: int
    bytes:
      description: The size in bytes, V(null) when the type is unknown.
      type: int
    class:
      description: The tensor class (see RV(bytes)).
      type: str
    block:
      description: The block index, V(null) for tensors outside the blocks.
      type: int
    file:
      description: The shard that holds the tensor.
      type: str
  sample: [{"name": "blk.1.ffn_up_exps.weight", "type": "q5_0", "shape": [2688, 1856, 128], "bytes": 438829056,
            "class": "routed_experts", "block": 1,
            "file": "/srv/models/Nemotron-3-Nano-30B-A3B-Q4_K_M-00001-of-00006.gguf"}]
model:
  description:
    - A compact summary of the model (format V(1)) - the architecture, the files, the metadata the memory model
      reads and one row V([name, type_id, shape, bytes]) per tensor.
    - Pass the registered result (or this key) as O(ai_llm.moe_offload.moe_offload_plan#module:gguf) and the
      planner does not read the file again.
  returned: always
  type: dict
  sample: {"version": 1, "architecture": "nemotron_h_moe", "files": ["/srv/models/nano.gguf"],
           "metadata": {"general.architecture": "nemotron_h_moe", "nemotron_h_moe.block_count": 52,
                        "tokenizer.ggml.tokens": {"count": 131072}},
           "tensors": [["blk.1.ffn_up_exps.weight", 6, [2688, 1856, 128], 701890560]], "warnings": []}
pattern_check:
  description: What the pattern given in O(pattern) would move.
  returned: when O(pattern) is given
  type: dict
  contains:
    pattern:
      description: The pattern checked.
      type: str
    ok:
      description: V(true) when it moves exactly the routed experts and nothing else.
      type: bool
    matched:
      description: The routed-expert tensors it moves.
      type: list
      elements: str
    missed:
      description: The routed-expert tensors it does not move (they would stay in GPU memory).
      type: list
      elements: str
    non_expert:
      description: The other tensors it would move to host memory, with their class.
      type: list
      elements: dict
    verdict:
      description: The result in plain words; for an unusable pattern (invalid, holding V(,), V(=) or a quote,
        too long...) the reason.
      type: str
  sample: {"pattern": "exp", "ok": false, "matched": ["blk.1.ffn_down_exps.weight"], "missed": [],
           "non_expert": [{"tensor": "blk.1.exp_probs_b.bias", "class": "router"}],
           "verdict": "wrong: also moves 1 non-expert tensor(s): 1 router (e.g. blk.1.exp_probs_b.bias)"}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_inspection import ReportError, report


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            tensors=dict(type="str", default="experts", choices=["none", "experts", "all"]),
            pattern=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    try:
        result, warnings = report(module.params["path"], module.params["tensors"], module.params["pattern"])
    except ReportError as exc:
        module.fail_json(msg=str(exc), changed=False, **exc.fields)
    for warning in warnings:
        module.warn(warning)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
