"""The speed model (``_speed_model``): the bytes a placement reads per token and per prompt micro-batch, the rates it
divides them by, the figures, and the calibration against a measured speed. Every figure is derived here from the
small qwen3moe of exact sizes (tests/helpers/plans.py ``exact_moe``: F32 tensors, 4 bytes an element)."""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _speed_model as spm
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import Options
from tests.helpers.plans import SIZING

GB = 10 ** 9
F32 = 4
# exact_moe("DEEE"): per block attention q, k, v, o (64x64, 64x32, 64x32, 64x64); block 0 a dense FFN (64x128 up,
# 128x64 down); blocks 1-3 a router (64x8) and 8 experts of 64x64 (up, down); token_embd and output 64x512.
ATTENTION = (64 * 64 + 64 * 32 + 64 * 32 + 64 * 64) * F32  # 49152 per block
DENSE_FFN = (64 * 128 + 128 * 64) * F32  # 65536
ROUTER = 64 * 8 * F32  # 2048 per MoE block
EXPERTS = 2 * 64 * 64 * 8 * F32  # 262144 per MoE block (up and down)
EMBD = 64 * 512 * F32  # 131072: token_embd, and output.weight alike
OUTPUT = EMBD + 64 * F32  # output.weight and output_norm
SHARE = 2 / 8.0  # expert_used_count / expert_count
# Elements of the weight matrices (the FLOP of a token are 2 x these): attention 64x64 + 2 x 64x32 + 64x64 a block,
# the dense FFN 2 x 64x128, a router 64x8, 2/8 of a block's 2 x 64x64x8 experts, the output 64x512.
ATTENTION_ELEMENTS = 4096 + 2 * 2048 + 4096  # 12288
DENSE_FFN_ELEMENTS = 2 * 8192  # 16384
ROUTER_ELEMENTS = 512
ACTIVE_EXPERT_ELEMENTS = 2 * 64 * 64 * 8 // 4  # 16384 of 65536
OUTPUT_ELEMENTS = 64 * 512  # 32768
KV_CELL = (32 + 32) * 2  # K and V rows of 2 KV heads x 16, f16: bytes per cell of one block
DENSE_GPU = OUTPUT + 4 * ATTENTION + DENSE_FFN + 3 * ROUTER  # what the GPU reads whole


def all_experts(facts):
    """The expert tensors of blocks 1-3."""
    return [n for b in (1, 2, 3) for n in facts.expert_tensors_by_block[b]]


def test_decode_reads_dense_weights_whole_a_share_of_each_expert_the_cache_and_one_embedding_row(moe):
    """Block 1's experts in host memory, one slot of 4096 cells: per token the GPU reads its dense tensors, 2/8 of
    blocks 2 and 3's experts and the KV cache of 4 blocks; the host 2/8 of block 1's experts (the one token_embd row
    a token looks up is not counted); 4 + 2 x 1 splits."""
    terms = spm.speed_terms(moe, Options(4096, **SIZING), moe.expert_tensors_by_block[1])
    assert terms.decode_gpu_bytes == (DENSE_GPU + 2 * EXPERTS * SHARE + 4 * KV_CELL * 4096,)
    assert terms.decode_host_bytes == EXPERTS * SHARE
    assert terms.decode_splits == 6 and terms.context_tokens == 4096
    # a context of 1000 tokens reads 1000 cells of each block's cache
    shorter = spm.speed_terms(moe, Options(4096, **SIZING), moe.expert_tensors_by_block[1], context_tokens=1000)
    assert shorter.decode_gpu_bytes[0] == DENSE_GPU + 2 * EXPERTS * SHARE + 4 * KV_CELL * 1000


