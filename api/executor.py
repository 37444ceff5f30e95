"""The job executor: queue order, device allocation, profile, plan, train.

One dispatcher thread walks the PENDING jobs oldest first. A job needs its
requested devices (all of the cluster when it names none); it starts when
they are free, otherwise it waits and reserves them, so a later job cannot
starve it by grabbing them one at a time. Each started job gets its own
runner thread (:mod:`api.job_runner`): profile (cached), plan, then durable
training that writes every step to the store as it comes, checkpoints,
recovers from failed devices and follows speed changes; ``POST
/jobs/{id}/stop`` is honoured between steps. Two jobs on disjoint devices run
at once.

Jobs run on the cluster handle's warm device workers (:mod:`workers.pool`),
started in the background when the executor starts, so a job's first step
does not wait for processes to start and import torch.

On shutdown running jobs are asked to stop (they checkpoint where they
stop) but left RUNNING in the store; a service killed outright leaves them
RUNNING too. The next start resumes every RUNNING job on its devices from
its last checkpoint, before any queued job, with a ``restart`` event saying so.
"""

from __future__ import annotations

import logging
import threading

from api.job_runner import JobRunner, LiveJob
from api.services import ClusterHandle, Profiler
from api.settings import Settings
from api.states import JobState
from api.store import FAILED, STOPPED, SUCCEEDED, JobRecord, JobStore
from scheduler.errors import HetschedError

log = logging.getLogger("hetsched.executor")
POLL_S = 1.0


class Executor:
    def __init__(
        self, *, store: JobStore, handle: ClusterHandle, profiler: Profiler, settings: Settings
    ) -> None:
        self.store = store
        self.handle = handle
        self.profiler = profiler
        self.settings = settings
        self._lock = threading.Lock()
        self._live: dict[str, LiveJob] = {}
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
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
            self._launch(job, job.devices or job.spec.devices or [], resume=True)
        self._thread = threading.Thread(target=self._loop, name="hetsched-dispatch", daemon=True)
        self._thread.start()
        # Warm every device's worker in the background: the first job then starts warm.
        threading.Thread(target=self.handle.warm, name="hetsched-warm", daemon=True).start()

    def shutdown(self, timeout_s: float = 30.0) -> None:
        self._closing.set()
        self._wake.set()
        with self._lock:
            live = list(self._live.values())
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
        if job is not None:
            job.stop.set()

    # --- what is running -----------------------------------------------------------

    def busy_devices(self) -> dict[str, str]:
        with self._lock:
            return {d: job.job_id for job in self._live.values() for d in job.devices}

    def live(self) -> list[LiveJob]:
        with self._lock:
            return list(self._live.values())

    # --- dispatch ----------------------------------------------------------------

    def _loop(self) -> None:
        while not self._closing.is_set():
            try:
                self._dispatch()
            except Exception:  # a bad record must not stop the queue
                log.exception("dispatch failed")
            self._wake.wait(POLL_S)
            self._wake.clear()

    def _dispatch(self) -> None:
        reserved = dict(self.busy_devices())
        for job in self.store.pending():
            if self._closing.is_set():
                return
            if self.handle.cluster is None or not self.handle.available:
                self._wait(job, f"waiting: cluster unavailable ({self.handle.message})")
                continue
            wanted = job.spec.devices or self.handle.cluster.ids
            taken = {d: reserved[d] for d in wanted if d in reserved}
            if taken:
                holders = sorted(set(taken.values()))
                self._wait(
                    job,
                    f"waiting for {', '.join(sorted(taken))} (held by job {', '.join(holders)})",
                )
                for d in wanted:
                    reserved.setdefault(d, job.id)
                continue
            if not self.store.start(job.id, list(wanted)):
                continue  # stopped meanwhile
            for d in wanted:
                reserved[d] = job.id
            self.store.log(job.id, "INFO", f"started on {', '.join(wanted)}")
            self._launch(job, list(wanted), resume=False)

    def _launch(self, job: JobRecord, devices: list[str], *, resume: bool) -> None:
        """Run ``job`` on ``devices`` in a thread of its own."""
        if not devices and self.handle.cluster is not None:
            devices = self.handle.cluster.ids
        live = LiveJob(job_id=job.id, devices=devices)
        live.thread = threading.Thread(
            target=self._run, args=(job, live, resume), name=f"hetsched-job-{job.id}", daemon=True
        )
        with self._lock:
            self._live[job.id] = live
        live.thread.start()

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
            self._wake.set()
        if state is None:
            return  # shutting down: left RUNNING for the restart to report
        if self.store.finish(job.id, state, message):
            self.store.log(job.id, "ERROR" if state == FAILED else "INFO", f"{state}: {message}")

    def _train(self, job: JobRecord, live: LiveJob, resume: bool) -> tuple[JobState | None, str]:
        self._check_stop(job.id, live)
        if live.stop.is_set():
            return self._stopped(0)
        result = self.runner.run(job, live, resume=resume)
        if result is None or result.stopped:
            return self._stopped(live.steps_done)
        return SUCCEEDED, f"finished {job.spec.steps} steps"

    def _claim(self, live: LiveJob, wanted: list[str]) -> list[str]:
        with self._lock:
            taken = {d for job in self._live.values() if job is not live for d in job.devices}
            live.devices = [d for d in wanted if d not in taken]
            return list(live.devices)

    def _release(self, live: LiveJob, keep: list[str]) -> None:
        with self._lock:
            live.devices = keep
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
