"""``/api/v1/plans``: a dry run of the planner on this cluster; nothing is trained."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import UNAUTHORIZED, Auth, StateDep, errors
from api.schemas.plans import PlanCreate, PlanPreview
from api.services import check_devices, dry_run, model_from_ref
from api.views import plan_public
from scheduler.hardware.precision import device_precisions

router = APIRouter(prefix="/plans", tags=["plans"])


@router.post(
    "",
    response_model=PlanPreview,
    dependencies=[Auth],
    responses={
        **errors({409: "Nothing fits, or a device lacks the precision"}),
        **UNAUTHORIZED,
    },
)
def create_plan(spec: PlanCreate, state: StateDep) -> PlanPreview:
    """The plan a job with this spec would get, with the even and proportional baselines.

    Uses the latest measurement of the model on these devices, measures them
    when they are idle, and otherwise (or without a cluster) the GPU catalogue.
    """
    model = model_from_ref(spec.model, data_dir=state.settings.data_dir)
    device_ids = check_devices(state.handle, spec.devices)
    cluster = state.handle.cluster
    if cluster is not None:  # a device that cannot run the precision: a one-line 409
        device_precisions((cluster.device(i) for i in device_ids), spec.precision)
    busy = set(state.executor.busy_devices()) if state.executor else set()
    plan, source = dry_run(
        handle=state.handle,
        profiler=state.profiler,
        model=model,
        device_ids=device_ids,
        global_batch=spec.global_batch,
        strategy=spec.strategy,
        busy=busy,
        precision=spec.precision,
    )
    return PlanPreview(
        model=model.name,
        profile_source=source,  # type: ignore[arg-type]
        plan=plan_public(plan),
    )
