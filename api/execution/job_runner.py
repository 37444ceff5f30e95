"""One job's run on the service: profile, plan, train durably, record what changed.

Called by the executor's runner thread (:mod:`api.execution.executor`); the run itself
is :class:`workers.session.RunBuilder`'s, the same as ``hetsched simulate``'s. Every
step, checkpoint, recovery, re-plan, restart and host-bound notice goes to the job store (``GET
/jobs/{id}``) and the job's log.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from api.core.settings import Settings
from api.core.telemetry import Telemetry
from api.execution.ledger import LiveJob
from api.services import (
    ClusterHandle,
    Profiler,
    inside_data_dir,
    model_from_ref,
    plan_summary,
    resolve_dataset,
)
from api.store import JobRecord, JobStore
from scheduler.errors import HetschedError
from scheduler.planning.plan import Plan

if TYPE_CHECKING:  # the workers (torch, Ray) load when the first job runs
    from scheduler.replan.decision import ReplanDecision
    from workers.records import HostBound
    from workers.session import (
        CheckpointInfo,
        CheckpointStore,
        Recovery,
        RunBuilder,
        RunConfig,
        StepMetrics,
        TrainJob,
        TrainResult,
    )

MAX_CHECKPOINT_EVERY = 50


def checkpoint_every(steps: int, asked: int | None) -> int:
    """The job's checkpoint interval in steps.

    >>> checkpoint_every(200, None), checkpoint_every(2000, None), checkpoint_every(5, None)
    (20, 50, 1)
    """
    return asked if asked is not None else min(MAX_CHECKPOINT_EVERY, max(1, steps // 10))


@dataclass(kw_only=True, slots=True)
class JobRunner:
    """Runs the service's jobs, one call per run of a job (a start, a restart, a move).

    Owns how a job's spec becomes a run (:class:`workers.session.RunBuilder`): where
    its checkpoints live (:meth:`root`), what it starts from (its own last
    checkpoint after a restart or a move, another job's, or Hugging Face weights),
    and the callbacks that write what the run reports to the job store
    (:class:`JobHooks`). The executor owns which devices a job holds: ``claim`` and
    ``release`` are its.
    """

    store: JobStore
    handle: ClusterHandle
    profiler: Profiler
    settings: Settings
    release: Callable[[LiveJob, list[str]], None]
    """Sets the devices a job holds (the others go back to the queue)."""
    claim: Callable[[LiveJob, list[str]], list[str]]
    """Atomically: of these devices, those no other job holds become the job's."""
    telemetry: Telemetry | None = None
    """Where ``/metrics`` counts steps, checkpoints, recoveries and events."""

    def run(
        self, job: JobRecord, live: LiveJob, *, resume: bool, moved: bool = False
    ) -> TrainResult | None:
        """Train ``job``; None when a stop came before training started.

        ``moved``: the policy moved it to ``live.devices``; it goes on from its own
        last checkpoint (written where the move stopped it), re-planned there.
        """
        from workers.session import CheckpointStore, RunBuilder

        spec = job.spec
        train_job = self._train_job(job)
        model = train_job.model
        self.store.log(job.id, "INFO", f"profiling {model.name} on {len(live.devices)} devices")
        # What the job may use; its plan may hand some back, and a recovery take them again.
        profile = self.profiler.measure(model, list(live.devices))
        builder = RunBuilder(
            job=train_job,
            profile=profile.at_precision(spec.precision),
            strategy=spec.strategy,
            global_batch=spec.global_batch,
        )
        plan = builder.plan()
        self.record_plan(job, live, plan)
        if live.stop.is_set():
            return None
        checkpoints = CheckpointStore(self.settings.job_checkpoints(job.id))
        if moved:  # None: it moved before its first checkpoint
            restore = checkpoints.latest()
        else:
            restore = self._restore(job, builder, checkpoints, resume=resume)
        return builder.train(
            plan,
            pool=self.handle.pool,
            config=self._config(job, builder, checkpoints.root),
            hooks=JobHooks(runner=self, job=job, live=live),
            restore=restore,
        )

    def _train_job(self, job: JobRecord) -> TrainJob:
        """What ``job`` trains, on the service's cluster, its dataset checked again (the
        file may have changed since the job was submitted) before any device is profiled."""
        from workers.session import TrainJob

        spec = job.spec
        model = model_from_ref(spec.model, data_dir=self.settings.data_dir)
        dataset = resolve_dataset(
            self.settings.data_dir,
            spec.dataset,
            seq_len=model.seq_len,
            vocab_size=model.vocab_size,
            global_batch=spec.global_batch,
        )
        assert self.handle.cluster is not None
        return TrainJob(
            cluster=self.handle.cluster,
            model=model,
            steps=spec.steps,
            seed=spec.seed,
            dataset=dataset,
            optimizer=spec.optimizer.runtime(),
            simulated=self.handle.simulated,
            cache_dir=self.profiler.cache_dir,
        )

    def record_plan(self, job: JobRecord, live: LiveJob, plan: Plan) -> None:
        """The job's plan in the store and the log; the devices it leaves out go back."""
        active = [d.id for d in plan.active]
        self.store.set_plan(job.id, plan, active)
        self.store.log(job.id, "INFO", plan_summary(plan))
        for excluded in plan.excluded:
            self.store.log(job.id, "WARNING", f"{excluded.id} left out: {excluded.reason}")
        released = [d for d in live.devices if d not in active]
        if released:
            self.release(live, active)
            self.store.log(job.id, "INFO", f"released {', '.join(released)} (not in the plan)")

    def _config(self, job: JobRecord, builder: RunBuilder, root: str) -> RunConfig:
        from workers.session import Checkpointing, default_validation

        spec = job.spec
        return builder.config(
            checkpointing=Checkpointing(
                root=root,
                every_steps=checkpoint_every(spec.steps, spec.checkpoint_every),
                every_s=spec.checkpoint_every_s,
                manifest={"job": job.id, "spec": spec.model_dump(mode="json")},
            ),
            validation=default_validation(
                spec.steps, every=spec.val_every, batches=spec.val_batches
            ),
            max_failures=spec.max_failures,
            follow_speed=spec.replan if spec.replan is not None else self.settings.replan,
        )

    def _restore(
        self, job: JobRecord, builder: RunBuilder, checkpoints: CheckpointStore, *, resume: bool
    ) -> CheckpointInfo | None:
        """The checkpoint to start from: the job's own after a restart, or ``init_from``'s."""
        from workers.session import CheckpointStore

        if resume:
            latest = checkpoints.latest()
            for step, why in sorted(checkpoints.skipped.items()):
                self.store.log(job.id, "WARNING", f"checkpoint of step {step} skipped: {why}")
            where = (
                f"its checkpoint of step {latest.step}" if latest else "the start (no checkpoint)"
            )
            if self.telemetry is not None:
                self.telemetry.event("restart")
            self.store.add_event(
                job.id,
                kind="restart",
                step=latest.step + 1 if latest else 0,
                data={"resumed_step": latest.step + 1 if latest else 0},
            )
            self.store.log(job.id, "WARNING", f"control plane restarted: resuming from {where}")
            if latest is not None:
                return latest
        if job.spec.init_from is None:
            return None
        if job.spec.init_from.startswith("hf:"):
            return self._from_hf(job, builder, job.spec.init_from.removeprefix("hf:"))
        other, _, step = job.spec.init_from.partition("@")
        if self.store.get(other) is None:
            raise HetschedError(f"init_from: no job {other!r}")
        source = CheckpointStore(self.settings.job_checkpoints(other))
        info = source.get(int(step)) if step else source.latest()
        if info is None:
            raise HetschedError(f"init_from: job {other} has no checkpoint")
        self.store.log(
            job.id, "INFO", f"starting from job {other}'s checkpoint of step {info.step}"
        )
        return info

    def _from_hf(self, job: JobRecord, builder: RunBuilder, name: str) -> CheckpointInfo:
        """``init_from: hf:DIR``: the Hugging Face directory's weights as a checkpoint of
        step -1 under the job's root, which the job (and its recoveries) start from."""
        from workers.session import start_from_hf

        directory = inside_data_dir(self.settings.data_dir, name, what="init_from")
        if not directory.is_dir():
            raise HetschedError(
                f"init_from: no directory {name!r} in the server's data directory "
                f"{self.settings.data_dir.resolve()}"
            )
        info = start_from_hf(
            directory,
            model=builder.job.model,
            ref=f"hf:{name}",
            uri=f"{self.settings.job_checkpoints(job.id)}/init-hf",
            manifest={"job": job.id, "init_from": f"hf:{name}"},
        )
        self.store.log(job.id, "INFO", f"starting from the Hugging Face weights in {name}")
        return info


class RunningMedian:
    """The median of the step times after a run's first (its warm-up), or the first alone
    while there is no other, kept in O(log n) a step: two heaps, the lower half negated
    (the classic two-heap running median), where re-sorting every step's time at every step
    cost a long job O(n log n) a step."""

    def __init__(self) -> None:
        self._first: float | None = None
        self._low: list[float] = []  # the smaller half, negated: -low[0] is its largest
        self._high: list[float] = []  # the larger half: high[0] is its smallest

    def add(self, x: float) -> None:
        if self._first is None:
            self._first = x
            return
        heapq.heappush(self._low, -heapq.heappushpop(self._high, x))
        if len(self._low) > len(self._high):
            heapq.heappush(self._high, -heapq.heappop(self._low))

    @property
    def value(self) -> float:
        if not self._high:
            if self._first is None:
                raise ValueError("RunningMedian: no value yet")
            return self._first
        if len(self._high) > len(self._low):
            return self._high[0]
        return (self._high[0] - self._low[0]) / 2


@dataclass(kw_only=True, slots=True)
class JobHooks:
    """What one run of a job reports, written to the job store, its log and its
    :class:`LiveJob`; a :class:`workers.session.RunHooks` by shape (not by base class:
    the workers load when the first job runs)."""

    runner: JobRunner
    job: JobRecord
    live: LiveJob
    median_step_s: RunningMedian = field(default_factory=RunningMedian)
    """This run's step times so far, for the job's measured step time."""
    step_ended: float = 0.0
    """``time.monotonic()`` at the latest step's end: a checkpoint's duration starts there."""

    def on_step(self, m: StepMetrics) -> None:
        job_id, steps = self.job.id, self.job.spec.steps
        self.median_step_s.add(m.step_s)
        self.runner.store.add_step(
            job_id,
            step=m.step,
            loss=m.loss,
            step_s=m.step_s,
            samples_per_s=m.samples_per_s,
            devices=[d.to_dict() for d in m.devices],
            measured_step_s=self.median_step_s.value,
            val_loss=m.val_loss,
        )
        live = self.live
        live.step_s, live.samples_per_s = m.step_s, m.samples_per_s
        live.steps_done = m.step + 1
        live.device_steps = {d.id: (d.busy_s, d.wait_s, d.peak_bytes) for d in m.devices}
        self.step_ended = time.monotonic()
        if self.runner.telemetry is not None:
            self.runner.telemetry.step(job_id, step_s=m.step_s, loss=m.loss, val_loss=m.val_loss)
        if m.val_loss is not None:
            self._log("INFO", f"step {m.step}: validation loss {m.val_loss:.4f}")
        if m.step < 3 or (m.step + 1) % max(1, steps // 20) == 0 or m.step + 1 == steps:
            self._log(
                "INFO",
                f"step {m.step} ({m.step + 1}/{steps} done): loss {m.loss:.4f}, "
                f"{m.step_s * 1e3:.0f} ms, {m.samples_per_s:.1f} samples/s",
            )

    def on_checkpoint(self, info: CheckpointInfo, kept_steps: tuple[int, ...]) -> None:
        self.runner.store.add_checkpoint(
            self.job.id, step=info.step, uri=info.uri, keep=list(kept_steps)
        )
        if self.runner.telemetry is not None and self.step_ended:
            self.runner.telemetry.checkpoint_seconds.observe(time.monotonic() - self.step_ended)

    def on_recovery(self, recovery: Recovery) -> None:
        record = recovery.to_dict()
        if self.runner.telemetry is not None:
            self.runner.telemetry.event("recovery")
            self.runner.telemetry.recovery_seconds.observe(recovery.recover_s)
        self.runner.store.add_event(
            self.job.id, kind="recovery", step=recovery.resumed_step, data=record
        )
        self._log(
            "WARNING",
            f"recovered from {recovery.error} at step {recovery.failed_step}: "
            f"devices lost: {', '.join(recovery.lost) or 'none'}; resumed at step "
            f"{recovery.resumed_step} in {recovery.recover_s:.1f} s",
        )

    def on_replan(self, decision: ReplanDecision) -> None:
        store, plan = self.runner.store, decision.new_plan
        if self.runner.telemetry is not None:
            self.runner.telemetry.event("replan")
        store.add_event(self.job.id, kind="replan", step=decision.step, data=decision.to_dict())
        self._log("INFO", f"re-planned at step {decision.step}: {decision.reason}")
        store.set_plan(self.job.id, plan, [d.id for d in plan.active])

    def on_host_bound(self, notice: HostBound) -> None:
        if self.runner.telemetry is not None:
            self.runner.telemetry.event("host_bound")
        self.runner.store.add_event(
            self.job.id, kind="host_bound", step=notice.step, data=notice.to_dict()
        )
        self._log("WARNING", notice.message())

    def on_plan(self, plan: Plan) -> None:
        self.runner.record_plan(self.job, self.live, plan)

    def should_stop(self) -> bool:
        return self.live.pausing()

    def claim(self, device_ids: Sequence[str]) -> list[str]:
        # Every device the job may use that is not lost and no other job holds: a device
        # the first plan handed back may now be what keeps the job going.
        return self.runner.claim(self.live, list(device_ids))

    def _log(self, level: str, message: str) -> None:
        self.runner.store.log(self.job.id, level, message)
