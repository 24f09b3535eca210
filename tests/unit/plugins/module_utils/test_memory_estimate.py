"""The memory per GPU and host (``_memory_estimate``) on synthetic and real Nano headers."""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _common as common
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _compute_buffers as cbuf
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _kv_cache as kvc
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _memory_estimate as mest
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _model_facts as mfacts
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import Options
from tests.helpers.memory_models import (
    MIB, NANO_ATTENTION, attention_model, attention_only, facts, nano_facts, weights_model)

NANO_FACTS = nano_facts()


def test_split_puts_kv_and_state_on_the_layer_device_and_cuda_keeps_four_copies_of_the_inputs():
    result = mest.estimate(NANO_FACTS, Options(32768, 2, backend="cpu"), split=[1, 1], n_devices=2)
    devices = result["devices_by_block"]
    kv_total = sum(g["kv"] for g in result["gpus"])
    assert kv_total == 6144 * 32768
    assert result["gpus"][0]["kv"] == 2 * 512 * 32768 * sum(1 for b in NANO_ATTENTION if devices[b] == 0)
    assert sum(g["recurrent"] for g in result["gpus"]) == 2 * 23 * 2170880

    # llama-context.cpp: several devices, every layer offloaded and no tensor override run pipeline-parallel with
    # GGML_SCHED_MAX_COPIES (4) copies of each split's inputs ("pipeline parallelism enabled (n_copies=4)" in
    # llama-server's log); over RPC, or with -ot ...=CPU, one copy.
    def computes(backend, cpu=()):
        result = mest.estimate(NANO_FACTS, Options(4096, backend=backend), cpu, split=[1, 1], n_devices=2)
        devices = result["devices_by_block"]
        expected = [cbuf.compute_buffer_bytes(NANO_FACTS, Options(4096), [b for b in range(52) if devices[b] == d],
                                              d == result["output_device"], copies=4 if backend == "cuda" else 1)
                    for d in (0, 1)]
        return [g["compute"] for g in result["gpus"]], expected, result["host"]["compute"]
    for backend in ("cuda", "rpc"):
        got, expected, host = computes(backend)
        copies = 4 if backend == "cuda" else 1
        assert got == expected and host == cbuf.host_compute_bytes(NANO_FACTS, Options(4096), copies=copies)
    experts = NANO_FACTS.expert_tensors_by_block[1]
    assert computes("cuda", experts)[0] == computes("rpc", experts)[0]


@pytest.mark.parametrize("ctx, parallel", [(0, 1), (4096, 0), (-1, 1), (256, 512)])
def test_bad_context(ctx, parallel):
    with pytest.raises(mfacts.MemoryModelError):
        mest.estimate(NANO_FACTS, Options(ctx, parallel))


def test_estimate_adds_up_each_gpu_and_the_host_with_its_defaults_and_the_real_nano_header(nano):
    assert nano.warnings == []
    assert nano.n_vocab == 131072  # from the skipped token array's count
    result = mest.estimate(nano, Options(32768, 2, backend="cpu"), cpu_tensors=nano.expert_names)
    gpu = result["gpus"][0]
    assert gpu["kv"] == 6144 * 32768 and gpu["recurrent"] == 2 * 23 * 2170880
    non_expert = sum(t.nbytes for t in nano.tensors if t.name not in set(nano.expert_names))
    embd = [t.nbytes for t in nano.tensors if t.name == "token_embd.weight"][0]
    assert gpu["model"] == non_expert - embd
    assert 1360 < gpu["model_mib"] < 1380  # llama-server b10435 on an RPC device: 1369.17 MiB (plan_accuracy.py)
    assert 21700 < common.mib(result["host"]["model"] - embd) < 21850  # routed experts: about 21,772 MiB
    result = mest.estimate(NANO_FACTS, Options(32768, 2, backend="cpu", margin_mib=512, host_margin_mib=256))
    (gpu,) = result["gpus"]
    assert gpu["kv"] == 6144 * 32768 and gpu["recurrent"] == 2 * 23 * 2170880 and gpu["margin"] == 512 * MIB
    assert gpu["total"] == gpu["model"] + gpu["kv"] + gpu["recurrent"] + gpu["compute"] + gpu["margin"]
    assert gpu["kv_mib"] == 192.0 and gpu["recurrent_mib"] == 95.23 and gpu["margin_mib"] == 512.0
    host = result["host"]
    assert host["kv"] == 0 and host["recurrent"] == 0 and host["output"] == 2 * 131072 * 4
    assert host["margin"] == 256 * MIB
    assert host["total"] == host["model"] + host["output"] + host["compute"] + host["margin"]
    assert host["output_mib"] == 1.0 and host["mmap"] is True and host["pinned"] is False
    assert result["n_ctx"] == 32768 and result["cells"] == kvc.CacheCells(32768, 16384, 2, 0, 512)
    assert mest.estimate(attention_model(), Options(513, 2, backend="rpc"))["n_ctx"] == 1024  # padded for each slot
    assert result["devices_by_block"] == [0] * 52 and result["output_device"] == 0 and result["warnings"] == []
    # the defaults: one slot, f16, flash attention and the 1024 MiB margins
    result = mest.estimate(NANO_FACTS, Options(4096))
    assert result["gpus"][0]["margin"] == 1024 * MIB and result["host"]["margin"] == 1024 * MIB
    assert result["gpus"][0]["kv"] == 6144 * 4096 and result["gpus"][0]["recurrent"] == 23 * 2170880
    assert result["host"]["output"] == 131072 * 4 and result["flash_attn"] is True


