"""The job executor: scheduling rounds that decide which devices each job holds.

One dispatcher thread asks the service's policy (:mod:`scheduler.policy.decide`)
whenever something changes and every ``round_s``, and applies its answer;
the devices themselves change hands through :class:`~api.execution.ledger.DeviceLedger`,
and each started job runs in a thread of its own (:mod:`api.execution.job_runner`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from api.core.settings import Settings
from api.core.telemetry import Telemetry
from api.execution.job_runner import JobRunner
from api.execution.ledger import DeviceLedger, LiveJob
from api.execution.scheduling import (
    PINNED,
    Demands,
    Schedule,
    ScheduledJob,
    apply_quotas,
    pinned_reason,
    quota_reason,
    running_row,
)
from api.services import ClusterHandle, Profiler
from api.states import JobState
from api.store import FAILED, STOPPED, SUCCEEDED, JobRecord, JobStore, StoreUnavailable
from scheduler.errors import HetschedError
from scheduler.hardware.cluster import Cluster
from scheduler.policy.decide import decide
from scheduler.policy.types import Allocation, JobDemand, PolicySettings

log = logging.getLogger("hetsched.executor")
POLL_S = 1.0
ARRIVAL_GRACE_S = 0.3
"""A round waits until no wake came for this long (at most ``ARRIVAL_MAX_S``), so jobs
submitted together are decided together."""
ARRIVAL_MAX_S = 2.0
FINISH_RETRY_S = 1.0
"""Pause between attempts at a job's final state once the store's own retries gave up."""


class Executor:
    """Owns the scheduling rounds and each started job's thread.

    A round asks the policy (``HETSCHED_POLICY``: ``fifo``, ``fair`` or ``goodput``)
    which devices every running and waiting job should hold, from each job's planned
    rate on candidate device sets (:mod:`api.execution.scheduling`), and applies it:
    a waiting job starts once its devices are free; a running job given other
    devices checkpoints, hands its devices over, and goes on from that checkpoint
    re-planned on its new ones. Waiting jobs age (the policy's ``max_wait_s``), so
    none is starved. An ``allocation`` event on the job records every start and move.

    A job whose spec names its devices is pinned (:attr:`JobRecord.pinned`): it runs
    on exactly those, never moves, and goes ahead of the policy's jobs for them; while
    it waits it reserves those that are free (under ``fifo`` it also waits behind an
    older waiting job). On shutdown running jobs stop at a checkpoint but stay RUNNING
    in the store; the next start resumes each on its devices, before any queued job.
    """

    def __init__(
        self,
        *,
        store: JobStore,
        handle: ClusterHandle,
        profiler: Profiler,
        settings: Settings,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.store = store
        self.telemetry = telemetry
        self.handle = handle
        self.profiler = profiler
        self.settings = settings
        self.policy = settings.policy
        self.policy_settings = PolicySettings(reallocation_s=settings.reallocation_s)
        self.demands = Demands(store=store, data_dir=settings.data_dir)
        self._wake = threading.Event()
        self._closing = threading.Event()
        self.ledger = DeviceLedger(on_release=self._wake.set)
        self._thread: threading.Thread | None = None
        self._schedule = Schedule(policy=self.policy, round_s=settings.round_s)
        self.runner = JobRunner(
            store=store,
            handle=handle,
            profiler=profiler,
            settings=settings,
            release=self.ledger.release,
            claim=self.ledger.claim,
            telemetry=telemetry,
        )

    # --- lifecycle --------------------------------------------------------------

    def start(self) -> None:
        for job in self.store.running():  # the service restarted while these ran: resume them
            devices = job.devices or job.spec.devices or []
            if not devices and self.handle.cluster is not None:
                devices = self.handle.cluster.ids
            live = self.ledger.resume(job.id, devices, pinned=job.pinned, project=job.project)
            live.steps_done = job.steps_done  # what it did before: a stop now says so
            live.reason = "resumed on its devices after the service restarted"
            self._thread_for(job, live, resume=True)
        self._thread = threading.Thread(target=self._loop, name="hetsched-dispatch", daemon=True)
        self._thread.start()
        # Warm every device's worker in the background: the first job then starts warm.
        threading.Thread(target=self.handle.warm, name="hetsched-warm", daemon=True).start()

    def shutdown(self, timeout_s: float = 30.0) -> None:
        self._closing.set()
        self._wake.set()
        for job in self.ledger.close():
            if job.thread is not None:
                job.thread.join(timeout_s)
        if self._thread is not None:
            self._thread.join(timeout_s)

    def wake(self) -> None:
        self._wake.set()

    def request_stop(self, job_id: str) -> bool:
        """Tell the job's runner to stop after its step; False when no runner has it."""
        return self.ledger.stop(job_id)

    # --- what is running -----------------------------------------------------------

    def busy_devices(self) -> dict[str, str]:
        """Device id -> id of the job running on it."""
        return self.ledger.holders()

    def live(self) -> list[LiveJob]:
        return self.ledger.jobs()

    def schedule(self) -> Schedule:
        """The latest round's decision (``GET /api/v1/schedule``), its jobs matched to the
        ledger as ``busy_devices`` is: a round shows a job RUNNING before it publishes, so a
        job it is starting is listed as running, and one that ended is not listed."""
        schedule = self._schedule
        live = {lj.job_id: lj for lj in self.ledger.jobs()}
        kept = [r for r in schedule.jobs if (r.status == "waiting") != (r.job_id in live)]
        listed = {r.job_id for r in kept}
        for job_id, lj in live.items():
            record = None if job_id in listed else self.store.get(job_id)
            if record is not None and record.state is JobState.RUNNING:
                kept.append(running_row(record, lj, None))
        return replace(schedule, jobs=tuple(kept))

    # --- rounds ------------------------------------------------------------------

    def _loop(self) -> None:
        last = 0.0
        while not self._closing.is_set():
            woken = self._wake.is_set()
            if woken:
                self._settle()
            self._wake.clear()
            if woken or time.monotonic() - last >= self.settings.round_s:
                last = time.monotonic()
                try:
                    self._round()
                except Exception:  # a bad record must not stop the queue
                    log.exception("scheduling round failed")
            self._wake.wait(POLL_S)

    def _settle(self) -> None:
        """Let a burst of wakes (several submissions) end before deciding."""
        deadline = time.monotonic() + ARRIVAL_MAX_S
        while time.monotonic() < deadline and not self._closing.is_set():
            self._wake.clear()
            if not self._wake.wait(ARRIVAL_GRACE_S):
                return

    def _round(self) -> None:
        """Start the pinned jobs whose devices are free, then let the policy share the rest."""
        pending = self.store.pending()
        cluster = self.handle.cluster
        if cluster is None or not self.handle.available:
            for job in pending:
                self._wait(job, f"waiting: cluster unavailable ({self.handle.message})")
            return
        waiting = [j for j in pending if not j.pinned]
        blocked = set(self._lost())  # and below: what pinned jobs reserve or run on
        held = self.ledger.holders()
        rows = [self._pinned(j, held, blocked, waiting) for j in pending if j.pinned]
        live = self.ledger.jobs()
        # fifo sees pinned jobs as jobs that keep their devices, so a job wanting the whole
        # cluster waits for them as it always did; the other policies share what is left.
        if self.policy != "fifo":
            blocked |= {d for j in live if j.pinned for d in j.granted}
        shared_ids = [d for d in cluster.ids if d not in blocked]
        shared = [j for j in live if self.policy == "fifo" or not j.pinned]
        if not shared_ids:
            why = "every device is lost or held by jobs that named their devices"
            for job in waiting:
                self._wait(job, f"waiting for devices: {why}")
                rows.append(ScheduledJob.of(job, "waiting", reason=why))
        if not shared_ids or (all(j.pinned for j in shared) and not waiting):
            self._publish(rows, live)
            return
        if not live and len(waiting) == 1 and self._alone(waiting[0], shared_ids, rows):
            self._publish(rows, live)
            return
        self._share(cluster, cluster.subset(shared_ids), shared, waiting, rows, live)

    def _alone(self, job: JobRecord, device_ids: list[str], rows: list[ScheduledJob]) -> bool:
        """A job alone on an idle cluster starts at once on every device it may use: no
        policy choice to make, and its own plan (from its profile, measured as it starts)
        keeps the devices that speed it up and hands back the others. False when it bounds
        its device count, or its project's quota does, below the cluster's, so the policy
        must choose which."""
        spec = job.spec
        if spec.max_devices is not None and spec.max_devices < len(device_ids):
            return False
        quota = self.store.accounts.project(job.project)
        cap = quota.max_devices if quota is not None else None
        if cap is not None and cap < len(device_ids):
            return False
        if spec.min_devices > len(device_ids):
            return False
        reason = (
            f"alone on an idle cluster: all {len(device_ids)} devices; "
            "its plan keeps those that help it"
        )
        if not self._start(job, device_ids, reason=reason):
            return False
        rows.append(
            ScheduledJob.of(
                job, "running", held=tuple(device_ids), devices=tuple(device_ids), reason=reason
            )
        )
        return True

    def _share(
        self,
        cluster: Cluster,
        sub: Cluster,
        shared: list[LiveJob],
        waiting: list[JobRecord],
        rows: list[ScheduledJob],
        live: list[LiveJob],
    ) -> None:
        """Let the policy share ``sub`` (of ``cluster``) among ``shared`` and ``waiting`` jobs."""
        records = {j.job_id: self.store.get(j.job_id) for j in shared}
        demands = self._quotas(self._demands(sub, shared, records, waiting), records, waiting, rows)
        self._measure(demands, waiting, idle=not live)
        allocation = decide(
            sub,
            demands,
            policy=self.policy,
            rates=self.demands.rates_for(cluster),
            settings=self.policy_settings,
        )
        for lj in shared:
            if not lj.pinned:
                self._steer(lj, allocation)
        by_id = {j.id: j for j in waiting}
        for demand in demands:
            queued = by_id.get(demand.name)
            if queued is not None:
                rows.append(self._place(queued, allocation))
        sources = {d.model: self.demands.source(d.model) for d in demands}
        self._publish(rows, live, allocation, sources, records)

    def _demands(
        self,
        sub: Cluster,
        shared: list[LiveJob],
        records: dict[str, JobRecord | None],
        waiting: list[JobRecord],
    ) -> list[JobDemand]:
        """What each running and waiting job asks of the policy on ``sub``."""
        demands: list[JobDemand] = []
        present = set(sub.ids)
        for lj in shared:
            record = records[lj.job_id]
            have = tuple(d for d in (lj.granted or lj.devices) if d in present)
            if record is not None and have:
                demands.append(
                    self.demands.demand(record, held=have, steps_done=lj.steps_done, cluster=sub)
                )
        for job in waiting:
            try:
                demands.append(self.demands.demand(job, held=(), steps_done=0, cluster=sub))
            except HetschedError as exc:  # cannot happen for a job the API accepted
                self._wait(job, f"waiting: {exc}")
        return demands

    def _quotas(
        self,
        demands: list[JobDemand],
        records: dict[str, JobRecord | None],
        waiting: list[JobRecord],
        rows: list[ScheduledJob],
    ) -> list[JobDemand]:
        """The demands within their projects' quotas, weighted by project; the jobs a quota
        holds back wait, saying which."""
        project_of = {j.id: j.project for j in waiting}
        project_of |= {i: r.project for i, r in records.items() if r is not None}
        projects = {p.name: p for p in self.store.accounts.projects()}
        held = self.ledger.held_by_project()
        kept, held_back = apply_quotas(demands, project_of=project_of, projects=projects, held=held)
        for job in waiting:
            why = held_back.get(job.id)
            if why:
                self._wait(job, f"waiting: {why}")
                rows.append(ScheduledJob.of(job, "waiting", reason=why))
        return kept

    def _lost(self) -> set[str]:
        return self.handle.pool.lost() if self.handle.pool is not None else set()

    def _measure(self, demands: list[JobDemand], waiting: list[JobRecord], *, idle: bool) -> None:
        """Use measured rates for each model; on an idle cluster, measure it first (cached),
        and the jobs that wait for it say so."""
        cluster = self.handle.cluster
        assert cluster is not None
        for name in {d.model for d in demands}:
            if self.demands.use_measured(name, cluster) or not idle:
                continue
            job = next(d for d in demands if d.model == name)
            record = self.store.get(job.name)
            if record is None:
                continue
            for other in waiting:
                if self.demands.model_of(other)[0] == name:
                    self._wait(other, f"waiting: profiling the devices for {name} to place it")
            try:
                model = self.demands.model_of(record)[1]
                lost = self._lost()
                self.profiler.measure(model, [d for d in cluster.ids if d not in lost])
            except Exception as exc:  # the policy falls back on catalogue figures
                log.warning("could not measure %s for scheduling: %s", name, exc)
                continue
            self.demands.use_measured(name, cluster)

    def _pinned(
        self,
        job: JobRecord,
        held: dict[str, str],
        blocked: set[str],
        waiting: list[JobRecord],
    ) -> ScheduledJob:
        """Start a pinned job if its devices are free; otherwise it reserves them."""
        wanted = list(job.spec.devices or [])
        taken = {d: held[d] for d in wanted if d in held}
        reserved = [d for d in wanted if d in blocked and d not in taken]
        ahead = [o for o in waiting if o.created_at < job.created_at]
        quota = self.store.accounts.project(job.project)
        over = quota_reason(
            quota, held=self.ledger.held_by_project().get(job.project, 0), need=len(wanted)
        )
        if over:
            why = over
        elif self.policy == "fifo" and ahead:
            why = f"waiting for job {ahead[0].id} (first in line)"
        elif taken:
            holders = ", ".join(sorted(set(taken.values())))
            why = f"waiting for {', '.join(sorted(taken))} (held by job {holders})"
        elif reserved:
            why = f"waiting for {', '.join(reserved)} (reserved or lost)"
        else:
            why = ""
        if why:
            if not over:  # reserved: the policy's jobs cannot take them from it
                blocked.update(wanted)
            self._wait(job, f"waiting: {why}" if over else why)
            return ScheduledJob.of(job, "waiting", devices=tuple(wanted), reason=why)
        reason = pinned_reason(len(wanted))
        if not self._start(job, wanted, reason=reason):
            return ScheduledJob.of(job, "waiting", devices=tuple(wanted), reason="starting")
        for d in wanted:
            held[d] = job.id
        return ScheduledJob.of(
            job, PINNED, held=tuple(wanted), devices=tuple(wanted), reason=reason
        )

    def _place(self, job: JobRecord, allocation: Allocation) -> ScheduledJob:
        """Start a waiting job where the policy put it, once those devices are free."""
        ids = list(allocation.devices.get(job.id, ()))
        reason = allocation.reasons.get(job.id, "")
        rate = allocation.samples_per_s.get(job.id, 0.0)
        if not ids:
            self._wait(job, f"waiting for devices ({self.policy}): {reason}")
            return ScheduledJob.of(job, "waiting", reason=reason)
        if not self._start(job, ids, reason=reason, rate=rate):
            holders = self.ledger.holders()
            moving = sorted({holders[d] for d in ids if d in holders})
            why = f"waiting for {', '.join(moving)} to hand over its devices ({reason})"
            self._wait(job, f"waiting for devices: job {why}")
            return ScheduledJob.of(job, "waiting", devices=tuple(ids), rate=rate, reason=why)
        return ScheduledJob.of(
            job, "running", held=tuple(ids), devices=tuple(ids), rate=rate, reason=reason
        )

    def _steer(self, live: LiveJob, allocation: Allocation) -> None:
        """Tell a running job whether the policy moves it, and where."""
        ids = list(allocation.devices.get(live.job_id, ()))
        if not ids:
            return  # the policies never preempt a running job; nothing to do
        reason = allocation.reasons.get(live.job_id, "")
        if self.ledger.steer(live, ids, reason):
            self.store.log(
                live.job_id,
                "INFO",
                f"{self.policy}: moving to {', '.join(ids)} at the next step: {reason}",
            )

    def _publish(
        self,
        rows: list[ScheduledJob],
        live: list[LiveJob],
        allocation: Allocation | None = None,
        sources: dict[str, str] | None = None,
        records: dict[str, JobRecord | None] | None = None,
    ) -> None:
        """Keep the round's decision for ``GET /schedule``: ``rows`` and every running job."""
        records = records or {}
        for lj in live:
            record = records.get(lj.job_id) or self.store.get(lj.job_id)
            if record is not None:
                rows.append(running_row(record, lj, allocation))
        self._schedule = Schedule(
            policy=self.policy,
            round_s=self.settings.round_s,
            decided_at=datetime.now(UTC),
            solver=allocation.solver if allocation is not None else "",
            rates=sources or {},
            jobs=tuple(rows),
        )

    # --- starting and moving --------------------------------------------------------

    def _start(self, job: JobRecord, devices: list[str], *, reason: str, rate: float = 0.0) -> bool:
        """Start ``job`` on ``devices`` if none is held; False otherwise (or stopped)."""
        quota = self.store.accounts.project(job.project)
        live = self.ledger.admit(
            job.id,
            devices,
            pinned=job.pinned,
            project=job.project,
            max_devices=quota.max_devices if quota is not None else None,
        )
        if live is None:
            return False
        live.reason, live.rate = reason, rate  # before the store shows it running
        allocation = self._allocation(live, old=(), new=tuple(devices), reason=reason, rate=rate)
        if not self.store.start(job.id, list(devices), allocation=allocation):
            self.ledger.remove(job.id)
            return False  # stopped meanwhile
        self.store.log(job.id, "INFO", f"started on {', '.join(devices)}")
        if self.telemetry is not None:
            self.telemetry.event("allocation")
            if job.started_at is None:  # its first start
                waited_s = (datetime.now(UTC) - job.created_at.replace(tzinfo=UTC)).total_seconds()
                self.telemetry.queue_wait_seconds.observe(max(0.0, waited_s))
        self._thread_for(job, live, resume=False)
        return True

    def _thread_for(self, job: JobRecord, live: LiveJob, *, resume: bool) -> None:
        live.thread = threading.Thread(
            target=self._run, args=(job, live, resume), name=f"hetsched-job-{job.id}", daemon=True
        )
        live.thread.start()

    def _allocation(
        self, live: LiveJob, *, old: tuple[str, ...], new: tuple[str, ...], reason: str, rate: float
    ) -> dict[str, Any]:
        """The data of an ``allocation`` event: the job's allocation history on its page."""
        return {
            "policy": PINNED if live.pinned else self.policy,
            "from": list(old),
            "to": list(new),
            "reason": reason,
            "samples_per_s": rate,
        }

    def _move(self, live: LiveJob) -> bool:
        """Hand the job's devices over and take its new ones; False: it was stopped."""
        move = self.ledger.park(live)
        if move is None:
            return False
        live.reason, live.rate = move.reason, 0.0
        self.store.log(
            live.job_id,
            "INFO",
            f"{self.policy}: moved from {', '.join(move.old)} to {', '.join(move.new)} "
            f"at step {live.steps_done}",
        )
        allocation = self._allocation(
            live, old=move.old, new=move.new, reason=move.reason, rate=0.0
        )
        self.store.add_event(live.job_id, kind="allocation", step=live.steps_done, data=allocation)
        if self.telemetry is not None:
            self.telemetry.event("allocation")
        return True

    def _wait(self, job: JobRecord, message: str) -> None:
        if job.message != message:
            self.store.set_waiting(job.id, message)

    # --- one job --------------------------------------------------------------------

    def _run(self, job: JobRecord, live: LiveJob, resume: bool = False) -> None:
        try:
            state, message = self._train(job, live, resume)
        except StoreUnavailable as exc:  # a database stall outlasted the store's retries
            state, message = FAILED, f"failed after {live.steps_done} steps: {exc}"
        except HetschedError as exc:
            state, message = FAILED, str(exc)
        except Exception as exc:  # a runtime bug must still end the job with a reason
            log.exception("job %s crashed", job.id)
            state, message = FAILED, f"internal error: {type(exc).__name__}: {exc}"
        finally:
            self.demands.forget(job.id)
        try:
            if state is not None:  # None: shutting down, left RUNNING for the restart to resume
                self._finish(job.id, state, message)
        finally:
            # Only now: while it holds its devices, a stop reaches this runner, not a dead job.
            self.ledger.remove(job.id)

    def _finish(self, job_id: str, state: JobState, message: str) -> None:
        """The job's final state, retried until it lands: a job the database stalled must
        not stay RUNNING with no runner. Gives up only when the service shuts down (the
        job then stays RUNNING, and the next start resumes it)."""
        while True:
            try:
                finished = self.store.finish(job_id, state, message)
                break
            except StoreUnavailable as exc:
                if self._closing.is_set():
                    log.error("job %s: shutting down before %s landed: %s", job_id, state, exc)
                    return
                log.error("job %s: %s did not land yet (%s); retrying", job_id, state, exc)
                self._closing.wait(FINISH_RETRY_S)
        if finished:
            with contextlib.suppress(StoreUnavailable):
                self.store.log(
                    job_id, "ERROR" if state == FAILED else "INFO", f"{state}: {message}"
                )

    def _train(self, job: JobRecord, live: LiveJob, resume: bool) -> tuple[JobState | None, str]:
        self._check_stop(job.id, live)
        moved = False
        while True:
            if live.stop.is_set():
                return self._stopped(live.steps_done)
            result = self.runner.run(job, live, resume=resume, moved=moved)
            if result is not None and not result.stopped:
                return SUCCEEDED, f"finished {job.spec.steps} steps"
            if live.stop.is_set() or not live.move.is_set():
                return self._stopped(live.steps_done)
            if not self._move(live):
                return self._stopped(live.steps_done)
            moved = True

    def _check_stop(self, job_id: str, live: LiveJob) -> None:
        """Pick up a stop request stored before this job's event existed."""
        record = self.store.get(job_id)
        if record is not None and record.stop_requested:
            live.stop.set()

    def _stopped(self, steps_done: int) -> tuple[JobState | None, str]:
        if self._closing.is_set():
            return None, ""
        return STOPPED, f"stopped on request after {steps_done} steps"
