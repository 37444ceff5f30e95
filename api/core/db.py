"""The job store's tables and engine (SQLAlchemy 2), read and written by :mod:`api.store`.

SQLite in the data directory by default; any SQLAlchemy URL (PostgreSQL, MySQL)
works unchanged: only portable column types, JSON documents stored as text.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Engine,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    create_engine,
    event,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, MappedColumn, mapped_column

from api.core.migrate import upgrade

DEFAULT_USER = "admin"
"""Owner of what was made before users existed, and who single-user mode and
``HETSCHED_API_TOKEN`` act as."""
DEFAULT_PROJECT = "default"
"""Project of what was made before projects existed, and the admin's own."""


def now() -> datetime:
    """What every row's time is written as."""
    return datetime.now(UTC)


def utc(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; they were written in UTC."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


class Base(DeclarativeBase):
    pass


def _time(*, nullable: bool = False, index: bool | None = None) -> MappedColumn[Any]:
    """A moment, stored with its time zone (rows are written with :func:`now`'s UTC)."""
    return mapped_column(DateTime(timezone=True), nullable=nullable, index=index)


def _serial() -> MappedColumn[int]:
    """A row's own key, numbered by the database in insertion order."""
    return mapped_column(Integer, primary_key=True, autoincrement=True)


def _job_id(*, primary_key: bool = False, index: bool = False) -> MappedColumn[str]:
    """The job a row belongs to; deleting the job deletes its rows."""
    return mapped_column(
        String(32),
        ForeignKey("jobs.id", ondelete="CASCADE"),
        primary_key=primary_key,
        index=index,
    )


class JobRow(Base):
    """One job: its spec (which owns the steps and the global batch), state, plan, and
    the running aggregates (a resume after a restart needs the plan and last step)."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, index=True, unique=True)
    """Submission order (the queue order); unique, so no two jobs share a place."""
    name: Mapped[str] = mapped_column(String(100))
    model_name: Mapped[str] = mapped_column(String(100))
    submission_id: Mapped[str | None] = mapped_column(String(128), unique=True, nullable=True)
    spec_json: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16), index=True)
    message: Mapped[str] = mapped_column(Text, default="")
    devices_json: Mapped[str] = mapped_column(Text, default="[]")
    plan_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    steps_done: Mapped[int] = mapped_column(Integer, default=0)
    last_loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    predicted_step_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    measured_step_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    stop_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = _time()
    started_at: Mapped[datetime | None] = _time(nullable=True)
    ended_at: Mapped[datetime | None] = _time(nullable=True)
    owner: Mapped[str] = mapped_column(String(64), server_default=DEFAULT_USER)
    """The user who submitted it (api/accounts.py)."""
    project: Mapped[str] = mapped_column(String(64), server_default=DEFAULT_PROJECT, index=True)
    """The project it counts against: who may see it, and whose quotas hold it."""


class StepRow(Base):
    __tablename__ = "job_steps"

    job_id: Mapped[str] = _job_id(primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    loss: Mapped[float] = mapped_column(Float)
    step_s: Mapped[float] = mapped_column(Float)
    samples_per_s: Mapped[float] = mapped_column(Float)
    devices_json: Mapped[str] = mapped_column(Text)
    time: Mapped[datetime] = _time()
    val_loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    """Validation loss after the step; NULL on steps without an evaluation."""


class LogRow(Base):
    """What the executor did with a job, one line each."""

    __tablename__ = "job_logs"

    id: Mapped[int] = _serial()
    job_id: Mapped[str] = _job_id(index=True)
    time: Mapped[datetime] = _time()
    level: Mapped[str] = mapped_column(String(8))
    message: Mapped[str] = mapped_column(Text)


class ProfileRow(Base):
    __tablename__ = "profiles"

    id: Mapped[int] = _serial()
    key: Mapped[str] = mapped_column(String(400), unique=True)
    """cluster name + model + device set: one row per distinct measurement."""
    model: Mapped[str] = mapped_column(String(100))
    cluster: Mapped[str] = mapped_column(String(200))
    source: Mapped[str] = mapped_column(String(16))
    profile_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = _time()


class EventRow(Base):
    """What changed a running job's plan: a recovery, a re-plan, a restart of the service."""

    __tablename__ = "job_events"

    id: Mapped[int] = _serial()
    job_id: Mapped[str] = _job_id(index=True)
    time: Mapped[datetime] = _time()
    kind: Mapped[str] = mapped_column(String(16))
    step: Mapped[int] = mapped_column(Integer)
    data_json: Mapped[str] = mapped_column(Text)


class CheckpointRow(Base):
    __tablename__ = "job_checkpoints"

    job_id: Mapped[str] = _job_id(primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    uri: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = _time()
    pruned_at: Mapped[datetime | None] = _time(nullable=True)
    """When retention removed it (its download then answers 410); NULL while kept."""


class UserRow(Base):
    """Someone with an API token; the token itself is never stored, only its SHA-256."""

    __tablename__ = "users"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_sha256: Mapped[str | None] = mapped_column(String(64), unique=True, nullable=True)
    """Hex digest of the token; NULL for the built-in admin (HETSCHED_API_TOKEN)."""
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = _time()
    revoked_at: Mapped[datetime | None] = _time(nullable=True)


class ProjectRow(Base):
    """A group of users sharing jobs, datasets and quotas; NULL quota: no limit."""

    __tablename__ = "projects"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    """Its share of the cluster against other projects under ``fair`` and ``goodput``."""
    max_devices: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_queued: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_priority: Mapped[float | None] = mapped_column(Float, nullable=True)
    storage_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    created_at: Mapped[datetime] = _time()


class MembershipRow(Base):
    __tablename__ = "memberships"

    user_name: Mapped[str] = mapped_column(
        String(64), ForeignKey("users.name", ondelete="CASCADE"), primary_key=True
    )
    project: Mapped[str] = mapped_column(
        String(64), ForeignKey("projects.name", ondelete="CASCADE"), primary_key=True
    )


class DatasetRow(Base):
    """Who uploaded a dataset file; files without a row belong to the default project."""

    __tablename__ = "datasets"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64))
    project: Mapped[str] = mapped_column(String(64), index=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = _time()


class AuditRow(Base):
    """Who did what: submissions, stops, deletions, faults, users and projects."""

    __tablename__ = "audit"

    id: Mapped[int] = _serial()
    time: Mapped[datetime] = _time(index=True)
    actor: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(32), index=True)
    target: Mapped[str] = mapped_column(String(200))
    project: Mapped[str | None] = mapped_column(String(64), nullable=True)
    detail: Mapped[str] = mapped_column(Text, default="")


