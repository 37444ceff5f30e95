"""``/api/v1/schedule``: the scheduling policy in force, what its latest round decided, and
each project's quotas and usage. A user sees their projects' jobs; a device another
project's job holds shows as held by ``another project``."""

from __future__ import annotations

from fastapi import APIRouter

from api.accounts import Principal, may
from api.deps import UNAUTHORIZED, ReaderDep, StateDep
from api.execution.scheduling import Schedule
from api.schemas.schedule import ProjectUsagePublic, SchedulePublic
from api.views import same_named, scheduled_job_public

router = APIRouter(prefix="/schedule", tags=["schedule"])
OTHER_PROJECT = "another project"
"""What a device held by a job the caller may not see shows as holding it."""


@router.get("", response_model=SchedulePublic, responses=UNAUTHORIZED)
def read_schedule(state: StateDep, principal: ReaderDep) -> SchedulePublic:
    """Who holds which device, the queue and why each job waits (a quota, say), every job's
    reason, and each project's quotas and usage."""
    executor = state.executor
    if executor is None:  # jobs are stored but not run: nothing is allocated
        settings = state.settings
        schedule, busy = Schedule(policy=settings.policy, round_s=settings.round_s), {}
    else:
        schedule, busy = executor.schedule(), executor.busy_devices()
    rows = [r for r in schedule.jobs if may(principal, r.project, "read")]
    shown = {r.job_id for r in rows}
    busy = {d: (j if j in shown else OTHER_PROJECT) for d, j in busy.items()}
    allocation: dict[str, list[str]] = {}
    for device, job_id in busy.items():
        if job_id != OTHER_PROJECT:
            allocation.setdefault(job_id, []).append(device)
    ids = state.handle.cluster.ids if state.handle.cluster is not None else []
    jobs = [scheduled_job_public(row) for row in rows]
    return SchedulePublic.model_validate(
        {
            **same_named(schedule, SchedulePublic),
            "allocation": allocation,
            "devices": {d: busy.get(d) for d in ids},
            "queue": [j for j in jobs if j.status == "waiting"],
            "jobs": jobs,
            "projects": _usage(state, principal),
        }
    )


def _usage(state: StateDep, principal: Principal) -> list[ProjectUsagePublic]:
    accounts = state.store.accounts
    held = state.executor.ledger.held_by_project() if state.executor is not None else {}
    queued = state.store.queued_by_project()
    stored = accounts.storage_used()
    return [
        ProjectUsagePublic(
            name=p.name,
            weight=p.weight,
            max_devices=p.max_devices,
            devices_held=held.get(p.name, 0),
            max_queued=p.max_queued,
            queued=queued.get(p.name, 0),
            max_priority=p.max_priority,
            storage_bytes=p.storage_bytes,
            storage_used_bytes=stored.get(p.name, 0),
        )
        for p in accounts.projects()
        if may(principal, p.name, "read")
    ]