def test_a_prompt_micro_batch_copies_host_experts_over_pcie_with_op_offload_and_the_cpu_reads_them_without(moe):
    """512 tokens a micro-batch: each block's experts are hit with 1 - (6/8)^512 (all but nothing); with op offload
    (CUDA, 512 >= 32) block 1's experts cross PCIe whole and GPU 0 reads them, 4 + 3 x 1 splits; without, the CPU
    reads them, 4 + 2 x 1 splits. The cache is read for the micro-batch's 512 cells."""
    hit = 1 - 0.75 ** 512
    assert spm.experts_hit(SHARE, 2) == 1 - 0.75 ** 2 == 7 / 16.0
    cached = 4 * KV_CELL * 512
    without = spm.speed_terms(moe, Options(4096, **SIZING), moe.expert_tensors_by_block[1])
    assert without.ubatch_tokens == 512 and without.prompt_pcie_bytes == 0 and without.prompt_splits == 6
    assert without.prompt_gpu_bytes == (round(DENSE_GPU + 2 * EXPERTS * hit + cached),)
    assert without.prompt_host_bytes == round(EXPERTS * hit)
    offload = spm.speed_terms(moe, Options(4096, backend="cuda", op_offload=True, margin_mib=0),
                              moe.expert_tensors_by_block[1])
    assert offload.prompt_pcie_bytes == EXPERTS and offload.prompt_splits == 7
    assert offload.prompt_gpu_bytes == (round(DENSE_GPU + 2 * EXPERTS * hit + cached + EXPERTS),)
    assert offload.prompt_host_bytes == 0
    # a prompt of 16 tokens is below GGML_OP_OFFLOAD_MIN_BATCH: the CPU computes block 1's experts
    short = spm.speed_terms(moe, Options(4096, backend="cuda", op_offload=True, margin_mib=0),
                            moe.expert_tensors_by_block[1], prompt_tokens=16)
    assert short.ubatch_tokens == 16 and short.prompt_pcie_bytes == 0 and short.prompt_splits == 6


def test_splits_of_a_layer_split_and_of_experts_on_another_gpu_and_none_on_a_cpu_host(moe):
    """--tensor-split 1,1 over 4 blocks and the output: blocks 0-2 on GPU 0, block 3 and the output on GPU 1 (one
    boundary). Block 2's experts on GPU 1: a device change there and back, 4 + 2 + 1 splits, and GPU 1 reads 2/8 of
    them. A CPU host reads everything from host memory in one split."""
    moved = dict((n, 1) for n in moe.expert_tensors_by_block[2])
    terms = spm.speed_terms(moe, Options(4096, **SIZING), (), [1, 1], 2, moved)
    assert terms.decode_splits == 7
    assert terms.decode_gpu_bytes == (3 * ATTENTION + DENSE_FFN + 2 * ROUTER + EXPERTS * SHARE + 3 * KV_CELL * 4096,
                                      OUTPUT + ATTENTION + ROUTER + 2 * EXPERTS * SHARE + KV_CELL * 4096)
    cpu = spm.speed_terms(moe, Options(4096, **SIZING), (), None, 0)
    assert cpu.decode_gpu_bytes == () and cpu.decode_splits == 0
    assert cpu.decode_host_bytes == DENSE_GPU + 3 * EXPERTS * SHARE + 4 * KV_CELL * 4096


def test_blocks_that_ngl_leaves_on_the_host_are_read_there_whole_with_their_cache(moe):
    """-ngl 3 of 5 layers: blocks 0 and 1 on the host (block 0 dense, block 1 with experts). Per token the host reads
    their attention, block 0's FFN, block 1's router and 2/8 of its experts, and their KV cache; they add no split
    (they run on the CPU beside the input layer). A prompt micro-batch with op offload copies their weights over
    PCIe to GPU 0, 3 splits a block (as host experts); without op offload the CPU reads them."""
    options = Options(4096, n_gpu_layers=3, **SIZING)
    terms = spm.speed_terms(moe, options)
    host = 2 * ATTENTION + DENSE_FFN + ROUTER
    assert terms.decode_host_bytes == host + EXPERTS * SHARE + 2 * KV_CELL * 4096
    assert terms.decode_gpu_bytes == (OUTPUT + 2 * ATTENTION + 2 * ROUTER + 2 * EXPERTS * SHARE + 2 * KV_CELL * 4096,)
    assert terms.decode_splits == 4 and terms.prompt_splits == 4 and terms.prompt_pcie_bytes == 0
    assert terms.prompt_host_bytes == round(host + EXPERTS * (1 - 0.75 ** 512) + 2 * KV_CELL * 512)
    offload = spm.speed_terms(moe, Options(4096, n_gpu_layers=3, backend="cuda", op_offload=True, margin_mib=0))
    assert offload.prompt_pcie_bytes == host + EXPERTS and offload.prompt_splits == 4 + 3 * 2
    assert offload.prompt_host_bytes == 2 * KV_CELL * 512 and offload.decode_splits == 4


