"""The memory model: exact weights, KV cache, recurrent state and output buffer; the compute estimate."""
from __future__ import annotations

from collections import namedtuple

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _common as common
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _compute_buffers as cbuf
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _kv_cache as kvc
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _memory_estimate as mest
from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _model_facts as mfacts
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import Options
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._gguf import read_model
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import tensor_nbytes
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._tensor_classes import classify_model
from tools import gguf_models

T = namedtuple("T", "name shape type_id nbytes")
F32, F16, Q8_0 = 0, 1, 8
NANO = gguf_models.NANO_PATTERN


def tensor(name, shape, type_id=F32):
    return T(name, tuple(shape), type_id, tensor_nbytes(type_id, shape))


def synthetic_nemotron(pattern=NANO, n_embd=2688, drop=(), expert_type=Q8_0):
    """Metadata and tensor infos of a Nemotron-H MoE shaped like Nano (no file)."""
    hkv = [2 if c == "*" else 0 for c in pattern]
    ff = [1856 if c == "E" else 0 for c in pattern]
    md = {"general.architecture": "nemotron_h_moe", "nemotron_h_moe.block_count": len(pattern),
          "nemotron_h_moe.embedding_length": n_embd, "nemotron_h_moe.context_length": 1048576,
          "nemotron_h_moe.attention.head_count": 32, "nemotron_h_moe.attention.head_count_kv": hkv,
          "nemotron_h_moe.feed_forward_length": ff, "nemotron_h_moe.attention.key_length": 128,
          "nemotron_h_moe.attention.value_length": 128, "nemotron_h_moe.ssm.conv_kernel": 4,
          "nemotron_h_moe.ssm.inner_size": 4096, "nemotron_h_moe.ssm.state_size": 128,
          "nemotron_h_moe.ssm.group_count": 8, "nemotron_h_moe.ssm.time_step_rank": 64,
          "nemotron_h_moe.expert_count": 128, "nemotron_h_moe.expert_used_count": 6,
          "nemotron_h_moe.expert_feed_forward_length": 1856, "nemotron_h_moe.vocab_size": 131072}
    for key in drop:
        md.pop(key)
    ts = [tensor("token_embd.weight", (n_embd, 131072), Q8_0)]
    for i, c in enumerate(pattern):
        p = "blk.%d." % i
        ts.append(tensor(p + "attn_norm.weight", (n_embd,)))
        if c == "M":
            ts += [tensor(p + "ssm_in.weight", (n_embd, 2 * 4096 + 2 * 8 * 128 + 64), Q8_0),
                   tensor(p + "ssm_conv1d.weight", (4, 4096 + 2 * 8 * 128)),
                   tensor(p + "ssm_norm.weight", (4096 // 8, 8)), tensor(p + "ssm_out.weight", (4096, n_embd), Q8_0)]
        elif c == "*":
            ts += [tensor(p + "attn_q.weight", (n_embd, 4096), Q8_0), tensor(p + "attn_k.weight", (n_embd, 256), Q8_0),
                   tensor(p + "attn_v.weight", (n_embd, 256), Q8_0),
                   tensor(p + "attn_output.weight", (4096, n_embd), Q8_0)]
        else:
            ts += [tensor(p + "ffn_gate_inp.weight", (n_embd, 128)),
                   tensor(p + "ffn_up_exps.weight", (n_embd, 1856, 128), expert_type),
                   tensor(p + "ffn_down_exps.weight", (1856, n_embd, 128), expert_type),
                   tensor(p + "ffn_up_shexp.weight", (n_embd, 3712), Q8_0),
                   tensor(p + "ffn_down_shexp.weight", (3712, n_embd), Q8_0)]
    ts += [tensor("output_norm.weight", (n_embd,)), tensor("output.weight", (n_embd, 131072), Q8_0)]
    return md, ts


def facts_of(md, ts):
    layout = classify_model(md.get("general.architecture"), md, ts)
    return mfacts.model_facts(md, ts, layout)


@pytest.fixture(scope="module")
def nano():
    return facts_of(*synthetic_nemotron())


@pytest.mark.parametrize("name, n, expected", [
    ("f32", 256, 1024), ("f16", 256, 512), ("bf16", 256, 512), ("q8_0", 256, 272), ("q4_0", 256, 144),
    ("q4_1", 256, 160), ("iq4_nl", 256, 144), ("q5_0", 256, 176), ("q5_1", 256, 192)])
def test_row_bytes_of_every_cache_type(name, n, expected):
    assert kvc.row_bytes(name, n) == expected


def test_row_bytes_refuses_unknown_types_and_partial_blocks():
    with pytest.raises(mfacts.MemoryModelError, match="unknown cache type 'q6_k'"):
        kvc.row_bytes("q6_k", 256)
    with pytest.raises(mfacts.MemoryModelError, match="not a multiple of the 32-element blocks"):
        kvc.row_bytes("q8_0", 80)


def test_nano_kv_is_6144_bytes_per_token_on_six_layers(nano):
    assert sorted(nano.kv_blocks) == [5, 12, 19, 26, 33, 42]
    kv = kvc.kv_cache_bytes(nano, Options(32768, 2))
    assert sum(kv.values()) == 6144 * 32768
    assert common.mib(sum(kv.values())) == 192.00
    assert common.mib(sum(kvc.kv_cache_bytes(nano, Options(131072)).values())) == 768.00
    q8 = kvc.kv_cache_bytes(nano, Options(32768, cache_type_k="q8_0", cache_type_v="q8_0"))
    assert sum(q8.values()) == 6 * 2 * 272 * 32768


def test_nano_recurrent_state_per_sequence(nano):
    assert len(nano.recurrent_blocks) == 23
    one = kvc.recurrent_state_bytes(nano, 1)
    assert set(one.values()) == {2170880}  # ((4-1)*(4096+2*8*128) + 128*4096) * 4
    assert common.mib(sum(one.values())) == 47.62
    two = sum(kvc.recurrent_state_bytes(nano, 2).values())
    assert two == 2 * 23 * 2170880 and common.mib(two) == 95.23  # 95.234375 MiB (2 x 47.617)
    assert sum(kvc.recurrent_state_bytes(nano, 0).values()) == 23 * 2170880  # cells = max(1, parallel)


@pytest.mark.parametrize("ctx, parallel, unified, cells, streams", [
    (32768, 2, False, 16384, 2), (1000, 1, False, 1024, 1), (1000, 2, False, 512, 2), (3000, 3, False, 1024, 3),
    (3000, 3, True, 3072, 1)])
def test_context_padding_and_streams(ctx, parallel, unified, cells, streams):
    assert kvc.context_cells(ctx, parallel, unified)[1:] == (cells, streams)


def test_weights_token_embd_on_host_output_on_gpu(nano):
    experts = [n for names in nano.expert_tensors_by_block.values() for n in names]
    assert len(experts) == 46
    gpu, host, detail = mest.weight_bytes(nano, experts, backend="cpu")
    sizes = dict((t.name, t.nbytes) for t in nano.tensors)
    non_expert = sum(v for k, v in sizes.items() if k not in experts)
    assert gpu == [non_expert - sizes["token_embd.weight"]]
    assert host == sum(sizes[n] for n in experts) + sizes["token_embd.weight"]
    assert detail["output_device"] == 0
    none_gpu, none_host = mest.weight_bytes(nano, (), backend="cpu")[:2]
    assert none_host == sizes["token_embd.weight"] and none_gpu[0] == sum(sizes.values()) - none_host


def test_cuda_alignment_and_row_padding_add_little():
    md, ts = synthetic_nemotron()
    facts = facts_of(md, ts)
    cpu_gpu = mest.weight_bytes(facts, backend="cpu")[0][0]
    cuda_gpu = mest.weight_bytes(facts, backend="cuda")[0][0]
    # 2688 is not a multiple of 512: each q8_0 matrix gets (512 - 2688 % 512) elements of padding once
    assert 0 < cuda_gpu - cpu_gpu < 400 * (128 + 384 * 34 // 32)


def test_tied_embeddings_put_a_copy_on_the_gpu():
    md, ts = synthetic_nemotron("ME*")
    tied = [t for t in ts if t.name != "output.weight"]
    facts = facts_of(md, tied)
    gpu, host = mest.weight_bytes(facts, backend="cpu")[:2]
    embd = [t.nbytes for t in ts if t.name == "token_embd.weight"][0]
    assert host == embd
    assert gpu[0] == sum(t.nbytes for t in tied)  # everything, token_embd counted once more on the GPU


@pytest.mark.parametrize("blocks, split, devices, output", [
    (4, [1, 1], [0, 0, 0, 1], 1),
    (5, [1, 1], [0, 0, 0, 1, 1], 1),
    (4, [3, 1], [0, 0, 0, 0], 1),
    (52, None, [0] * 52, 0),
])
def test_layer_split_like_llama_cpp(blocks, split, devices, output):
    assert mest.layer_devices(blocks, split, len(split) if split else 1) == (devices, output)


def test_bad_split():
    with pytest.raises(mfacts.MemoryModelError, match="share"):
        mest.layer_devices(4, [1, 1, 1], 2)
    with pytest.raises(mfacts.MemoryModelError, match="no GPU"):
        mest.layer_devices(4, None, 0)


def test_split_puts_kv_and_state_on_the_layer_device(nano):
    result = mest.estimate(nano, Options(32768, 2, backend="cpu"), split=[1, 1], n_devices=2)
    devices = result["devices_by_block"]
    kv_total = sum(g["kv"] for g in result["gpus"])
    assert kv_total == 6144 * 32768
    assert result["gpus"][0]["kv"] == 2 * 512 * 32768 * sum(1 for b in (5, 12, 19, 26, 33, 42) if devices[b] == 0)
    assert sum(g["recurrent"] for g in result["gpus"]) == 2 * 23 * 2170880


def test_metadata_fallback_to_tensor_shapes_with_warnings():
    drop = ("nemotron_h_moe.attention.key_length", "nemotron_h_moe.attention.value_length",
            "nemotron_h_moe.ssm.conv_kernel", "nemotron_h_moe.ssm.inner_size", "nemotron_h_moe.ssm.state_size",
            "nemotron_h_moe.ssm.group_count", "nemotron_h_moe.embedding_length", "nemotron_h_moe.vocab_size")
    facts = facts_of(*synthetic_nemotron(drop=drop))
    full = facts_of(*synthetic_nemotron())
    assert facts.kv_blocks == full.kv_blocks
    assert facts.recurrent_blocks == full.recurrent_blocks
    assert (facts.n_embd, facts.n_vocab) == (2688, 131072)
    text = " ".join(facts.warnings)
    assert "attn_k/attn_v" in text and "ssm" in text and "embedding_length" in text and "vocabulary" in text


def test_missing_everything_is_a_clear_error():
    md, ts = synthetic_nemotron("M*", drop=("nemotron_h_moe.ssm.conv_kernel",))
    ts = [t for t in ts if "ssm_conv1d" not in t.name]
    with pytest.raises(mfacts.MemoryModelError, match="ssm_conv1d"):
        facts_of(md, ts)


def test_quantized_v_cache_needs_flash_attention(nano):
    with pytest.raises(mfacts.MemoryModelError, match="flash attention"):
        mest.estimate(nano, Options(4096, cache_type_v="q8_0", flash_attn="off"))
    assert mest.estimate(nano, Options(4096, cache_type_v="q8_0", flash_attn="on"))["flash_attn"] is True


@pytest.mark.parametrize("ctx, parallel", [(0, 1), (4096, 0), (-1, 1), (256, 512)])
def test_bad_context(nano, ctx, parallel):
    with pytest.raises(mfacts.MemoryModelError):
        mest.estimate(nano, Options(ctx, parallel))


def test_compute_grows_with_context_and_with_op_offload_copy(nano):
    small = cbuf.compute_buffer_bytes(nano, Options(4096))
    large = cbuf.compute_buffer_bytes(nano, Options(262144))
    # the KQ mask: cells x tokens x f16
    assert large - small == (262144 - 4096) * 512 * 2
    copy = nano.expert_bytes_by_block()[1]
    with_copy = cbuf.compute_buffer_bytes(nano, Options(4096), cpu_expert_bytes_max=copy)
    assert with_copy - small == copy
    assert cbuf.compute_buffer_bytes(nano, Options(4096, op_offload=False), cpu_expert_bytes_max=copy) == small
    assert cbuf.compute_buffer_bytes(nano, Options(4096, ubatch=16), cpu_expert_bytes_max=copy) < small


def test_training_context_warning(nano):
    assert mest.estimate(nano, Options(2 * 1048576))["warnings"]
    assert mest.estimate(nano, Options(4096))["warnings"] == []


@pytest.fixture(scope="module")
def nano_file(tmp_path_factory):
    return gguf_models.write_nemotron_nano_30b(tmp_path_factory.mktemp("nano"), shards=6)


def test_real_nano_header(nano_file):
    model = read_model(nano_file[0])
    layout = classify_model(model.architecture, model.metadata, model.tensors)
    facts = mfacts.model_facts(model.metadata, model.tensors, layout)
    assert facts.warnings == []
    assert facts.n_vocab == 131072  # from the skipped token array's count
    result = mest.estimate(facts, Options(32768, 2, backend="cpu"), cpu_tensors=layout.expert_tensors)
    gpu = result["gpus"][0]
    assert gpu["kv_mib"] == 192.00
    assert gpu["recurrent_mib"] == 95.23
    assert gpu["kv"] == 6144 * 32768 and gpu["recurrent"] == 2 * 23 * 2170880
    non_expert = sum(t.nbytes for t in model.tensors if t.name not in set(layout.expert_tensors))
    embd = [t.nbytes for t in model.tensors if t.name == "token_embd.weight"][0]
    assert gpu["model"] == non_expert - embd
    assert 1360 < gpu["model_mib"] < 1380  # llama-server b10435 on an RPC device: 1369.17 MiB (plan_accuracy.py)
    assert 21700 < common.mib(result["host"]["model"] - embd) < 21850  # routed experts: about 21,772 MiB
