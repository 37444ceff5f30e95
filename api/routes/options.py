"""``/api/v1/options``: what a submit form can offer on this server."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import StateDep
from api.schemas.fields import allowed_strategies
from api.schemas.service import Options
from api.services import list_datasets
from scheduler.models.presets import PRESETS

router = APIRouter(prefix="/options", tags=["options"])


@router.get("", response_model=Options)
def read_options(state: StateDep) -> Options:
    cluster = state.handle.cluster
    return Options(
        models=list(PRESETS),
        strategies=list(allowed_strategies()),
        datasets=list_datasets(state.settings.data_dir),
        devices=cluster.ids if cluster else [],
    )