def test_gpu_bandwidth_from_the_datasheet_table_a_given_figure_or_an_assumption():
    assert spm.gpu_bandwidth("NVIDIA H200") == (4800 * GB, "datasheet peak of NVIDIA H200")
    assert spm.gpu_bandwidth("NVIDIA H200 NVL") == (4800 * GB, "datasheet peak of NVIDIA H200 NVL")  # its own entry
    assert spm.gpu_bandwidth("NVIDIA RTX A5500", {"NVIDIA RTX A5500": 700 * GB}) == (700 * GB, "given")
    assert spm.gpu_bandwidth("GPU0") == (500 * GB, "assumed: GPU0 is not in the table")
    with pytest.raises(spm.SpeedModelError, match="must be a number > 0"):
        spm.gpu_bandwidth("GPU0", {"GPU0": 0})


def test_the_host_figure_is_given_then_calibrated_then_measured_then_assumed():
    calibration = {"host_bytes_per_second": 30 * GB, "measured": {"decode_tokens_per_second": 20.0}}
    assumed = spm.bandwidths(["NVIDIA H200"], Options(4096))
    assert (assumed.host, assumed.sources["host"], assumed.calibrated) == (40 * GB, "assumed", False)
    assert (assumed.pcie, assumed.split_seconds) == (25 * GB, 100e-6)
    measured = spm.bandwidths([], Options(4096), 12 * GB)
    assert (measured.host, measured.sources["host"]) == (12 * GB, "measured by host_info")
    calibrated = spm.bandwidths([], Options(4096, calibration=calibration), 12 * GB)
    assert (calibrated.host, calibrated.split_seconds, calibrated.calibrated) == (30 * GB, 100e-6, True)
    given = spm.bandwidths([], Options(4096, calibration=calibration, host_bytes_per_second=50 * GB), 12 * GB)
    assert (given.host, given.calibrated) == (50 * GB, False)
    split = spm.bandwidths([], Options(4096, calibration={"split_seconds": 2e-4}))
    assert (split.split_seconds, split.sources["split"], split.calibrated) == (2e-4, "calibrated", True)
    for wrong, message in (({"host": 1}, "unknown key"), ({}, "gives none of"), ({"split_seconds": -1}, ">= 0"),
                           ({"token_seconds": -1}, ">= 0"), ({"host_flops_per_second": 0}, "> 0")):
        with pytest.raises(spm.SpeedModelError, match=message):
            spm.bandwidths([], Options(4096, calibration=wrong))


