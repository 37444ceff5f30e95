"""Value objects that training runs take and return (contract.md).

Re-exported by :mod:`workers.session`, the one entry point callers use.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True, slots=True)
class OptimizerConfig:
    """AdamW (Loshchilov & Hutter, 2019) settings."""

    lr: float = 3e-3
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"optimizer.lr: must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"optimizer.weight_decay: must be >= 0, got {self.weight_decay}")
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if not 0 <= value < 1:
                raise ValueError(f"optimizer.{name}: must be in [0, 1), got {value}")


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceStep:
    id: str
    busy_s: float
    """Compute time this step (paced, for simulated devices)."""
    wait_s: float
    """Time waiting at the all-reduce / pipeline."""
    peak_bytes: int


@dataclass(frozen=True, kw_only=True, slots=True)
class RankStep:
    """What one rank reports after a step (crosses Ray from the worker to the driver)."""

    loss: float
    """Mean token loss over the global batch (every rank reports the same)."""
    device: DeviceStep


@dataclass(frozen=True, kw_only=True, slots=True)
class StepMetrics:
    step: int
    """0-based."""
    loss: float
    """Mean token loss over the global batch."""
    step_s: float
    samples_per_s: float
    devices: tuple[DeviceStep, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainResult:
    steps_done: int
    losses: list[float]
    step_times_s: list[float]
    devices: tuple[DeviceStep, ...]
    """Per device, medians over the steps after the first."""
    stopped: bool
    """True when should_stop() ended the run early."""
    state: dict[str, Any] | None = None
    """Rank 0's model and optimizer state after the last step, when asked for
    (``train(..., keep_state=True)``): a checkpoint to resume or verify from."""


def median_devices(steps: list[StepMetrics]) -> tuple[DeviceStep, ...]:
    """Per-device medians over steps after the first (the first pays for warm-up)."""
    if not steps:
        return ()
    used = steps[1:] or steps
    out = []
    for i, first in enumerate(used[0].devices):
        out.append(
            DeviceStep(
                id=first.id,
                busy_s=statistics.median(s.devices[i].busy_s for s in used),
                wait_s=statistics.median(s.devices[i].wait_s for s in used),
                peak_bytes=max(s.devices[i].peak_bytes for s in steps),
            )
        )
    return tuple(out)
