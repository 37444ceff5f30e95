"""The job store: every read and write of job records, behind one class.

Routes and the executor never write SQL; they call :class:`JobStore`, which
hands back plain frozen dataclasses. State changes are conditional updates
(``WHERE state = …``), so a terminal state never changes even when a stop
request races the executor's final write.
"""

from __future__ import annotations

import functools
import json
import logging
import time
import uuid
from collections.abc import Callable, Collection, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from sqlalchemy import Engine, Row, delete, func, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from api.accounts import AccountStore
from api.core.db import (
    DEFAULT_PROJECT,
    DEFAULT_USER,
    CheckpointRow,
    EventRow,
    JobRow,
    LogRow,
    ProfileRow,
    StepRow,
    WriteCount,
    now,
    utc,
)
from api.schemas.jobs import JobCreate
from api.states import TERMINAL_STATES, JobState
from scheduler.errors import HetschedError
from scheduler.planning.plan import Plan, plan_from_dict

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# Short names for the states of api/states.py (the executor uses them).
PENDING, RUNNING = JobState.PENDING, JobState.RUNNING
STOPPED, SUCCEEDED, FAILED = JobState.STOPPED, JobState.SUCCEEDED, JobState.FAILED
TERMINAL = TERMINAL_STATES


R = TypeVar("R", bound="DataclassInstance")
"""A record type of this module (each is a dataclass)."""
P = ParamSpec("P")
T = TypeVar("T")

log = logging.getLogger("hetsched.store")
DEFAULT_RETRY_S = 300.0
"""How long a write is retried while the database is locked or unreachable."""
BACKOFF_FIRST_S = 0.05
BACKOFF_MAX_S = 2.0
QUEUED = "queued: waiting for the next scheduling round"
"""A new job's reason, until the round that places it (at most a couple of seconds)."""
SEQ_ATTEMPTS = 20
"""Submissions that may race one another for the next queue place before one gives up."""


class StoreUnavailable(HetschedError):
    """A write did not land within the store's retry budget (the database stayed locked
    or unreachable); the message says what, for how long, and the database's error."""


def _transient(exc: DBAPIError) -> bool:
    """A locked SQLite file, a dropped connection, a serialization failure: worth a retry."""
    return isinstance(exc, OperationalError) or bool(exc.connection_invalidated)


def _retrying(write: Callable[P, T]) -> Callable[P, T]:
    """Run a :class:`JobStore` write again, with back-off, while the database fails it
    transiently, for up to the store's ``retry_s``; then :class:`StoreUnavailable`.

    Each attempt is one whole transaction, so a retry never half-repeats a write.
    """

    @functools.wraps(write)
    def retried(*args: P.args, **kwargs: P.kwargs) -> T:
        store = args[0]
        assert isinstance(store, JobStore)
        started = time.monotonic()
        pause_s, attempts = BACKOFF_FIRST_S, 0
        while True:
            try:
                result = write(*args, **kwargs)
            except DBAPIError as exc:
                if not _transient(exc):
                    raise
                attempts += 1
                waited_s = time.monotonic() - started
                reason = _one_line(exc.orig if exc.orig is not None else exc)
                if waited_s >= store.retry_s:
                    log.error("%s: gave up after %.1f s: %s", write.__name__, waited_s, reason)
                    raise StoreUnavailable(
                        f"database: {write.__name__} did not land in {waited_s:.0f} s "
                        f"({attempts} attempts): {reason}"
                    ) from exc
                if attempts == 1:
                    log.warning(
                        "%s: %s; retrying for up to %.0f s", write.__name__, reason, store.retry_s
                    )
                time.sleep(min(pause_s, max(0.0, store.retry_s - waited_s)))
                pause_s = min(pause_s * 2, BACKOFF_MAX_S)
                continue
            if attempts:
                log.warning(
                    "%s: landed after %d retries (%.1f s)",
                    write.__name__,
                    attempts,
                    time.monotonic() - started,
                )
            return result

    return retried


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


