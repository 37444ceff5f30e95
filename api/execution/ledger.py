"""Which devices each running job holds, and how jobs hand devices to one another.

The executor's rounds decide; this ledger is what makes their decisions safe
to apply while jobs run in threads of their own. Pure threading: it is tested
without Ray or a service (tests/api/test_ledger.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

HANDOVER_POLL_S = 0.2
"""A parked job looks again this often even without a notification (a stop event set
by a caller that did not come through the ledger)."""


@dataclass(kw_only=True, slots=True)
class LiveJob:
    """What the dashboard and /metrics read about a running job without the database."""

    job_id: str
    devices: list[str]
    project: str = ""
    """Whose ``max_devices`` quota its devices count against."""
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
    reason: str = ""
    """Why it holds its devices: the reason of its latest start or move."""
    rate: float = 0.0
    """The policy's planned samples/s for it there (0: not planned, a move's or a pin's)."""
    move_to: list[str] | None = None
    """Devices the policy moves it to at its next step boundary; None: it stays."""
    move_reason: str = ""
    move: threading.Event = field(default_factory=threading.Event)
    """Set when it should checkpoint and hand its devices over (see ``move_to``)."""

    def pausing(self) -> bool:
        """Checked between steps: stop for good, or for a move."""
        return self.stop.is_set() or self.move.is_set()


@dataclass(frozen=True, kw_only=True, slots=True)
class Handover:
    """A parked job's move, once every device of its new allocation was free."""

    old: tuple[str, ...]
    """Devices it held when it parked."""
    new: tuple[str, ...]
    """Devices it holds now."""
    reason: str
    """The policy's reason for the move."""


class DeviceLedger:
    """Owns the running jobs (one :class:`LiveJob` each) and which device each holds.

    A device is held by at most one job. A job is admitted only onto devices no
    other job holds; its plan may release some of them and a recovery claim
    free ones back. A job the policy moves is told so between steps
    (:meth:`steer`); it checkpoints, then parks (:meth:`park`): it hands all of its
    devices over and waits until every device of its new allocation is free.
    Every release calls ``on_release``, so the executor runs a round and the
    freed devices go to whoever waits for them.
    """

    def __init__(self, *, on_release: Callable[[], None]) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._jobs: dict[str, LiveJob] = {}
        self._closing = False
        self._on_release = on_release

    def jobs(self) -> list[LiveJob]:
        with self._lock:
            return list(self._jobs.values())

    def holders(self) -> dict[str, str]:
        """Device id -> id of the job that holds it."""
        with self._lock:
            return self._holders()

    def _holders(self) -> dict[str, str]:
        return {d: job.job_id for job in self._jobs.values() for d in job.devices}

    def held_by_project(self) -> dict[str, int]:
        """Project -> devices its running jobs hold (what ``max_devices`` quotas count)."""
        with self._lock:
            counts: dict[str, int] = {}
            for job in self._jobs.values():
                counts[job.project] = counts.get(job.project, 0) + len(job.devices)
            return counts

    def admit(
        self,
        job_id: str,
        devices: list[str],
        *,
        pinned: bool,
        project: str = "",
        max_devices: int | None = None,
    ) -> LiveJob | None:
        """The job, now holding ``devices``; None when another job holds any of them, or
        when its project would then hold more than ``max_devices``."""
        with self._lock:
            held = self._holders()
            if any(d in held for d in devices):
                return None
            if max_devices is not None:
                mine = sum(len(j.devices) for j in self._jobs.values() if j.project == project)
                if mine + len(devices) > max_devices:
                    return None
            return self._add(job_id, devices, pinned=pinned, project=project)

    def resume(
        self, job_id: str, devices: list[str], *, pinned: bool, project: str = ""
    ) -> LiveJob:
        """A job the service ran before it restarted, on the devices it held then."""
        with self._lock:
            return self._add(job_id, devices, pinned=pinned, project=project)

    def _add(self, job_id: str, devices: list[str], *, pinned: bool, project: str) -> LiveJob:
        live = LiveJob(
            job_id=job_id,
            devices=list(devices),
            project=project,
            pinned=pinned,
            granted=list(devices),
        )
        self._jobs[job_id] = live
        return live

    def remove(self, job_id: str) -> None:
        """The job ended (or never started): its devices are free."""
        with self._lock:
            self._jobs.pop(job_id, None)
            self._changed.notify_all()
        self._on_release()

    def stop(self, job_id: str) -> bool:
        """Ask the job to stop after its current step (a parked job stops at once);
        False when no runner has it."""
        with self._lock:
            live = self._jobs.get(job_id)
            if live is not None:
                live.stop.set()
            self._changed.notify_all()
            return live is not None

    def close(self) -> list[LiveJob]:
        """Stop every job (the service shuts down); returns them, to wait for."""
        with self._lock:
            self._closing = True
            live = list(self._jobs.values())
            for job in live:
                job.stop.set()
            self._changed.notify_all()
        return live

    def claim(self, live: LiveJob, wanted: list[str]) -> list[str]:
        """Of ``wanted``, those no other job holds become the job's (all it holds)."""
        with self._lock:
            taken = {d for job in self._jobs.values() if job is not live for d in job.devices}
            live.devices = [d for d in wanted if d not in taken]
            return list(live.devices)

    def release(self, live: LiveJob, keep: list[str]) -> None:
        """The job keeps only ``keep``; the rest go back to the queue."""
        with self._lock:
            live.devices = list(keep)
            self._changed.notify_all()
        self._on_release()

    def steer(self, live: LiveJob, devices: list[str], reason: str) -> bool:
        """Apply the policy's latest allocation for a running job.

        True when it asks the job for a new move (the caller says so in the job's
        log); a job already parked just takes the latest decision, and one whose
        allocation came back to what it has before it moved stays.
        """
        wanted = frozenset(devices)
        with self._lock:
            current = {frozenset(live.granted), frozenset(live.devices)}
            if wanted in current and live.move_to is None:
                live.granted = list(devices)
                return False
            if live.move.is_set() and not live.devices:
                live.move_to, live.move_reason = list(devices), reason
                self._changed.notify_all()
                return False
            if wanted in current:  # the policy changed its mind before the move
                live.move_to, live.move_reason = None, ""
                live.move.clear()
                return False
            if live.move_to == devices:
                return False
            live.move_to, live.move_reason = list(devices), reason
            live.move.set()
            return True

    def park(self, live: LiveJob) -> Handover | None:
        """Hand the job's devices over and wait until its new ones are free.

        None when it was stopped (or the service shuts down) meanwhile: it then
        holds nothing.
        """
        with self._lock:
            old = tuple(live.devices)
            live.devices = []
            self._changed.notify_all()
        self._on_release()
        with self._lock:
            while True:
                if live.stop.is_set() or self._closing:
                    live.devices = []
                    return None
                target = live.move_to
                if target and not set(target) & set(self._holders()):
                    move = Handover(old=old, new=tuple(target), reason=live.move_reason)
                    live.devices, live.granted = list(target), list(target)
                    live.move_to, live.move_reason = None, ""
                    live.move.clear()
                    break
                self._changed.wait(HANDOVER_POLL_S)
        self._on_release()
        return move
