"""Analytic speeds against published measurements (scheduler/cost/roofline.py).

Relative speeds are what the planner's splits depend on, so they are checked
against published ratios on the workload they were measured on: a
2.7B-parameter GPT (GPT-Neo-2.7B's shape) at the micro-batches people train it
with, through the same analytic profile ``hetsched plan --cluster`` uses.

Published ratios (and where they come from):
- T4 : L4 ≈ 1.0: per-layer GPT-2.7B timings quoted by issue 12 from the
  heterogeneous-training literature (the L4's fp16 peak is about the V100's; its
  300 GB/s and 72 W cap are not). Issue 12's V100 : L4 ≈ 2.7 was the one figure the
  L4's share was fitted to; the model no longer fits anything to an issue's quote
  (issue 20). Since the L4 runs at its own measured GEMM rate (53.8 TFLOP/s at 8192²,
  zzc0721/torch-performance-test-data issue #120; it was 27.5, the RTX 4090's TFLOP/s per
  watt times 72 W) the model gives T4 : L4 ≈ 0.5 here and V100 : L4 ≈ 1.9, a strict xfail.
  The held-out profiles say the same two things: Cephalo's/Zorse's GPT-2.7B block (eager
  attention, sequence 512) runs about as fast on the two cards (T4 : L4 1.06, where the
  model now gives 0.65), while their Llama layers, compute-bound under flash attention,
  run on the L4 at 1.5-2x the old rate and within -20 to +11 % of the new one
  (tests/benchmarks/test_speed_fidelity.py). What slows the L4 on the eager GPT blocks is
  not modelled.
- A100 : V100 between 1.95 and 2.5 for language-model training with fp16 tensor
  cores: Lambda, "NVIDIA A100 GPU Benchmarks for Deep Learning" (2020), an
  estimate from NVIDIA's published numbers rather than its own measurement.
- The T4 sustains about 24 TFLOP/s in a long fp16 cuBLAS GEMM, held there by its
  70 W cap: NVIDIA developer forums, "About GPU peak performance" (2023).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.cost.precision import rates_at
from scheduler.cost.profile import analytic_profile
from scheduler.cost.roofline import (
    ADAMW_BYTES_PER_PARAM,
    POWER_CAPPED_W,
    TFLOPS_PER_W,
    Rates,
    block_time,
    dvfs_capped_tflops,
    optimizer_step_s,
    sustained_gemm_tflops,
)
from scheduler.hardware.catalogue import CATALOGUE, lookup
from scheduler.hardware.cluster import parse_cluster
from scheduler.models.presets import ModelPreset, get_preset

GPT_2_7B = ModelPreset(
    name="gpt-neo-2.7b",
    family="gpt",
    num_layers=32,
    d_model=2560,
    num_heads=20,
    d_ff=4 * 2560,
    vocab_size=50257,
    seq_len=2048,
)
TYPES = ("V100-32GB", "L4-24GB", "T4-16GB", "A100-80GB")
TOLERANCE = 0.2
"""Relative error allowed against a published point ratio (and outside a published
range). Nothing here is fitted to these ratios: the rates come from the catalogue's
figures and measurements (:mod:`scheduler.cost.roofline`)."""


def sample_rates(micro_batch: int) -> dict[str, float]:
    """Samples per second of each GPU type on GPT-2.7B at ``micro_batch``."""
    cluster = parse_cluster(
        {"name": "four", "nodes": [{"name": "n", "devices": [{"type": t} for t in TYPES]}]}
    )
    profile = analytic_profile(cluster, GPT_2_7B, precision="auto")  # published: 16-bit runs
    return {
        d.type: micro_batch / (d.fixed_s + micro_batch * d.per_sample_s) for d in profile.devices
    }


@pytest.mark.parametrize("micro_batch", [1, 2, 4])
def test_relative_speeds_of_four_gpu_types_match_published_measurements(
    micro_batch: int,
) -> None:
    rate = sample_rates(micro_batch)
    assert 1.95 * (1 - TOLERANCE) <= rate["A100-80GB"] / rate["V100-32GB"] <= 2.5 * (1 + TOLERANCE)


@pytest.mark.xfail(
    strict=True,
    reason="the L4 at its own measured GEMM rate (53.8 TFLOP/s, 2.2x the T4's 24) runs "
    "GPT-2.7B about twice the T4's rate in the model; the quoted ratio is about 1 (module "
    "docstring)",
)
@pytest.mark.parametrize("micro_batch", [1, 2, 4])
def test_the_t4_and_the_l4_run_gpt_2_7b_about_as_fast(micro_batch: int) -> None:
    rate = sample_rates(micro_batch)
    assert rate["T4-16GB"] / rate["L4-24GB"] == pytest.approx(1.0, rel=TOLERANCE)


def test_peak_flops_alone_would_miss_the_l4() -> None:
    # What analytic profiles did before: every card at one share of its datasheet peak.
    peaks = {t: lookup(t).peak_tflops for t in TYPES}
    assert peaks["V100-32GB"] / peaks["L4-24GB"] == pytest.approx(1.0, abs=0.05)


def test_the_t4_sustains_its_measured_gemm_rate() -> None:
    assert Rates.of(lookup("T4-16GB")).flops_per_s / 1e12 == pytest.approx(24, rel=0.05)


def test_every_catalogue_entry_sustains_at_most_its_peak_and_bandwidth() -> None:
    for key, gpu in CATALOGUE.items():
        rates = Rates.of(gpu)
        # GeForce cards boost above the clock their peak is quoted at: the RTX 4090 by 4 %
        # (Mu Li's 172 of 165.2), the RTX 5090 by 7 % (zzc0721/torch-performance-test-data's
        # median 224.2 of 209.5 at 8192²)
        margin = 1.10 if gpu.segment == "geforce" else 1.05
        assert 0 < rates.flops_per_s / 1e12 <= margin * gpu.peak_tflops, key
        assert 0 < rates.bytes_per_s / 1e9 <= gpu.bandwidth_gbps, key


def test_geforce_cards_sustain_only_their_half_rate_fp32_accumulate_peak() -> None:
    # Training accumulates in fp32: a GeForce card gets half its fp16-accumulate rate,
    # so an RTX 3090 is no faster than a datacenter card of half its fp16 peak.
    for key in ("RTX3090-24GB", "RTX4090-24GB", "RTX5090-32GB"):
        gpu = lookup(key)
        assert gpu.fp16_accumulate_tflops is not None
        assert sustained_gemm_tflops(gpu) <= 0.55 * gpu.fp16_accumulate_tflops, key


def test_70_watt_cards_throttle_far_below_their_peak() -> None:
    # Their power cap binds, not their clock: at most TDP x the TFLOP/s per watt their
    # architecture sustains on a card at its cap (the T4 and L4 measured themselves).
    for key in ("L4-24GB", "T4-16GB", "A2-16GB", "A16-16GB"):
        gpu = lookup(key)
        assert gpu.tdp_w <= POWER_CAPPED_W
        assert sustained_gemm_tflops(gpu) <= gpu.tdp_w * TFLOPS_PER_W[gpu.architecture], key
    for key in ("L4-24GB", "T4-16GB"):
        gpu = lookup(key)
        assert sustained_gemm_tflops(gpu) < 0.6 * gpu.peak_tflops, key  # uncapped: 0.75
    # the A2 and A16 (GA107, clocked for 60 W) do not: a 70 W RTX A2000 sustains 0.89 of
    # its peak, more than their segment's share
    for key in ("A2-16GB", "A16-16GB"):
        gpu = lookup(key)
        assert sustained_gemm_tflops(gpu) == pytest.approx(0.75 * gpu.peak_tflops), key
    # the L4 has the V100's fp16 peak and, measured, 57 % of its sustained rate
    assert sustained_gemm_tflops(lookup("L4-24GB")) < 0.6 * sustained_gemm_tflops(
        lookup("V100-32GB")
    )
    # a datacenter card above the cap without a capped card of its architecture keeps its
    # segment's share
    a30 = lookup("A30-24GB")
    assert sustained_gemm_tflops(a30) == pytest.approx(0.75 * a30.peak_tflops)


def test_a_150_watt_a10_sustains_what_dynamic_power_leaves_of_a_300_watt_a6000() -> None:
    # Same GA102 chip: the A6000 sustains 95 TFLOP/s at 300 W (measured). At half the power
    # and 0.81x its peak the A10 gets 95 x 0.81^(2/3) x 0.5^(1/3), about 65, not the 94 its
    # segment's share of peak would give, nor the 47.5 a linear per-watt bound would.
    a10, a6000 = lookup("A10-24GB"), lookup("A6000-48GB")
    assert dvfs_capped_tflops(a10) == pytest.approx(
        95 * (a10.peak_tflops / a6000.peak_tflops) ** (2 / 3) * 0.5 ** (1 / 3)
    )
    assert sustained_gemm_tflops(a10) == pytest.approx(65.4, abs=0.5)
    assert a10.tdp_w * TFLOPS_PER_W["ampere-ga10x"] < sustained_gemm_tflops(a10)
    assert sustained_gemm_tflops(a10) < 0.75 * a10.peak_tflops
    # the reference itself, GeForce cards and the 70 W cards keep their own rules
    assert dvfs_capped_tflops(a6000) == pytest.approx(95)
    assert dvfs_capped_tflops(lookup("RTX3090-24GB")) is None
    assert dvfs_capped_tflops(lookup("A2-16GB")) is None
    # a spec's peak override scales the capped rate too
    assert sustained_gemm_tflops(a10, peak_tflops=62.5) == pytest.approx(
        sustained_gemm_tflops(a10) / 2
    )


def test_a_spec_peak_override_scales_the_sustained_rate() -> None:
    a100 = lookup("A100-80GB")
    assert sustained_gemm_tflops(a100, peak_tflops=156) == pytest.approx(
        sustained_gemm_tflops(a100) / 2
    )


def test_a_kernel_runs_at_the_slower_of_compute_and_memory() -> None:
    rates = Rates(flops_per_s=100e12, bytes_per_s=1e12)
    assert rates.time_s(flops=100e12, num_bytes=0.5e12) == 1.0  # compute-bound
    assert rates.time_s(flops=10e12, num_bytes=2e12) == 2.0  # memory-bound


def test_small_models_lean_on_bandwidth_large_ones_on_flops() -> None:
    # The share of a block's time in memory-bound kernels shrinks as d_model grows
    # (their bytes grow with h, the products' FLOPs with h²): Ivanov et al. (2021).
    rates = Rates.of(lookup("V100-32GB"))

    def memory_share(d_model: int) -> float:
        m = ModelPreset(
            name="m",
            family="gpt",
            num_layers=1,
            d_model=d_model,
            num_heads=d_model // 64,
            d_ff=4 * d_model,
            vocab_size=256,
            seq_len=1024,
        )
        compute_s = m.block_flops_per_sample / rates.flops_per_s
        return 1 - compute_s / block_time(m, rates).per_sample_s

    assert memory_share(256) > memory_share(1024) > memory_share(4096) > 0


def test_recomputation_costs_time_as_the_analytic_ratios_say() -> None:
    rates = Rates.of(lookup("A100-80GB"))
    plain, selective, full = (block_time(GPT_2_7B, rates, r) for r in ("none", "selective", "full"))
    assert full.per_sample_s == pytest.approx(plain.per_sample_s * 4 / 3)
    assert plain.per_sample_s < selective.per_sample_s < 1.05 * plain.per_sample_s
    assert full.fixed_s > plain.fixed_s  # the weights are read once more


def test_the_adamw_step_streams_every_state_once_at_the_sustained_bandwidth() -> None:
    # 1.3B parameters: 36 GB streamed, about 23 ms on an A100 and twice that on a V100,
    # whatever the micro-batch (the step is paid once per training step).
    a100, v100 = Rates.of(lookup("A100-80GB")), Rates.of(lookup("V100-32GB"))
    params = 1_300_000_000
    assert optimizer_step_s(params, a100) == pytest.approx(ADAMW_BYTES_PER_PARAM * params / 1616e9)
    assert optimizer_step_s(params, v100) / optimizer_step_s(params, a100) == pytest.approx(
        1616 / 784
    )


def test_a100_pcie_parts_sustain_less_than_the_sxm_part() -> None:
    # Same chip and peak; a 300 W (80 GB) or 250 W (40 GB) board and less bandwidth: slower
    # in matrix products (Bekman's measured PCIe/SXM ratio) and in streaming kernels.
    sxm = Rates.of(lookup("A100-80GB"))
    for key in ("A100PCIE-80GB", "A100PCIE-40GB"):
        pcie = Rates.of(lookup(key))
        assert pcie.flops_per_s < sxm.flops_per_s, key
        assert pcie.bytes_per_s < sxm.bytes_per_s, key


@pytest.mark.parametrize(
    ("key", "mamf"),
    [
        ("MI300X-192GB", 668.4),
        ("B200-180GB", 1745.0),
        ("GH200-144GB", 828.6),
        ("GAUDI2-96GB", 418.7),
    ],
)
def test_parts_measured_only_by_the_mamf_table_keep_its_ratio_to_the_h100_sxm(
    key: str, mamf: float
) -> None:
    # Bekman's maximum achievable matmul FLOPS (bf16), the H100 SXM at 794.5 in the same
    # table: what a user reads under SUSTAINED in `hetsched gpus` is that ratio of the H100's.
    h100 = sustained_gemm_tflops(lookup("H100-80GB"))
    assert sustained_gemm_tflops(lookup(key)) / h100 == pytest.approx(mamf / 794.5, rel=1e-3)


def test_an_mi250x_gcd_keeps_the_older_tables_ratio_and_agrees_with_an_mi210() -> None:
    # The MI250X is listed per GCD (ROCm shows two devices per module), and only the
    # table's older v1 version measures it: 147.0 on one GCD where its H100 SXM has 792.1.
    # The MI210 is the same die (104 of its 110 compute units, 300 W against the GCD's 280 W
    # share), measured by another source (torch-performance-test-data #195, fp16 8192²):
    # the two land within 5 % of each other.
    gcd, mi210 = lookup("MI250X-64GB"), lookup("MI210-64GB")
    h100 = sustained_gemm_tflops(lookup("H100-80GB"))
    assert gcd.memory_gb == 64 and gcd.peak_tflops == pytest.approx(383.0 / 2)
    assert sustained_gemm_tflops(gcd) / h100 == pytest.approx(147.0 / 792.1, rel=1e-3)
    assert sustained_gemm_tflops(mi210) == pytest.approx(sustained_gemm_tflops(gcd), rel=0.05)


def test_an_mi300x_runs_matrix_products_slower_than_an_h100_sxm_despite_its_peak() -> None:
    # 1,307 TFLOP/s of peak against 989, but 0.51 of it reached against the H100's 0.80:
    # at its segment's 0.75 of peak the planner gave it 1.5x an H100's products.
    mi300x, h100 = lookup("MI300X-192GB"), lookup("H100-80GB")
    assert mi300x.peak_tflops > 1.3 * h100.peak_tflops
    assert sustained_gemm_tflops(mi300x) < 0.9 * sustained_gemm_tflops(h100)
    llama = replace(get_preset("llama-7b"), seq_len=2048, attention="flash")
    mi300x_s = block_time(llama, Rates.of(mi300x)).per_sample_s
    h100_s = block_time(llama, Rates.of(h100)).per_sample_s
    assert 0.8 < h100_s / mi300x_s < 1.0  # a compute-bound layer: a little slower


def test_flash_attention_costs_hopper_more_of_its_speed_as_sequences_grow() -> None:
    # FlashAttention-2 uses none of Hopper's tensor-core instructions (35 % of an H100's
    # peak, FlashAttention-3's paper) where an A100 runs it near its GEMM rate, so a long
    # sequence, whose attention is a larger share of the layer, narrows the H100's lead;
    # between two Ampere cards the ratio barely moves.
    def layer_speed(gpu: str, seq_len: int) -> float:
        m = replace(get_preset("llama-13b"), seq_len=seq_len, attention="flash")
        return 1 / block_time(m, Rates.of(lookup(gpu))).per_sample_s

    def lead(fast: str, slow: str, seq_len: int) -> float:
        return layer_speed(fast, seq_len) / layer_speed(slow, seq_len)

    hopper_drop = lead("H100-80GB", "A100-80GB", 4096) / lead("H100-80GB", "A100-80GB", 512)
    ampere_drop = lead("A100-80GB", "A10G-24GB", 4096) / lead("A100-80GB", "A10G-24GB", 512)
    assert hopper_drop < 0.97
    assert ampere_drop == pytest.approx(1, abs=0.02)
    hopper = Rates.of(lookup("H100-80GB")).fused_attention_share
    assert hopper < Rates.of(lookup("A100-80GB")).fused_attention_share
    # and a plan in another precision keeps it (it rebuilds the rates for its element size)
    assert rates_at(lookup("H100-80GB"), "fp32").fused_attention_share == hopper


def test_fp32_products_run_at_the_measured_fp32_rate_not_the_16_bit_share() -> None:
    # fp32 (TF32 off) is the default precision of plans and jobs. Scaling the 16-bit rate's
    # share of peak to the fp32 peak made an RTX 4090 (1.04 of its tensor peak, 0.65 of its
    # fp32 one) run fp32 products 6.0x an A100's, where torch.mm at 8192² measures 3.0x.
    def fp32_tflops(key: str) -> float:
        return rates_at(lookup(key), "fp32").flops_per_s / 1e12

    assert fp32_tflops("A100PCIE-40GB") == pytest.approx(17.56)
    assert fp32_tflops("RTX4090-24GB") / fp32_tflops("A100PCIE-40GB") == pytest.approx(
        53.41 / 17.56
    )
    # an unmeasured part takes its architecture's measured share: the A100 SXM the PCIe's
    assert fp32_tflops("A100-80GB") == pytest.approx(17.56)
    # a spec's override of the 16-bit peak scales the fp32 rate alike
    halved = rates_at(lookup("A100-80GB"), "fp32", tensor_tflops=156.0).flops_per_s / 1e12
    assert halved == pytest.approx(17.56 / 2)


def test_a_power_capped_card_runs_fp32_products_below_its_architectures_share() -> None:
    # The 72 W L4 reaches 0.35 of its fp32 peak where the uncapped Ada RTX 4090 reaches 0.65;
    # an unmeasured capped card takes the capped cards' share, not the uncapped parts'.
    t4, rtx2080ti = lookup("T4-16GB"), lookup("RTX2080TI-11GB")
    t4_share = rates_at(t4, "fp32").flops_per_s / 1e12 / 8.1
    turing_share = rates_at(rtx2080ti, "fp32").flops_per_s / 1e12 / 13.4
    assert t4_share < 0.6 < turing_share
