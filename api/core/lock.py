"""One service per data directory and per database: the lock ``hetsched serve`` holds.

Two services on one data directory would both resume every RUNNING job, so two runners
would write the same step rows and checkpoint folder, and the second would overwrite
the first's Ray process record. ``hetsched serve`` therefore takes, before it touches
anything, an exclusive ``flock`` on ``<data_dir>/serve.lock`` and on ``<db>.serve.lock``
beside its SQLite file (wherever that lies), and holds them for its lifetime. The kernel
releases a ``flock`` when its process dies, SIGKILL included, so a restart after
``kill -9`` never finds a stale lock. A database shared without the directory
(PostgreSQL, MySQL on another host) is locked the same way in the database itself: a
session-level advisory lock (``pg_try_advisory_lock``, MySQL's ``GET_LOCK``) on a
connection held open for the service's lifetime, which the server releases when that
connection ends, so no lease row can go stale.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path
from types import TracebackType

from sqlalchemy import Connection, create_engine, text
from sqlalchemy.engine import make_url

from api.core.settings import Settings
from scheduler.errors import HetschedError

LOCK_NAME = "serve.lock"
ADVISORY_NAME = "hetsched-serve"
"""What the database-side lock is called (MySQL) or hashed from (PostgreSQL's key)."""


class ServiceLocked(HetschedError):
    """Another service holds this data directory or database."""


def _holder(path: Path) -> str:
    try:
        pid = path.read_text().strip()
    except OSError:
        return ""
    return f" (pid {pid})" if pid.isdigit() else ""


class FileLock:
    """An exclusive ``flock`` on one file, held until :meth:`release` or the process ends."""

    def __init__(self, path: Path, *, flag: str, what: str) -> None:
        self.path = path
        self.flag = flag
        """The command-line flag that names what is locked (the error points at it)."""
        self.what = what
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise HetschedError(
                f"{self.flag}: cannot create the lock file {self.path} ({exc.strerror})"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ServiceLocked(
                f"{self.flag}: another hetsched serve{_holder(self.path)} is running on "
                f"{self.what}; stop it first, or give this one another {self.flag}"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


class DatabaseLock:
    """A session-level advisory lock in a PostgreSQL or MySQL database, held on a
    connection of its own until :meth:`release` or the connection ends."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._connection: Connection | None = None

    @staticmethod
    def supported(url: str) -> bool:
        return make_url(url).get_backend_name() in ("postgresql", "mysql", "mariadb")

    def acquire(self) -> None:
        url = make_url(self.url)
        engine = create_engine(url, pool_pre_ping=True)
        connection = engine.connect()
        if url.get_backend_name() == "postgresql":
            key = int.from_bytes(hashlib.sha256(ADVISORY_NAME.encode()).digest()[:8], "big")
            key -= 1 << 63  # a signed 64-bit key
            got = connection.scalar(text("SELECT pg_try_advisory_lock(:k)"), {"k": key})
        else:
            got = connection.scalar(text("SELECT GET_LOCK(:n, 0)"), {"n": ADVISORY_NAME})
        connection.commit()
        if not got:
            connection.close()
            engine.dispose()
            raise ServiceLocked(
                f"--db: another hetsched serve holds the database {url.render_as_string()}; "
                "stop it first, or give this one another --db"
            )
        self._connection = connection

    def release(self) -> None:
        if self._connection is not None:
            engine = self._connection.engine
            self._connection.close()
            engine.dispose()
            self._connection = None


class ServiceLock:
    """Every lock one service holds on what it must own alone: its data directory, a
    SQLite file outside it, or a shared database (see the module docstring)."""

    def __init__(self, settings: Settings) -> None:
        data_dir = settings.data_dir.resolve()
        self._locks: list[FileLock | DatabaseLock] = [
            FileLock(data_dir / LOCK_NAME, flag="--data-dir", what=f"the data directory {data_dir}")
        ]
        url = make_url(settings.database_url)
        if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
            # Beside the file itself: a service whose data directory differs but whose --db
            # names this file finds it too.
            db_file = Path(url.database).resolve()
            lock_file = db_file.with_name(f"{db_file.name}.{LOCK_NAME}")
            self._locks.append(FileLock(lock_file, flag="--db", what=f"the database {db_file}"))
        elif DatabaseLock.supported(settings.database_url):
            self._locks.append(DatabaseLock(settings.database_url))

    def __enter__(self) -> ServiceLock:
        taken: list[FileLock | DatabaseLock] = []
        try:
            for lock in self._locks:
                lock.acquire()
                taken.append(lock)
        except BaseException:
            for lock in reversed(taken):
                lock.release()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for lock in reversed(self._locks):
            lock.release()
