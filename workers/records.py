"""Value objects that training runs take and return: settings, step metrics, results, recoveries.

Callers reach them through :mod:`workers.session`.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, kw_only=True, slots=True)
class OptimizerConfig:
    """AdamW (Loshchilov & Hutter, 2019) with warm-up, cosine decay and clipping.

    The learning rate rises linearly over ``warmup_steps`` and then follows a
    half cosine from ``lr`` down to ``min_lr_ratio × lr`` at ``decay_steps``
    (Loshchilov & Hutter, SGDR, 2017; the GPT-3 recipe); ``decay_steps`` of 0
    keeps it constant after the warm-up. ``grad_clip`` caps the global
    gradient norm (Pascanu et al., 2013), summed over every device and stage,
    so clipping is the same whatever the split.
    """

    lr: float = 3e-3
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    warmup_steps: int = 0
    decay_steps: int = 0
    min_lr_ratio: float = 0.1
    grad_clip: float | None = None
    """Largest global gradient norm; None: no clipping."""

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"optimizer.lr: must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"optimizer.weight_decay: must be >= 0, got {self.weight_decay}")
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if not 0 <= value < 1:
                raise ValueError(f"optimizer.{name}: must be in [0, 1), got {value}")
        for name in ("warmup_steps", "decay_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"optimizer.{name}: must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"optimizer.min_lr_ratio: must be in [0, 1], got {self.min_lr_ratio}")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"optimizer.grad_clip: must be > 0 or null, got {self.grad_clip}")

    def lr_at(self, step: int) -> float:
        """The learning rate of step ``step`` (0-based).

        >>> c = OptimizerConfig(lr=1.0, warmup_steps=2, decay_steps=4, min_lr_ratio=0.0)
        >>> [round(c.lr_at(t), 3) for t in range(6)]
        [0.5, 1.0, 1.0, 0.5, 0.0, 0.0]
        """
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.decay_steps <= self.warmup_steps:
            return self.lr
        progress = min(1.0, (step - self.warmup_steps) / (self.decay_steps - self.warmup_steps))
        floor = self.min_lr_ratio * self.lr
        return floor + (self.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceStep:
    id: str
    busy_s: float
    """Compute time this step (paced, for simulated devices)."""
    wait_s: float
    """Time waiting at the all-reduce / pipeline."""
    peak_bytes: int
    compute_ratio: float | None = None
    """A simulated device's real compute over the time it was paced to this step (a
    fully-sharded rank's less its passes' time in collectives, where it waits for its
    peers); well over 1 the host could not keep its GPU's pace
    (:func:`workers.run.pace.host_bound`). None on a real GPU, a rank without samples,
    and in step records written before it was measured."""

    def to_dict(self) -> dict[str, Any]:
        """As a job's step record and ``hetsched simulate --json`` list it."""
        return asdict(self)


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
    val_loss: float | None = None
    """Mean token loss on the held-out validation samples after this step's update;
    None on steps without an evaluation (:class:`workers.run.driver.Validation`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainResult:
    steps_done: int
    losses: list[float]
    step_times_s: list[float]
    devices: tuple[DeviceStep, ...]
    """Per device, medians over the steps after the first."""
    stopped: bool
    """True when should_stop() ended the run early."""
    val_losses: dict[int, float] = field(default_factory=dict)
    """Step -> validation loss after it, for the steps that were evaluated."""
    state: dict[str, Any] | None = None
    """Rank 0's model and optimizer state after the last step, when asked for
    (``RunConfig(keep_state=True)``): a checkpoint to resume or verify from."""

    @classmethod
    def of(
        cls,
        history: list[StepMetrics],
        *,
        stopped: bool,
        state: dict[str, Any] | None,
        medians_over: list[StepMetrics] | None = None,
    ) -> TrainResult:
        """The result of ``history`` (one record per step, in order), with device medians
        over ``medians_over`` (default: the whole history)."""
        return cls(
            steps_done=len(history),
            losses=[m.loss for m in history],
            val_losses=val_losses(history),
            step_times_s=[m.step_s for m in history],
            devices=median_devices(history if medians_over is None else medians_over),
            stopped=stopped,
            state=state,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Recovery:
    """One recovery from a failure, as the job record and the dashboard show it."""

    time_s: float
    """When the failure was noticed (epoch seconds)."""
    error: str
    failed_step: int
    """The step that did not complete."""
    resumed_step: int
    """The first step run again (the one after the restored checkpoint)."""
    lost: tuple[str, ...]
    """Devices left out because they are gone."""
    old_plan: dict[str, Any]
    new_plan: dict[str, Any]
    recover_s: float
    """From noticing the failure to the end of the first step after it."""

    @property
    def steps_redone(self) -> int:
        return self.failed_step - self.resumed_step

    def to_dict(self) -> dict[str, Any]:
        return {
            "time_s": self.time_s,
            "error": self.error,
            "failed_step": self.failed_step,
            "resumed_step": self.resumed_step,
            "steps_redone": self.steps_redone,
            "lost": list(self.lost),
            "old_plan": self.old_plan,
            "new_plan": self.new_plan,
            "recover_s": self.recover_s,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class HostBound:
    """Simulated devices whose compute overran their pacing several steps in a row: the
    job's speeds are this host's, not its GPUs' (said once per job)."""

    step: int
    """The step at which the streak was long enough."""
    lags: tuple[tuple[str, float], ...]
    """``(device id, compute over paced time)`` of each lagging device at that step."""

    def message(self) -> str:
        """The one line the job's log and events show."""
        ids = [device_id for device_id, _ in self.lags]
        worst = max(ratio for _, ratio in self.lags)
        if len(ids) == 1:
            who, whose = f"{ids[0]}'s pace", f"{worst:.1f}x its"
        else:
            who, whose = f"the pace of {', '.join(ids)}", f"up to {worst:.1f}x their"
        return (
            f"host-bound: this host cannot keep {who} (compute {whose} paced time); "
            "speeds of this job are not those of its GPUs"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "message": self.message(),
            "devices": [{"id": d, "compute_ratio": round(ratio, 3)} for d, ratio in self.lags],
        }


def _median_ratio(steps: list[StepMetrics], i: int) -> float | None:
    ratios = [s.devices[i].compute_ratio for s in steps]
    known = [r for r in ratios if r is not None]
    return statistics.median(known) if known else None


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
                compute_ratio=_median_ratio(used, i),
            )
        )
    return tuple(out)


def val_losses(steps: list[StepMetrics]) -> dict[int, float]:
    """The validation losses of the steps that have one."""
    return {s.step: s.val_loss for s in steps if s.val_loss is not None}
