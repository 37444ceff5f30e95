"""The job executor: queue order, device allocation, profile, plan, train.

One dispatcher thread walks the PENDING jobs oldest first. A job needs its
requested devices (all of the cluster when it names none); it starts when
they are free, otherwise it waits and reserves them, so a later job cannot
starve it by grabbing them one at a time. Each started job gets its own
runner thread: profile (cached), plan, then ``workers.session.train`` with
``on_step`` writing every step to the store as it comes and ``should_stop``
honouring ``POST /jobs/{id}/stop`` between steps. Two jobs on disjoint
devices run at once.

Jobs run on the cluster handle's warm device workers (:mod:`workers.pool`),
started in the background when the executor starts, so a job's first step
does not wait for processes to start and import torch.

On shutdown running jobs are asked to stop but left RUNNING in the store;
the next start marks them FAILED ("control plane restarted …"), keeping their
plan and steps so a later version can resume them.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from api.services import ClusterHandle, Profiler, model_from_ref, plan_summary, resolve_dataset
from api.settings import Settings
from api.store import FAILED, STOPPED, SUCCEEDED, JobRecord, JobStore
from scheduler.errors import HetschedError
from scheduler.planner import make_plan

log = logging.getLogger("hetsched.executor")
POLL_S = 1.0


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

    # --- lifecycle --------------------------------------------------------------

    def start(self) -> None:
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
            wanted = job.spec.get("devices") or self.handle.cluster.ids
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
            live = LiveJob(job_id=job.id, devices=list(wanted))
            live.thread = threading.Thread(
                target=self._run, args=(job, live), name=f"hetsched-job-{job.id}", daemon=True
            )
            with self._lock:
                self._live[job.id] = live
            for d in wanted:
                reserved[d] = job.id
            self.store.log(job.id, "INFO", f"started on {', '.join(wanted)}")
            live.thread.start()

    def _wait(self, job: JobRecord, message: str) -> None:
        if job.message != message:
            self.store.set_waiting(job.id, message)

    # --- one job --------------------------------------------------------------------

    def _run(self, job: JobRecord, live: LiveJob) -> None:
        try:
            state, message = self._train(job, live)
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

    def _train(self, job: JobRecord, live: LiveJob) -> tuple[str | None, str]:
        from workers.session import OptimizerConfig, StepMetrics, train

        spec = job.spec
        model = model_from_ref(spec["model"])
        self.store.log(job.id, "INFO", f"profiling {model.name} on {len(live.devices)} devices")
        self._check_stop(job.id, live)
        if live.stop.is_set():
            return self._stopped(0)
        profile = self.profiler.measure(model, live.devices)
        plan = make_plan(profile, int(spec["global_batch"]), str(spec["strategy"]))
        active = [d.id for d in plan.active]
        self.store.set_plan(job.id, plan.to_dict(), active)
        self.store.log(job.id, "INFO", plan_summary(plan))
        for excluded in plan.excluded:
            self.store.log(job.id, "WARNING", f"{excluded.id} left out: {excluded.reason}")
        released = [d for d in live.devices if d not in active]
        if released:
            with self._lock:
                live.devices = active
            self.store.log(job.id, "INFO", f"released {', '.join(released)} (not in the plan)")
            self._wake.set()
        self._check_stop(job.id, live)
        if live.stop.is_set():
            return self._stopped(0)
        dataset = resolve_dataset(
            self.settings.data_dir, str(spec["dataset"]), seq_len=model.seq_len
        )
        optimizer = OptimizerConfig(
            lr=float(spec["optimizer"]["lr"]), weight_decay=float(spec["optimizer"]["weight_decay"])
        )
        steps = int(spec["steps"])
        step_times: list[float] = []
        every = max(1, steps // 20)

        def on_step(m: StepMetrics) -> None:
            step_times.append(m.step_s)
            devices = [
                {"id": d.id, "busy_s": d.busy_s, "wait_s": d.wait_s, "peak_bytes": d.peak_bytes}
                for d in m.devices
            ]
            self.store.add_step(
                job.id,
                step=m.step,
                loss=m.loss,
                step_s=m.step_s,
                samples_per_s=m.samples_per_s,
                devices=devices,
                step_times_s=step_times,
            )
            live.step_s, live.samples_per_s = m.step_s, m.samples_per_s
            live.steps_done = m.step + 1
            live.device_steps = {d.id: (d.busy_s, d.wait_s, d.peak_bytes) for d in m.devices}
            if m.step < 3 or (m.step + 1) % every == 0 or m.step + 1 == steps:
                self.store.log(
                    job.id,
                    "INFO",
                    f"step {m.step + 1}/{steps}: loss {m.loss:.4f}, "
                    f"{m.step_s * 1e3:.0f} ms, {m.samples_per_s:.1f} samples/s",
                )

        assert self.handle.cluster is not None
        # The whole cluster, not the subset: simulated pacing is relative to its
        # fastest device, as it was when the profile was measured.
        result = train(
            cluster=self.handle.cluster,
            model=model,
            plan=plan,
            steps=steps,
            seed=int(spec["seed"]),
            dataset=dataset,
            optimizer=optimizer,
            simulated=self.handle.simulated,
            on_step=on_step,
            should_stop=live.stop.is_set,
            cache_dir=self.profiler.cache_dir,
            pool=self.handle.pool,
        )
        if result.stopped or result.steps_done < steps:
            return self._stopped(result.steps_done)
        return SUCCEEDED, f"finished {result.steps_done} steps"

    def _check_stop(self, job_id: str, live: LiveJob) -> None:
        """Pick up a stop request stored before this job's event existed."""
        record = self.store.get(job_id)
        if record is not None and record.stop_requested:
            live.stop.set()

    def _stopped(self, steps_done: int) -> tuple[str | None, str]:
        if self._closing.is_set():
            return None, ""
        return STOPPED, f"stopped on request after {steps_done} steps"