REQUEST_THREADS = 40
"""anyio's default thread limit: how many sync routes (each with its connection) run at once."""


READ_ONLY_STATEMENTS = ("SELECT", "BEGIN", "PRAGMA", "SAVEPOINT", "RELEASE", "ROLLBACK", "SHOW")
"""Statements that change no row; any other statement counts as a write."""


class WriteCount:
    """How many of ``engine``'s connections wrote and were handed back to the pool.

    A connection goes back after its transaction committed (or rolled back), so a
    reader that took :attr:`value` before reading and finds it unchanged later knows
    that no write through this engine landed in between: what :class:`api.views.JobPages`
    answers polls from without reading the database again.
    """

    def __init__(self, engine: Engine) -> None:
        self.value = 0
        self._lock = threading.Lock()  # two writers returning at once both count
        event.listen(engine, "after_cursor_execute", self._executed)
        event.listen(engine.pool, "checkin", self._returned)

    def _executed(self, connection, _cursor, statement, *_args) -> None:  # type: ignore[no-untyped-def]
        if not statement.lstrip()[:9].upper().startswith(READ_ONLY_STATEMENTS):
            connection.info["wrote"] = True

    def _returned(self, _dbapi_connection, record) -> None:  # type: ignore[no-untyped-def]
        if record is None or record.info.pop("wrote", False):
            with self._lock:
                self.value += 1


def make_engine(url: str, *, busy_timeout_s: float = 30.0) -> Engine:
    """An engine for ``url``, its schema migrated to the newest revision (api/core/migrate.py);
    SQLite gets WAL and foreign keys, and waits ``busy_timeout_s`` for another connection's
    lock before a statement fails (the job store then retries, :mod:`api.store`)."""
    is_sqlite = url.startswith("sqlite")
    connect_args = {"check_same_thread": False, "timeout": busy_timeout_s} if is_sqlite else {}
    # The pool holds a connection for each request thread (anyio's pool runs up to 40 sync
    # routes at once): with SQLAlchemy's default of 5, fifty dashboards polling made and
    # closed an overflow connection, with its pragmas, for most requests.
    engine = create_engine(
        url,
        connect_args=connect_args,
        pool_pre_ping=not is_sqlite,
        pool_size=REQUEST_THREADS,
        max_overflow=REQUEST_THREADS,
    )
    if is_sqlite:

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
            cursor = dbapi_connection.cursor()
            # WAL: the dashboard's readers never wait for the executor's per-step writes.
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

    upgrade(engine)
    return engine