@dataclass(frozen=True, kw_only=True, slots=True)
class JobRecord:
    id: str
    name: str
    model_name: str
    submission_id: str | None
    spec: JobCreate
    """The job as submitted, parsed once here; nothing downstream reads the JSON."""
    state: JobState
    message: str
    devices: list[str]
    plan: Plan | None
    steps_done: int
    last_loss: float | None
    predicted_step_s: float | None
    measured_step_s: float | None
    stop_requested: bool
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    owner: str = DEFAULT_USER
    """Who submitted it."""
    project: str = DEFAULT_PROJECT
    """Whose members see it, and whose quotas hold it."""

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    @property
    def pinned(self) -> bool:
        """It named its devices: it runs on exactly those, and the policy never moves it."""
        return self.spec.devices is not None


@dataclass(frozen=True, kw_only=True, slots=True)
class StepRecord:
    step: int
    loss: float
    step_s: float
    samples_per_s: float
    devices: list[dict[str, Any]]
    time: datetime
    val_loss: float | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class LogRecord:
    time: datetime
    level: str
    message: str


@dataclass(frozen=True, kw_only=True, slots=True)
class EventRecord:
    """What changed a running job's plan (``recovery``, ``replan``, ``restart``)."""

    time: datetime
    kind: str
    step: int
    data: dict[str, Any]


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointRecord:
    step: int
    uri: str
    created_at: datetime
    pruned_at: datetime | None = None
    """When retention removed it; None while it is kept."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ProfileRecord:
    id: int
    model: str
    cluster: str
    source: str
    profile: dict[str, Any]
    created_at: datetime


def _from_row(record_type: type[R], row: object, **stored_otherwise: Any) -> R:
    """The record of ``row``: each field from the column of its name (a datetime read as
    UTC), but those given in ``stored_otherwise`` (parsed JSON, enums)."""
    values = {
        f.name: getattr(row, f.name) for f in fields(record_type) if f.name not in stored_otherwise
    }
    for name, value in values.items():
        if isinstance(value, datetime):
            values[name] = utc(value)
    return record_type(**values, **stored_otherwise)


JOBS, EVENTS = JobRow.__table__, EventRow.__table__


def event_record(row: EventRow | Row[Any]) -> EventRecord:
    return _from_row(EventRecord, row, data=json.loads(row.data_json))


def job_record(row: JobRow | Row[Any]) -> JobRecord:
    return _from_row(
        JobRecord,
        row,
        spec=JobCreate.model_validate_json(row.spec_json),
        state=JobState(row.state),
        devices=json.loads(row.devices_json),
        plan=plan_from_dict(json.loads(row.plan_json)) if row.plan_json else None,
    )


def _event_row(job_id: str, *, kind: str, step: int, data: dict[str, Any]) -> EventRow:
    return EventRow(job_id=job_id, time=now(), kind=kind, step=step, data_json=json.dumps(data))


class JobStore:
    """Owns every read and write of the job store's tables (:mod:`api.core.db`).

    Jobs and their state changes, the steps, logs, events and checkpoints each job
    wrote, and the measured profiles; each call is one transaction and hands back
    frozen records, never rows.
    """

    def __init__(self, engine: Engine, *, retry_s: float = DEFAULT_RETRY_S) -> None:
        self.engine = engine
        self.retry_s = retry_s
        """Writes are retried this long while the database is locked or unreachable."""
        self._session = sessionmaker(engine, expire_on_commit=False)
        self.writes = WriteCount(engine)
        """Bumped after each write lands; unchanged means nothing was written since."""
        self.accounts = AccountStore(engine, self.writes)
        """Users, projects, dataset owners and the audit log, on the same database."""

    def _tx(self) -> AbstractContextManager[Session]:
        return self._session.begin()

    # --- jobs ----------------------------------------------------------------

    @_retrying
    def create_job(
        self,
        *,
        name: str,
        model_name: str,
        spec: JobCreate,
        submission_id: str | None,
        owner: str = DEFAULT_USER,
        project: str = DEFAULT_PROJECT,
    ) -> tuple[JobRecord, bool]:
        """Store a PENDING job at the end of the queue; with a known ``submission_id``
        return that job instead. Returns ``(job, created)``.

        The queue place is the next after the highest in the same INSERT (one statement,
        so SQLite serialises it), and unique in the schema: where two writers still
        collide (two services on PostgreSQL), the loser takes the next place.
        """
        for _ in range(SEQ_ATTEMPTS):
            if submission_id is not None:
                existing = self.get_by_submission(submission_id)
                if existing is not None:
                    return existing, False
            row = JobRow(
                id=uuid.uuid4().hex[:12],
                name=name,
                model_name=model_name,
                submission_id=submission_id,
                spec_json=spec.model_dump_json(),
                state=PENDING,
                message=QUEUED,
                devices_json="[]",
                steps_done=0,
                stop_requested=False,
                created_at=now(),
                owner=owner,
                project=project,
            )
            row.seq = select(func.coalesce(func.max(JobRow.seq), 0) + 1).scalar_subquery()  # type: ignore[assignment]
            try:
                with self._tx() as session:
                    session.add(row)
            except IntegrityError:
                continue  # a racing submission took this place (or this submission_id)
            return job_record(row), True
        raise StoreUnavailable(
            f"database: no free queue place after {SEQ_ATTEMPTS} attempts (submissions racing)"
        )

    def get(self, job_id: str) -> JobRecord | None:
        with self._tx() as session:
            row = session.get(JobRow, job_id)
            return job_record(row) if row is not None else None

    def get_by_submission(self, submission_id: str) -> JobRecord | None:
        with self._tx() as session:
            row = session.scalar(select(JobRow).where(JobRow.submission_id == submission_id))
            return job_record(row) if row is not None else None

    def list_jobs(
        self,
        *,
        state: JobState | None = None,
        limit: int = 100,
        offset: int = 0,
        projects: Collection[str] | None = None,
        owner: str | None = None,
    ) -> tuple[list[JobRecord], int]:
        """Newest first; ``count`` is over all pages. ``projects``: only theirs (None: all)."""
        with self._tx() as session:
            query = select(JobRow)
            counter = select(func.count()).select_from(JobRow)
            conditions = []
            if state is not None:
                conditions.append(JobRow.state == state)
            if projects is not None:
                conditions.append(JobRow.project.in_(list(projects)))
            if owner is not None:
                conditions.append(JobRow.owner == owner)
            if conditions:
                query, counter = query.where(*conditions), counter.where(*conditions)
            rows = session.scalars(query.order_by(JobRow.seq.desc()).limit(limit).offset(offset))
            return [job_record(r) for r in rows], int(session.scalar(counter) or 0)

    def pending(self) -> list[JobRecord]:
        """The queue, oldest first."""
        with self._tx() as session:
            rows = session.scalars(
                select(JobRow).where(JobRow.state == PENDING).order_by(JobRow.seq)
            )
            return [job_record(r) for r in rows]

    def queued_by_project(self) -> dict[str, int]:
        """Project -> its PENDING jobs."""
        with self._tx() as session:
            rows = session.execute(
                select(JobRow.project, func.count())
                .where(JobRow.state == PENDING)
                .group_by(JobRow.project)
            )
            return {project: int(n) for project, n in rows}

    def unfinished(self) -> list[JobRecord]:
        """PENDING and RUNNING jobs, oldest first: those that may still read a dataset or
        another job's checkpoint."""
        with self._tx() as session:
            rows = session.scalars(
                select(JobRow).where(JobRow.state.in_([PENDING, RUNNING])).order_by(JobRow.seq)
            )
            return [job_record(r) for r in rows]

    def count_by_state(self) -> dict[str, int]:
        with self._tx() as session:
            rows = session.execute(select(JobRow.state, func.count()).group_by(JobRow.state))
            counts = {str(state): 0 for state in JobState}
            counts.update({state: int(n) for state, n in rows})
            return counts

    @_retrying
    def _transition(
        self,
        job_id: str,
        from_states: Iterable[JobState],
        *,
        event: EventRow | None = None,
        **values: Any,
    ) -> bool:
        """Set ``values`` on the job if it is in one of ``from_states`` (False if not),
        adding ``event`` in the same transaction when it was."""
        with self._tx() as session:
            result = session.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.state.in_(list(from_states)))
                .values(**values)
            )
            moved = bool(result.rowcount)  # type: ignore[attr-defined]
            if moved and event is not None:
                session.add(event)
            return moved

    def set_waiting(self, job_id: str, message: str) -> None:
        self._transition(job_id, [PENDING], message=message)

    def start(
        self, job_id: str, devices: list[str], *, allocation: dict[str, Any] | None = None
    ) -> bool:
        """PENDING -> RUNNING with its devices; False when it is no longer pending. The
        ``allocation`` event that says why is written in the same transaction, so no reader
        sees a running job without it."""
        event = None
        if allocation is not None:
            event = _event_row(job_id, kind="allocation", step=0, data=allocation)
        return self._transition(
            job_id,
            [PENDING],
            event=event,
            state=RUNNING,
            devices_json=json.dumps(devices),
            started_at=now(),
            message="profiling",
        )

    def set_plan(self, job_id: str, plan: Plan, devices: list[str]) -> None:
        """Store the plan and the devices it uses (the others are handed back)."""
        self._transition(
            job_id,
            [RUNNING],
            plan_json=json.dumps(plan.to_dict()),
            devices_json=json.dumps(devices),
            predicted_step_s=plan.predicted_step_s,
            message="training",
        )

    def finish(self, job_id: str, state: JobState | str, message: str) -> bool:
        """Move a non-terminal job to a terminal ``state``; False when already terminal."""
        state = JobState(state)
        assert state.terminal
        return self._transition(
            job_id, [PENDING, RUNNING], state=state, message=message, ended_at=now()
        )

    def request_stop(self, job_id: str) -> JobRecord | None:
        """PENDING jobs stop at once; RUNNING ones are flagged for the executor."""
        self._transition(
            job_id,
            [PENDING],
            state=STOPPED,
            stop_requested=True,
            message="stopped before it started",
            ended_at=now(),
        )
        self._transition(job_id, [RUNNING], stop_requested=True, message="stop requested")
        return self.get(job_id)

    @_retrying
    def delete(self, job_id: str) -> bool:
        """Delete a terminal job and its metrics and logs; False when it is not terminal."""
        with self._tx() as session:
            row = session.get(JobRow, job_id)
            if row is None or row.state not in TERMINAL:
                return False
            session.execute(delete(StepRow).where(StepRow.job_id == job_id))
            session.execute(delete(LogRow).where(LogRow.job_id == job_id))
            session.execute(delete(EventRow).where(EventRow.job_id == job_id))
            session.execute(delete(CheckpointRow).where(CheckpointRow.job_id == job_id))
            session.delete(row)
            return True

    def running(self) -> list[JobRecord]:
        """Jobs in state RUNNING, oldest first (after a restart: the ones to resume)."""
        with self._tx() as session:
            rows = session.scalars(
                select(JobRow).where(JobRow.state == RUNNING).order_by(JobRow.seq)
            )
            return [job_record(r) for r in rows]

    # --- what changed a running job, and its checkpoints -------------------------

    @_retrying
    def add_event(self, job_id: str, *, kind: str, step: int, data: dict[str, Any]) -> None:
        with self._tx() as session:
            session.add(_event_row(job_id, kind=kind, step=step, data=data))

    def events(self, job_id: str) -> list[EventRecord]:
        with self._tx() as session:
            rows = session.scalars(
                select(EventRow).where(EventRow.job_id == job_id).order_by(EventRow.id)
            )
            return [event_record(r) for r in rows]

    def job_rows(self, job_id: str) -> tuple[Row[Any], list[Row[Any]]] | None:
        """The job's row and its events' rows as stored, in one read and without the ORM:
        what :class:`api.views.JobPages` compares before it parses anything
        (:func:`job_record`, :func:`event_record` make them records)."""
        with self.engine.connect() as connection:
            job = connection.execute(select(JOBS).where(JOBS.c.id == job_id)).first()
            if job is None:
                return None
            events = connection.execute(
                select(EVENTS).where(EVENTS.c.job_id == job_id).order_by(EVENTS.c.id)
            ).all()
        return job, list(events)

    def count_events(self) -> dict[str, int]:
        """Events of every job by kind (``recovery``, ``replan``, ``restart``), zeros included."""
        with self._tx() as session:
            rows = session.execute(select(EventRow.kind, func.count()).group_by(EventRow.kind))
            counts = dict.fromkeys(("recovery", "replan", "restart"), 0)
            counts.update({kind: int(n) for kind, n in rows})
            return counts

    @_retrying
    def add_checkpoint(self, job_id: str, *, step: int, uri: str, keep: list[int]) -> None:
        """Record a checkpoint; those no longer kept (retention removed them) are marked
        pruned, so a download of one answers 410, not 404."""
        with self._tx() as session:
            session.merge(CheckpointRow(job_id=job_id, step=step, uri=uri, created_at=now()))
            session.execute(
                update(CheckpointRow)
                .where(
                    CheckpointRow.job_id == job_id,
                    CheckpointRow.step.not_in(keep),
                    CheckpointRow.pruned_at.is_(None),
                )
                .values(pruned_at=now())
            )

    def checkpoints(self, job_id: str) -> list[CheckpointRecord]:
        """The kept ones, newest last."""
        with self._tx() as session:
            rows = session.scalars(
                select(CheckpointRow)
                .where(CheckpointRow.job_id == job_id, CheckpointRow.pruned_at.is_(None))
                .order_by(CheckpointRow.step)
            )
            return [_from_row(CheckpointRecord, r) for r in rows]

    def checkpoint(self, job_id: str, step: int) -> CheckpointRecord | None:
        """Checkpoint ``step`` of the job, kept or pruned; None when it never had one."""
        with self._tx() as session:
            row = session.get(CheckpointRow, (job_id, step))
            return _from_row(CheckpointRecord, row) if row is not None else None

    # --- steps and logs --------------------------------------------------------

    @_retrying
    def add_step(
        self,
        job_id: str,
        *,
        step: int,
        loss: float,
        step_s: float,
        samples_per_s: float,
        devices: list[dict[str, Any]],
        measured_step_s: float,
        val_loss: float | None = None,
    ) -> None:
        """Store one step and refresh the job's aggregates: its steps done, latest loss and
        ``measured_step_s`` (the runner's median step time after the warm-up step)."""
        with self._tx() as session:
            session.merge(
                StepRow(
                    job_id=job_id,
                    step=step,
                    loss=loss,
                    step_s=step_s,
                    samples_per_s=samples_per_s,
                    devices_json=json.dumps(devices),
                    time=now(),
                    val_loss=val_loss,
                )
            )
            session.execute(
                update(JobRow)
                .where(JobRow.id == job_id)
                .values(
                    steps_done=step + 1,
                    last_loss=loss,
                    measured_step_s=measured_step_s,
                )
            )

    def steps(self, job_id: str, *, since: int = 0) -> list[StepRecord]:
        with self._tx() as session:
            rows = session.scalars(
                select(StepRow)
                .where(StepRow.job_id == job_id, StepRow.step >= since)
                .order_by(StepRow.step)
            )
            return [_from_row(StepRecord, r, devices=json.loads(r.devices_json)) for r in rows]

    @_retrying
    def log(self, job_id: str, level: str, message: str) -> None:
        with self._tx() as session:
            session.add(LogRow(job_id=job_id, time=now(), level=level, message=message))

    def logs(self, job_id: str, *, since: int = 0) -> list[LogRecord]:
        with self._tx() as session:
            rows = session.scalars(
                select(LogRow).where(LogRow.job_id == job_id).order_by(LogRow.id).offset(since)
            )
            return [_from_row(LogRecord, r) for r in rows]

    # --- profiles --------------------------------------------------------------

    @_retrying
    def save_profile(
        self, *, key: str, model: str, cluster: str, source: str, profile: dict[str, Any]
    ) -> ProfileRecord:
        with self._tx() as session:
            row = session.scalar(select(ProfileRow).where(ProfileRow.key == key))
            if row is None:
                row = ProfileRow(key=key)
                session.add(row)
            row.model, row.cluster, row.source = model, cluster, source
            row.profile_json, row.created_at = json.dumps(profile), now()
            session.flush()
            return _from_row(ProfileRecord, row, profile=profile)

    def profiles(self) -> list[ProfileRecord]:
        """Newest first."""
        with self._tx() as session:
            rows = session.scalars(select(ProfileRow).order_by(ProfileRow.created_at.desc()))
            return [_from_row(ProfileRecord, r, profile=json.loads(r.profile_json)) for r in rows]
