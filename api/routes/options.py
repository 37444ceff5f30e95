"""``/api/v1/options``: what a submit form can offer on this server."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import StateDep
from api.schemas import Options, allowed_strategies
from api.services import list_datasets
from scheduler.models import PRESETS

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