def test_a_prompt_micro_batch_computes_2_flop_a_weight_element_a_token_on_the_device_that_holds_it(moe):
    """512 tokens a micro-batch: each weight matrix 2 x elements x 512 FLOP (experts 2/8 of theirs), the output
    matrix for one token (the last's logits), token_embd none (get_rows). CPU host: all of it on the host. Block 1's
    experts in host memory: the host computes them without op offload, GPU 0 with it (they are copied there)."""
    expert = spm.matmul_flops(next(t for t in moe.tensors if t.name == "blk.1.ffn_up_exps.weight"), 512, SHARE)
    assert expert == 2 * (64 * 64 * 8) * SHARE * 512 == 8388608
    assert spm.matmul_flops(next(t for t in moe.tensors if t.name == "output.weight"), 512, SHARE) == 2 * 32768
    assert spm.matmul_flops(next(t for t in moe.tensors if t.name == "token_embd.weight"), 512, SHARE) == 0
    per_token = 4 * ATTENTION_ELEMENTS + DENSE_FFN_ELEMENTS + 3 * ROUTER_ELEMENTS + 3 * ACTIVE_EXPERT_ELEMENTS
    assert per_token == 49152 + 16384 + 1536 + 49152 == 116224
    everything = 2 * 512 * per_token + 2 * OUTPUT_ELEMENTS  # 119013376 + 65536
    cpu = spm.speed_terms(moe, Options(4096, **SIZING), (), None, 0)
    assert (cpu.prompt_gpu_flops, cpu.prompt_host_flops) == ((), everything) and everything == 119078912
    host_block = 2 * 512 * ACTIVE_EXPERT_ELEMENTS  # 16777216
    without = spm.speed_terms(moe, Options(4096, **SIZING), moe.expert_tensors_by_block[1])
    assert (without.prompt_gpu_flops, without.prompt_host_flops) == ((everything - host_block,), host_block)
    offload = spm.speed_terms(moe, Options(4096, backend="cuda", op_offload=True, margin_mib=0),
                              moe.expert_tensors_by_block[1])
    assert (offload.prompt_gpu_flops, offload.prompt_host_flops) == ((everything,), 0)
    # a prompt of 16 tokens: 16 tokens of work, the CPU computing block 1's experts (below the op offload batch)
    short = spm.speed_terms(moe, Options(4096, backend="cuda", op_offload=True, margin_mib=0),
                            moe.expert_tensors_by_block[1], prompt_tokens=16)
    assert short.prompt_host_flops == 2 * 16 * ACTIVE_EXPERT_ELEMENTS == 524288


def test_compute_rates_from_the_datasheet_table_a_given_figure_or_an_assumption_and_the_host_s_sources():
    assert spm.gpu_flops("NVIDIA H200") == (989.4e12, "datasheet peak of NVIDIA H200")
    assert spm.gpu_flops("NVIDIA H200 NVL") == (50e12, "assumed: NVIDIA H200 NVL is not in the table")  # not the SXM's
    assert spm.gpu_flops("GPU0") == (50e12, "assumed: GPU0 is not in the table")
    assert set(spm.GPU_PEAK_FLOPS) <= set(spm.GPU_PEAK_BANDWIDTH)
    with pytest.raises(spm.SpeedModelError, match=r"gpu_flops_per_second\['GPU0'\] must be a number > 0"):
        spm.gpu_flops("GPU0", {"GPU0": -1})
    assumed = spm.bandwidths(["NVIDIA H200"], Options(4096))
    assert (assumed.gpu_flops, assumed.host_flops, assumed.sources["host_flops"]) == ((989.4e12,), 100e9, "assumed")
    assert (assumed.token_seconds, assumed.sources["token"], assumed.prompt_calibrated) == (0.0, "assumed", False)
    calibrated = spm.bandwidths([], Options(4096, calibration={"host_flops_per_second": 60e9, "token_seconds": 1e-3}))
    assert (calibrated.host_flops, calibrated.prompt_calibrated, calibrated.token_seconds) == (60e9, True, 1e-3)
    assert calibrated.calibrated is True  # the overhead is a decode figure
    given = spm.bandwidths(["G"], Options(4096, calibration={"host_flops_per_second": 60e9}, host_flops_per_second=80e9,
                                          gpu_flops_per_second={"G": 20e12}))
    assert (given.host_flops, given.sources["host_flops"], given.prompt_calibrated, given.gpu_flops) == (
        80e9, "given", False, (20e12,))


