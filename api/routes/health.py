"""``/healthz``: is the service up, and can it reach its database and cluster?"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from fastapi import APIRouter
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from api.deps import StateDep
from api.schemas.service import Health

router = APIRouter(tags=["health"])


def _version() -> str:
    try:
        return version("hetsched")
    except PackageNotFoundError:
        return "unknown"


@router.get("/healthz", response_model=Health)
def healthz(state: StateDep) -> Health:
    try:
        with state.store.engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        database = "ok"
    except SQLAlchemyError:
        database = "error"
    return Health(
        status="ok" if database == "ok" else "degraded",
        database=database,  # type: ignore[arg-type]
        cluster="available" if state.handle.available else "unavailable",
        executor="running" if state.executor is not None else "disabled",
        version=_version(),
    )
