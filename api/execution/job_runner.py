"""One job's run on the service: profile, plan, train durably, record what changed.

Called by the executor's runner thread (:mod:`api.execution.executor`). The job trains
on the cluster handle's warm workers through ``workers.session.train`` with:

- checkpoints every ``checkpoint_every`` steps (default a tenth of the job,
  at most 50) and/or ``checkpoint_every_s`` seconds, and at a stop and the
  end, under ``<checkpoint root>/<job id>`` (``HETSCHED_CHECKPOINT_URI``);
- recovery from up to ``max_failures`` failed devices: the same global batch
  is planned again on the job's devices that are still there and the last
  checkpoint restored into that plan;
- live re-planning when a device's speed changes (``replan``, default the
  service's ``HETSCHED_REPLAN``);
- a start from another job's checkpoint or a Hugging Face directory in the
  data directory (``init_from``), or, when the service restarted while the
  job ran, from the job's own last checkpoint.

Every recovery, re-plan and restart is an event on the job (``GET
/jobs/{id}``) and a log line; every checkpoint is listed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from api.core.settings import Settings
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
from scheduler.planning.planner import make_plan

if TYPE_CHECKING:  # the workers (torch, Ray) load when the first job runs
    from scheduler.replan.decision import ReplanDecision
    from workers.session import CheckpointInfo, Recovery, TrainResult

MAX_CHECKPOINT_EVERY = 50
SHAPE_FIELDS = (
    "family",
    "num_layers",
    "d_model",
    "num_heads",
    "num_kv_heads",
    "d_ff",
    "vocab_size",
    "max_seq_len",
    "norm_eps",
    "rope_theta",
    "gelu_approximate",
)
"""What a job's model must share with ``init_from``'s weights (shapes and the functions)."""


@dataclass(kw_only=True, slots=True)
class LiveJob:
    """What the dashboard and /metrics read about a running job without the database."""

    job_id: str
    devices: list[str]
    stop: threading.Event = field(default_factory=threading.Event)
    step_s: float | None = None
    samples_per_s: float | None = None
    steps_done: int = 0
    device_steps: dict[str, tuple[float, float, int]] = field(default_factory=dict)
    """id -> (busy_s, wait_s, peak_bytes) of the latest step."""
    thread: threading.Thread | None = None
    pinned: bool = False
    """It named its devices: the policy never moves it."""
    granted: list[str] = field(default_factory=list)
    """What the policy last gave it (its plan may leave some of them out)."""
    move_to: list[str] | None = None
    """Devices the policy moves it to at its next step boundary; None: it stays."""
    move_reason: str = ""
    move: threading.Event = field(default_factory=threading.Event)
    """Set when it should checkpoint and hand its devices over (see ``move_to``)."""

    def pausing(self) -> bool:
        """Checked between steps: stop for good, or for a move."""
        return self.stop.is_set() or self.move.is_set()


def checkpoint_every(steps: int, asked: int | None) -> int:
    """The job's checkpoint interval in steps.

    >>> checkpoint_every(200, None), checkpoint_every(2000, None), checkpoint_every(5, None)
    (20, 50, 1)
    """
    return asked if asked is not None else min(MAX_CHECKPOINT_EVERY, max(1, steps // 10))


@dataclass(kw_only=True, slots=True)
class JobRunner:
    store: JobStore
    handle: ClusterHandle
    profiler: Profiler
    settings: Settings
    release: Callable[[LiveJob, list[str]], None]
    """Sets the devices a job holds (the others go back to the queue)."""
    claim: Callable[[LiveJob, list[str]], list[str]]
    """Atomically: of these devices, those no other job holds become the job's."""

    def root(self, job_id: str) -> str:
        return f"{self.settings.checkpoint_root}/{job_id}"

    def run(
        self, job: JobRecord, live: LiveJob, *, resume: bool, moved: bool = False
    ) -> TrainResult | None:
        """Train ``job``; None when a stop came before training started.

        ``moved``: the policy moved it to ``live.devices``; it goes on from its own
        last checkpoint (written where the move stopped it), re-planned there.
        """
        from workers.session import (
            Checkpointing,
            CheckpointStore,
            LiveReplanning,
            OptimizerConfig,
            StepMetrics,
            default_validation,
            train,
        )

        spec, store = job.spec, self.store
        model = model_from_ref(spec.model, data_dir=self.settings.data_dir)
        store.log(job.id, "INFO", f"profiling {model.name} on {len(live.devices)} devices")
        wanted = list(live.devices)  # what the job may use; its plan may hand some back
        profile = self.profiler.measure(model, wanted)

        plan = make_plan(profile, spec.global_batch, spec.strategy)
        self._set_plan(job, live, plan)
        if live.stop.is_set():
            return None
        restore = self._latest(job) if moved else self._restore(job, resume=resume)
        dataset = resolve_dataset(
            self.settings.data_dir,
            spec.dataset,
            seq_len=model.seq_len,
            vocab_size=model.vocab_size,
            global_batch=spec.global_batch,
        )
        opt = spec.optimizer
        optimizer = OptimizerConfig(
            lr=opt.lr,
            weight_decay=opt.weight_decay,
            warmup_steps=opt.warmup_steps,
            decay_steps=opt.decay_steps,
            min_lr_ratio=opt.min_lr_ratio,
            grad_clip=opt.grad_clip,
        )
        every = max(1, spec.steps // 20)
        step_times: list[float] = []

        def on_step(m: StepMetrics) -> None:
            step_times.append(m.step_s)
            store.add_step(
                job.id,
                step=m.step,
                loss=m.loss,
                step_s=m.step_s,
                samples_per_s=m.samples_per_s,
                devices=[
                    {"id": d.id, "busy_s": d.busy_s, "wait_s": d.wait_s, "peak_bytes": d.peak_bytes}
                    for d in m.devices
                ],
                step_times_s=step_times,
                val_loss=m.val_loss,
            )
            live.step_s, live.samples_per_s = m.step_s, m.samples_per_s
            live.steps_done = m.step + 1
            live.device_steps = {d.id: (d.busy_s, d.wait_s, d.peak_bytes) for d in m.devices}
            if m.val_loss is not None:
                store.log(job.id, "INFO", f"step {m.step + 1}: validation loss {m.val_loss:.4f}")
            if m.step < 3 or (m.step + 1) % every == 0 or m.step + 1 == spec.steps:
                store.log(
                    job.id,
                    "INFO",
                    f"step {m.step + 1}/{spec.steps}: loss {m.loss:.4f}, "
                    f"{m.step_s * 1e3:.0f} ms, {m.samples_per_s:.1f} samples/s",
                )

        def on_checkpoint(info: CheckpointInfo) -> None:
            kept = [c.step for c in CheckpointStore(self.root(job.id)).complete()]
            store.add_checkpoint(job.id, step=info.step, uri=info.uri, keep=kept)

        def on_recovery(recovery: Recovery) -> None:
            record = recovery.to_dict()
            store.add_event(job.id, kind="recovery", step=record["resumed_step"], data=record)
            lost = ", ".join(record["lost"]) or "none"
            store.log(
                job.id,
                "WARNING",
                f"recovered from {record['error']} at step {record['failed_step']}: "
                f"devices lost: {lost}; resumed at step {record['resumed_step']} "
                f"in {record['recover_s']:.1f} s",
            )

        def on_replan(decision: ReplanDecision) -> None:
            store.add_event(job.id, kind="replan", step=decision.step, data=decision.to_dict())
            store.log(job.id, "INFO", f"re-planned at step {decision.step}: {decision.reason}")
            store.set_plan(job.id, decision.new_plan, [d.id for d in decision.new_plan.active])

        def replan(lost: set[str]) -> Plan:
            # Every device the job may use that is not lost and no other job holds: a device
            # the first plan handed back may now be what keeps the job going.
            usable = self.claim(live, [d for d in wanted if d not in lost])
            if not usable:
                raise HetschedError(
                    f"recovery: no usable device left (lost: {', '.join(sorted(lost))})"
                )
            new_plan = make_plan(profile.subset(usable), spec.global_batch, spec.strategy)
            self._set_plan(job, live, new_plan)
            return new_plan

        follow = spec.replan if spec.replan is not None else self.settings.replan
        assert self.handle.cluster is not None
        # The whole cluster, not the subset: simulated pacing is relative to its
        # fastest device, as it was when the profile was measured.
        return train(
            cluster=self.handle.cluster,
            model=model,
            plan=plan,
            steps=spec.steps,
            seed=spec.seed,
            dataset=dataset,
            optimizer=optimizer,
            simulated=self.handle.simulated,
            on_step=on_step,
            should_stop=live.pausing,
            cache_dir=self.profiler.cache_dir,
            pool=self.handle.pool,
            checkpointing=Checkpointing(
                root=self.root(job.id),
                every_steps=checkpoint_every(spec.steps, spec.checkpoint_every),
                every_s=spec.checkpoint_every_s,
                manifest={"job": job.id, "spec": spec.model_dump(mode="json")},
            ),
            restore=restore,
            max_failures=spec.max_failures,
            replan=replan,
            on_checkpoint=on_checkpoint,
            on_recovery=on_recovery,
            live=LiveReplanning(profile=profile, strategy=spec.strategy, total_steps=spec.steps)
            if follow
            else None,
            on_replan=on_replan,
            validation=default_validation(
                spec.steps, every=spec.val_every, batches=spec.val_batches
            ),
        )

    def _set_plan(self, job: JobRecord, live: LiveJob, plan: Plan) -> None:
        active = [d.id for d in plan.active]
        self.store.set_plan(job.id, plan, active)
        self.store.log(job.id, "INFO", plan_summary(plan))
        for excluded in plan.excluded:
            self.store.log(job.id, "WARNING", f"{excluded.id} left out: {excluded.reason}")
        released = [d for d in live.devices if d not in active]
        if released:
            self.release(live, active)
            self.store.log(job.id, "INFO", f"released {', '.join(released)} (not in the plan)")

    def _latest(self, job: JobRecord) -> CheckpointInfo | None:
        """The job's own last checkpoint, after a move (None: it moved before any)."""
        from workers.session import CheckpointStore

        return CheckpointStore(self.root(job.id)).latest()

    def _restore(self, job: JobRecord, *, resume: bool) -> CheckpointInfo | None:
        """The checkpoint to start from: the job's own after a restart, or ``init_from``'s."""
        from workers.session import CheckpointStore

        if resume:
            latest = CheckpointStore(self.root(job.id)).latest()
            where = (
                f"its checkpoint of step {latest.step}" if latest else "the start (no checkpoint)"
            )
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
            return self._from_hf(job, job.spec.init_from.removeprefix("hf:"))
        other, _, step = job.spec.init_from.partition("@")
        if self.store.get(other) is None:
            raise HetschedError(f"init_from: no job {other!r}")
        source = CheckpointStore(self.root(other))
        info = source.get(int(step)) if step else source.latest()
        if info is None:
            raise HetschedError(f"init_from: job {other} has no checkpoint")
        self.store.log(
            job.id, "INFO", f"starting from job {other}'s checkpoint of step {info.step}"
        )
        return info

    def _from_hf(self, job: JobRecord, name: str) -> CheckpointInfo:
        """``init_from: hf:DIR``: the Hugging Face directory's weights as a checkpoint of
        step -1 under the job's root, which the job (and its recoveries) start from."""
        from workers.models.hf import load_hf_directory
        from workers.session import write_weights

        directory = inside_data_dir(self.settings.data_dir, name, what="init_from")
        if not directory.is_dir():
            raise HetschedError(
                f"init_from: no directory {name!r} in the server's data directory "
                f"{self.settings.data_dir.resolve()}"
            )
        model = model_from_ref(job.spec.model, data_dir=self.settings.data_dir)
        preset, state = load_hf_directory(directory, seq_len=model.seq_len)
        for dim in SHAPE_FIELDS:
            if getattr(preset, dim) != getattr(model, dim):
                raise HetschedError(
                    f"init_from: {name} holds a model with {dim} {getattr(preset, dim)}, the "
                    f"job's has {getattr(model, dim)}; give the job model 'hf:{name}'"
                )
        info = write_weights(
            f"{self.root(job.id)}/init-hf", state, {"job": job.id, "init_from": f"hf:{name}"}
        )
        self.store.log(job.id, "INFO", f"starting from the Hugging Face weights in {name}")
        return info
