"""Analytic speed: every piece of the model as a roofline on a GPU of the catalogue.

A kernel runs at the slower of its FLOPs at the share of peak tensor throughput
training sustains and its bytes at the share of memory bandwidth streaming
kernels reach (Williams, Waterman & Patterson, "Roofline", CACM 2009); shares per
GPU in :mod:`scheduler.hardware.catalogue`, kernel classes in :func:`block_time`.

Checked against published figures (tests/scheduler/test_roofline.py): on a
2.7B-parameter GPT at micro-batch 1–4, relative speeds V100 : L4 ≈ 2.7 and
T4 : L4 ≈ 1 (per-layer measurements quoted by issue 12), A100 : V100 within
1.95×–2.5× for language models in fp16 (Lambda's estimate from NVIDIA's
published numbers, "NVIDIA A100 GPU Benchmarks for Deep Learning", 2020), and
the T4's sustained 24 TFLOP/s (a measured cuBLAS GEMM, see the catalogue). The
model gives 2.6, 1.0 and 2.5. The L4's share is fitted to the first ratio; the
others are not fitted.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.hardware.catalogue import GpuSpec
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


@dataclass(frozen=True, kw_only=True, slots=True)
class Rates:
    """What a device sustains: the two slopes of its roofline."""

    flops_per_s: float
    bytes_per_s: float

    @classmethod
    def of(
        cls, gpu: GpuSpec, *, peak_tflops: float | None = None, flops_share: float | None = None
    ) -> Rates:
        """``gpu``'s sustained rates; ``peak_tflops`` (a spec override) and ``flops_share``
        (``--efficiency``) replace the catalogue's when given."""
        peak = gpu.peak_tflops if peak_tflops is None else peak_tflops
        share = gpu.flops_share if flops_share is None else flops_share
        return cls(
            flops_per_s=peak * 1e12 * share,
            bytes_per_s=gpu.bandwidth_gbps * 1e9 * gpu.bandwidth_share,
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
    num_bytes = 0.0
    if model.attention == "math":
        # scores written, softmax read and written, read by the product with V
        num_bytes = ELEMENTWISE_PASSES * BYTES_16BIT * 4.0 * a * s * s
    return rates.time_s(flops=flops, num_bytes=num_bytes)


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
