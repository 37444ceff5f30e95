"""Host contention: how busy this machine is, and whether simulated devices kept their pace.

A simulated device is paced to its GPU's time only while its real compute fits
inside that time (:mod:`workers.devices.pacing`). Other CPU-bound processes
(a laptop in use, a shared build machine) slow the compute down; then the
device runs at the host's pace, and every figure measured from it (its profile,
a run's step time, the speed-up over ``even``) describes the host, not the GPU.

Two measurements decide it here:

- :func:`probe_host`, live, before a profile: one thread repeats the devices' own
  forward+backward for a moment and reads what share of a core it got
  (``time.thread_time`` over wall time) and, on Linux, how busy the other cores
  were (``/proc/stat``). On ``C`` cores with ``B`` other runnable processes a
  thread gets ``C / (B + 1)`` of a core once they saturate them, so ``B`` follows
  from either reading. It also reads how much more CPU time each pass took than
  the host calibration's: time-sharing a core evicts the model from the caches
  the others use, so the same work costs more CPU time beside busy processes
  (1.2-3x for gpt-tiny beside two busy loops on a 2-core VM, where a bare Python
  loop costs the same). The pacing margin is raised from both (:func:`margin_for`).
- :class:`PaceCheck`, after the fact: a device's profiled or trained time against
  the time it was paced to. More than :data:`LAG_TOLERANCE` over it is a device
  that could not keep its pace: its figures are the host's.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PROBE_S = 0.3
"""How long :func:`probe_host` spins: a few dozen of the scheduler's time slices."""
SATURATED_SHARE = 0.9
"""Below this share of a core the probe's thread was waiting for one: cores saturated."""
MARGIN_LEVELS = (2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0)
"""Margins the live contention rounds up to, so that a little jitter in the probe does not
change the simulation's pace from one profile to the next."""
MAX_MARGIN = MARGIN_LEVELS[-1]
"""Past this the simulation would crawl: the host is reported as unable to keep up."""
IDLE_INFLATION = 1.15
"""A probe's passes cost up to this much more CPU time than the calibration on an idle host
too (the calibration takes each size's fastest run, the probe its median): the margin is
raised for CPU-time inflation only beyond it."""
LAG_TOLERANCE = 0.15
"""A device whose measured time exceeds its paced time by more than this share lagged.
Pacing itself is late by the OS's wake-up (about a millisecond a pass, under 5 %)."""
_STAT = Path("/proc/stat")


@dataclass(frozen=True, kw_only=True, slots=True)
class HostLoad:
    """What :func:`probe_host` saw: the cores and how many CPU-bound processes use them."""

    num_cpus: int
    cpu_share: float
    """Share of one core the probing thread got (1.0: a core was free)."""
    others: float
    """CPU-bound processes running besides the probe (an estimate; 0 on an idle host)."""
    cpu_inflation: float = 1.0
    """The probe's CPU time per pass over the host calibration's (1.0: not measured)."""

    def to_dict(self) -> dict[str, Any]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


