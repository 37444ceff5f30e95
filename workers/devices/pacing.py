"""Pacing: how a simulated device stretches this host's time into its GPU's time.

DESIGN.md, "Simulated devices": device ``i`` takes ``K · (speed_max / speed_i)
· t_host(m)`` per micro-batch of ``m`` samples, where ``t_host`` is this host's
uncontended forward+backward time (:mod:`workers.devices.calibration`) and ``K`` a
contention margin, so that several actors sharing few cores still finish
their real compute inside the target. Speed is the catalogue's peak dense
TFLOP/s (``Device.peak_tflops``) times any slow-down in force (fault injection).
``K`` grows with the other CPU-bound processes measured live, and with how much more CPU
time the model's own passes take beside them (:mod:`workers.devices.contention`), so the
devices keep their pace on a busy host.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import ray
import torch

from scheduler.hardware.capacity import simulated_budget_bytes
from scheduler.hardware.cluster import Cluster, Device
from scheduler.models.presets import ModelPreset
from workers.devices.calibration import ForwardBackward, HostCalibration, calibrate_host, host_key
from workers.devices.contention import HostLoad, ProbeWork, host_cpus, margin_for, probe_host
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


def speed_ratio(cluster: Cluster, device: Device) -> float:
    fastest = max(d.peak_tflops for d in cluster.devices)
    return fastest / device.peak_tflops


def simulated_capacity_bytes(cluster: Cluster, device: Device) -> int:
    return simulated_budget_bytes(device.memory_bytes, cluster.simulation.memory_scale)


PROBE_MICRO_BATCH = 1
"""The probe's passes: the calibration's smallest, so that even a large model's probe
repeats its pass a few times."""

_MARGINS: dict[tuple[int, int, str], tuple[float, HostLoad]] = {}
"""``(devices, cores, model) -> (margin, load)`` of the last live probe, so that the runs
after a profile pace as it did."""
_MARGINS_LOCK = threading.Lock()


def _env_margin() -> float | None:
    env = os.environ.get("HETSCHED_PACING_MARGIN")
    if not env:
        return None
    try:
        value = float(env)
    except ValueError:
        value = 0.0
    if not value >= 1:
        raise WorkerError(f"HETSCHED_PACING_MARGIN: must be a number >= 1, got {env!r}")
    return value


def probe_with_model(model: ModelPreset, host: HostCalibration) -> HostLoad:
    """:func:`probe_host` repeating ``model``'s forward+backward on this thread, one torch
    thread as in the device actors and the calibration (the process's setting is put back)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        passes = ForwardBackward(model)
        work = ProbeWork(
            cpu_s=lambda: passes.cpu_s(PROBE_MICRO_BATCH),
            calibrated_s=host.time_s(PROBE_MICRO_BATCH),
        )
        return probe_host(work=work)
    finally:
        torch.set_num_threads(threads)


def pacing_margin(
    cluster: Cluster, model: ModelPreset, host: HostCalibration, *, probe: bool = False
) -> tuple[float, HostLoad | None]:
    """Contention margin ``K`` for ``cluster``'s simulation of ``model`` on this machine,
    and the load it was raised from.

    ``$HETSCHED_PACING_MARGIN`` sets it (no load then). Otherwise it follows the
    simulated devices per core Ray may use, the other CPU-bound processes and the
    CPU-time inflation of ``model``'s passes against ``host``, measured live
    (:func:`probe_with_model`, :func:`workers.devices.contention.margin_for`):
    measured when ``probe`` (a profile, which every run then follows) or when
    nothing was measured yet for a cluster of this size and this model in this process.
    """
    env = _env_margin()
    if env is not None:
        return env, None
    num_cpus = int(ray.cluster_resources().get("CPU", 2)) if ray.is_initialized() else 2
    key = (len(cluster.devices), min(num_cpus, host_cpus()), host_key(model))
    with _MARGINS_LOCK:
        if probe or key not in _MARGINS:
            load = probe_with_model(model, host)
            margin = margin_for(key[0], key[1], load.others, cpu_inflation=load.cpu_inflation)
            _MARGINS[key] = (margin, load)
        return _MARGINS[key]


PacingOf = Callable[[str], tuple[int, Pacing | None]]
"""``device id -> (capacity_bytes, pacing)``; ``(0, None)`` for real GPUs."""


def simulated_pacing(
    cluster: Cluster,
    model: ModelPreset,
    *,
    cache_dir: Path | None,
    refresh: bool = False,
    probe: bool = False,
) -> PacingOf:
    """``device id -> (capacity_bytes, Pacing)`` for the simulated devices of ``cluster``;
    ``probe`` measures the host's contention again (:func:`pacing_margin`)."""
    host = calibrate_host(model, cache_dir=cache_dir, refresh=refresh)
    margin, _load = pacing_margin(cluster, model, host, probe=probe)

    def of(device_id: str) -> tuple[int, Pacing | None]:
        device = cluster.device(device_id)
        return simulated_capacity_bytes(cluster, device), Pacing(
            margin=margin, speed_ratio=speed_ratio(cluster, device), host=host
        )

    return of


def no_pacing(device_id: str) -> tuple[int, Pacing | None]:
    """Real GPUs: their actors read their own budget."""
    return 0, None