def test_predict_divides_bytes_by_bandwidths_flop_by_compute_rates_and_adds_the_splits_and_the_overhead(moe):
    """H200 (4800 GB/s, 989.4 TFLOP/s), a host of 50 GB/s and 100 GFLOP/s (assumed), 100 us a split, 0 overhead:
    the seconds per token and per micro-batch, by hand; then with a calibrated overhead of 1 ms."""
    terms = spm.speed_terms(moe, Options(4096, **SIZING), moe.expert_tensors_by_block[1])
    rates = spm.bandwidths(["NVIDIA H200"], Options(4096, host_bytes_per_second=50 * GB))
    decode = (DENSE_GPU + 2 * EXPERTS * SHARE + 4 * KV_CELL * 4096) / 4800e9 + EXPERTS * SHARE / 50e9 + 6 * 100e-6
    prompt = (terms.prompt_gpu_bytes[0] / 4800e9 + terms.prompt_host_bytes / 50e9 + 6 * 100e-6
              + 102301696 / 989.4e12 + 16777216 / 100e9)  # the FLOP of the test above: 119078912 - 16777216 on GPU 0
    speed = spm.predict(terms, rates)
    assert speed["decode_tokens_per_second"] == round(1 / decode, 2)
    assert speed["prompt_tokens_per_second"] == round(512 / prompt, 1)
    assert speed["calibrated"] is False and speed["prompt_calibrated"] is False
    assert "GPU 0 0.00 GB at 4800 GB/s (datasheet peak of NVIDIA H200)" in speed["from"]
    assert "6 graph splits at 100 us (assumed), 0 us overhead a graph evaluation (assumed)" in speed["from"]
    assert "computing GPU 0 0.102 GFLOP at 989.4 TFLOP/s (datasheet peak of NVIDIA H200), host 0.0168 GFLOP at " \
        "100 GFLOP/s (assumed)" in speed["from"]
    slow = spm.predict(terms, spm.bandwidths(["NVIDIA H200"], Options(4096, host_bytes_per_second=50 * GB,
                                                                      calibration={"token_seconds": 1e-3})))
    assert slow["decode_tokens_per_second"] == round(1 / (decode + 1e-3), 2)
    assert slow["prompt_tokens_per_second"] == round(512 / (prompt + 1e-3), 1)


def _speed(terms, host=30e9, split=250e-6, token=0.0, flops=None):
    """The decode tokens/s (and with ``flops``, ``(decode, prompt)``) the model gives ``terms`` on an H200 and a
    host of ``host`` bytes/s and ``flops`` FLOP/s."""
    decode = 1 / (sum(b / 4800e9 for b in terms.decode_gpu_bytes) + terms.decode_host_bytes / host
                  + terms.decode_splits * split + token)
    if flops is None:
        return decode
    micro_batch = (sum(b / 4800e9 for b in terms.prompt_gpu_bytes) + terms.prompt_host_bytes / host
                   + terms.prompt_splits * split + token + sum(f / 989.4e12 for f in terms.prompt_gpu_flops)
                   + terms.prompt_host_flops / flops)
    return decode, terms.ubatch_tokens / micro_batch