@pytest.mark.parametrize("split, n, cumulative", [
    ([3, 1], 2, [0.75, 1.0]), (None, 4, [0.25, 0.5, 0.75, 1.0]), ([0, 2], 2, [0.0, 1.0]), ([2, 0], 2, [1.0, 1.0]),
    ([1], 1, [1.0])])
def test_normalize_split_is_cumulative(split, n, cumulative):
    """llama.cpp: splits[i] = sum(split[:i + 1]) / sum(split); an even split without --tensor-split."""
    assert mest.normalize_split(split, n) == cumulative


@pytest.mark.parametrize("split, n, message", [
    ([1, 1], 0, "there is no GPU to place layers on"),
    ([1, 1, 1], 2, "the tensor split [1, 1, 1] does not give a share >= 0 to each of the 2 GPUs"),
    ([1, -1], 2, "the tensor split [1, -1] does not give a share >= 0 to each of the 2 GPUs"),
    ([0, 0], 2, "the tensor split [0, 0] does not give a share >= 0 to each of the 2 GPUs"),
])
def test_normalize_split_errors(split, n, message):
    with pytest.raises(mfacts.MemoryModelError) as info:
        mest.normalize_split(split, n)
    assert str(info.value) == message


@pytest.mark.parametrize("blocks, split, n, expected", [
    (4, [1, 1], 2, ([0, 0, 0, 1], 1)), (5, [1, 1], 2, ([0, 0, 0, 1, 1], 1)), (4, [3, 1], 2, ([0, 0, 0, 0], 1)),
    (52, None, 1, ([0] * 52, 0)),
    (3, [1, 1], 2, ([0, 0, 1], 1)),  # block 2 at 2/4 = 0.5 is not below the first bound 0.5
    (2, [1, 1], 2, ([0, 0], 1)),  # the output layer at 2/3
    (4, [0, 1], 2, ([1, 1, 1, 1], 1)),
    (4, [1, 0], 2, ([0, 0, 0, 0], 0)),
    (3, None, 1, ([0, 0, 0], 0)),
    (5, [1, 1, 2], 3, ([0, 0, 1, 2, 2], 2)),  # bounds 0.25, 0.5, 1.0 for positions 0, 1/6 ... 5/6
])
def test_layer_devices_first_device_whose_cumulative_share_exceeds_the_position(blocks, split, n, expected):
    """Block i (the output layer as i == n_layer) goes to the first device with i / (n_layer + 1) < splits[d]."""
    assert mest.layer_devices(blocks, split, n) == expected
    if split is None and n == 1:  # the defaults: one device
        assert mest.layer_devices(blocks) == expected