def host_cpus() -> int:
    """Cores this process may run on (its affinity where the OS says, else all)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _busy_ticks() -> tuple[int, int] | None:
    """``(busy, total)`` clock ticks of all cores from ``/proc/stat``; None off Linux."""
    try:
        fields = _STAT.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    idle = ticks[3] + ticks[4]
    return sum(ticks) - idle, sum(ticks)


@dataclass(frozen=True, kw_only=True, slots=True)
class ProbeWork:
    """What :func:`probe_host` repeats: one pass of the devices' own compute, and the CPU
    time the host calibration measured for it uncontended."""

    cpu_s: Callable[[], float]
    """Runs one pass on the calling thread and returns its thread CPU time."""
    calibrated_s: float


def _spin_cpu_s() -> float:
    start = time.thread_time()
    sum(range(200))
    return time.thread_time() - start


def probe_host(duration_s: float = PROBE_S, *, work: ProbeWork | None = None) -> HostLoad:
    """Repeat ``work`` (a bare spin without it) for ``duration_s`` on one thread and estimate
    the other CPU-bound processes and the CPU-time inflation of ``work``.

    Saturated cores (the thread got less than :data:`SATURATED_SHARE` of one):
    ``others = C / share - 1``. Otherwise the other cores' busy time over the probe
    (``/proc/stat``; its core count must be this process's, as in most containers).
    The inflation is the median pass's CPU time over ``work.calibrated_s``, after one
    pass that warms the caches (at least one more pass, however long it takes).
    """
    num_cpus = host_cpus()
    if work is not None:
        work.cpu_s()
    cpu_s = work.cpu_s if work is not None else _spin_cpu_s
    passes: list[float] = []
    before = _busy_ticks()
    wall0, cpu0 = time.perf_counter(), time.thread_time()
    while not passes or time.perf_counter() - wall0 < duration_s:
        passes.append(cpu_s())
    wall, cpu = time.perf_counter() - wall0, time.thread_time() - cpu0
    after = _busy_ticks()
    share = min(1.0, cpu / wall) if wall > 0 else 1.0
    others = num_cpus / max(share, 1e-3) - 1 if share < SATURATED_SHARE else 0.0
    if before is not None and after is not None and after[1] > before[1]:
        cores_seen = (after[1] - before[1]) / (os.sysconf("SC_CLK_TCK") * wall)
        if round(cores_seen) == num_cpus:  # the file counts this process's cores
            busy_cores = (after[0] - before[0]) / (after[1] - before[1]) * num_cpus
            others = max(others, busy_cores - share)
    inflation = 1.0
    if work is not None and work.calibrated_s > 0:
        inflation = max(1.0, statistics.median(passes) / work.calibrated_s)
    return HostLoad(
        num_cpus=num_cpus, cpu_share=share, others=max(0.0, others), cpu_inflation=inflation
    )


def needed_margin(
    num_devices: int, num_cpus: int, others: float = 0.0, *, cpu_inflation: float = 1.0
) -> float:
    """Margin ``K`` at which the fastest device's compute fits its paced time, unrounded.

    Its ``num_devices`` peers and ``others`` share ``num_cpus`` cores while they all
    compute, so a pass takes ``(num_devices + others) / num_cpus`` times its
    uncontended time; twice that leaves room for Ray, gloo and the driver
    (DESIGN.md finds 2–3 enough for four actors on two idle cores). Beside busy
    processes each pass also costs ``cpu_inflation`` times its calibrated CPU time
    (:func:`probe_host`), which multiplies it once over :data:`IDLE_INFLATION`.

    >>> needed_margin(4, 2)
    4.0
    >>> needed_margin(4, 2, others=4.0)
    8.0
    >>> [needed_margin(1, 1, others=2.0, cpu_inflation=x) for x in (1.1, 1.5)]
    [6.0, 9.0]
    """
    inflation = cpu_inflation if cpu_inflation > IDLE_INFLATION else 1.0
    return max(MARGIN_LEVELS[0], 2.0 * inflation * (num_devices + others) / max(num_cpus, 1))


def margin_for(
    num_devices: int, num_cpus: int, others: float = 0.0, *, cpu_inflation: float = 1.0
) -> float:
    """:func:`needed_margin` rounded up to a level of :data:`MARGIN_LEVELS`, at most the last.

    >>> margin_for(4, 2), margin_for(4, 2, others=2.3), margin_for(4, 2, others=40)
    (4.0, 8.0, 16.0)
    >>> margin_for(1, 1, others=2.0, cpu_inflation=2.0)
    12.0
    """
    need = needed_margin(num_devices, num_cpus, others, cpu_inflation=cpu_inflation)
    return next((k for k in MARGIN_LEVELS if k >= need - 1e-9), MAX_MARGIN)


@dataclass(frozen=True, kw_only=True, slots=True)
class Lag:
    """A device that took longer than the time it was paced to."""

    device_id: str
    where: str
    """``profile``, or the strategy whose run it lagged in."""
    measured_s: float
    paced_s: float

    @property
    def ratio(self) -> float:
        return self.measured_s / self.paced_s if self.paced_s > 0 else math.inf


def lagging(measured_s: float, paced_s: float) -> bool:
    """Whether ``measured_s`` is over ``paced_s`` by more than :data:`LAG_TOLERANCE`.

    >>> lagging(1.1, 1.0), lagging(1.3, 1.0), lagging(0.0, 0.0)
    (False, True, False)
    """
    return measured_s > (1 + LAG_TOLERANCE) * paced_s and measured_s - paced_s > 1e-3


@dataclass(frozen=True, kw_only=True, slots=True)
class PaceCheck:
    """Whether a simulation's devices kept their GPUs' pace; owns the warning line."""

    margin: float
    load: HostLoad | None
    """The last live probe (None: the margin was set by ``$HETSCHED_PACING_MARGIN``)."""
    lags: tuple[Lag, ...] = field(default=())

    @property
    def keeps_pace(self) -> bool:
        return not self.lags

    def untrusted(self, where: str) -> bool:
        """Whether the figures of ``where`` (``profile`` or a strategy) are the host's."""
        return any(lag.where in (where, "profile") for lag in self.lags)

    def warning(self) -> str | None:
        """One line for the user when a device lagged; None when every one kept pace."""
        if self.keeps_pace:
            return None
        worst = max(self.lags, key=lambda lag: lag.ratio)
        wheres = ", ".join(dict.fromkeys(lag.where for lag in self.lags))
        load = ""
        if self.load is not None:
            inflated = ""
            if self.load.cpu_inflation > IDLE_INFLATION:
                inflated = f", each pass {self.load.cpu_inflation:.1f}x its idle CPU time"
            load = (
                f" (a thread got {self.load.cpu_share:.0%} of a core: about "
                f"{self.load.others:.1f} other CPU-bound processes on {self.load.num_cpus} cores"
                f"{inflated})"
            )
        return (
            f"host too busy{load}: simulated devices could not keep their GPUs' pace in "
            f"{wheres} ({worst.device_id} took {worst.ratio:.1f}x its paced "
            f"{worst.paced_s * 1e3:.0f} ms at margin {self.margin:g}); the timings measure "
            "this host, not the GPUs: rerun on a quieter host or raise HETSCHED_PACING_MARGIN"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "keeps_pace": self.keeps_pace,
            "warning": self.warning(),
            "margin": self.margin,
            "load": self.load.to_dict() if self.load is not None else None,
            "lags": [
                {
                    "device": lag.device_id,
                    "where": lag.where,
                    "measured_s": lag.measured_s,
                    "paced_s": lag.paced_s,
                }
                for lag in self.lags
            ],
        }


def run_lags(where: str, devices: Iterable[tuple[str, float, float]]) -> list[Lag]:
    """Lags of a run's devices, from ``(device id, measured busy_s, planned busy_s)``."""
    return [
        Lag(device_id=device_id, where=where, measured_s=measured, paced_s=planned)
        for device_id, measured, planned in devices
        if lagging(measured, planned)
    ]


def profile_sizes(limit: int | None, sizes: Sequence[int]) -> list[int]:
    """The timed micro-batch sizes a profile's line must match its pacing at (ends only)."""
    timed = [m for m in sizes if limit is None or m <= max(limit, 1)]
    return sorted({timed[0], timed[-1]}) if timed else []