def test_calibrate_solves_the_host_bandwidth_and_from_two_placements_that_differ_in_splits_the_split_cost(moe):
    """Speeds made from a host of 30 GB/s and 250 us a split: one measurement with the split cost held gives the
    host back; two placements (block 1, blocks 1-3 in host memory: host bytes B and 3B, splits 6 and 10, not in
    proportion) give both, the 2 x 2 system ``1/d - G = B x + S s`` solved exactly."""
    rates = spm.bandwidths(["NVIDIA H200"], Options(4096, calibration={"split_seconds": 250e-6}))
    one = spm.speed_terms(moe, Options(4096, **SIZING), moe.expert_tensors_by_block[1])
    three = spm.speed_terms(moe, Options(4096, **SIZING), all_experts(moe))
    assert three.decode_splits == 4 + 2 * 3 and three.decode_host_bytes == 3 * EXPERTS * SHARE
    solved = spm.calibrate([(one, _speed(one))], rates)
    assert solved["split_seconds"] is None and solved["host_bytes_per_second"] == pytest.approx(30e9, rel=1e-9)
    assert solved["token_seconds"] is None and solved["host_flops_per_second"] is None  # no prompt figure given
    assumed = spm.bandwidths(["NVIDIA H200"], Options(4096))
    both = spm.calibrate([(one, _speed(one)), (three, _speed(three))], assumed)
    assert both["host_bytes_per_second"] == pytest.approx(30e9, rel=1e-6)
    assert both["split_seconds"] == pytest.approx(250e-6, rel=1e-6) and both["token_seconds"] is None
    # nothing in host memory: the measurement gives the split cost
    gpu_only = spm.speed_terms(moe, Options(4096, **SIZING))
    alone = spm.calibrate([(gpu_only, 1 / (gpu_only.decode_gpu_bytes[0] / 4800e9 + 4 * 250e-6))], assumed)
    assert alone["host_bytes_per_second"] is None and alone["split_seconds"] == pytest.approx(250e-6, rel=1e-9)
    with pytest.raises(spm.SpeedModelError, match="give no positive host_bytes_per_second"):
        spm.calibrate([(one, 1e6)], rates)
    # the same placement twice: host bytes (B, B) and splits (6, 6) in proportion, a degenerate 2 x 2 system
    with pytest.raises(spm.SpeedModelError, match="degenerate.*host_bytes_per_second from split_seconds"):
        spm.calibrate([(one, _speed(one)), (one, _speed(one) * 1.01)], assumed)


def test_three_placements_give_the_overhead_too_and_a_prompt_figure_the_host_s_compute_rate(moe):
    """Speeds made from 30 GB/s, 250 us a split, 2 ms a graph evaluation and 50 GFLOP/s. With one GPU, host bytes
    N x B and splits 4 + 2 x N move together (with the overhead's column of ones, dependent): a CPU-only placement
    (all bytes, no split) makes the three columns independent. One CPU-only measurement with its prompt figure:
    the bandwidth from decode, then ``F / (512 / p - host bytes / bandwidth)`` the compute rate."""
    assumed = spm.bandwidths(["NVIDIA H200"], Options(4096))
    one = spm.speed_terms(moe, Options(4096, **SIZING), moe.expert_tensors_by_block[1])
    three = spm.speed_terms(moe, Options(4096, **SIZING), all_experts(moe))
    cpu = spm.speed_terms(moe, Options(4096, **SIZING), (), None, 0)
    made = dict(host=30e9, split=250e-6, token=2e-3, flops=50e9)
    rows = [(t,) + _speed(t, **made) for t in (one, three, cpu)]
    solved = spm.calibrate(rows, assumed)
    assert solved["host_bytes_per_second"] == pytest.approx(30e9, rel=1e-6)
    assert solved["split_seconds"] == pytest.approx(250e-6, rel=1e-6)
    assert solved["token_seconds"] == pytest.approx(2e-3, rel=1e-6)
    assert solved["host_flops_per_second"] == pytest.approx(50e9, rel=1e-6)
    # one CPU-only measurement, no overhead: decode 1/d = host bytes / 30e9; prompt 512/p = prompt host bytes / 30e9
    # + 119078912 FLOP / 50e9
    decode, prompt = _speed(cpu, host=30e9, flops=50e9)
    assert prompt == pytest.approx(512 / (cpu.prompt_host_bytes / 30e9 + 119078912 / 50e9))
    solved = spm.calibrate([(cpu, decode, prompt)], assumed)
    assert solved["host_bytes_per_second"] == pytest.approx(30e9, rel=1e-9)
    assert solved["host_flops_per_second"] == pytest.approx(50e9, rel=1e-9)
    # a prompt faster than memory alone allows leaves no time for compute: the rate is not solved
    assert spm.calibrate([(cpu, decode, 1e9)], assumed)["host_flops_per_second"] is None
