"""``/api/v1/cluster``: the devices, their figures and what runs on them."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status

from api.deps import Auth, StateDep
from api.schemas import ClusterPublic, ErrorPublic, ProfileCreate, ProfilePublic
from api.services import check_devices, model_from_ref
from api.views import cluster_public, profile_public

router = APIRouter(prefix="/cluster", tags=["cluster"])


@router.get("", response_model=ClusterPublic)
def read_cluster(state: StateDep) -> ClusterPublic:
    """Nodes and devices: type, memory, measured speed, status (idle, or busy with a job)."""
    return cluster_public(state.handle, state.store, state.executor)


@router.post(
    "/profile",
    response_model=ProfilePublic,
    dependencies=[Auth],
    responses={
        401: {"model": ErrorPublic, "description": "Token missing or wrong"},
        409: {"model": ErrorPublic, "description": "Cluster unavailable or devices busy"},
    },
)
def profile_cluster(spec: ProfileCreate, state: StateDep) -> ProfilePublic:
    """Measure the devices for a model (cached unless ``refresh``)."""
    model = model_from_ref(spec.model)
    device_ids = check_devices(state.handle, spec.devices)
    if not state.handle.available:
        raise HTTPException(
            status.HTTP_409_CONFLICT, f"cluster: unavailable ({state.handle.message})"
        )
    busy = state.executor.busy_devices() if state.executor else {}
    taken = [d for d in device_ids if d in busy]
    if taken:
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"devices: {', '.join(taken)} busy with job {busy[taken[0]]}; profile them when idle",
        )
    _profile, record = state.profiler.measure_record(model, device_ids, refresh=spec.refresh)
    return profile_public(record)
