"""Pacing: how a simulated device stretches this host's time into its GPU's time.

DESIGN.md, "Simulated devices": device ``i`` takes ``K · (speed_max / speed_i)
· t_host(m)`` per micro-batch of ``m`` samples, where ``t_host`` is this host's
uncontended forward+backward time (:mod:`workers.devices.calibration`) and ``K`` a
contention margin, so that several actors sharing few cores still finish
their real compute inside the target. Speed is the catalogue's peak dense
TFLOP/s (``Device.peak_tflops``) times any slow-down in force (fault injection).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import ray

from scheduler.hardware.capacity import simulated_budget_bytes
from scheduler.hardware.cluster import Cluster, Device
from scheduler.models.presets import ModelPreset
from workers.devices.calibration import HostCalibration, calibrate_host
from workers.errors import WorkerError

FORWARD_SHARE = 1 / 3
"""Share of a micro-batch's time spent in the forward pass (backward ≈ 2× forward)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Pacing:
    """How a simulated device stretches host time into its GPU's time."""

    margin: float
    """Contention margin ``K``: host time is multiplied by it even on the fastest device."""
    speed_ratio: float
    """``speed_max / speed_i`` over the cluster's devices (>= 1)."""
    host: HostCalibration
    """Host time of what this device computes: the whole model, or a pipeline stage's pieces."""

    @property
    def slowdown(self) -> float:
        return self.margin * self.speed_ratio

    def target_s(self, micro_batch: int) -> float:
        return self.slowdown * self.host.time_s(micro_batch)


def with_recompute(pacing: Pacing, preset: ModelPreset, mode: str) -> Pacing:
    """A device that recomputes activations works longer by the forward work it repeats."""
    if mode == "none":
        return pacing
    ratio = preset.flops_per_sample_with(mode) / preset.flops_per_sample  # type: ignore[arg-type]
    host = HostCalibration(
        fixed_s=pacing.host.fixed_s * ratio, per_sample_s=pacing.host.per_sample_s * ratio
    )
    return replace(pacing, host=host)


def default_margin(num_devices: int, num_cpus: int) -> float:
    """Contention margin ``K``: two simulated devices per core get 4, at least 2.5.

    DESIGN.md finds 2–3 enough for four actors on two otherwise idle cores;
    the extra keeps the fastest devices on pace while other processes share
    the machine (measured: at 3, a busy 2-core host made them overrun).

    >>> default_margin(4, 2)
    4.0
    >>> default_margin(2, 8)
    2.5
    """
    return max(2.5, 2.0 * num_devices / max(num_cpus, 1))


def speed_ratio(cluster: Cluster, device: Device) -> float:
    fastest = max(d.peak_tflops for d in cluster.devices)
    return fastest / device.peak_tflops


def simulated_capacity_bytes(cluster: Cluster, device: Device) -> int:
    return simulated_budget_bytes(device.memory_bytes, cluster.simulation.memory_scale)


def pacing_margin(cluster: Cluster) -> float:
    """Contention margin ``K`` for ``cluster``'s simulation on this machine.

    ``$HETSCHED_PACING_MARGIN`` overrides it; otherwise it follows the number
    of simulated devices per CPU Ray may use (:func:`default_margin`).
    """
    env = os.environ.get("HETSCHED_PACING_MARGIN")
    if env:
        try:
            value = float(env)
        except ValueError:
            value = 0.0
        if not value >= 1:
            raise WorkerError(f"HETSCHED_PACING_MARGIN: must be a number >= 1, got {env!r}")
        return value
    num_cpus = int(ray.cluster_resources().get("CPU", 2)) if ray.is_initialized() else 2
    return default_margin(len(cluster.devices), min(num_cpus, os.cpu_count() or num_cpus))


PacingOf = Callable[[str], tuple[int, Pacing | None]]
"""``device id -> (capacity_bytes, pacing)``; ``(0, None)`` for real GPUs."""


def simulated_pacing(
    cluster: Cluster, model: ModelPreset, *, cache_dir: Path | None, refresh: bool = False
) -> PacingOf:
    """``device id -> (capacity_bytes, Pacing)`` for the simulated devices of ``cluster``."""
    host = calibrate_host(model, cache_dir=cache_dir, refresh=refresh)
    margin = pacing_margin(cluster)

    def of(device_id: str) -> tuple[int, Pacing | None]:
        device = cluster.device(device_id)
        return simulated_capacity_bytes(cluster, device), Pacing(
            margin=margin, speed_ratio=speed_ratio(cluster, device), host=host
        )

    return of


def no_pacing(device_id: str) -> tuple[int, Pacing | None]:
    """Real GPUs: their actors read their own budget."""
    return 0, None
