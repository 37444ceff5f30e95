"""``/api/v1/schedule``: the scheduling policy in force and what its latest round decided."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import StateDep
from api.schemas.schedule import SchedulePublic
from api.views import scheduled_job_public

router = APIRouter(prefix="/schedule", tags=["schedule"])


@router.get("", response_model=SchedulePublic)
def read_schedule(state: StateDep) -> SchedulePublic:
    """Who holds which device, the queue and why each job waits, and every job's reason."""
    executor = state.executor
    if executor is None:  # jobs are stored but not run: nothing is allocated
        settings = state.settings
        return SchedulePublic(
            policy=settings.policy,
            round_s=settings.round_s,
            decided_at=None,
            solver="",
            rates={},
            allocation={},
            devices={d: None for d in (state.handle.cluster.ids if state.handle.cluster else [])},
            queue=[],
            jobs=[],
        )
    schedule = executor.schedule()
    busy = executor.busy_devices()
    allocation: dict[str, list[str]] = {}
    for device, job_id in busy.items():
        allocation.setdefault(job_id, []).append(device)
    ids = state.handle.cluster.ids if state.handle.cluster is not None else []
    jobs = [scheduled_job_public(row) for row in schedule.jobs]
    return SchedulePublic(
        policy=schedule.policy,
        round_s=schedule.round_s,
        decided_at=schedule.decided_at,
        solver=schedule.solver,
        rates=schedule.rates,
        allocation=allocation,
        devices={d: busy.get(d) for d in ids},
        queue=[j for j in jobs if j.status == "waiting"],
        jobs=jobs,
    )
