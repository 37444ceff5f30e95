"""Who may do what: users and their tokens, projects and their quotas, the audit log.

:class:`Principal` is who a request acts as (api/deps.py resolves it once per
request); :func:`may` is the one rule that says whether it may read or act on
something of a project. :class:`AccountStore` owns the tables of users,
projects, memberships, dataset owners and the audit log (:mod:`api.core.db`).

Tokens are stored as SHA-256 digests only (a random 256-bit token needs no
slow hash: there is nothing to guess from its digest); the token itself is
shown once, when it is made.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Literal

from sqlalchemy import Engine, delete, func, select
from sqlalchemy.orm import Session, sessionmaker

from api.core.db import (
    DEFAULT_PROJECT,
    DEFAULT_USER,
    AuditRow,
    DatasetRow,
    MembershipRow,
    ProjectRow,
    UserRow,
    WriteCount,
    now,
    utc,
)
from scheduler.errors import HetschedError

Action = Literal["read", "act"]
TOKEN_PREFIX = "hs_"
"""Tokens start so, which tells them apart in a config file and in secret scanners."""


class AccountError(HetschedError):
    """A request about users or projects names something that does not exist (422)."""


class AccountConflict(HetschedError):
    """A user or project of that name exists, or the change would lock the admins out (409)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Principal:
    """Who a request acts as: a user, the admin, or nobody (no token sent)."""

    name: str | None
    """The user's name; None when no token came (``open_reads`` may still let it read)."""
    is_admin: bool = False
    projects: tuple[str, ...] = ()
    reads_all: bool = False
    """Reads of every project's jobs without a token (``HETSCHED_OPEN_READS``, a demo)."""

    @property
    def authenticated(self) -> bool:
        return self.name is not None

    @property
    def default_project(self) -> str:
        """Where its jobs and uploads go unless it names a project."""
        if DEFAULT_PROJECT in self.projects or not self.projects:
            return DEFAULT_PROJECT
        return self.projects[0]


SINGLE_USER = Principal(name=DEFAULT_USER, is_admin=True, projects=(DEFAULT_PROJECT,))
"""Everyone, when no token is configured anywhere (loopback only, as before users)."""


def may(principal: Principal, project: str, action: Action) -> bool:
    """Whether ``principal`` may ``read`` (specs, logs, metrics, checkpoints) or ``act`` on
    (submit, stop, delete, upload into) what ``project`` owns. The one rule: admins do
    everything, members their projects', and ``open_reads`` lets anyone read."""
    if principal.is_admin:
        return True
    if action == "read" and principal.reads_all:
        return True
    return principal.authenticated and project in principal.projects


def visible_projects(principal: Principal) -> tuple[str, ...] | None:
    """The projects whose jobs ``principal`` may list; None: every project."""
    if principal.is_admin or principal.reads_all:
        return None
    return principal.projects


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, kw_only=True, slots=True)
class UserRecord:
    name: str
    is_admin: bool
    projects: tuple[str, ...]
    created_at: datetime
    revoked_at: datetime | None

    @property
    def principal(self) -> Principal:
        return Principal(name=self.name, is_admin=self.is_admin, projects=self.projects)


def refusal(user: UserRecord | None, *, where: str) -> str | None:
    """Why the user a request names (by its token, or the proxy's header: ``where``) may
    not act: unknown, or revoked; None when it may."""
    if user is None:
        return f"authorization: wrong {where}"
    if user.revoked_at is not None:
        return f"authorization: the token of {user.name!r} was revoked"
    return None


@dataclass(frozen=True, kw_only=True, slots=True)
class ProjectRecord:
    """A project and its quotas (None: no limit)."""

    name: str
    weight: float
    created_at: datetime
    max_devices: int | None = None
    max_queued: int | None = None
    max_priority: float | None = None
    storage_bytes: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class AuditRecord:
    id: int
    time: datetime
    actor: str
    action: str
    target: str
    project: str | None
    detail: str


@dataclass(frozen=True, kw_only=True, slots=True)
class DatasetOwner:
    name: str
    owner: str
    project: str
    size_bytes: int
    shared: bool = False
    """Placed in the data directory by the operator, not uploaded: every job may train on
    it, as on the bundled corpus (only the default project's members delete it)."""


def may_use_dataset(principal: Principal, dataset: DatasetOwner, action: Action) -> bool:
    """:func:`may` for a dataset file: the operator's own files are everyone's to read."""
    return (action == "read" and dataset.shared) or may(principal, dataset.project, action)


