"""Analytic relative speeds against published per-GPU measurements.

The planner splits work by the ratio of device speeds, so the question a user asks of
the model is "how fast is card X relative to card Y on this model". Every row of
tests/benchmarks/data/speed_measurements.csv is a published measurement with its source,
grouped by study (one software stack) and workload; ``fitted`` rows are inputs of the
model (the catalogue's measured GEMM rates come from them), ``held_out`` rows are used
nowhere but here. Speeds are only compared inside one (study, workload) group, three ways:

- **each case against its group's geometric mean** (the table, one row per (workload,
  GPU), and the figures asserted against issue 20's targets): one number per case, and
  no single card's own error enters every other row;
- **every pair in the group** (``X/Y`` measured vs analytic, ``|log ratio|`` as a
  percentage): the user's question itself; its errors compound two cases' errors, so
  they run larger than the per-case ones;
- **against the A100** where a group has one (the figure the first version reported):
  one reference's error shifts its whole group.

What the tables show (issue 20), and which effect each large error misses:

- **Lambda** (whole BERT training steps, sequence 384, eleven GPU types): median 3 %,
  worst 21 % per case. The 150 W A10 read +14 % at its segment's share of peak; the
  model now scales it from the capped 300 W A6000 by dynamic power (-1 to -4 %). The H100
  SXM5 read +8 to +18 % at 0.75 of its peak; it now runs its products at the 637 TFLOP/s
  its 8192² matmul measures in Mu Li's notebook (+3 to +14 %). The H100 PCIe read +5 to +9 %
  at 0.75 of its peak; it now runs at its own measured 437 TFLOP/s (0.58 of peak;
  zzc0721/torch-performance-test-data, the catalogue's rule for that source): -3 to +2 %.
  Left: the 300 W RTX 6000 Ada (+10 to +21 %; power-capped too, but no card of its
  architecture is measured at a binding cap, and no public GEMM figure for it was found)
  and the A6000 (-10 to -14 %).
- **mli** (one block, sequence 128 to 1024, six GPU types; the T4 from another user's run
  of the notebook in the same container; BERT at 512 and GPT-2 at 1024 from the notebooks'
  cells the README leaves out, 3090 Ti and T4 only, within 5 %): median 7 %, worst 52 %.
  The power-capped cards read slow: the A6000 by 7-15 % (in both studies: its measured
  95 TFLOP/s GEMM and 656 GB/s under-state what it does in a layer) and the 70 W T4 by
  12-16 %; a capped card may run its products faster when they alternate with
  memory-bound kernels than in a GEMM loop, which the model does not capture. The A100 at
  sequence 512 is the outlier (+52 %; a strict xfail). What is known of it:

  - *A second GA100 run of the notebook does not repeat it* (study "ryanli"). An A800
    SXM4 80GB (the A100 SXM4 80GB's chip, clocks and HBM2e, NVLink cut to 400 GB/s) on
    PyTorch 1.13.1 / CUDA 11.7, the release mli ran, measured BERT at sequence 128 at
    135.9 TFLOP/s, level with mli's A100 (136), but GPT-2 at 80.8 and the T5 encoder at
    78.3 where mli's A100 measured 53 and 56: 1.5x and 1.4x. Its time per sample over the
    model's at sequence 512 is 1.36 and 1.40, inside the other cards' 1.09-1.37 (mli's A100:
    2.07 and 1.96), and its ratios to the RTX 3090 beside it fit the model within 5 %. So
    mli's A100 runs these two sequence-512 layers a third slower than another GA100 on the
    same code and PyTorch release; what slowed it (the README names no form factor or power
    limit) is not recorded. Its README puts it level with the RTX 4090 in the forward pass
    alone as well (GPT-2 45 and 48 TFLOP/s, T5 encoder 44 and 47); the row stays (it is
    mli's published figure), a strict xfail.
  - *Where the time goes, in absolute terms* (the table "measured time per sample over
    the model's"): at sequence 512 the model under-counts these Hugging Face layers on
    every card (1.09-1.32 on the GDDR cards: GPT-2's tanh GELU runs as eight kernels,
    T5 takes its norms' variance and its softmax in fp32), which cancels in the ratios;
    the A100 reads 2.07 and 1.96. At sequence 128 it is 1.13 against the others' 0.82-1.05.
  - *Not the attention.* xformers' A100 timing of PyTorch's eager attention forward at the
    same 1024 x 512 x 64 (batch 64 x 16 heads, head size 64; September 2022 software,
    tests/benchmarks/data/a100_eager_attention.csv) lands within 9 % of what the
    catalogue's A100 rates give it, and its other head sizes within 22 % (the benchmark
    ``test_a100_rates_price_a_second_public_a100_timing_of_eager_attention``): an A100
    streams the score matrices, at sequence 512, at its measured bandwidth. The part the
    A100 misses lies in the rest of those layers: the elementwise kernels, norms and
    layout copies.
  - *A candidate mechanism, neither modelled nor established.* The catalogue's bandwidths
    come from the notebook's fp32 vector multiply, whose PyTorch 1.13 kernel loads four
    elements, 16 bytes, per thread; the layers' 16-bit kernels load four elements too,
    8 bytes, so they keep half the bytes in flight. That costs most where each SM must
    keep the most in flight to reach the bandwidth: the HBM parts (about 10.6 bytes per
    SM clock on the A100 at 1,616 GB/s, 108 SMs, 1.41 GHz; 6.4 on the V100; 2.9 on the
    RTX 4090 and 4-6 on the other GDDR cards, from NVIDIA's whitepapers' SM counts and
    boost clocks). The other HBM parts show the A100's excess mildly: the V100 runs
    1.15x the GA102 cards' shortfall here, the H100 on PyTorch 2.0 (mli-pt2) 1.19x the
    RTX 4090's. But the one public measurement of that effect found, 128-bit loads for
    16-bit types, gained 4-10 % on an H100 (pytorch/pytorch#145746), far from the A100's
    1.5x; and a rule for it would need each part's SM count and clock, which the catalogue
    does not carry, with its one constant set from this A100 row. So the row stays an
    xfail.
  - *Ruled out before* (the table "time per sample beyond the dense products": five
    cards of three architectures need 400-600 MB per sample for the layer, the A100
    940-1,010 MB): the batch (each card's best; per-sample time moves under 6 % above
    batch 16), launch overhead (kernels of tens of MB at batch 64), L2 capacity (the
    score matrices are 512 MB at sequence 512, above every L2 here), dropout's random
    numbers (some 8 us a sample on the A100), and the attention's batched products at
    head size 64 (now measured directly, above). The notebook's A100 GEMM figure,
    230 TFLOP/s, is itself below another A100's cuBLAS fp16 8192^2 of that year (272.7,
    triton-lang/triton#743), and the README names no form factor; the catalogue's A100
    rates come from this run and fit Lambda's A100 rows (-2 to -7 %), so they stay.
- **mli-pt2** (the notebook on PyTorch 2.0: an H100 SXM5 and an RTX 4090, two users; with
  BERT at 512 and GPT-2 at 1024 from the same notebooks): median 9 %, worst 13 %; the 4090
  agrees with mli's within 6 %.
- **ryanli** (the notebook again: an A800 SXM4 80GB on PyTorch 1.13.1 and an RTX 3090 on
  PyTorch 1.8.0, BERT at 128 and 512, GPT-2 at 512 and 1024, T5 encoder): median 2 %,
  worst 5 %.
- **zorse** (Cephalo's and Zorse's profiles: one layer's marginal fwd+bwd kernel time per
  sample under fp16 autocast, PyTorch 2.1; GPT 1.3B-6.7B blocks with eager attention at
  512 and Llama 1.1B-13B layers at 512, 1024 and 2048, flash-attention 2 on Ampere and
  newer; eleven GPU types, 13 groups, 89 cases): median 9 %, worst 177 % (a strict
  xfail). Per GPU, the median error: A100 40GB +5 %, A100 80GB -8 %, A10G +3 %, A6000
  -11 %, V100 +4 %, P40 -4 %, T4 -4 %, P100 -16 %, L4 +8 %, and the two it misses (the
  A100 80GB and A6000 moved from +2 and 0 % with no change of their own: each case is
  against its group's geometric mean, and the L4, in most groups, now runs faster):

  - *the 400 W H100 NVL* (+22 to +29 %; it read +54 to +60 % at 0.75 of its 835 dense
    TFLOP/s): no public GEMM figure of the NVL was found, so it scales by dynamic power
    from the 350 W H100 PCIe, whose own measurement, 437 TFLOP/s at 8192² (0.58 of its
    peak), shows its cap binding (``CAPPED_REFERENCE``), to about 490. It still runs at
    about 0.8x that. The 700 W parts keep their rates: the H100 SXM and the H200 (the
    same chip at the same power) run at the H100 SXM's own measured 637. Its lead over
    the A100 40GB on the Llama-13b layer shrinks with the sequence (measured 1.78x at 512,
    1.61x at 1024, 1.54x at 2048) where the Ampere cards' ratios hold (A100 : A10G on
    Llama-7b 3.33, 3.40, 3.43): FlashAttention-2 uses none of Hopper's tensor-core
    instructions and reaches 35 % of an H100's peak (FlashAttention-3's paper), so the
    fused kernels now run on Hopper at 0.55 of the GEMM rate, not Ampere's 0.8
    (``FUSED_ATTENTION_SHARE_BY_ARCHITECTURE``): +25 to +32 % became +22 to +29 %, and the
    13b layer at 1024 and 2048 came under 25 %. The model's lead still falls less with the
    sequence than the measured one (2.13x to 2.08x); what else grows with it on the NVL is
    not known.
  - *the T4's GPT-6.7b entry* (+177 %): that fp16 entry is no faster than the same
    layer's fp32 one (147 against 171 ms per sample), where the T4's GPT-2.7b entry is
    3.6x its fp32; the T4's other 11 cases read -36 to +19 %.

  The 72 W L4 read -51 to +4 % (median -35 %) at 27.5 TFLOP/s, the RTX 4090's TFLOP/s per
  watt times 72 W: a GeForce card's, at half-rate fp32 accumulate. It now runs at its own
  measured 53.8 TFLOP/s (fp16 8192², zzc0721/torch-performance-test-data issue #120): its
  Llama layers, compute-bound under flash attention, read -20 to +11 %, but its GPT-1.3b
  and 2.7b blocks (eager attention, memory-bound) +21 and +32 %: on those the L4 runs
  about as fast as the T4 (T4 : L4 1.06, the model 0.65, issue 12's "T4 : L4 ≈ 1" of
  tests/scheduler/test_roofline.py), which the model does not capture. The A10G
  (-20 to -1 % at its dynamic-power scaling from the A6000) runs at its own 65.7: -12 to
  +6 %. The P100 (the 12 GB PCIe card of the profiles) read +13 to +81 % at its datasheet
  fp16 rate; PyTorch's fp16 GEMMs accumulate in fp32, which a part without tensor cores
  runs at its fp32 rate, so the catalogue gives the P100 that rate, and now the 16 GB PCIe
  card's measured 7.46 (-36 to -6 %).
- **zorse-fp32** (the same profiles' fp32 entries, no autocast: the GPT blocks and
  DeepspeedBert's Hugging Face BERT layers at 512, BERT-xlarge also at 1024; ten GPU types, 53
  cases): the speed model's fp32 path, fp32 being hetsched's default precision. It ran fp32
  products at the 16-bit rate's share of the fp32 peak: median 17 %, worst 66 %, 14 cases over
  25 % (the L4 +32 and +66 % and the L40S +28 to +40 % at their tensor rates' share; the 70 W
  T4 -33 to -39 % at its tensor cores' capped 0.37; the V100 -28 and -33 %). With each part's
  own fp32 GEMM measurement (torch-performance-test-data's FP32 8192², the catalogue's rule)
  or its architecture's measured share of the fp32 peak
  (:func:`~scheduler.cost.roofline.sustained_fp32_gemm_tflops`): median 13 %, worst 33 %,
  8 cases over 25 % (a strict xfail). Left: the P40 (+22 to +30 %; no fp32 figure of it, so
  it takes the HBM P100s' 0.9 of peak), the L40S (+12 to +24 %; the GeForce RTX 4090's 0.65,
  where its summary-only figure, 46.9 at most over sizes, is 0.51), the T4 (-18 to -28 %; the
  capped cards' median share, 0.48, from the L4 and the RTX A2000), the V100 (-11 to -24 %),
  the L4's GPT-6.7b block (+33 %) and the P100's BERT-xlarge layer at 512 (+29 %).
- every pair of a group: median 13 %, worst 331 % (zorse's T4 GPT-6.7b entry in the five
  worst pairs, its P40 / T4 pair at Llama-tiny 512 in the sixth); against the A100:
  median 10 %, worst 44 %.

Run on purpose:

    .venv/bin/python -m pytest -m benchmark -s tests/benchmarks/test_speed_fidelity.py
"""

