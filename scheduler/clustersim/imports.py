"""Public job traces as hetsched traces: Gavel's physical-cluster traces and Sia's workloads.

Each job of a published trace becomes a transformer job that takes as long, on the
GPUs it asked for of the type it was recorded on, as the original did (under
hetsched's cost model, :class:`~scheduler.policy.rates.PlannedRates`):

1. The original duration ``D`` (seconds) and GPU count ``n`` come from the trace
   (how, per format, below).
2. The model is picked by the job's size class in GPU-hours ``n·D/3600``, the classes
   Sia's workload generator uses (< 1, 1–10, 10–100, >= 100 GPU-hours;
   ``sia-simulator/utils/generate_workload.py`` in github.com/siasosp23/artifacts):
   ``gpt2-small``, ``gpt2-medium``, ``gpt2-large``, ``gpt2-xl``. When that preset
   does not fit the original GPU (a K80 or an RTX 2080 Ti holds no ``gpt2-large``),
   the largest smaller preset that fits stands in.
3. The global batch is :data:`PER_DEVICE_BATCH` samples per device times ``n``.
4. Steps = ``D`` × (samples/s of that model and batch on ``n`` devices of the original
   type, one node when they fit on one of :data:`NODE_SIZE`) / batch, rounded: replaying
   the job alone on those devices takes ``D`` again, within half a step (the round
   trip test checks it, and 1% for jobs of 50 steps or more).

Formats:

- ``gavel``: a ``.trace`` file of Gavel's ``scheduler/traces/`` (github.com/
  stanford-futuredata/gavel; Narayanan et al., OSDI'20): one job a line, tab-separated,
  in one of the four layouts Gavel wrote over its history, told apart by field count
  (:data:`GAVEL_LAYOUTS`; each as Gavel's own ``parse_trace`` of that time reads it):

  - 10 fields (the physical-cluster traces, ``traces/physical_cluster/``): job type,
    command, working directory, steps argument, needs-data-dir flag, total steps, scale
    factor (GPUs), priority weight, SLO, arrival time (s).
  - 9 fields: job type, command, steps argument, needs-data-dir flag, total steps, scale
    factor, priority weight, SLO, arrival time (``scheduler/utils.py: parse_trace`` at
    commits 52d9895abb4c and 05786c3cab2d).
  - 7 fields (the MSR-derived ``traces/msr/seed=N/*.trace``): job type, command, steps
    argument, needs-data-dir flag, total steps, arrival time, scale factor; priority 1
    (``scheduler/utils.py: parse_trace`` at commit ace90a38988f, the commit that wrote
    ``traces/msr/seed=0/925e2b.trace``). Gavel skips a line of scale factor 0, and so
    does this reader.
  - 6 fields (``traces/generated/``, e.g. ``microbenchmark/arrival_rate_1.trace``): job
    type, command, steps argument, total steps, arrival time, scale factor; priority 1
    (``scheduler/emulate_scheduler_with_trace.py: parse_trace`` at commit 0a6434dc4431).

  Durations are ``total_steps / (scale_factor × steps/s on one V100)`` (linear scaling
  across GPUs assumed), with the one-V100 isolated throughputs Gavel itself used:
  :data:`GAVEL_V100_STEPS_PER_S` for job types with a batch size (and ``A3C``,
  ``CycleGAN``), :data:`GAVEL_BARE_V100_STEPS_PER_S` for the bare job types (``LM``,
  ``ResNet-50``, ...) of the 6-field traces. A job type in neither is a one-line error.
  Jobs are rigid (Gavel does not resize them): ``min_devices = max_devices = scale
  factor``; the original GPU is a ``V100-16GB``.
- ``sia``: a workload CSV of Sia's artifact (``sia-simulator/workloads/{philly,saturn,
  newtrace}/``; Jayaram Subramanya et al., SOSP'23), columns ``name, time,
  application, num_replicas, batch_size`` and optionally ``category``. The CSV has no
  duration: Sia's generator picks the application by the source job's GPU-time class
  (``cifar10`` < 1 GPU-hour, ``deepspeech2``/``bert`` 1–10, ``yolov3`` 10–100,
  ``imagenet`` >= 100), so each job gets its class's log-midpoint
  (:data:`SIA_GPU_HOURS`) spread over ``num_replicas`` RTX 2080 Ti (Sia's base GPU
  type, ``rtx``). Jobs are adaptive up to their ``num_replicas`` (``min_devices`` 1),
  or rigid where ``category`` says ``rigid``.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from scheduler.clustersim.trace import TraceError, TraceJob, parse_trace, read_trace
from scheduler.hardware.cluster import parse_cluster
from scheduler.policy.configs import ClusterClasses
from scheduler.policy.rates import Config, PlannedRates

TraceFormat = Literal["csv", "gavel", "sia"]
TRACE_FORMATS: tuple[TraceFormat, ...] = ("csv", "gavel", "sia")

SIZE_CLASSES: tuple[tuple[float, str], ...] = (
    (1.0, "gpt2-small"),
    (10.0, "gpt2-medium"),
    (100.0, "gpt2-large"),
    (math.inf, "gpt2-xl"),
)
"""(GPU-hours below which, preset): Sia's generator's size classes."""
PER_DEVICE_BATCH = {"gpt2-small": 16, "gpt2-medium": 8, "gpt2-large": 4, "gpt2-xl": 4}
NODE_SIZE = 8
"""GPUs per node of the original cluster (Sia's generator: ``NGPUS_PER_NODE = 8``)."""

GAVEL_GPU = "V100-16GB"
GAVEL_V100_STEPS_PER_S = {
    "ResNet-18 (batch size 16)": 77.31737353972872,
    "ResNet-18 (batch size 32)": 65.80540708735272,
    "ResNet-18 (batch size 64)": 48.88418054077558,
    "ResNet-18 (batch size 128)": 30.287504836881368,
    "ResNet-18 (batch size 256)": 16.98737109878475,
    "ResNet-50 (batch size 16)": 17.37438936466519,
    "ResNet-50 (batch size 32)": 9.920583420101398,
    "ResNet-50 (batch size 64)": 5.4575999796347645,
    "ResNet-50 (batch size 128)": 2.8459812117650305,
    "Transformer (batch size 16)": 12.845652425203205,
    "Transformer (batch size 32)": 12.475277737306772,
    "Transformer (batch size 64)": 9.568023720783357,
    "Transformer (batch size 128)": 5.771210833383417,
    "Transformer (batch size 256)": 1.707029875260509,
    "A3C": 8.233033211429207,
    "LM (batch size 5)": 167.12285773375763,
    "LM (batch size 10)": 143.3605131584025,
    "LM (batch size 20)": 107.9508715706423,
    "LM (batch size 40)": 71.72303675816012,
    "LM (batch size 80)": 43.90361072741378,
    "Recommendation (batch size 512)": 0.33148208257478157,
    "Recommendation (batch size 1024)": 0.47997973329981225,
    "Recommendation (batch size 2048)": 0.5675318418131742,
    "Recommendation (batch size 4096)": 0.6244083613498694,
    "Recommendation (batch size 8192)": 0.6023546957515021,
    "CycleGAN": 4.918494739402234,
}
"""Isolated steps/s on one V100: every ``"null"`` entry under ``"v100"`` of Gavel's
``scheduler/oracle_throughputs.json`` at commit 19b15c0a0d5f, as written there."""

GAVEL_BARE_V100_STEPS_PER_S = {
    "ResNet-18": 46.81725852189685,
    "ResNet-50": 1.3768704198194044,
    "Transformer": 8.741806494725642,
    "LM": 96.24638978858054,
    "Recommendation": 0.43019487158826614,
    "A3C": 7.237954214304961,
    "CycleGAN": 3.675618512816215,
}
"""The same for the bare job types of Gavel's early (6-field) traces: the ``"null"``
entries under ``"v100"`` of ``scheduler/combined_throughputs.json`` at commit
474a31a26c9f, the file Gavel's sweeps over those traces read
(``scheduler/run_throughput_vs_latency_lambda_sweep.py`` at commit 0287b5315d16)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class GavelLayout:
    """Which field (0-based) of a line holds what, in one of Gavel's trace layouts, and
    how Gavel's reader of that layout treated it."""

    total_steps: int
    scale_factor: int
    arrival_time: int
    priority_weight: int | None = None
    """None: the layout has no priority; every job gets 1."""
    skips_zero_scale: bool = False
    """Gavel's reader of this layout drops a line whose scale factor is 0."""
    bare_job_types: bool = False
    """The layout's traces name job types without a batch size, so their throughputs
    are :data:`GAVEL_BARE_V100_STEPS_PER_S` (tried first; the other table after)."""

    def steps_per_s(self, job_type: str) -> float | None:
        """One-V100 steps/s of ``job_type``; None where Gavel published none."""
        first, then = GAVEL_V100_STEPS_PER_S, GAVEL_BARE_V100_STEPS_PER_S
        if self.bare_job_types:
            first, then = then, first
        return first.get(job_type, then.get(job_type))


GAVEL_LAYOUTS = {
    10: GavelLayout(total_steps=5, scale_factor=6, arrival_time=9, priority_weight=7),
    9: GavelLayout(total_steps=4, scale_factor=5, arrival_time=8, priority_weight=6),
    7: GavelLayout(total_steps=4, scale_factor=6, arrival_time=5, skips_zero_scale=True),
    6: GavelLayout(total_steps=3, scale_factor=5, arrival_time=4, bare_job_types=True),
}
"""Field count -> layout (the module docstring cites each)."""

SIA_GPU = "RTX2080TI-11GB"
SIA_GPU_HOURS = {
    "cifar10": 0.13,  # sqrt(1/60 * 1): the generator drops jobs under a minute
    "deepspeech2": 3.2,
    "bert": 3.2,
    "yolov3": 32.0,
    "imagenet": 320.0,
}
"""GPU-hours per Sia application: the log-midpoint of the class it stands for."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OriginalJob:
    """A job as a public trace records it, before conversion."""

    name: str
    arrival_s: float
    duration_s: float
    num_devices: int
    gpu_type: str
    priority: float = 1.0
    rigid: bool = False


def reference_config(gpu_type: str, num_devices: int) -> Config:
    """``num_devices`` GPUs of ``gpu_type`` as the original cluster held them: nodes of
    :data:`NODE_SIZE`, one node when they fit on one."""
    nodes = [
        {"name": f"n{i}", "devices": [{"type": gpu_type, "count": min(NODE_SIZE, left)}]}
        for i, left in enumerate(range(num_devices, 0, -NODE_SIZE))
    ]
    classes = ClusterClasses.of(parse_cluster({"name": "original", "nodes": nodes}))
    (device_class,) = classes.ids
    return classes.config({device_class: num_devices})


def convert(job: OriginalJob, rates: PlannedRates) -> TraceJob:
    """The transformer job of the same duration (the module docstring says how)."""
    n = job.num_devices
    config = reference_config(job.gpu_type, n)
    gpu_hours = job.duration_s * n / 3600
    wanted = next(i for i, (below, _) in enumerate(SIZE_CLASSES) if gpu_hours < below)
    for _, model in reversed(SIZE_CLASSES[: wanted + 1]):
        batch = PER_DEVICE_BATCH[model] * n
        rate = rates(model=model, global_batch=batch, config=config)
        if rate > 0:
            break
    else:
        raise TraceError(
            f"trace job {job.name!r}: no preset fits {n} x {job.gpu_type}, its original GPUs"
        )
    return TraceJob(
        name=job.name,
        arrival_s=round(job.arrival_s, 3),
        model=model,
        global_batch=batch,
        steps=max(1, round(job.duration_s * rate / batch)),
        priority=job.priority,
        min_devices=n if job.rigid else 1,
        max_devices=n,
    )


def original_duration_s(job: TraceJob, gpu_type: str, rates: PlannedRates) -> float:
    """How long ``job`` takes alone on its ``max_devices`` GPUs of ``gpu_type``: the
    inverse of :func:`convert`."""
    n = job.max_devices or 1
    rate = rates(
        model=job.model, global_batch=job.global_batch, config=reference_config(gpu_type, n)
    )
    return job.steps * job.global_batch / rate


def parse_gavel(text: str) -> list[OriginalJob]:
    """Jobs of a Gavel ``.trace`` document in any of :data:`GAVEL_LAYOUTS` (format in the
    module docstring); lines may mix layouts, each is told by its own field count."""
    jobs: list[OriginalJob] = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        job = _gavel_job(line.split("\t"), where=f"gavel trace line {line_no}", index=len(jobs))
        if job is not None:
            jobs.append(job)
    if not jobs:
        raise TraceError("gavel trace: no jobs")
    return jobs


def _gavel_job(fields: list[str], *, where: str, index: int) -> OriginalJob | None:
    """One line's job, or None where Gavel's reader of its layout skips the line."""
    layout = GAVEL_LAYOUTS.get(len(fields))
    if layout is None:
        counts = sorted(GAVEL_LAYOUTS)
        allowed = ", ".join(str(n) for n in counts[:-1]) + f" or {counts[-1]}"
        raise TraceError(f"{where}: {len(fields)} tab-separated fields, a Gavel job has {allowed}")
    if layout.skips_zero_scale and fields[layout.scale_factor].strip() == "0":
        return None
    job_type = fields[0].strip()
    steps_per_s = layout.steps_per_s(job_type)
    if steps_per_s is None:
        raise TraceError(
            f"{where}, job type: {job_type!r} has no V100 throughput in Gavel's published "
            f"files; known: {', '.join([*GAVEL_V100_STEPS_PER_S, *GAVEL_BARE_V100_STEPS_PER_S])}"
        )
    total_steps = _field(where, "total steps", fields[layout.total_steps], integer=True)
    scale = int(_field(where, "scale factor", fields[layout.scale_factor], integer=True))
    arrival_s = _field(where, "arrival time", fields[layout.arrival_time], integer=False, minimum=0)
    priority = 1.0
    if layout.priority_weight is not None:
        priority = _field(where, "priority weight", fields[layout.priority_weight], integer=False)
    return OriginalJob(
        name=f"gavel-{index:04d}",
        arrival_s=arrival_s,
        duration_s=total_steps / (scale * steps_per_s),
        num_devices=scale,
        gpu_type=GAVEL_GPU,
        priority=priority,
        rigid=True,
    )


def parse_sia(text: str) -> list[OriginalJob]:
    """Jobs of a Sia workload CSV (format in the module docstring)."""
    reader = csv.DictReader(io.StringIO(text))
    need = ("name", "time", "application", "num_replicas")
    missing = [c for c in need if c not in (reader.fieldnames or [])]
    if missing:
        raise TraceError(
            f"sia trace row 1: column {missing[0]} is missing; needs {', '.join(need)}"
        )
    jobs: list[OriginalJob] = []
    for row in reader:
        where = f"sia trace row {reader.line_num}"
        app = (row.get("application") or "").strip()
        if app not in SIA_GPU_HOURS:
            raise TraceError(
                f"{where}, column application: unknown {app!r}; known: {', '.join(SIA_GPU_HOURS)}"
            )
        n = int(_field(where, "column num_replicas", row["num_replicas"] or "", integer=True))
        jobs.append(
            OriginalJob(
                name=(row.get("name") or "").strip() or f"sia-{len(jobs)}",
                arrival_s=_field(where, "column time", row["time"] or "", integer=False, minimum=0),
                duration_s=SIA_GPU_HOURS[app] * 3600 / n,
                num_devices=n,
                gpu_type=SIA_GPU,
                rigid=(row.get("category") or "").strip() == "rigid",
            )
        )
    if not jobs:
        raise TraceError("sia trace: no jobs")
    return jobs


def _field(where: str, what: str, text: str, *, integer: bool, minimum: float = 1) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < minimum or (integer and value != int(value)):
        kind = "an integer" if integer else "a number"
        raise TraceError(f"{where}, {what}: must be {kind} >= {minimum:g}, got {text.strip()!r}")
    return value


def import_trace(text: str, trace_format: TraceFormat) -> list[TraceJob]:
    """A trace document of ``trace_format`` as hetsched jobs, sorted by arrival."""
    if trace_format == "csv":
        try:
            return parse_trace(text)
        except TraceError:
            if (guess := _looks_like(text)) is None:
                raise
            public, why = guess
            raise TraceError(
                f"trace: not hetsched's CSV but, by its {why}, a {public} trace: "
                f"add --trace-format {public}"
            ) from None
    originals = parse_gavel(text) if trace_format == "gavel" else parse_sia(text)
    rates = PlannedRates()
    return sorted((convert(j, rates) for j in originals), key=lambda j: j.arrival_s)


def _looks_like(text: str) -> tuple[TraceFormat, str] | None:
    """The public format a trace that is not hetsched's CSV seems to be in, and why: Gavel's
    rows are tab-separated, Sia's header names ``application`` and ``num_replicas``."""
    first = text.partition("\n")[0]  # read_trace has dropped any byte-order mark
    if "\t" in first:
        return "gavel", "tab-separated rows"
    columns = {c.strip() for c in first.split(",")}
    if {"application", "num_replicas"} <= columns:
        return "sia", "columns application and num_replicas"
    return None


def load_any(path: str | Path, trace_format: TraceFormat) -> list[TraceJob]:
    if trace_format not in TRACE_FORMATS:
        raise TraceError(
            f"--trace-format: unknown {trace_format!r}; allowed: {', '.join(TRACE_FORMATS)}"
        )
    return import_trace(read_trace(path), trace_format)