LEGACY_DATASET = (DEFAULT_USER, DEFAULT_PROJECT)
"""Owner and project of a dataset file that has no row (placed there by hand, or uploaded
before users existed)."""


_PROJECT_COLUMNS = tuple(f.name for f in fields(ProjectRecord) if f.name != "created_at")
"""What a project's record and its row hold alike: its name and quotas (a new quota is a
field of both, and nothing else to write)."""


def _project(row: ProjectRow) -> ProjectRecord:
    copied = {name: getattr(row, name) for name in _PROJECT_COLUMNS}
    return ProjectRecord(**copied, created_at=utc(row.created_at) or now())


def _dataset(row: DatasetRow) -> DatasetOwner:
    return DatasetOwner(
        name=row.name, owner=row.owner, project=row.project, size_bytes=row.size_bytes
    )


class AccountStore:
    """Owns every read and write of users, projects, memberships, dataset owners and the
    audit log; each call is one transaction and hands back frozen records."""

    def __init__(self, engine: Engine, writes: WriteCount | None = None) -> None:
        self._session = sessionmaker(engine, expire_on_commit=False)
        self._has_tokens: bool | None = None
        self._writes = writes if writes is not None else WriteCount(engine)
        self._by_digest: dict[str, tuple[int, UserRecord]] = {}
        """Users found by token, with the engine's write count before the read."""

    def _tx(self) -> AbstractContextManager[Session]:
        return self._session.begin()

    # --- users ------------------------------------------------------------------------

    def has_tokens(self) -> bool:
        """Whether any user has a live token (then the service is no longer single-user).
        Cached: every token is made and revoked through this store."""
        if self._has_tokens is None:
            with self._tx() as session:
                live = select(func.count()).where(
                    UserRow.token_sha256.is_not(None), UserRow.revoked_at.is_(None)
                )
                self._has_tokens = bool(session.scalar(live))
        return self._has_tokens

    def _user(self, session: Session, row: UserRow) -> UserRecord:
        projects = session.scalars(
            select(MembershipRow.project)
            .where(MembershipRow.user_name == row.name)
            .order_by(MembershipRow.project)
        )
        return UserRecord(
            name=row.name,
            is_admin=row.is_admin,
            projects=tuple(projects),
            created_at=utc(row.created_at) or now(),
            revoked_at=utc(row.revoked_at),
        )

    def by_token(self, token: str) -> UserRecord | None:
        """The user holding ``token`` (revoked ones included: the caller says so)."""
        digest, writes = token_digest(token), self._writes.value
        with self._tx() as session:
            row = session.scalar(select(UserRow).where(UserRow.token_sha256 == digest))
            if row is None or not secrets.compare_digest(row.token_sha256 or "", digest):
                return None
            user = self._user(session, row)
        self._by_digest[digest] = (writes, user)
        return user

    def known_token(self, token: str) -> UserRecord | None:
        """:meth:`by_token`'s last answer for ``token`` while nothing was written since
        (no token made or revoked, no membership changed); None: ask :meth:`by_token`."""
        known = self._by_digest.get(token_digest(token))
        if known is None or known[0] != self._writes.value:
            return None
        return known[1]

    def user(self, name: str) -> UserRecord | None:
        with self._tx() as session:
            row = session.get(UserRow, name)
            return self._user(session, row) if row is not None else None

    def users(self) -> list[UserRecord]:
        with self._tx() as session:
            rows = session.scalars(select(UserRow).order_by(UserRow.name))
            return [self._user(session, r) for r in rows]

    def add_user(
        self, name: str, *, projects: Sequence[str], is_admin: bool
    ) -> tuple[UserRecord, str]:
        """A new user and their token (shown once; only its digest is kept)."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self._tx() as session:
            if session.get(UserRow, name) is not None:
                raise AccountConflict(f"name: user {name!r} exists; revoke it or pick another")
            missing = [p for p in projects if session.get(ProjectRow, p) is None]
            if missing:
                raise AccountError(
                    f"project: no project {missing[0]!r}; add it first "
                    f"(hetsched projects add {missing[0]})"
                )
            session.add(
                UserRow(
                    name=name,
                    token_sha256=token_digest(token),
                    is_admin=is_admin,
                    created_at=now(),
                )
            )
            session.flush()
            for project in dict.fromkeys(projects):
                session.add(MembershipRow(user_name=name, project=project))
        self._has_tokens = True
        user = self.user(name)
        assert user is not None
        return user, token

    def revoke(self, name: str) -> UserRecord:
        """The user's token stops working at once; the user's jobs stay."""
        with self._tx() as session:
            row = session.get(UserRow, name)
            if row is None:
                raise AccountError(f"name: no user {name!r}")
            if row.token_sha256 is None:
                raise AccountConflict(
                    f"name: {name!r} is the built-in admin (HETSCHED_API_TOKEN); change that "
                    "variable instead"
                )
            row.revoked_at = row.revoked_at or now()
        self._has_tokens = None
        user = self.user(name)
        assert user is not None
        return user

    # --- projects -----------------------------------------------------------------------

    def add_project(self, record: ProjectRecord) -> ProjectRecord:
        with self._tx() as session:
            if session.get(ProjectRow, record.name) is not None:
                raise AccountConflict(f"name: project {record.name!r} exists")
            copied = {name: getattr(record, name) for name in _PROJECT_COLUMNS}
            session.add(ProjectRow(**copied, created_at=now()))
        return record

    def set_quotas(self, name: str, **quotas: float | int | None) -> ProjectRecord:
        """Change some of a project's quotas (those given; None lifts a limit)."""
        with self._tx() as session:
            row = session.get(ProjectRow, name)
            if row is None:
                raise AccountError(f"name: no project {name!r}")
            for field, value in quotas.items():
                setattr(row, field, value)
            session.flush()
            return _project(row)

    def project(self, name: str) -> ProjectRecord | None:
        with self._tx() as session:
            row = session.get(ProjectRow, name)
            return _project(row) if row is not None else None

    def projects(self) -> list[ProjectRecord]:
        with self._tx() as session:
            return [_project(r) for r in session.scalars(select(ProjectRow).order_by("name"))]

    # --- datasets' owners -------------------------------------------------------------------

    def dataset(self, name: str) -> DatasetOwner:
        """Who owns dataset file ``name`` (a file without a row: the default project)."""
        with self._tx() as session:
            row = session.get(DatasetRow, name)
            if row is None:
                owner, project = LEGACY_DATASET
                return DatasetOwner(
                    name=name, owner=owner, project=project, size_bytes=0, shared=True
                )
            return _dataset(row)

    def datasets(self) -> dict[str, DatasetOwner]:
        """Name -> owner of every uploaded dataset file."""
        with self._tx() as session:
            return {r.name: _dataset(r) for r in session.scalars(select(DatasetRow))}

    def add_dataset(self, owner: DatasetOwner) -> None:
        with self._tx() as session:
            session.merge(
                DatasetRow(
                    name=owner.name,
                    owner=owner.owner,
                    project=owner.project,
                    size_bytes=owner.size_bytes,
                    created_at=now(),
                )
            )

    def forget_dataset(self, name: str) -> None:
        with self._tx() as session:
            session.execute(delete(DatasetRow).where(DatasetRow.name == name))

    def storage_used(self) -> dict[str, int]:
        """Project -> bytes of the datasets it uploaded."""
        with self._tx() as session:
            rows = session.execute(
                select(DatasetRow.project, func.sum(DatasetRow.size_bytes)).group_by(
                    DatasetRow.project
                )
            )
            return {project: int(total or 0) for project, total in rows}

    # --- the audit log ------------------------------------------------------------------------

    def audit(
        self, actor: Principal, action: str, target: str, *, project: str | None, detail: str = ""
    ) -> None:
        with self._tx() as session:
            session.add(
                AuditRow(
                    time=now(),
                    actor=actor.name or "anonymous",
                    action=action,
                    target=target[:200],
                    project=project,
                    detail=detail,
                )
            )

    def audit_log(
        self, *, limit: int = 100, offset: int = 0, action: str | None = None
    ) -> tuple[list[AuditRecord], int]:
        """Newest first; ``count`` is over all pages."""
        with self._tx() as session:
            query = select(AuditRow)
            counter = select(func.count()).select_from(AuditRow)
            if action is not None:
                query, counter = (
                    query.where(AuditRow.action == action),
                    counter.where(AuditRow.action == action),
                )
            rows = session.scalars(query.order_by(AuditRow.id.desc()).limit(limit).offset(offset))
            records = [
                AuditRecord(
                    id=r.id,
                    time=utc(r.time) or now(),
                    actor=r.actor,
                    action=r.action,
                    target=r.target,
                    project=r.project,
                    detail=r.detail,
                )
                for r in rows
            ]
            return records, int(session.scalar(counter) or 0)
