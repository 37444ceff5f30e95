"""Analytic relative speeds against published per-GPU measurements.

The planner splits work by the ratio of device speeds, so what matters is each
GPU's speed relative to a reference GPU on the same workload. Every row of
tests/benchmarks/data/speed_measurements.csv is a published measurement with its
source; ``fitted`` rows are inputs of the model (the catalogue's measured GEMM
rates and bandwidths come from them), ``held_out`` rows are used nowhere but
here. The benchmark prints analytic vs measured speed relative to the A100 per
(workload, GPU), fitted and held-out rows apart, with the median and worst
error of each, and the held-out rows once more against the geometric mean of the GPUs
measured on each workload (for information: the reference's own error otherwise enters
every row). What the tables show (issue 20): on the sequence-512 layers (GPT-2, T5) every
card but the A100 is within 17 % of the model against the geometric mean, while the A100
measures 48 % slower than modelled; its time beyond the model's is about twice the other
cards' (26 ms against 11-20 ms per step at batch 64), which neither its GEMM rate nor its
bandwidth explains, so against the A100 every row reads 34-44 % off. Run on purpose:

    .venv/bin/python -m pytest -m benchmark -s tests/benchmarks/test_speed_fidelity.py
"""

from __future__ import annotations

import csv
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import pytest

from scheduler.cost.roofline import Rates, block_time, sustained_gemm_tflops
from scheduler.hardware.catalogue import lookup
from scheduler.models.presets import ModelPreset

DATA = Path(__file__).parent / "data" / "speed_measurements.csv"
REFERENCE = "A100-80GB"
MEDIAN_TARGET = 0.10
WORST_TARGET = 0.25
"""Issue 20's targets on held-out rows: median error under 10 %, none over 25 %."""


def _block(name: str, *, seq_len: int, d_ff: int = 4096) -> ModelPreset:
    """One 1024-wide, 16-head transformer block with the ``math`` attention kernel
    (what the Hugging Face layers measured run)."""
    return ModelPreset(
        name=name,
        family="gpt",
        num_layers=1,
        d_model=1024,
        num_heads=16,
        d_ff=d_ff,
        vocab_size=1,
        seq_len=seq_len,
        attention="math",
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    model: ModelPreset
    micro_batch: int
    """The batch at which the source's best figure was measured."""

    def source_flops(self) -> float:
        """Forward + backward FLOPs as the source counts them (micro_bench.ipynb):
        3 × (16·b·s·h² + 4·b·h·s² + 8·b·s·h²)."""
        b, s, h = self.micro_batch, self.model.seq_len, self.model.d_model
        return 3.0 * (16 * b * s * h * h + 4 * b * h * s * s + 8 * b * s * h * h)

    def predicted_tflops(self, gpu_key: str) -> float:
        piece = block_time(self.model, Rates.of(lookup(gpu_key)))
        seconds = piece.fixed_s + self.micro_batch * piece.per_sample_s
        return self.source_flops() / seconds / 1e12


WORKLOADS = {
    # bert-large-uncased layer, best at sequence 128, batch 128
    "bert-large-layer": Workload(model=_block("bert-large-layer", seq_len=128), micro_batch=128),
    # gpt2-medium block, best at sequence 512, batch 64
    "gpt2-medium-block": Workload(model=_block("gpt2-medium-block", seq_len=512), micro_batch=64),
    # t5-large encoder block (d_ff 4096), sequence 512, best at batch 64
    "t5-large-encoder-block": Workload(
        model=_block("t5-large-encoder-block", seq_len=512), micro_batch=64
    ),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    workload: str
    gpu: str
    measured_tflops: float
    role: str
    source: str


def load_rows() -> list[Row]:
    lines = [line for line in DATA.read_text().splitlines() if not line.startswith("#")]
    return [
        Row(
            workload=r["workload"],
            gpu=r["gpu"],
            measured_tflops=float(r["measured_tflops"]),
            role=r["role"],
            source=r["source"],
        )
        for r in csv.DictReader(lines)
    ]


def predicted_tflops(workload: str, gpu: str) -> float:
    if workload.startswith("matmul"):
        return sustained_gemm_tflops(lookup(gpu))
    return WORKLOADS[workload].predicted_tflops(gpu)


def relative_errors(rows: list[Row]) -> list[tuple[Row, float, float, float]]:
    """``(row, measured relative, predicted relative, error)`` against the reference GPU
    on the same workload; the reference rows themselves are 1 by definition and left out."""
    measured = {(r.workload, r.gpu): r.measured_tflops for r in rows}
    out = []
    for r in rows:
        if r.gpu == REFERENCE:
            continue
        measured_rel = r.measured_tflops / measured[(r.workload, REFERENCE)]
        predicted_rel = predicted_tflops(r.workload, r.gpu) / predicted_tflops(
            r.workload, REFERENCE
        )
        out.append((r, measured_rel, predicted_rel, predicted_rel / measured_rel - 1))
    return out


def relative_to_geomean(rows: list[Row]) -> list[tuple[Row, float, float, float]]:
    """As :func:`relative_errors`, against the geometric mean of every GPU measured on the
    workload instead of one reference GPU: a planner only uses ratios between devices,
    and one reference's own error otherwise enters every row of its workload."""
    by_workload: dict[str, list[Row]] = {}
    for r in rows:
        by_workload.setdefault(r.workload, []).append(r)
    out = []
    for workload, members in by_workload.items():
        measured = [r.measured_tflops for r in members]
        predicted = [predicted_tflops(workload, r.gpu) for r in members]
        measured_mean, predicted_mean = _geomean(measured), _geomean(predicted)
        for r, m, p in zip(members, measured, predicted, strict=True):
            measured_rel, predicted_rel = m / measured_mean, p / predicted_mean
            out.append((r, measured_rel, predicted_rel, predicted_rel / measured_rel - 1))
    return out


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _print_table(
    title: str, results: list[tuple[Row, float, float, float]], against: str = REFERENCE
) -> None:
    print(f"\n{title}: speed relative to {against}")
    print(f"{'workload':<24}{'gpu':<16}{'measured':>9}{'analytic':>10}{'error':>8}")
    for row, measured_rel, predicted_rel, error in results:
        print(
            f"{row.workload:<24}{row.gpu:<16}{measured_rel:>9.2f}{predicted_rel:>10.2f}"
            f"{error:>+8.0%}"
        )
    errors = [abs(e) for *_, e in results]
    print(f"median |error| {statistics.median(errors):.1%}, worst {max(errors):.1%}")


def test_every_row_is_sourced_and_known() -> None:
    """Fast check of the data file: every row names a source and a catalogue GPU."""
    rows = load_rows()
    assert rows
    for r in rows:
        assert r.source and r.role in {"fitted", "held_out"}, r
        lookup(r.gpu)
        assert r.workload.startswith("matmul") or r.workload in WORKLOADS, r


@pytest.mark.benchmark
def test_analytic_relative_speeds_match_published_measurements() -> None:
    rows = load_rows()
    fitted = relative_errors([r for r in rows if r.role == "fitted"])
    held_out = relative_errors([r for r in rows if r.role == "held_out"])
    _print_table("fitted rows (model inputs)", fitted)
    _print_table("held-out rows (not used by the model)", held_out)
    _print_table(
        "held-out rows, for information",
        relative_to_geomean([r for r in rows if r.role == "held_out"]),
        against="the geometric mean of the GPUs measured on the workload",
    )
    errors = [abs(e) for *_, e in held_out]
    assert statistics.median(errors) < MEDIAN_TARGET
    assert max(errors) < WORST_TARGET
