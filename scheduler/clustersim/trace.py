"""Job traces for the cluster simulator: the CSV format, its reader, and a generator.

The format is documented on :func:`parse_trace`, the generated mix on
:func:`generate_trace`.
"""

from __future__ import annotations

import csv
import io
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from scheduler.errors import HetschedError, SpecError
from scheduler.hardware.gpu_names import resolve_type
from scheduler.models.presets import PRESETS
from scheduler.policy.rates import Config, DeviceClass, PlannedRates

K = TypeVar("K")

REQUIRED = ("name", "arrival_s", "model", "global_batch", "steps")
OPTIONAL = ("priority", "min_devices", "max_devices", "restart_s", "device_types")
COLUMNS = (*REQUIRED, *OPTIONAL)


class TraceError(HetschedError):
    """A trace file is unreadable or a row is invalid."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TraceJob:
    name: str
    arrival_s: float
    model: str
    global_batch: int
    steps: int
    priority: float = 1.0
    min_devices: int = 1
    max_devices: int | None = None
    restart_s: float | None = None
    """Seconds a restart of this job costs (checkpoint, restart, restore); ``None``: the
    replay's ``reallocation_s``."""
    device_types: tuple[str, ...] | None = None
    """Catalogue types it may run on; ``None``: any."""

    def to_row(self) -> dict[str, str]:
        return {
            "name": self.name,
            "arrival_s": f"{self.arrival_s:g}",
            "model": self.model,
            "global_batch": str(self.global_batch),
            "steps": str(self.steps),
            "priority": f"{self.priority:g}",
            "min_devices": str(self.min_devices),
            "max_devices": "" if self.max_devices is None else str(self.max_devices),
            "restart_s": "" if self.restart_s is None else f"{self.restart_s:g}",
            "device_types": "|".join(self.device_types or ()),
        }


def _cell(row: dict[str, str | None], column: str) -> str:
    return (row.get(column) or "").strip()


def _number(where: str, text: str, *, integer: bool, minimum: float, strict: bool = False) -> float:
    kind = "an integer" if integer else "a number"
    bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        raise TraceError(f"{where}: must be {kind} {bound}, got {text!r}") from None
    if not math.isfinite(value) or value < minimum or (strict and value <= minimum):
        raise TraceError(f"{where}: must be {kind} {bound}, got {text!r}")
    return value


def _device_types(where: str, text: str) -> tuple[str, ...] | None:
    """``A100-40GB|T4-16GB`` as canonical catalogue keys (any name
    :func:`~scheduler.hardware.gpu_names.resolve_type` reads); empty: any type."""
    if not text:
        return None
    out = []
    for name in (t.strip() for t in text.split("|")):
        try:
            out.append(resolve_type(name).key)
        except SpecError as exc:
            raise TraceError(f"{where}: {exc}; separate types with '|'") from None
    return tuple(dict.fromkeys(out))


def _job(row: dict[str, str | None], line: int) -> TraceJob:
    def where(column: str) -> str:
        return f"trace row {line}, column {column}"

    for column in REQUIRED:
        if not _cell(row, column):
            raise TraceError(f"{where(column)}: required, got an empty cell")
    model = _cell(row, "model").lower()
    if model not in PRESETS:
        raise TraceError(f"{where('model')}: unknown preset {model!r}; known: {', '.join(PRESETS)}")
    priority = _cell(row, "priority")
    min_devices = _cell(row, "min_devices")
    max_devices = _cell(row, "max_devices")
    restart = _cell(row, "restart_s")
    job = TraceJob(
        name=_cell(row, "name"),
        arrival_s=_number(where("arrival_s"), _cell(row, "arrival_s"), integer=False, minimum=0),
        model=model,
        global_batch=int(
            _number(where("global_batch"), _cell(row, "global_batch"), integer=True, minimum=1)
        ),
        steps=int(_number(where("steps"), _cell(row, "steps"), integer=True, minimum=1)),
        priority=_number(where("priority"), priority, integer=False, minimum=0, strict=True)
        if priority
        else 1.0,
        min_devices=int(_number(where("min_devices"), min_devices, integer=True, minimum=1))
        if min_devices
        else 1,
        max_devices=int(_number(where("max_devices"), max_devices, integer=True, minimum=1))
        if max_devices
        else None,
        restart_s=_number(where("restart_s"), restart, integer=False, minimum=0)
        if restart
        else None,
        device_types=_device_types(where("device_types"), _cell(row, "device_types")),
    )
    if job.max_devices is not None and job.max_devices < job.min_devices:
        raise TraceError(
            f"{where('max_devices')}: {job.max_devices} is below min_devices {job.min_devices}"
        )
    return job