@pytest.mark.parametrize("blocks, split, n, layers, expected", [
    # llama-model.cpp: i_gpu_start = n_layer + 1 - ngl, layer il on the host below it, else on the first device
    # whose bound exceeds (il - i_gpu_start) / ngl
    (5, None, 1, 3, ([None, None, None, 0, 0], 0)),  # i_gpu_start 3: blocks 3, 4 and the output layer
    (5, [1, 1], 2, 4, ([None, None, 0, 0, 1], 1)),  # positions 0, 1/4, 2/4, 3/4 against the bounds 0.5, 1.0
    (5, None, 1, 1, ([None] * 5, 0)),  # -ngl 1: the output layer alone
    (5, None, 1, 0, ([None] * 5, None)),  # -ngl 0: nothing offloaded
    (5, [1, 1], 2, 6, ([0, 0, 0, 1, 1], 1)), (5, [1, 1], 2, 99, ([0, 0, 0, 1, 1], 1)),  # every layer, as None
])
def test_layer_devices_with_fewer_gpu_layers_leave_the_first_blocks_on_the_host(blocks, split, n, layers, expected):
    assert mest.layer_devices(blocks, split, n, layers) == expected
    assert mest.host_layer_blocks(blocks, layers) == [b for b, d in enumerate(expected[0]) if d is None]
    assert mest.host_layer_blocks(blocks, None) == []


def test_blocks_left_on_the_host_keep_their_weights_kv_cache_and_recurrent_state_there():
    """Nemotron Nano -ngl 40 on one GPU: blocks 0-12 on the host (52 blocks + output = 53 layers), their weights,
    their KV cache (llama-kv-cache.cpp: a layer's cache on dev_layer(il)) and their recurrent state."""
    options = Options(4096, 2, n_gpu_layers=40)
    result = mest.estimate(NANO_FACTS, options)
    every = mest.estimate(NANO_FACTS, Options(4096, 2))
    host_blocks = list(range(13))
    assert result["devices_by_block"] == [None] * 13 + [0] * 39 and result["output_device"] == 0
    block_bytes = sum(t.nbytes for t in NANO_FACTS.tensors if t.block in host_blocks)
    assert result["host"]["model"] == every["host"]["model"] + block_bytes
    kv = kvc.kv_cache_bytes(NANO_FACTS, options)
    rs = kvc.recurrent_state_bytes(NANO_FACTS, 2)
    assert result["host"]["kv"] == sum(kv.get(b, 0) for b in host_blocks) > 0
    assert result["host"]["recurrent"] == sum(rs.get(b, 0) for b in host_blocks) > 0
    assert result["gpus"][0]["kv"] + result["host"]["kv"] == every["gpus"][0]["kv"]
    assert result["gpus"][0]["recurrent"] + result["host"]["recurrent"] == every["gpus"][0]["recurrent"]
    assert result["gpus"][0]["model"] < every["gpus"][0]["model"] - block_bytes * 0.99
    # the host computes its blocks; with op offload the GPU also computes their products from 32 tokens on
    assert result["host"]["compute"] > every["host"]["compute"]
    assert result["gpus"][0]["compute"] > mest.estimate(NANO_FACTS, Options(4096, 2, n_gpu_layers=40,
                                                                            op_offload=False))["gpus"][0]["compute"]


def test_weights_on_cuda_pad_quantized_rows_once_and_align_to_128():
    """ggml-cuda.cu get_alloc_size: a quantized tensor whose ne0 is not a multiple of MATRIX_ROW_PADDING (512) gets
    ggml_row_size(type, 512 - ne0 % 512) more bytes; the CUDA buffer type aligns every tensor to 128."""
    f = weights_model()
    # attn_q 11424 bytes: 2688 % 512 = 128, 384 elements (408 bytes) of padding -> 11832, aligned to 11904
    norm = 2688 * 4  # F32: no row padding, 10752 is a multiple of 128
    experts = 4352  # ne0 1024: no padding; 4352 = 34 * 128
    q_small = 2176  # 512 x 4 q8_0: a multiple of 512 elements, 2176 = 17 * 128
    gpu, host, detail = mest.weight_bytes(f)
    assert gpu == [11904 + norm + experts + q_small + 2856448]  # output 2856000 + 408 = 2856408, aligned to 2856448
    assert host == 2856000 and detail == {"devices_by_block": [0, 0], "output_device": 0, "host_expert_bytes": 0}
    cpu_gpu, cpu_host = mest.weight_bytes(f, backend="cpu")[:2]
    assert cpu_gpu == [11424 + norm + experts + q_small + 2856000] and cpu_host == 2856000  # 32-byte aligned already


