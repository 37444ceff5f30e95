"""``/api/v1/schedule``: the scheduling policy in force and what its latest round decided."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import StateDep
from api.execution.scheduling import Schedule
from api.schemas.schedule import SchedulePublic
from api.views import same_named, scheduled_job_public

router = APIRouter(prefix="/schedule", tags=["schedule"])


@router.get("", response_model=SchedulePublic)
def read_schedule(state: StateDep) -> SchedulePublic:
    """Who holds which device, the queue and why each job waits, and every job's reason."""
    executor = state.executor
    if executor is None:  # jobs are stored but not run: nothing is allocated
        settings = state.settings
        schedule, busy = Schedule(policy=settings.policy, round_s=settings.round_s), {}
    else:
        schedule, busy = executor.schedule(), executor.busy_devices()
    allocation: dict[str, list[str]] = {}
    for device, job_id in busy.items():
        allocation.setdefault(job_id, []).append(device)
    ids = state.handle.cluster.ids if state.handle.cluster is not None else []
    jobs = [scheduled_job_public(row) for row in schedule.jobs]
    return SchedulePublic.model_validate(
        {
            **same_named(schedule, SchedulePublic),
            "allocation": allocation,
            "devices": {d: busy.get(d) for d in ids},
            "queue": [j for j in jobs if j.status == "waiting"],
            "jobs": jobs,
        }
    )