from __future__ import annotations

import csv
import itertools
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import pytest

from scheduler.cost.precision import rates_at
from scheduler.cost.roofline import (
    BYTES_16BIT,
    Rates,
    block_time,
    embed_time,
    optimizer_step_s,
    sustained_gemm_tflops,
)
from scheduler.hardware.catalogue import GpuSpec, lookup
from scheduler.models.activations import AttentionKernel
from scheduler.models.presets import ModelPreset

DATA = Path(__file__).parent / "data" / "speed_measurements.csv"
EAGER_ATTENTION = Path(__file__).parent / "data" / "a100_eager_attention.csv"
A100_SXM4 = ("A100-80GB", "A100-40GB")
"""The parts an A100 measurement that names no memory size may have run on."""
REFERENCE = "A100-80GB"
NOTEBOOK_STUDIES = ("mli", "mli-pt2", "ryanli")
"""Studies that ran Mu Li's micro_bench notebook, whose TFLOP/s count
:func:`mli_seconds_per_sample` turns back into time."""
MEDIAN_TARGET = 0.10
WORST_TARGET = 0.25
"""Issue 20's targets on held-out cases: median error under 10 %, none over 25 %."""


def _block(name: str, *, seq_len: int, d_model: int = 1024, num_layers: int = 1) -> ModelPreset:
    """A BERT/GPT-2-shaped stack (LayerNorm, GELU, biases, learned positions) with the
    ``math`` attention kernel, which the Hugging Face and NVIDIA layers measured run."""
    return ModelPreset(
        name=name,
        family="gpt",
        num_layers=num_layers,
        d_model=d_model,
        num_heads=d_model // 64,
        d_ff=4 * d_model,
        vocab_size=30522,  # BERT's WordPiece vocabulary; a lone block has no embedding
        seq_len=seq_len,
        max_seq_len=max(seq_len, 512),
        attention="math",
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    """What a study timed: a matrix product, one block's forward + backward, a whole
    training step (embedding, every block, the AdamW step; BERT's SQuAD head, ``2h``
    weights, is left out), or one block's marginal forward + backward time per sample
    (``marginal``: the slope of kernel time over the batch, so no fixed cost)."""

    kind: Literal["matmul", "block", "step", "marginal"]
    model: ModelPreset | None = None
    precision: Literal["16-bit", "fp32"] = "16-bit"
    """What the study computed in: 16-bit (pure fp16 or fp16 autocast) or fp32 with TF32 off."""
    attention_on: Callable[[GpuSpec], AttentionKernel] | None = None
    """The attention kernel the study's code picks on each GPU, where it picks per GPU."""

    def predicted_speed(self, gpu_key: str, micro_batch: int) -> float:
        """Analytic samples per second (TFLOP/s for a matrix product)."""
        gpu = lookup(gpu_key)
        if self.kind == "matmul":
            return sustained_gemm_tflops(gpu)
        assert self.model is not None
        model = self.model
        if self.attention_on is not None:
            model = replace(model, attention=self.attention_on(gpu))
        rates = rates_at(gpu, "fp32") if self.precision == "fp32" else Rates.of(gpu)
        block = block_time(model, rates)
        if self.kind == "marginal":
            return 1 / block.per_sample_s
        seconds = block.fixed_s + micro_batch * block.per_sample_s
        if self.kind == "step":
            embed = embed_time(model, rates)
            seconds = (
                model.num_layers * seconds
                + embed.fixed_s
                + micro_batch * embed.per_sample_s
                + optimizer_step_s(model.num_params, rates)
            )
        return micro_batch / seconds


FLASH_ATTENTION_2 = frozenset({"ampere-ga100", "ampere-ga10x", "ada", "hopper"})
"""Architectures of compute capability 8.0 and newer, where flash-attention 2 runs."""


def _zorse_llama_attention(gpu: GpuSpec) -> AttentionKernel:
    """What Cephalo's and Zorse's Llama layer (models/llama_simple.py) runs: flash-attention 2
    in 16-bit on compute capability 8.0 and newer, eager attention on the P40 ("a lot slower
    on sdpa"), PyTorch's scaled_dot_product_attention (its memory-efficient kernel below 8.0)
    elsewhere."""
    if gpu.architecture in FLASH_ATTENTION_2:
        return "flash"
    return "math" if gpu.key == "P40-24GB" else "memory_efficient"


ZORSE_LAYERS: dict[str, tuple[int, int, int]] = {
    # models/gpt_simple.py's DeepspeedGPT blocks: d_model, heads, a 4h MLP
    "gpt-1.3b": (2048, 128, 4 * 2048),
    "gpt-2.7b": (2560, 80, 4 * 2560),
    "gpt-6.7b": (4096, 128, 4 * 4096),
    # models/llama_simple.py's Hugging Face Llama decoder layers (no grouped-query attention)
    "llama-tiny": (2048, 32, 5632),
    "llama-3b": (3200, 32, 8640),
    "llama-7b": (4096, 32, 11008),
    "llama-13b": (5120, 40, 13824),
}
"""Cephalo's and Zorse's layer shapes: d_model, heads, d_ff."""


def _zorse(layer: str, seq_len: int, *, fp32: bool = False) -> Workload:
    """One of :data:`ZORSE_LAYERS`: the GPT blocks run eager attention and tanh GELU, the
    Llama layers the attention :func:`_zorse_llama_attention` picks per GPU; ``fp32``: the
    layer in fp32 (study "zorse-fp32")."""
    d_model, heads, d_ff = ZORSE_LAYERS[layer]
    gpt = layer.startswith("gpt")
    model = ModelPreset(
        name=f"zorse-{layer}",
        family="gpt" if gpt else "llama",
        num_layers=1,
        d_model=d_model,
        num_heads=heads,
        d_ff=d_ff,
        vocab_size=49152,
        seq_len=seq_len,
        gelu_approximate="tanh" if gpt else "none",
        attention="math" if gpt else "flash",
    )
    return Workload(
        kind="marginal",
        model=model,
        attention_on=None if gpt else _zorse_llama_attention,
        precision="fp32" if fp32 else "16-bit",
    )


def _zorse_bert(name: str, seq_len: int, d_model: int) -> Workload:
    """A DeepspeedBert layer of study "zorse-fp32" (Hugging Face's BertLayer) in fp32."""
    model = _block(f"zorse-{name}", seq_len=seq_len, d_model=d_model)
    return Workload(kind="marginal", model=model, precision="fp32")


WORKLOADS = {
    "matmul-8192": Workload(kind="matmul"),
    # mli: bert-large-uncased layer (sequence 128), gpt2-medium block and t5-large encoder
    # block (d_ff 4096; sequence 512), 1024 wide, 16 heads
    "bert-large-layer": Workload(kind="block", model=_block("bert-large-layer", seq_len=128)),
    "gpt2-medium-block": Workload(kind="block", model=_block("gpt2-medium-block", seq_len=512)),
    # the notebook's other sequences (the README leaves them out): BERT's at 512, GPT-2's at 1024
    "bert-large-layer-512": Workload(
        kind="block", model=_block("bert-large-layer-512", seq_len=512)
    ),
    "gpt2-medium-block-1024": Workload(
        kind="block", model=_block("gpt2-medium-block-1024", seq_len=1024)
    ),
    "t5-large-encoder-block": Workload(
        kind="block", model=_block("t5-large-encoder-block", seq_len=512)
    ),
    # lambda: BERT-base (12 x 768) and BERT-large (24 x 1024), sequence 384
    "bert-base-squad": Workload(
        kind="step", model=_block("bert-base", seq_len=384, d_model=768, num_layers=12)
    ),
    "bert-large-squad": Workload(
        kind="step", model=_block("bert-large", seq_len=384, d_model=1024, num_layers=24)
    ),
    # zorse: one layer's marginal fwd+bwd, GPT blocks at 512, Llama layers at 512/1024/2048
    **{
        f"zorse-{layer}-{seq}": _zorse(layer, seq)
        for layer, seqs in (
            ("gpt-1.3b", (512,)),
            ("gpt-2.7b", (512,)),
            ("gpt-6.7b", (512,)),
            ("llama-tiny", (512, 1024)),
            ("llama-3b", (512, 1024)),
            ("llama-7b", (512, 1024, 2048)),
            ("llama-13b", (512, 1024, 2048)),
        )
        for seq in seqs
    },
    # zorse-fp32: the same profiles' fp32 entries, GPT blocks and BERT layers
    **{
        f"zorse-{layer}-512-fp32": _zorse(layer, 512, fp32=True)
        for layer in ZORSE_LAYERS
        if layer.startswith("gpt")
    },
    **{
        f"zorse-{name}-{seq}-fp32": _zorse_bert(name, seq, d_model)
        for name, d_model, seqs in (
            ("bert-base", 768, (512,)),
            ("bert-large", 1024, (512,)),
            ("bert-xlarge", 1536, (512, 1024)),
        )
        for seq in seqs
    },
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    study: str
    workload: str
    gpu: str
    micro_batch: int
    measured: float
    role: str
    source: str

    @property
    def group(self) -> tuple[str, str]:
        return (self.study, self.workload)

    def predicted(self) -> float:
        return WORKLOADS[self.workload].predicted_speed(self.gpu, self.micro_batch)


@dataclass(frozen=True, kw_only=True, slots=True)
class Case:
    """One row's speed relative to something, measured and analytic."""

    row: Row
    measured_rel: float
    predicted_rel: float

    @property
    def error(self) -> float:
        return self.predicted_rel / self.measured_rel - 1


def load_rows() -> list[Row]:
    lines = [line for line in DATA.read_text().splitlines() if not line.startswith("#")]
    return [
        Row(
            study=r["study"],
            workload=r["workload"],
            gpu=r["gpu"],
            micro_batch=int(r["micro_batch"]),
            measured=float(r["measured"]),
            role=r["role"],
            source=r["source"],
        )
        for r in csv.DictReader(lines)
    ]


def _groups(rows: list[Row]) -> dict[tuple[str, str], list[Row]]:
    out: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        out.setdefault(r.group, []).append(r)
    return out


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def against_geomean(rows: list[Row]) -> list[Case]:
    """Every row against the geometric mean of its (study, workload) group."""
    out = []
    for members in _groups(rows).values():
        measured = [r.measured for r in members]
        predicted = [r.predicted() for r in members]
        m_mean, p_mean = _geomean(measured), _geomean(predicted)
        out += [
            Case(row=r, measured_rel=m / m_mean, predicted_rel=p / p_mean)
            for r, m, p in zip(members, measured, predicted, strict=True)
        ]
    return out


def against_reference(rows: list[Row]) -> list[Case]:
    """Every row against the A100 of its group (groups without one are left out)."""
    out = []
    for members in _groups(rows).values():
        ref = next((r for r in members if r.gpu == REFERENCE), None)
        if ref is None:
            continue
        out += [
            Case(
                row=r,
                measured_rel=r.measured / ref.measured,
                predicted_rel=r.predicted() / ref.predicted(),
            )
            for r in members
            if r is not ref
        ]
    return out


def pair_errors(rows: list[Row]) -> list[tuple[Row, Row, float]]:
    """``(x, y, error)`` for every pair of one group: how far the analytic ``x/y`` is from
    the measured one, ``exp(|log(analytic / measured)|) - 1`` (the same either way round)."""
    out = []
    for members in _groups(rows).values():
        for x, y in itertools.combinations(members, 2):
            ratio = (x.predicted() / y.predicted()) / (x.measured / y.measured)
            out.append((x, y, math.exp(abs(math.log(ratio))) - 1))
    return out


def _chip(gpu_key: str) -> tuple[str, float, float, float]:
    """What sets a card's speed in the catalogue; keys of one chip at one clock, power and
    bandwidth (the V100 16 and 32 GB) share it."""
    gpu = lookup(gpu_key)
    return (gpu.architecture, gpu.peak_tflops, gpu.bandwidth_gbps, gpu.tdp_w)


def cross_study_ratios(rows: list[Row]) -> dict[tuple[str, str], list[tuple[Row, float, float]]]:
    """For every two chips measured together in more than one study, each group's
    ``(row of the first, measured ratio, analytic ratio)``, keyed by the two chips' first
    catalogue keys: how far one pair's measured ratio moves between workloads and studies
    while its catalogue figures stay put, a floor no model of the hardware alone gets under."""
    names: dict[tuple[str, float, float, float], str] = {}
    for r in sorted(rows, key=lambda r: r.gpu):
        names.setdefault(_chip(r.gpu), r.gpu)
    out: dict[tuple[str, str], list[tuple[Row, float, float]]] = {}
    for members in _groups(rows).values():
        ordered = sorted(members, key=lambda r: names[_chip(r.gpu)])
        for x, y in itertools.combinations(ordered, 2):
            key = (names[_chip(x.gpu)], names[_chip(y.gpu)])
            ratios = (x.measured / y.measured, x.predicted() / y.predicted())
            out.setdefault(key, []).append((x, *ratios))
    return {k: v for k, v in out.items() if len({x.study for x, *_ in v}) > 1}


def _print_cross_study(rows: list[Row]) -> None:
    print("\nthe same two chips across studies and workloads (measured ratio, analytic ratio):")
    for (a, b), groups in cross_study_ratios(rows).items():
        measured = [m for _, m, _ in groups]
        cells = ", ".join(f"{x.workload} {m:.2f}/{p:.2f}" for x, m, p in groups)
        print(f"  {a} / {b}: spread {max(measured) / min(measured) - 1:.0%}: {cells}")


def mli_seconds_per_sample(row: Row) -> float:
    """A block row of the mli notebook as seconds per sample: the notebook divides
    ``3·(24·s·h² + 4·s²·h)`` FLOPs per sample (forward + backward, products only) by the
    time, so its TFLOP/s are a speed in those units."""
    model = WORKLOADS[row.workload].model
    assert model is not None
    s, h = model.seq_len, model.d_model
    return 3 * (24 * s * h * h + 4 * s * s * h) / (row.measured * 1e12)


def unexplained_traffic_bytes(row: Row) -> float:
    """What a mli block row leaves once its dense products run at the card's measured GEMM
    rate: the rest of the measured time per sample, as bytes at the card's streaming
    bandwidth. A roofline of the card's two measured rates needs this to be about the same
    on every card of one workload (one software stack moves the same bytes)."""
    model = WORKLOADS[row.workload].model
    assert model is not None
    rates = Rates.of(lookup(row.gpu))
    products_s = 3 * 24 * model.seq_len * model.d_model**2 / rates.flops_per_s
    return (mli_seconds_per_sample(row) - products_s) * rates.bytes_per_s


def _print_unexplained(rows: list[Row]) -> None:
    print("\nnotebook blocks: time per sample beyond the dense products, as MB at its bandwidth:")
    for workload, members in _groups([r for r in rows if r.study in NOTEBOOK_STUDIES]).items():
        cells = ", ".join(f"{r.gpu} {unexplained_traffic_bytes(r) / 1e6:.0f}" for r in members)
        print(f"  {workload[0]:<11}{workload[1]:<27}{cells}")


def _print_absolute(rows: list[Row]) -> None:
    print("\nnotebook blocks: measured time per sample over the model's (absolute, not relative):")
    for workload, members in _groups([r for r in rows if r.study in NOTEBOOK_STUDIES]).items():
        ratios = [(r.gpu, mli_seconds_per_sample(r) * r.predicted()) for r in members]
        cells = ", ".join(f"{gpu} {ratio:.2f}" for gpu, ratio in ratios)
        print(f"  {workload[0]:<11}{workload[1]:<27}{cells}")


@dataclass(frozen=True, kw_only=True, slots=True)
class AttentionRow:
    """One timing of PyTorch's eager attention forward (data/a100_eager_attention.csv)."""

    batch_heads: int
    seq_len: int
    head_dim: int
    measured_s: float


def load_attention_rows() -> list[AttentionRow]:
    lines = [line for line in EAGER_ATTENTION.read_text().splitlines() if not line.startswith("#")]
    return [
        AttentionRow(
            batch_heads=int(r["batch_heads"]),
            seq_len=int(r["seq_len"]),
            head_dim=int(r["head_dim"]),
            measured_s=float(r["measured_us"]) * 1e-6,
        )
        for r in csv.DictReader(lines)
    ]


def eager_attention_forward_s(row: AttentionRow, rates: Rates) -> float:
    """The roofline of the timed reference, as :mod:`scheduler.cost.roofline` prices the
    ``math`` attention: its two products at the GEMM rate plus, at the streaming bandwidth, the
    16-bit elements its kernels move: q scaled (read, written), q and k read and the score
    matrix written by the first product, the score matrix read and written by the softmax, and
    read with v by the second product, which writes the output."""
    n, s, d = row.batch_heads, row.seq_len, row.head_dim
    head, scores = n * s * d, n * s * s
    elements = 2 * head + (2 * head + scores) + 2 * scores + (scores + 2 * head)
    return 2 * 2 * n * s * s * d / rates.flops_per_s + BYTES_16BIT * elements / rates.bytes_per_s


def _summary(errors: list[float]) -> str:
    return f"median |error| {statistics.median(errors):.1%}, worst {max(errors):.1%}"


def _print_cases(title: str, cases: list[Case]) -> None:
    print(f"\n{title}")
    print(f"{'study':<11}{'workload':<27}{'gpu':<17}{'measured':>9}{'analytic':>10}{'error':>8}")
    for c in cases:
        r = c.row
        print(
            f"{r.study:<11}{r.workload:<27}{r.gpu:<17}{c.measured_rel:>9.2f}"
            f"{c.predicted_rel:>10.2f}{c.error:>+8.0%}"
        )
    print(_summary([abs(c.error) for c in cases]))


def _print_pairs(title: str, pairs: list[tuple[Row, Row, float]], worst: int = 6) -> None:
    print(f"\n{title}: {len(pairs)} pairs, {_summary([e for *_, e in pairs])}; worst pairs:")
    for x, y, error in sorted(pairs, key=lambda p: -p[2])[:worst]:
        measured, predicted = x.measured / y.measured, x.predicted() / y.predicted()
        print(
            f"  {x.study:<11}{x.workload:<27}{x.gpu + ' / ' + y.gpu:<34}"
            f"measured {measured:.2f} analytic {predicted:.2f} ({error:.0%})"
        )


def test_every_row_is_sourced_and_known() -> None:
    """Fast check of the data files: every row names a source, a catalogue GPU and a
    workload, every group has at least two GPUs to compare, and the A100 attention timings
    hold the sequence-512 shape they are read for."""
    rows = load_rows()
    assert rows
    for r in rows:
        assert r.source and r.role in {"fitted", "held_out"}, r
        lookup(r.gpu)
        assert r.workload in WORKLOADS, r
        assert (r.micro_batch == 0) == (WORKLOADS[r.workload].kind == "matmul"), r
    assert all(len({r.gpu for r in g}) >= 2 for g in _groups(rows).values())
    assert any(r.seq_len == 512 and r.measured_s > 0 for r in load_attention_rows())


@pytest.mark.benchmark
def test_analytic_relative_speeds_match_published_measurements() -> None:
    """Prints every table; asserts issue 20's targets on all held-out cases."""
    rows = load_rows()
    fitted = [r for r in rows if r.role == "fitted"]
    held_out = [r for r in rows if r.role == "held_out"]
    _print_cases(
        "fitted rows (model inputs), against the group's geometric mean", against_geomean(fitted)
    )
    cases = against_geomean(held_out)
    _print_cases("held-out rows, against the group's geometric mean", cases)
    for study in sorted({r.study for r in held_out}):
        errors = [abs(c.error) for c in cases if c.row.study == study]
        print(f"  {study}: {_summary(errors)}")
    _print_pairs("held-out, every pair within a group", pair_errors(held_out))
    _print_cross_study(held_out)
    _print_unexplained(held_out)
    _print_absolute(held_out)
    reference = against_reference(held_out)
    print(f"\nheld-out, against the {REFERENCE}: {_summary([abs(c.error) for c in reference])}")
    assert statistics.median(abs(c.error) for c in cases) < MEDIAN_TARGET


def _known_miss(study: str, reason: str) -> object:
    """A study that misses the targets for the reason given: a strict xfail, so that
    meeting them shows (and the reason is then rewritten)."""
    return pytest.param(study, id=study, marks=pytest.mark.xfail(strict=True, reason=reason))


STUDIES = [
    pytest.param("lambda", id="lambda"),
    pytest.param("mli-pt2", id="mli-pt2"),
    pytest.param("ryanli", id="ryanli"),
    _known_miss(
        "zorse",
        "Cephalo's/Zorse's layer profiles: the T4's GPT-6.7b entry is no faster than its fp32 "
        "one (+177 %), the 400 W H100 NVL runs at about 0.8x the model's rate (+22 to +29 %), "
        "and the L4 runs the eager GPT blocks slower than its measured GEMM rate gives "
        "(+21 %, +32 %): no public figure of what slows them was found (module docstring)",
    ),
    _known_miss(
        "zorse-fp32",
        "the same profiles' fp32 layers (median 13 %, worst 33 %, 8 over 25 %): no fp32 "
        "GEMM figure of the P40 (+22 to +30 %, at the HBM P100s' share of peak), the L40S "
        "(+12 to +24 %, at the RTX 4090's) or the 70 W T4 (-18 to -28 %, at the capped L4's "
        "and A2000's) by the catalogue's rule (module docstring)",
    ),
    _known_miss(
        "mli",
        "mli's A100 at sequence 512 (GPT-2, T5: +52 %) takes 2.0x the model's time "
        "per sample where the GDDR cards take 1.1-1.3x, and an A800 (the same GA100) on "
        "the same notebook and PyTorch release takes 1.4x and fits the model within 5 % "
        "(study ryanli): that run of the A100 is slow, for a reason it does not record "
        "(module docstring)",
    ),
]


@pytest.mark.benchmark
@pytest.mark.parametrize("study", STUDIES)
def test_each_study_meets_the_targets(study: str) -> None:
    """Issue 20's targets per study (one software stack each), on held-out cases."""
    rows = [r for r in load_rows() if r.role == "held_out" and r.study == study]
    errors = [abs(c.error) for c in against_geomean(rows)]
    assert statistics.median(errors) < MEDIAN_TARGET, _summary(errors)
    assert max(errors) < WORST_TARGET, _summary(errors)


@pytest.mark.benchmark
def test_a100_rates_price_a_second_public_a100_timing_of_eager_attention() -> None:
    """The A100's catalogue rates against xformers' A100 timing of PyTorch's eager attention
    (tests/benchmarks/data/a100_eager_attention.csv), on either SXM4 part: at sequence 512,
    the shape of the mli study's A100 outliers, within issue 20's 25 %. An A100 of that
    software streams the score matrices of eager attention at its measured rates, so what
    the mli A100 rows miss lies in the rest of those layers (module docstring). Sequence 128
    is printed, not asserted: its kernels take about 50 us each, where the fixed cost per
    launch that the roofline leaves out is a large share."""
    print("\nxformers' A100, eager attention forward: measured / analytic time")
    errors = []
    for row in load_attention_rows():
        cells = []
        for key in A100_SXM4:
            error = row.measured_s / eager_attention_forward_s(row, Rates.of(lookup(key))) - 1
            cells.append(f"{key} {error:+.0%}")
            if row.seq_len == 512:
                errors.append(abs(error))
        print(
            f"  {row.batch_heads} x {row.seq_len} x {row.head_dim}: "
            f"{row.measured_s * 1e6:.0f} us, " + ", ".join(cells)
        )
    assert errors and max(errors) < WORST_TARGET, _summary(errors)