def parse_trace(text: str) -> list[TraceJob]:
    """Jobs of a trace document, sorted by arrival (ties keep file order).

    Format: CSV with a header row. Required columns, in any order:

    - ``name``: unique job name;
    - ``arrival_s``: submission time in seconds from the start of the trace (>= 0);
    - ``model``: a model preset (``hetsched plan --help`` lists them);
    - ``global_batch``: samples per step (>= 1);
    - ``steps``: training steps to run (>= 1).

    Optional columns (an empty cell takes the default):

    - ``priority``: weight > 0, default 1;
    - ``min_devices``: the job waits rather than run on fewer, default 1;
    - ``max_devices``: never more than this; empty: as many as help;
    - ``restart_s``: seconds one restart of this job costs (checkpoint, restart on new
      devices, restore); empty: the replay's ``--reallocation-s``;
    - ``device_types``: catalogue types it may run on, separated by ``|``
      (``A100-40GB|V100-32GB``); empty: any.

    Example::

        name,arrival_s,model,global_batch,steps,priority,min_devices,max_devices
        bert-ish,0,gpt2-small,64,2000,,,4
        big,120,gpt2-xl,32,500,2,2,8

    Every error names the row (as a spreadsheet numbers it, the header being row
    1), the column and what is allowed.
    """
    reader = csv.DictReader(io.StringIO(text))
    header = [h.strip() for h in reader.fieldnames or []]
    if not header:
        raise TraceError(f"trace: empty; the header row needs {', '.join(REQUIRED)}")
    reader.fieldnames = header
    for column in header:
        if column not in COLUMNS:
            raise TraceError(
                f"trace row 1, column {column}: unknown column; allowed: {', '.join(COLUMNS)}"
            )
    for column in REQUIRED:
        if column not in header:
            raise TraceError(
                f"trace row 1: column {column} is missing; required: {', '.join(REQUIRED)}"
            )
    jobs: list[TraceJob] = []
    seen: dict[str, int] = {}
    for row in reader:
        line = reader.line_num
        extra = row.get(None)  # type: ignore[call-overload, unused-ignore]
        if extra:
            raise TraceError(
                f"trace row {line}: {len(header) + len(extra)} cells, the header has {len(header)}"
            )
        if not any(_cell(row, c) for c in header):
            continue  # a blank line
        job = _job(row, line)
        if job.name in seen:
            raise TraceError(
                f"trace row {line}, column name: {job.name!r} already used on row {seen[job.name]}"
            )
        seen[job.name] = line
        jobs.append(job)
    if not jobs:
        raise TraceError("trace: no jobs (a header row and at least one job row are needed)")
    return sorted(jobs, key=lambda j: j.arrival_s)


def read_trace(path: str | Path) -> str:
    """A trace file's text, of any format; one line naming the file if it cannot be read."""
    path = Path(path)
    try:
        # utf-8-sig: a spreadsheet's CSV may start with a byte-order mark, not a column name
        return path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise TraceError(f"trace: cannot read {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise TraceError(f"trace: {path} is not UTF-8 text (byte {exc.start})") from None


def load_trace(path: str | Path) -> list[TraceJob]:
    return parse_trace(read_trace(path))


def trace_to_csv(jobs: list[TraceJob]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(COLUMNS), lineterminator="\n")
    writer.writeheader()
    for job in jobs:
        writer.writerow(job.to_row())
    return out.getvalue()


# --- the generator -------------------------------------------------------------

MODEL_MIX = {"gpt2-small": 0.4, "gpt2-medium": 0.3, "gpt2-large": 0.2, "gpt2-xl": 0.1}
BATCHES = {
    "gpt2-small": (32, 64, 128, 256),
    "gpt2-medium": (32, 64, 128),
    "gpt2-large": (16, 32, 64),
    "gpt2-xl": (16, 32),
}
REQUEST_MIX = {1: 0.4, 2: 0.2, 4: 0.2, 8: 0.15, 16: 0.05}
"""Devices a job asks for (``max_devices``): most jobs one GPU, few many (Philly)."""
DURATION_S = (10 * 60.0, 16 * 3600.0)
"""Work per job, as seconds on one A100-40GB, drawn log-uniform between these."""
REFERENCE = DeviceClass(type="A100-40GB", memory_gb=40, peak_tflops=312.0)


def _draw(rng: random.Random, mix: dict[K, float]) -> K:
    keys = list(mix)
    return rng.choices(keys, weights=[mix[k] for k in keys])[0]


LARGE_REQUEST_MIX = {1: 0.2, 2: 0.1, 4: 0.2, 8: 0.3, 16: 0.2}
"""A mix of mostly multi-GPU requests, for sweeps over job size."""


def generate_trace(
    num_jobs: int,
    *,
    jobs_per_hour: float,
    seed: int,
    request_mix: dict[int, float] | None = None,
) -> list[TraceJob]:
    """``num_jobs`` jobs arriving as a Poisson process; same seed, same trace.

    The mix is like those of published cluster traces (Microsoft Philly, Jeon et al.,
    ATC'19; as Gavel's generator, Narayanan et al., OSDI'20, resamples it): Poisson
    arrivals at a given rate, mostly small requests (1 GPU most often, up to 16),
    durations log-uniform from minutes to most of a day of one A100, and the GPT-2
    family of presets with the batch sizes people train them at. Durations are turned
    into steps through the planner's rate on one A100-40GB, so a trace means the same
    amount of work on any cluster. ``request_mix`` replaces :data:`REQUEST_MIX` (GPUs
    asked for -> share of jobs).
    """
    if num_jobs < 1:
        raise TraceError(f"--generate: must be >= 1 jobs, got {num_jobs}")
    if not (jobs_per_hour > 0 and math.isfinite(jobs_per_hour)):
        raise TraceError(f"--rate: must be a number of jobs per hour > 0, got {jobs_per_hour}")
    rng = random.Random(seed)
    rates = PlannedRates()
    one_a100 = Config.make({REFERENCE: 1}, multi_node=False)
    jobs = []
    t = 0.0
    lo, hi = DURATION_S
    for i in range(num_jobs):
        model = _draw(rng, MODEL_MIX)
        batch = rng.choice(BATCHES[model])
        request = _draw(rng, request_mix or REQUEST_MIX)
        work_s = math.exp(rng.uniform(math.log(lo), math.log(hi)))
        step_s = batch / rates(model=model, global_batch=batch, config=one_a100)
        jobs.append(
            TraceJob(
                name=f"job-{i:04d}",
                arrival_s=round(t, 1),
                model=model,
                global_batch=batch,
                steps=max(1, round(work_s / step_s)),
                max_devices=request,
            )
        )
        t += rng.expovariate(jobs_per_hour / 3600.0)
    return jobs