def test_weights_go_to_the_host_to_their_device_and_to_the_output_s_and_a_cpu_host_keeps_all():
    f = weights_model()
    gpu, host, detail = mest.weight_bytes(f, ["blk.0.ffn_up_exps.weight"], [1, 1], 2, "cpu")
    assert detail == {"devices_by_block": [0, 0], "output_device": 1, "host_expert_bytes": 4352}
    assert gpu == [11424 + 10752 + 2176, 2856000] and host == 2856000 + 4352
    moved = mest.weight_bytes(f, (), [1, 1], 2, "cpu", {"blk.0.ffn_up_exps.weight": 1})[0]
    assert moved == [11424 + 10752 + 2176, 4352 + 2856000]
    tied = facts(tensors=f.tensors[:-1], expert_tensors_by_block=f.expert_tensors_by_block)
    assert mest.weight_bytes(tied, backend="cpu")[:2] == ([11424 + 10752 + 4352 + 2176 + 2856000], 2856000)
    assert mest.weight_bytes(tied)[0] == [11904 + 10752 + 4352 + 2176 + 2856448]  # the copy padded like output.weight
    f = weights_model()
    total = sum(t.nbytes for t in f.tensors)
    assert mest.weight_bytes(f, n_devices=0) == ([], total, {"devices_by_block": [], "output_device": None,
                                                             "host_expert_bytes": 4352})
    result = mest.estimate(NANO_FACTS, Options(4096, 2), n_devices=0)
    assert result["gpus"] == [] and result["output_device"] is None
    host = result["host"]
    assert host["kv"] == 6144 * 4096 and host["recurrent"] == 2 * 23 * 2170880
    assert host["compute"] == cbuf.cpu_compute_bytes(NANO_FACTS, Options(4096, 2))


@pytest.mark.parametrize("flash_attn, on", [("auto", True), ("off", False)])
def test_estimate_reads_flash_attention(flash_attn, on):
    f = attention_only(n_vocab=100)
    result = mest.estimate(f, Options(512, flash_attn=flash_attn, backend="cpu"))
    assert result["flash_attn"] is on
    assert result["gpus"][0]["kv"] == sum(kvc.kv_cache_bytes(f, Options(512, flash_attn=on)).values())


def test_a_quantized_v_cache_needs_flash_attention_and_the_training_context_warning_starts_past_it():
    f = facts(kv_blocks={0: (64, 64)}, kv_heads={0: 2})
    with pytest.raises(mfacts.MemoryModelError) as info:
        mest.estimate(f, Options(512, cache_type_v="q8_0", flash_attn="off"))
    assert str(info.value) == ("a quantized V cache (cache_type_v=q8_0) needs flash attention: set flash_attn to on "
                               "or auto, or use cache_type_v f16")
    for plain in ("f32", "f16", "bf16"):
        assert mest.estimate(f, Options(512, cache_type_v=plain, flash_attn="off"))["flash_attn"] is False
    assert mest.estimate(f, Options(512, cache_type_v="q8_0", flash_attn="on"))["flash_attn"] is True
    f = facts(context_length=4096)
    assert mest.estimate(f, Options(4096, backend="cpu"))["warnings"] == []
    assert mest.estimate(f, Options(4097, backend="cpu"))["warnings"] == [
        "ctx_size 4097 is beyond the model's training context (4096): quality may drop"]


@pytest.mark.parametrize("mmap, n_devices, backend, pinned", [
    (False, 1, "cuda", True), (True, 1, "cuda", False), (False, 1, "rpc", False), (False, 0, "cuda", False)])
def test_host_weights_are_pinned_only_without_mmap_beside_a_cuda_gpu(mmap, n_devices, backend, pinned):
    host = mest.estimate(NANO_FACTS, Options(4096, mmap=mmap, backend=backend), n_devices=n_devices)["host"]
    assert host["pinned"] is pinned and host["mmap"] is mmap
