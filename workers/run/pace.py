"""Whether a job's simulated devices keep their GPUs' pace, step after step.

A simulated device whose real compute overruns the time it is paced to
(:attr:`workers.records.DeviceStep.compute_ratio` over the tolerance of
:mod:`workers.devices.contention`) runs at this host's speed: the job's step times,
samples/s and speed-ups are then the host's. :class:`PaceWatch` says so once, when it
lasts.
"""

from __future__ import annotations

from workers.devices.contention import LAG_TOLERANCE
from workers.records import DeviceStep, HostBound, StepMetrics

HOST_BOUND_STEPS = 3
"""Consecutive lagging steps of one device before the job says the host cannot keep up:
one slow step is a hiccup (a checkpoint written beside it, a collector pause); three in
a row are a host whose cores are taken."""


def host_bound(device: DeviceStep) -> bool:
    """Whether this step's time of ``device`` is the host's, not its emulated GPU's: its
    compute overran its paced time by more than :data:`LAG_TOLERANCE` (never a real GPU).

    >>> host_bound(DeviceStep(id="a/0", busy_s=1, wait_s=0, peak_bytes=0, compute_ratio=1.4))
    True
    >>> host_bound(DeviceStep(id="a/0", busy_s=1, wait_s=0, peak_bytes=0, compute_ratio=1.1))
    False
    """
    return device.compute_ratio is not None and device.compute_ratio > 1 + LAG_TOLERANCE


class PaceWatch:
    """Owns each simulated device's run of consecutive host-bound steps, and whether the
    job has said so (once per job: the figures stay marked in every step record)."""

    def __init__(self, steps: int = HOST_BOUND_STEPS) -> None:
        self.steps = steps
        self.streaks: dict[str, int] = {}
        self.reported = False

    def observe(self, metrics: StepMetrics) -> HostBound | None:
        """The notice when this step makes a device's streak long enough, the first time."""
        for d in metrics.devices:
            self.streaks[d.id] = self.streaks.get(d.id, 0) + 1 if host_bound(d) else 0
        if self.reported:
            return None
        lags = tuple(
            (d.id, d.compute_ratio)
            for d in metrics.devices
            if d.compute_ratio is not None and self.streaks[d.id] >= self.steps
        )
        if not lags:
            return None
        self.reported = True
        return HostBound(step=metrics.step, lags=lags)
