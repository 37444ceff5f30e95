"""What a job is told: what it trains (:class:`TrainJob`) and what it does besides its plan
(:class:`RunConfig`: checkpoints, validation, failures, re-planning).

One :class:`TrainJob` and one :class:`RunConfig` go from the caller (the service's job
runner, ``hetsched simulate``, a test) through :func:`workers.session.train` to the job
and each of its runs; every setting is checked where it is made, in one line naming the
field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler.errors import HetschedError
from scheduler.hardware.cluster import Cluster
from scheduler.hardware.faults import FaultSchedule
from scheduler.models.presets import ModelPreset
from workers.errors import WorkerError
from workers.records import OptimizerConfig
from workers.run.replanning import LiveReplanning


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainJob:
    """What one job trains, whatever its plan: the model on which cluster, for how many
    steps from which seed, on which data, with which optimizer and precision. Its plans
    and runs may change (recovery, re-planning, a move); this does not."""

    cluster: Cluster
    """The whole cluster, not the profiled subset: simulated pacing is relative to its
    fastest device, as it was when the profile was measured."""
    model: ModelPreset
    steps: int
    """The job's steps, counted from 0 (restored from a checkpoint, it goes on after the
    checkpoint's step)."""
    seed: int
    dataset: Path | None = None
    """A dataset file (:mod:`workers.data.dataset`), or None for the bundled corpus."""
    optimizer: OptimizerConfig = OptimizerConfig()
    simulated: bool = True
    """Simulated devices, paced against the host (:mod:`workers.devices.pacing`)."""
    cache_dir: Path | None = None
    """Where the host calibration that paces simulated devices is cached; give the
    profile's, so both pace alike (None: :func:`workers.devices.calibration.default_cache_dir`)."""
    dtype: str = "float32"
    """``float64`` for runs that check exactness against a reference."""

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise WorkerError(f"steps: must be >= 0, got {self.steps}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Checkpointing:
    """When and where a run writes checkpoints (:mod:`workers.checkpoint`)."""

    root: str
    """The job's storage location: a directory or an fsspec URI every node can reach."""
    every_steps: int | None = 50
    """Write after every this many steps (None: not by steps)."""
    every_s: float | None = None
    """Write when this many seconds passed since the last one (None: not by time)."""
    keep_last: int = 2
    """Complete checkpoints kept; older ones are pruned after each write."""
    manifest: dict[str, Any] = field(default_factory=dict)
    """What the caller adds to every manifest (the job spec, ...)."""

    def __post_init__(self) -> None:
        if self.every_steps is not None and self.every_steps < 1:
            raise HetschedError(f"checkpointing.every_steps: must be >= 1, got {self.every_steps}")
        if self.every_s is not None and not self.every_s > 0:
            raise HetschedError(f"checkpointing.every_s: must be > 0, got {self.every_s}")
        if self.keep_last < 1:
            raise HetschedError(f"checkpointing.keep_last: must be >= 1, got {self.keep_last}")

    def due(self, step: int, since_s: float) -> bool:
        by_steps = self.every_steps is not None and (step + 1) % self.every_steps == 0
        by_time = self.every_s is not None and since_s >= self.every_s
        return by_steps or by_time


@dataclass(frozen=True, kw_only=True, slots=True)
class Validation:
    """When a run evaluates the model on the held-out split, and on how much of it.

    Evaluation runs after a step's update, forward only, on ``batches ×
    global_batch`` validation samples spread evenly over the split and the
    same at every evaluation (:mod:`workers.data.dataset`); every rank computes its
    plan's share and the loss sums are SUM-reduced, so the figure is the same
    whatever the plan. Its time is not part of the step's.
    """

    every_steps: int
    """Evaluate after every this many steps, and after the job's last step."""
    batches: int = 1
    """Validation samples, in global batches."""

    def __post_init__(self) -> None:
        if self.every_steps < 1:
            raise WorkerError(f"val_every: must be >= 1, got {self.every_steps}")
        if self.batches < 1:
            raise WorkerError(f"val_batches: must be >= 1, got {self.batches}")

    def due(self, step: int, last_step: int) -> bool:
        return (step + 1) % self.every_steps == 0 or step == last_step


MIN_AUTO_VAL_STEPS = 20
"""Jobs shorter than this are not evaluated unless asked (smoke tests, benchmarks)."""


def default_validation(
    steps: int, *, every: int | None = None, batches: int = 1
) -> Validation | None:
    """The validation a job of ``steps`` steps gets: ``every`` steps when given (0: none);
    by default ten evaluations, a tenth of the job apart, the last after the final step,
    for jobs of at least 20 steps, and none for shorter ones.

    >>> default_validation(200).every_steps, default_validation(5), default_validation(5, every=1)
    (20, None, Validation(every_steps=1, batches=1))
    """
    if every is None:
        every = -(-steps // 10) if steps >= MIN_AUTO_VAL_STEPS else 0
    return Validation(every_steps=every, batches=batches) if every > 0 else None


@dataclass(frozen=True, kw_only=True, slots=True)
class RunConfig:
    """Every setting of a job's runs besides the plan, as one value (the defaults: none of it)."""

    checkpointing: Checkpointing | None = None
    """Write checkpoints as it says, and after the last step or a stop; None: never, and
    nothing is recovered (a re-plan then happens only in place)."""
    validation: Validation | None = None
    """Evaluate the held-out split when it says; each evaluated step carries its loss."""
    max_failures: int = 0
    """Failures recovered from the last checkpoint before the job fails (0: none)."""
    live: LiveReplanning | None = None
    """Follow speed changes (:mod:`workers.run.replanning`); None: keep the plan."""
    faults: FaultSchedule | None = None
    """A simulated cluster's faults, carried out at step boundaries (:mod:`workers.run.faults`)."""
    keep_state: bool = False
    """Return the final whole-model state (and rank 0's optimizer state for data parallelism)."""

    def __post_init__(self) -> None:
        if self.max_failures < 0:
            raise HetschedError(f"max_failures: must be >= 0, got {self.max_failures}")
        if self.max_failures > 0 and self.checkpointing is None:
            raise HetschedError(
                f"max_failures: {self.max_failures} recoveries need checkpointing to "
                "recover from; give checkpointing or max_failures 0"
            )
