"""``/api/v1/cluster``: the devices, their figures and what runs on them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, HTTPException, status

from api.deps import ADMIN_ONLY, AdminAuth, AdminDep, StateDep, errors
from api.schemas.cluster import ClusterPublic, DeviceFailure, DeviceSlowdown
from api.schemas.profiles import ProfileCreate, ProfilePublic
from api.schemas.service import Message
from api.services import check_devices, model_from_ref
from api.views import cluster_public, profile_public

router = APIRouter(prefix="/cluster", tags=["cluster"])
Handler = TypeVar("Handler", bound=Callable[..., Any])


@router.get("", response_model=ClusterPublic)
def read_cluster(state: StateDep) -> ClusterPublic:
    """Nodes and devices: type, memory, measured speed, status (idle, or busy with a job)."""
    return cluster_public(state.handle, state.store, state.executor)


@router.post(
    "/profile",
    response_model=ProfilePublic,
    dependencies=[AdminAuth],
    responses={**ADMIN_ONLY, **errors({409: "Cluster unavailable or devices busy"})},
)
def profile_cluster(spec: ProfileCreate, state: StateDep, principal: AdminDep) -> ProfilePublic:
    """Measure the devices for a model (cached unless ``refresh``); admins only."""
    model = model_from_ref(spec.model, data_dir=state.settings.data_dir)
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
    target = ", ".join(device_ids)
    state.store.accounts.audit(
        principal, "cluster.profile", target, project=None, detail=model.name
    )
    return profile_public(record)


# --- fault injection on a simulated cluster ----------------------------------------

FAULT_ERRORS = {
    **ADMIN_ONLY,
    **errors({404: "No such device", 409: "Not a simulated cluster, or unavailable"}),
}


def _fault_route(action: str) -> Callable[[Handler], Handler]:
    """``POST /cluster/devices/{device_id}/<action>``: one fault on a simulated device
    (admins only)."""
    return router.post(
        f"/devices/{{device_id:path}}/{action}",
        response_model=Message,
        dependencies=[AdminAuth],
        responses=FAULT_ERRORS,
    )


def simulated_pool(device_id: str, state: StateDep) -> Any:
    """The warm workers of the simulated cluster that has ``device_id`` (409, 404 otherwise)."""
    handle = state.handle
    if handle.cluster is None or not handle.available or handle.pool is None:
        raise HTTPException(status.HTTP_409_CONFLICT, f"cluster: unavailable ({handle.message})")
    if not handle.simulated:
        raise HTTPException(
            status.HTTP_409_CONFLICT, "cluster: faults are injected on simulated clusters only"
        )
    if device_id not in handle.cluster.ids:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"device: unknown id {device_id!r}; known: {', '.join(handle.cluster.ids)}",
        )
    return handle.pool


SimulatedPool = Annotated[Any, Depends(simulated_pool)]
"""A :class:`workers.cluster.pool.WorkerPool`, typed as ``ClusterHandle.pool`` is."""


@_fault_route("fail")
def fail_device(
    device_id: str, fault: DeviceFailure, pool: SimulatedPool, state: StateDep, who: AdminDep
) -> Message:
    """Crash the device's worker process (``crash``: it is restarted) or lose the device
    (``lost``: gone until restored). A job on it recovers from its last checkpoint."""
    state.store.accounts.audit(who, "device.fail", device_id, project=None, detail=fault.kind)
    if fault.kind == "lost":
        pool.mark_lost([device_id])
        return Message(message=f"{device_id} lost until POST .../restore")
    pool.crash(device_id)
    return Message(message=f"{device_id}: worker process killed")


@_fault_route("slowdown")
def slow_device(
    device_id: str, slowdown: DeviceSlowdown, pool: SimulatedPool, state: StateDep, who: AdminDep
) -> Message:
    """Make a simulated device ``factor`` times slower; a job on it re-plans when it pays."""
    detail = f"factor {slowdown.factor:g}"
    state.store.accounts.audit(who, "device.slowdown", device_id, project=None, detail=detail)
    pool.set_slowdown(device_id, slowdown.factor)
    return Message(message=f"{device_id} now {slowdown.factor:g}× its own time")


@_fault_route("restore")
def restore_device(device_id: str, pool: SimulatedPool, state: StateDep, who: AdminDep) -> Message:
    """Bring a lost device back and end its slow-down."""
    state.store.accounts.audit(who, "device.restore", device_id, project=None)
    pool.mark_lost([device_id], lost=False)
    pool.set_slowdown(device_id, 1.0)
    return Message(message=f"{device_id} restored")
