"""The stage of a start of llama-server read from its log (``_llama_stages.load_stage``)."""
from __future__ import annotations

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._llama_stages import load_stage
from tests.helpers.llama_logs import read


def test_the_stage_of_a_start_is_its_last_stage_line_and_the_tensors_created_while_it_loads_them():
    """The stage lines of a real b10435 start, in the order llama.cpp prints them (_llama_stages.STAGES cites where);
    the per-tensor lines of -lv 5 as src/llama-model.cpp create_tensor prints them."""
    lines = read("b10435_rpc_server_killed_lv4.log").splitlines()
    seen = [load_stage(lines[:i + 1]) for i in range(len(lines))]
    assert load_stage([]) == "starting"
    assert [s for i, s in enumerate(seen) if i == 0 or s != seen[i - 1]][-7:] == [
        "reading the model's header", "loading the tensors", "making the context (KV cache, compute buffers)",
        "warming up", "making the slots", "model loaded", "listening"]
    start = [line for line in lines if "loading model tensors" in line]
    created = ["create_tensor: loading tensor blk.%d.ffn_up_exps.weight" % i for i in range(3)]
    assert load_stage(start + created) == "loading the tensors (3 created)"
    assert load_stage(created + lines + created[:1]) == "listening"  # (tensor lines count in the tensors stage only)
