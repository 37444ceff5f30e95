"""The job executor: scheduling rounds, device allocation, profile, plan, train.

One dispatcher thread runs a scheduling round whenever something changes (a
job is submitted, finishes, fails, stops, or hands devices over) and every
``round_s``. A round asks the service's policy (``HETSCHED_POLICY``:
``fifo``, ``fair`` or the default ``goodput``, :mod:`scheduler.policy.decide`) which
devices every running and waiting job should hold, from each job's planned
rate on candidate device sets (measured profiles when the store has them,
catalogue figures otherwise; :mod:`api.execution.scheduling`), and applies it:

- a waiting job starts on the devices it was given once they are free;
- a running job given other devices (more, fewer, or different ones) is
  asked to stop after its current step with a checkpoint, hands its devices
  over, waits until its new ones are free, and goes on from that checkpoint,
  re-planned for the same global batch on them; an ``allocation`` event on
  the job records the old and new devices and the policy's reason (so does
  its start);
- no job is starved: waiting jobs age (the policy's ``max_wait_s``), and
  ``fifo`` reserves the devices of the job first in line.

A job that names its devices is pinned: it runs on exactly those, never
moves, and goes ahead of the policy's jobs for them; while it waits it
reserves those that are free, so it cannot be starved either. (Under ``fifo``
it also waits behind an older job still waiting, as the queue always did.)
Each started job gets its own runner thread (:mod:`api.execution.job_runner`): profile
(cached), plan, then durable training that writes every step to the store,
checkpoints, recovers from failed devices and follows speed changes; ``POST
/jobs/{id}/stop`` is honoured between steps.

Jobs run on the cluster handle's warm device workers (:mod:`workers.cluster.pool`),
started in the background when the executor starts. On shutdown running jobs
are asked to stop (they checkpoint where they stop) but left RUNNING in the
store; the next start resumes every RUNNING job on its devices from its last
checkpoint, before any queued job, with a ``restart`` event saying so.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime

from api.core.settings import Settings
from api.execution.job_runner import JobRunner, LiveJob
from api.execution.scheduling import Demands, Schedule, ScheduledJob
from api.services import ClusterHandle, Profiler
from api.states import JobState
from api.store import FAILED, STOPPED, SUCCEEDED, JobRecord, JobStore
from scheduler.errors import HetschedError
from scheduler.policy.decide import decide
from scheduler.policy.types import Allocation, JobDemand, PolicySettings

log = logging.getLogger("hetsched.executor")
POLL_S = 1.0
HANDOVER_POLL_S = 0.2
ARRIVAL_GRACE_S = 0.3
"""A round waits until no wake came for this long (at most ``ARRIVAL_MAX_S``), so jobs
submitted together are decided together."""
ARRIVAL_MAX_S = 2.0


class Executor:
    def __init__(
        self, *, store: JobStore, handle: ClusterHandle, profiler: Profiler, settings: Settings
    ) -> None:
        self.store = store
        self.handle = handle
        self.profiler = profiler
        self.settings = settings
        self.policy = settings.policy
        self.policy_settings = PolicySettings(reallocation_s=settings.reallocation_s)
        self.demands = Demands(store=store, data_dir=settings.data_dir)
        self._lock = threading.Lock()
        self._live: dict[str, LiveJob] = {}
        self._handover = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._schedule = Schedule(policy=self.policy, round_s=settings.round_s)
        self.runner = JobRunner(
            store=store,
            handle=handle,
            profiler=profiler,
            settings=settings,
            release=self._release,
            claim=self._claim,
        )

    # --- lifecycle --------------------------------------------------------------

    def start(self) -> None:
        for job in self.store.running():  # the service restarted while these ran: resume them
            devices = job.devices or job.spec.devices or []
            self._launch(job, devices, resume=True, pinned=job.spec.devices is not None)
        self._thread = threading.Thread(target=self._loop, name="hetsched-dispatch", daemon=True)
        self._thread.start()
        # Warm every device's worker in the background: the first job then starts warm.
        threading.Thread(target=self.handle.warm, name="hetsched-warm", daemon=True).start()

    def shutdown(self, timeout_s: float = 30.0) -> None:
        self._closing.set()
        self._wake.set()
        with self._lock:
            live = list(self._live.values())
            self._handover.notify_all()
        for job in live:
            job.stop.set()
        for job in live:
            if job.thread is not None:
                job.thread.join(timeout_s)
        if self._thread is not None:
            self._thread.join(timeout_s)

    def wake(self) -> None:
        self._wake.set()

    def request_stop(self, job_id: str) -> None:
        with self._lock:
            job = self._live.get(job_id)
            self._handover.notify_all()
        if job is not None:
            job.stop.set()

    # --- what is running -----------------------------------------------------------

    def busy_devices(self) -> dict[str, str]:
        with self._lock:
            return {d: job.job_id for job in self._live.values() for d in job.devices}

    def live(self) -> list[LiveJob]:
        with self._lock:
            return list(self._live.values())

    def schedule(self) -> Schedule:
        """The latest round's decision (``GET /api/v1/schedule``)."""
        return self._schedule

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
        pending = self.store.pending()
        cluster = self.handle.cluster
        if cluster is None or not self.handle.available:
            for job in pending:
                self._wait(job, f"waiting: cluster unavailable ({self.handle.message})")
            return
        lost = self.handle.pool.lost() if self.handle.pool is not None else set()
        with self._lock:
            live = list(self._live.values())
        held = {d: j.job_id for j in live for d in j.devices}
        rows: list[ScheduledJob] = []
        blocked = set(lost)  # lost, and reserved by (or started for) pinned waiting jobs
        waiting_unpinned = [j for j in pending if j.spec.devices is None]
        for job in pending:
            if job.spec.devices is not None:
                rows.append(self._pinned(job, held, blocked, waiting_unpinned))
        with self._lock:
            live = list(self._live.values())
        # fifo sees pinned jobs as jobs that keep their devices, so a job wanting the whole
        # cluster waits for them as it always did; the other policies share what is left.
        pinned = [j for j in live if j.pinned]
        if self.policy != "fifo":
            blocked |= {d for j in pinned for d in j.granted}
        shared_ids = [d for d in cluster.ids if d not in blocked]
        shared = [j for j in live if self.policy == "fifo" or not j.pinned]
        if not shared_ids:
            for job in waiting_unpinned:
                why = "every device is lost or held by jobs that named their devices"
                self._wait(job, f"waiting for devices: {why}")
                rows.append(self._row(job, "waiting", (), (), 0.0, why))
            self._publish(rows, live, "", {})
            return
        if not [j for j in shared if not j.pinned] and not waiting_unpinned:
            self._publish(rows, live, "", {})
            return
        records = {j.job_id: self.store.get(j.job_id) for j in shared}
        sub = cluster.subset(shared_ids)
        demands: list[JobDemand] = []
        present = set(shared_ids)
        for lj in shared:
            record = records[lj.job_id]
            have = tuple(d for d in (lj.granted or lj.devices) if d in present)
            if record is not None and have:
                demands.append(
                    self.demands.demand(record, held=have, steps_done=lj.steps_done, cluster=sub)
                )
        for job in waiting_unpinned:
            try:
                demands.append(self.demands.demand(job, held=(), steps_done=0, cluster=sub))
            except HetschedError as exc:  # cannot happen for a job the API accepted
                self._wait(job, f"waiting: {exc}")
        self._measure(demands, idle=not live)
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
        by_id = {j.id: j for j in waiting_unpinned}
        for demand in demands:
            queued = by_id.get(demand.name)
            if queued is not None:
                rows.append(self._place(queued, allocation))
        sources = {d.model: self.demands.source(d.model) for d in demands}
        self._publish(rows, live, allocation.solver, sources, allocation, records)

    def _measure(self, demands: list[JobDemand], *, idle: bool) -> None:
        """Use measured rates for each model; on an idle cluster, measure it first (cached)."""
        cluster = self.handle.cluster
        assert cluster is not None
        for name in {d.model for d in demands}:
            if self.demands.use_measured(name, cluster) or not idle:
                continue
            job = next(d for d in demands if d.model == name)
            record = self.store.get(job.name)
            if record is None:
                continue
            try:
                model = self.demands.model_of(record)[1]
                lost = self.handle.pool.lost() if self.handle.pool is not None else set()
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
        waiting_unpinned: list[JobRecord],
    ) -> ScheduledJob:
        wanted = list(job.spec.devices or [])
        taken = {d: held[d] for d in wanted if d in held}
        reserved = [d for d in wanted if d in blocked and d not in taken]
        ahead = [o for o in waiting_unpinned if o.created_at < job.created_at]
        if self.policy == "fifo" and ahead:
            why = f"waiting for job {ahead[0].id} (first in line)"
        elif taken:
            holders = ", ".join(sorted(set(taken.values())))
            why = f"waiting for {', '.join(sorted(taken))} (held by job {holders})"
        elif reserved:
            why = f"waiting for {', '.join(reserved)} (reserved or lost)"
        else:
            why = ""
        if why:
            blocked.update(wanted)  # reserved: the policy's jobs cannot take them from it
            self._wait(job, why)
            return self._row(job, "waiting", (), tuple(wanted), 0.0, why)
        reason = f"pinned: runs on the {len(wanted)} device(s) it named"
        if not self._start(job, wanted, reason=reason, pinned=True):
            return self._row(job, "waiting", (), tuple(wanted), 0.0, "starting")
        for d in wanted:
            held[d] = job.id
        return self._row(job, "pinned", tuple(wanted), tuple(wanted), 0.0, reason)

    def _place(self, job: JobRecord, allocation: Allocation) -> ScheduledJob:
        ids = list(allocation.devices.get(job.id, ()))
        reason = allocation.reasons.get(job.id, "")
        rate = allocation.samples_per_s.get(job.id, 0.0)
        if not ids:
            self._wait(job, f"waiting for devices ({self.policy}): {reason}")
            return self._row(job, "waiting", (), (), 0.0, reason)
        if not self._start(job, ids, reason=reason, rate=rate):
            holders = self.busy_devices()
            moving = sorted({holders[d] for d in ids if d in holders})
            why = f"waiting for {', '.join(moving)} to hand over its devices ({reason})"
            self._wait(job, f"waiting for devices: job {why}")
            return self._row(job, "waiting", (), tuple(ids), rate, why)
        return self._row(job, "running", tuple(ids), tuple(ids), rate, reason)

    def _steer(self, live: LiveJob, allocation: Allocation) -> None:
        """Tell a running job whether the policy moves it, and where."""
        ids = list(allocation.devices.get(live.job_id, ()))
        if not ids:
            return  # the policies never preempt a running job; nothing to do
        same_as = {frozenset(live.granted), frozenset(live.devices)}
        if frozenset(ids) in same_as and live.move_to is None:
            live.granted = ids
            return
        if live.move.is_set() and not live.devices:
            live.move_to = ids  # parked: it takes the latest decision
            live.move_reason = allocation.reasons.get(live.job_id, "")
            return
        if frozenset(ids) in same_as:  # the policy changed its mind before the move
            live.move_to, live.move_reason = None, ""
            live.move.clear()
            return
        if live.move_to != ids:
            live.move_to = ids
            live.move_reason = allocation.reasons.get(live.job_id, "")
            self.store.log(
                live.job_id,
                "INFO",
                f"{self.policy}: moving to {', '.join(ids)} at the next step: {live.move_reason}",
            )
            live.move.set()

    def _publish(
        self,
        rows: list[ScheduledJob],
        live: list[LiveJob],
        solver: str,
        sources: dict[str, str],
        allocation: Allocation | None = None,
        records: dict[str, JobRecord | None] | None = None,
    ) -> None:
        records = records or {}
        for lj in live:
            record = records.get(lj.job_id) or self.store.get(lj.job_id)
            if record is None:
                continue
            if lj.pinned:
                why = f"pinned: runs on the {len(lj.granted)} device(s) it named"
                rows.append(
                    self._row(record, "pinned", tuple(lj.devices), tuple(lj.granted), 0.0, why)
                )
                continue
            target = lj.move_to if lj.move_to is not None else lj.granted
            reason = lj.move_reason if lj.move_to is not None else ""
            rate = 0.0
            if allocation is not None:
                reason = reason or allocation.reasons.get(lj.job_id, "")
                rate = allocation.samples_per_s.get(lj.job_id, 0.0)
            status = "moving" if lj.move.is_set() else "running"
            rows.append(self._row(record, status, tuple(lj.devices), tuple(target), rate, reason))
        self._schedule = Schedule(
            policy=self.policy,
            round_s=self.settings.round_s,
            decided_at=datetime.now(UTC),
            solver=solver,
            rates=sources,
            jobs=tuple(rows),
        )

    @staticmethod
    def _row(
        job: JobRecord,
        status: str,
        held: tuple[str, ...],
        devices: tuple[str, ...],
        rate: float,
        reason: str,
    ) -> ScheduledJob:
        waiting = status == "waiting"
        return ScheduledJob(
            job_id=job.id,
            name=job.name,
            status=status,  # type: ignore[arg-type]
            held=held,
            devices=devices,
            samples_per_s=rate,
            reason=reason,
            priority=job.spec.priority,
            waiting_s=(datetime.now(UTC) - job.created_at).total_seconds() if waiting else 0.0,
        )

    # --- starting and moving --------------------------------------------------------

    def _start(
        self,
        job: JobRecord,
        devices: list[str],
        *,
        reason: str,
        rate: float = 0.0,
        pinned: bool = False,
    ) -> bool:
        """Start ``job`` on ``devices`` if none is held; False otherwise (or stopped)."""
        with self._lock:
            if any(d in self._live_held() for d in devices):
                return False
            live = self._new_live(job, devices, pinned=pinned)
        if not self.store.start(job.id, list(devices)):
            with self._lock:
                self._live.pop(job.id, None)
            return False  # stopped meanwhile
        self.store.log(job.id, "INFO", f"started on {', '.join(devices)}")
        self._allocated(job.id, step=0, old=[], new=devices, reason=reason, rate=rate)
        self._thread_for(job, live, resume=False)
        return True

    def _launch(self, job: JobRecord, devices: list[str], *, resume: bool, pinned: bool) -> None:
        """Run ``job`` on ``devices`` in a thread of its own (a resumed job)."""
        if not devices and self.handle.cluster is not None:
            devices = self.handle.cluster.ids
        with self._lock:
            live = self._new_live(job, devices, pinned=pinned)
        self._thread_for(job, live, resume=resume)

    def _new_live(self, job: JobRecord, devices: list[str], *, pinned: bool) -> LiveJob:
        live = LiveJob(job_id=job.id, devices=list(devices), pinned=pinned, granted=list(devices))
        self._live[job.id] = live
        return live

    def _thread_for(self, job: JobRecord, live: LiveJob, *, resume: bool) -> None:
        live.thread = threading.Thread(
            target=self._run, args=(job, live, resume), name=f"hetsched-job-{job.id}", daemon=True
        )
        live.thread.start()

    def _live_held(self) -> set[str]:
        return {d for j in self._live.values() for d in j.devices}

    def _allocated(
        self, job_id: str, *, step: int, old: list[str], new: list[str], reason: str, rate: float
    ) -> None:
        """An ``allocation`` event: the job's allocation history on its page."""
        self.store.add_event(
            job_id,
            kind="allocation",
            step=step,
            data={
                "policy": "pinned" if reason.startswith("pinned") else self.policy,
                "from": list(old),
                "to": list(new),
                "reason": reason,
                "samples_per_s": rate,
            },
        )

    def _park(self, live: LiveJob) -> bool:
        """Hand the job's devices over and wait until its new ones are free; False: stop."""
        with self._lock:
            old = list(live.devices)
            live.devices = []
            self._handover.notify_all()
        self._wake.set()
        while True:
            with self._lock:
                if live.stop.is_set() or self._closing.is_set():
                    live.devices = []
                    return False
                target = live.move_to
                if target and not (set(target) & self._live_held()):
                    live.devices, live.granted = list(target), list(target)
                    reason = live.move_reason
                    live.move_to, live.move_reason = None, ""
                    live.move.clear()
                    break
                self._handover.wait(HANDOVER_POLL_S)
        self._wake.set()
        self.store.log(
            live.job_id,
            "INFO",
            f"{self.policy}: moved from {', '.join(old)} to {', '.join(target)} "
            f"at step {live.steps_done}",
        )
        self._allocated(
            live.job_id, step=live.steps_done, old=old, new=target, reason=reason, rate=0.0
        )
        return True

    def _wait(self, job: JobRecord, message: str) -> None:
        if job.message != message:
            self.store.set_waiting(job.id, message)

    # --- one job --------------------------------------------------------------------

    def _run(self, job: JobRecord, live: LiveJob, resume: bool = False) -> None:
        try:
            state, message = self._train(job, live, resume)
        except HetschedError as exc:
            state, message = FAILED, str(exc)
        except Exception as exc:  # a runtime bug must still end the job with a reason
            log.exception("job %s crashed", job.id)
            state, message = FAILED, f"internal error: {type(exc).__name__}: {exc}"
        finally:
            with self._lock:
                self._live.pop(job.id, None)
                self._handover.notify_all()
            self.demands.forget(job.id)
            self._wake.set()
        if state is None:
            return  # shutting down: left RUNNING for the restart to report
        if self.store.finish(job.id, state, message):
            self.store.log(job.id, "ERROR" if state == FAILED else "INFO", f"{state}: {message}")

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
            if not self._park(live):
                return self._stopped(live.steps_done)
            moved = True

    def _claim(self, live: LiveJob, wanted: list[str]) -> list[str]:
        with self._lock:
            taken = {d for job in self._live.values() if job is not live for d in job.devices}
            live.devices = [d for d in wanted if d not in taken]
            return list(live.devices)

    def _release(self, live: LiveJob, keep: list[str]) -> None:
        with self._lock:
            live.devices = keep
            self._handover.notify_all()
        self._wake.set()

    def _check_stop(self, job_id: str, live: LiveJob) -> None:
        """Pick up a stop request stored before this job's event existed."""
        record = self.store.get(job_id)
        if record is not None and record.stop_requested:
            live.stop.set()

    def _stopped(self, steps_done: int) -> tuple[str | None, str]:
        if self._closing.is_set():
            return None, ""
        return STOPPED, f"stopped on request after {steps_done} steps"
