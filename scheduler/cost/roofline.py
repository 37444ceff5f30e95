"""Analytic speed: every piece of the model as a roofline on a GPU of the catalogue.

A kernel runs at the slower of its FLOPs at the rate matrix products sustain and
its bytes at the bandwidth streaming kernels reach (Williams, Waterman &
Patterson, "Roofline", CACM 2009). Neither rate is the datasheet's; both come
from what sets them on each part (:func:`sustained_gemm_tflops`,
:func:`sustained_bandwidth_gbps`):

- **matrix products** run at a published large-GEMM rate where one exists for
  the part (``GpuSpec.measured_gemm_tflops``), else at the share of peak its
  segment's measured parts reach (:data:`GEMM_SHARE`). GeForce cards accumulate
  fp16 products in fp32 at half their fp16-accumulate rate, and their catalogue
  peak is already that half rate (NVIDIA's GA102 and Ada whitepapers list both);
  they sustain it in full, boosting above the clock it is quoted at.
- **power-capped cards** (at most :data:`POWER_CAPPED_W`: T4, L4, A2, A16) run
  matrix products far below peak because the cap, not the clock, binds: a card measured
  itself (the T4, the L4) runs at its own measurement, which already holds its cap; the
  others at most ``TDP × TFLOP/s per W`` of their architecture measured at its own cap
  (:data:`TFLOPS_PER_W`). Unmeasured cards above it
  whose architecture has a card measured at a binding cap (:data:`CAPPED_REFERENCE`)
  scale from that card by dynamic power
  (:func:`dvfs_capped_tflops`): a 150 W A10 sustains about two thirds of what a 300 W
  A6000 of the same chip does, not the 94 TFLOP/s its segment's share of peak gives.
- **fp32 matrix products** (fp32 training, TF32 off) run at the part's own measured fp32
  GEMM rate, else at the fp32 share of peak its architecture's measured parts reach
  (:func:`sustained_fp32_gemm_tflops`), not at the 16-bit rate's share.
- **memory-bound kernels** (norms, activations, residuals, softmax, the fp32
  cross-entropy, weight reads) stream at a published measured bandwidth where
  there is one, else at :data:`BANDWIDTH_SHARE` of the datasheet's.
- **attention**: the ``math`` kernel runs its two products as GEMMs and streams
  its score matrix through every elementwise step (:data:`MATH_SCORE_PASSES`);
  the fused kernels run at :data:`FUSED_ATTENTION_SHARE` of the GEMM rate (less on
  Hopper, which FlashAttention-2 does not use in full:
  :data:`FUSED_ATTENTION_SHARE_BY_ARCHITECTURE`).

- **the optimizer step**: a fused AdamW streams every parameter's states once per
  step (:func:`optimizer_step_s`), at the streaming bandwidth.

Checked against five published sets of measurements (per-layer ones from Mu Li's notebook
on PyTorch 1.13 and 2.0 and from a second user's A800 and RTX 3090 runs of it, Cephalo's and
Zorse's per-layer GPT and Llama profiles, Lambda's whole steps; 21 catalogue GPU types) by
tests/benchmarks/test_speed_fidelity.py (data in tests/benchmarks/data/).
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass

from scheduler.hardware.catalogue import CATALOGUE, GpuSpec, Segment, lookup
from scheduler.models.activations import Recompute
from scheduler.models.presets import ModelPreset

LAUNCH_OVERHEAD_PER_LAYER_S = 50e-6
"""Kernel launches and Python per layer and micro-batch (forward + backward)."""
ELEMENTWISE_PASSES = 3
"""An elementwise kernel's bytes move once in forward and about twice in backward
(the gradient read and written, the saved input read)."""
WEIGHT_READS_PER_MICRO_BATCH = 3
"""Forward, backward-data and backward-weight products each read the weights."""
BYTES_16BIT = 2
LOGITS_FP32_PASSES = 4
"""The fp32 logits: written, read by the softmax, its gradient written and read."""
ADAMW_BYTES_PER_PARAM = 28
"""Bytes a fused (multi-tensor) mixed-precision AdamW step streams per parameter, once per
optimizer step: the fp32 master weight and both fp32 moments read and written (24), the
16-bit gradient read (2) and the 16-bit working weight written (2). The states are ZeRO's 16
bytes per parameter (Rajbhandari et al., SC'20, §3.1); a streaming kernel touches each once."""

GEMM_SHARE: dict[Segment, float] = {"datacenter": 0.75, "workstation": 0.61, "geforce": 1.0}
"""Share of ``peak_tflops`` a large fp16 GEMM sustains, by segment, for parts without a
published measurement. From Mu Li's transformers-benchmarks (8192² fp16 matmul in
PyTorch): A100 230 of 312 and V100 95 of 125 (datacenter, 0.74 and 0.76); RTX A6000
95 of 154.8 (a 300 W professional card at its cap, 0.61); RTX 3090 Ti 81 of 80 and
RTX 4090 172 of 165 (GeForce above their quoted boost clock, 1.0)."""
POWER_CAPPED_W = 75.0
"""Cards at or below this board power hold their cap by running below their boost clock."""
TFLOPS_PER_W: dict[str, float] = {
    "turing": 24.0 / 70,
    "ampere-ga10x": 28.41 / 70,
    "ada": 53.80 / 72,
}
"""Sustained fp16 GEMM TFLOP/s per watt of board power, per architecture, measured on a
non-GeForce card of it at a cap of at most :data:`POWER_CAPPED_W` (the regime the bound is
for): T4 24 TFLOP/s at 70 W (NVIDIA developer forums, thread 264462); RTX A2000 12GB 28.41
at 70 W (GA106, a professional card, full-rate fp32 accumulate like the A2's and A16's
GA107) and L4 53.80 at 72 W (zzc0721/torch-performance-test-data issues #72 and #120, fp16
8192² ``torch.mm``). They replace the RTX A6000 at 300 W and the RTX 4090 at 450 W (Mu Li's
transformers-benchmarks): cards outside the regime, and the 4090 a GeForce card, which runs
fp16 with fp32 accumulate at half rate, so its energy per FLOP is not a datacenter Ada
part's (and its cap may not bind). The L4 reaches 0.44 of its peak, its cap binding; the
A2000 0.89 of its dense 31.9, so a small Ampere part clocked for 70 W barely throttles, and
the bound does not bind on the A2 or A16 (their segment's share of peak is lower). Cards
with their own measurement (:attr:`GpuSpec.measured_gemm_tflops`) do not use it."""
CAPPED_REFERENCE: dict[str, str] = {"ampere-ga10x": "A6000-48GB", "hopper": "H100PCIE-80GB"}
"""Per architecture, a non-GeForce card whose own measured GEMM rate
(:attr:`~scheduler.hardware.catalogue.GpuSpec.measured_gemm_tflops`) shows its cap binding,
where the uncapped datacenter parts reach about 0.75 of peak: the RTX A6000 reaches 95 of
its 154.8 at 300 W (Mu Li's transformers-benchmarks), the H100 PCIe 437 of its 756 at 350 W
(0.58; zzc0721/torch-performance-test-data #95), where the 700 W H100 SXM reaches 637 of
the same chip's 989 (0.64). Unmeasured parts of the architecture above
:data:`POWER_CAPPED_W` scale from it by dynamic power (:func:`dvfs_capped_tflops`): the
400 W H100 NVL about 490, not the 626 its segment's share of peak gives."""
BANDWIDTH_SHARE = 0.85
"""Share of datasheet bandwidth streaming kernels reach where none is measured: the
median of the measured A100 (0.79), A6000 (0.85), V100 (0.87), RTX 3090 Ti (0.85) and
RTX 4090 (0.93) (vector multiply in Mu Li's transformers-benchmarks)."""
MATH_SCORE_PASSES = 10
"""16-bit element accesses of the ``math`` attention's score matrix in the forward
pass: written by the product with K; read and written by the scaling, the mask, the
softmax and the dropout; read by the product with V (Hugging Face's BERT and GPT-2
attention run these as separate kernels). The backward pass moves about twice that."""
FUSED_ATTENTION_SHARE = 0.8
"""Share of the GEMM rate the fused (flash, memory-efficient) attention kernels reach
forward + backward: FlashAttention-2 reaches 50–73 % of the A100's peak (Dao, 2023),
against about 74 % for a large GEMM."""
FUSED_ATTENTION_SHARE_BY_ARCHITECTURE: dict[str, float] = {"hopper": 0.35 / 0.64}
"""Where the fused kernels reach a different share of the GEMM rate. Hopper: FlashAttention-2
is written for Ampere's synchronous tensor-core instructions and uses none of Hopper's
(wgmma, TMA), so it reaches only about 35 % of an H100's peak (Shah et al.,
"FlashAttention-3", 2024, arXiv:2407.08608, abstract), where a large GEMM reaches 0.64
(the H100 SXM's measured 637 of 989 TFLOP/s): about 0.55 of the GEMM rate, not 0.8. A stack
that runs FlashAttention-3 or cuDNN's attention on Hopper runs it faster than this."""


def dvfs_capped_tflops(gpu: GpuSpec) -> float | None:
    """The GEMM rate ``gpu``'s board power allows, scaled from its architecture's capped
    reference card (:data:`CAPPED_REFERENCE`); None where there is none (or for GeForce
    cards, whose half-rate fp32-accumulate math draws a different power per FLOP).

    Dynamic power is ``C·V²·f`` (Hennessy & Patterson, *Computer Architecture: A
    Quantitative Approach*, 6th ed., §1.5) and a card under its cap lowers voltage with
    clock, so power grows as ``n·f³`` for ``n`` units at clock ``f``. The rate ``n·f`` at
    power ``P`` is then ``∝ n^(2/3)·P^(1/3)``; with ``n`` in proportion to the datasheet
    peak (same architecture, same FLOPs per unit and clock, boost clocks within 10 %):
    ``rate = ref_rate · (peak / ref_peak)^(2/3) · (TDP / ref_TDP)^(1/3)``. Below
    :data:`POWER_CAPPED_W` leakage and memory power dominate and the linear per-watt bound
    (:data:`TFLOPS_PER_W`) applies instead."""
    reference = CAPPED_REFERENCE.get(gpu.architecture)
    if reference is None or gpu.segment == "geforce" or gpu.tdp_w <= POWER_CAPPED_W:
        return None
    ref = lookup(reference)
    assert ref.measured_gemm_tflops is not None, reference
    units = math.pow(gpu.peak_tflops / ref.peak_tflops, 2 / 3)
    return ref.measured_gemm_tflops * units * math.cbrt(gpu.tdp_w / ref.tdp_w)


def sustained_gemm_tflops(gpu: GpuSpec, *, peak_tflops: float | None = None) -> float:
    """TFLOP/s ``gpu`` sustains in a training step's matrix products (module docstring).

    ``peak_tflops``: a spec's override of the catalogue peak; the sustained rate scales
    with it."""
    peak = gpu.peak_tflops if peak_tflops is None else peak_tflops
    if gpu.measured_gemm_tflops is not None:
        # measured on the part itself, under its own cap: no bound derived from another card
        return gpu.measured_gemm_tflops * peak / gpu.peak_tflops
    rate = peak * GEMM_SHARE[gpu.segment]
    per_watt = TFLOPS_PER_W.get(gpu.architecture)
    if gpu.tdp_w <= POWER_CAPPED_W and per_watt is not None:
        rate = min(rate, gpu.tdp_w * per_watt)
    capped = dvfs_capped_tflops(gpu)
    if capped is not None:
        rate = min(rate, capped * peak / gpu.peak_tflops)
    return rate


CAPPED_FP32_SHARE: dict[str, float] = {"ampere-ga10x": 4.92 / 8.0, "ada": 10.66 / 30.3}
"""Share of its fp32 peak a card at a cap of at most :data:`POWER_CAPPED_W` reaches in an
fp32 8192² ``torch.mm``, per architecture, measured (zzc0721/torch-performance-test-data): the
RTX A2000 12GB 4.92 of its 8.0 at 70 W (issue #72, the card :data:`TFLOPS_PER_W` takes for
GA10x) and the L4 10.66 of its 30.3 at 72 W (#120), against 0.62-0.75 for the uncapped GA10x
and Ada parts: the cap binds fp32 products too. A capped part of another architecture (the
70 W T4) takes their median."""


def fp32_gemm_share(gpu: GpuSpec) -> float:
    """Share of its fp32 peak ``gpu``'s fp32 matrix products sustain when it has no fp32
    measurement of its own. A card at or below :data:`POWER_CAPPED_W`: its architecture's
    capped share (:data:`CAPPED_FP32_SHARE`). Any other: the median of the measured shares
    (``measured_fp32_gemm_tflops`` over ``fp32_tflops``) of the uncapped parts of its
    architecture in its segment, else of its architecture, else of its segment."""
    if gpu.tdp_w <= POWER_CAPPED_W:
        return CAPPED_FP32_SHARE.get(
            gpu.architecture, statistics.median(CAPPED_FP32_SHARE.values())
        )
    return _fp32_share(gpu.architecture, gpu.segment)


@functools.cache
def _fp32_share(architecture: str, segment: Segment) -> float:
    # one share per measurement: a memory variant that carries its part's (the H200 the
    # H100 SXM's, the V100 16 GB the 32 GB's) does not count twice
    measured = {
        (g.architecture, g.segment, g.measured_fp32_gemm_tflops, g.fp32_tflops)
        for g in CATALOGUE.values()
        if g.measured_fp32_gemm_tflops is not None
        and g.fp32_tflops is not None
        and g.tdp_w > POWER_CAPPED_W
    }
    for same_architecture, same_segment in ((True, True), (True, False), (False, True)):
        shares = [
            tflops / peak
            for arch, seg, tflops, peak in measured
            if (arch == architecture or not same_architecture)
            and (seg == segment or not same_segment)
        ]
        if shares:
            return statistics.median(shares)
    return statistics.median(tflops / peak for *_, tflops, peak in measured)


def sustained_fp32_gemm_tflops(gpu: GpuSpec, *, fp32_peak_tflops: float) -> float:
    """TFLOP/s ``gpu`` sustains in fp32 training's matrix products (PyTorch keeps TF32 off).

    Not the 16-bit rate scaled to the fp32 peak: the fp32 pipeline is another unit with
    another power draw. A GA100 reaches 0.9 of its fp32 peak and 0.74 of its tensor one; an
    RTX 4090 0.65 of its fp32 peak and 1.04 of its tensor one.
    Its own measurement (``measured_fp32_gemm_tflops``), else :func:`fp32_gemm_share` of its
    fp32 peak. ``fp32_peak_tflops``: the fp32 peak the job runs at (a spec's override of the
    16-bit peak scales it, :func:`scheduler.hardware.precision.peak_tflops`)."""
    if gpu.measured_fp32_gemm_tflops is not None and gpu.fp32_tflops is not None:
        return gpu.measured_fp32_gemm_tflops * fp32_peak_tflops / gpu.fp32_tflops
    return fp32_peak_tflops * fp32_gemm_share(gpu)


def sustained_bandwidth_gbps(gpu: GpuSpec) -> float:
    """GB/s ``gpu``'s streaming kernels reach (module docstring)."""
    if gpu.measured_bandwidth_gbps is not None:
        return gpu.measured_bandwidth_gbps
    return gpu.bandwidth_gbps * BANDWIDTH_SHARE


@dataclass(frozen=True, kw_only=True, slots=True)
class Rates:
    """What a device sustains: the two slopes of its roofline."""

    flops_per_s: float
    bytes_per_s: float
    fused_attention_share: float = FUSED_ATTENTION_SHARE

    @classmethod
    def of(
        cls,
        gpu: GpuSpec,
        *,
        peak_tflops: float | None = None,
        flops_share: float | None = None,
        fp32: bool = False,
    ) -> Rates:
        """``gpu``'s sustained rates; ``peak_tflops`` (a spec override) scales them, and
        ``flops_share`` (``--efficiency``) replaces the sustained GEMM rate by that share of
        the peak. ``fp32``: the products run in fp32 and ``peak_tflops`` is the fp32 peak
        (:func:`sustained_fp32_gemm_tflops`)."""
        if flops_share is None and fp32:
            assert peak_tflops is not None, "an fp32 rate needs the fp32 peak"
            tflops = sustained_fp32_gemm_tflops(gpu, fp32_peak_tflops=peak_tflops)
        elif flops_share is None:
            tflops = sustained_gemm_tflops(gpu, peak_tflops=peak_tflops)
        else:
            tflops = (gpu.peak_tflops if peak_tflops is None else peak_tflops) * flops_share
        return cls(
            flops_per_s=tflops * 1e12,
            bytes_per_s=sustained_bandwidth_gbps(gpu) * 1e9,
            fused_attention_share=FUSED_ATTENTION_SHARE_BY_ARCHITECTURE.get(
                gpu.architecture, FUSED_ATTENTION_SHARE
            ),
        )

    def time_s(self, *, flops: float, num_bytes: float) -> float:
        """One kernel class: the slower of its compute and its memory traffic."""
        return max(flops / self.flops_per_s, num_bytes / self.bytes_per_s)


@dataclass(frozen=True, kw_only=True, slots=True)
class PieceTime:
    fixed_s: float
    """Per micro-batch: weight reads and launches."""
    per_sample_s: float


def _matmul_io_elements_per_token(model: ModelPreset) -> int:
    """Inputs and outputs of a block's matrix products in the forward pass."""
    h, f = model.d_model, model.d_ff
    if model.family == "gpt":
        return (h + 3 * h) + (h + h) + (h + f) + (f + h)  # qkv, out, fc, proj
    return (h + 3 * h) + (h + h) + (h + 2 * f) + (f + h)  # qkv, out, gate+up, down


def _elementwise_elements_per_token(model: ModelPreset) -> int:
    """Elements read and written by a block's elementwise kernels in the forward pass."""
    h, f = model.d_model, model.d_ff
    norms = 2 * 2 * h
    residuals = 2 * 3 * h
    if model.family == "gpt":
        return norms + residuals + 2 * f + 2 * 2 * h  # GELU; two dropouts
    return norms + residuals + 3 * f + 2 * 2 * h  # SiLU·up; rotary on Q and K


def _attention_core(model: ModelPreset, rates: Rates) -> float:
    """Forward + backward time of the attention core for one sample."""
    s, h, a = model.seq_len, model.d_model, model.num_heads
    flops = 3.0 * 4 * s * s * h
    if model.attention != "math":
        return flops / (rates.flops_per_s * rates.fused_attention_share)
    score_bytes = ELEMENTWISE_PASSES * BYTES_16BIT * MATH_SCORE_PASSES * a * s * s
    # the products and the streaming of the scores run as separate kernels: they add
    return flops / rates.flops_per_s + score_bytes / rates.bytes_per_s


def block_time(model: ModelPreset, rates: Rates, recompute: Recompute = "none") -> PieceTime:
    """One transformer block on a device with ``rates``.

    A training step runs its kernels one after another, so a piece's time is the sum
    over its kernel classes of each class's roofline:

    - **matrix products** (QKV, output and MLP projections, the head): FLOPs
      ``3·2·s·weights`` per sample (forward, then two products in backward:
      Narayanan et al., SC'21), bytes their 16-bit inputs and outputs;
      compute-bound at any micro-batch people train with;
    - **the attention core**: ``3·4·s²·h`` FLOPs; the fused kernels are
      compute-bound, the ``math`` kernel also streams its score matrix;
    - **elementwise kernels** (norms, GELU/SwiGLU, residual adds, rotary
      embeddings, the fp32 cross-entropy): few FLOPs, all bytes; bandwidth-bound.
      Ivanov et al., "Data Movement Is All You Need" (MLSys 2021) measured that on
      a V100 such kernels take about 40 % of BERT-large's training time while
      doing 0.2 % of its FLOPs; their share shrinks as ``h`` grows;
    - **weights**: read in the forward pass and twice in the backward pass, once
      per micro-batch whatever its size: the fixed time, with a launch overhead
      per layer.

    The planners need a linear form, ``fixed_s + b·per_sample_s``; summing the
    weight reads and the per-sample roofline over-counts a compute-bound
    micro-batch by at most its weight-read time.

    Recomputation repeats forward work (:mod:`scheduler.models.activations`): the
    forward is one third of a piece's forward + backward for every kernel class,
    so ``full`` adds a third of the block's per-sample time and one more weight
    read; ``selective`` adds a third of the attention core's time.
    """
    s = model.seq_len
    matmul_weights = model.block_params - (
        4 * model.d_model if model.family == "gpt" else 2 * model.d_model
    )
    matmul = rates.time_s(
        flops=3.0 * 2 * s * matmul_weights,
        num_bytes=ELEMENTWISE_PASSES * BYTES_16BIT * s * _matmul_io_elements_per_token(model),
    )
    core = _attention_core(model, rates)
    elementwise = (
        ELEMENTWISE_PASSES * BYTES_16BIT * s * _elementwise_elements_per_token(model)
    ) / rates.bytes_per_s
    weight_read_s = BYTES_16BIT * model.block_params / rates.bytes_per_s
    per_sample = matmul + core + elementwise
    fixed = LAUNCH_OVERHEAD_PER_LAYER_S + WEIGHT_READS_PER_MICRO_BATCH * weight_read_s
    if recompute == "full":
        return PieceTime(fixed_s=fixed + weight_read_s, per_sample_s=per_sample * 4 / 3)
    if recompute == "selective":
        return PieceTime(fixed_s=fixed, per_sample_s=per_sample + core / 3)
    return PieceTime(fixed_s=fixed, per_sample_s=per_sample)


def head_time(model: ModelPreset, rates: Rates) -> PieceTime:
    """Final norm, output projection and the fp32 cross-entropy over the vocabulary."""
    s, h, v = model.seq_len, model.d_model, model.vocab_size
    projection = rates.time_s(
        flops=3.0 * 2 * s * h * v, num_bytes=ELEMENTWISE_PASSES * BYTES_16BIT * s * (h + v)
    )
    logits = LOGITS_FP32_PASSES * 4.0 * s * v / rates.bytes_per_s
    weight_read_s = BYTES_16BIT * model.head_params / rates.bytes_per_s
    return PieceTime(
        fixed_s=LAUNCH_OVERHEAD_PER_LAYER_S + WEIGHT_READS_PER_MICRO_BATCH * weight_read_s,
        per_sample_s=projection + logits,
    )


def optimizer_step_s(num_params: int, rates: Rates) -> float:
    """One mixed-precision AdamW step over ``num_params`` parameters: bandwidth only
    (:data:`ADAMW_BYTES_PER_PARAM`). Paid once per training step, whatever the number of
    micro-batches, so it weighs most on a device that fits small ones."""
    return ADAMW_BYTES_PER_PARAM * num_params / rates.bytes_per_s


def embed_time(model: ModelPreset, rates: Rates) -> PieceTime:
    """A gather of ``s`` rows and its scatter-add gradient: bandwidth only.

    The gradient of a (dense) ``nn.Embedding`` is the whole table, written and
    accumulated every micro-batch, so the table counts like a weight read."""
    row_bytes = BYTES_16BIT * model.seq_len * model.d_model
    weight_read_s = BYTES_16BIT * model.embed_params / rates.bytes_per_s
    return PieceTime(
        fixed_s=LAUNCH_OVERHEAD_PER_LAYER_S + WEIGHT_READS_PER_MICRO_BATCH * weight_read_s,
        per_sample_s=ELEMENTWISE_PASSES * row_bytes / rates.bytes_per_s,
    )
