"""``/api/v1/jobs``: submit, list, inspect, stop and delete training jobs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, Request, Response, status
from fastapi.responses import StreamingResponse

from api.core.settings import API_PREFIX
from api.deps import UNAUTHORIZED, Auth, JobDep, StateDep, StoreDep
from api.execution.scheduling import check_device_counts
from api.schemas.jobs import (
    CheckpointPublic,
    CheckpointsPublic,
    JobCreate,
    JobLogsPublic,
    JobMetricsPublic,
    JobPublic,
    JobsPublic,
    LogLine,
    StepPublic,
)
from api.schemas.service import ErrorPublic, Message
from api.services import (
    check_devices,
    check_simulated_fit,
    model_from_ref,
    resolve_dataset,
    stream_checkpoint,
)
from api.states import JobState
from api.store import JobRecord
from api.views import JobPages, job_public
from scheduler.hardware.precision import device_precisions
from scheduler.models.presets import check_trainable

router = APIRouter(prefix="/jobs", tags=["jobs"])

ERRORS = {
    **UNAUTHORIZED,
    404: {"model": ErrorPublic, "description": "No such job"},
    409: {"model": ErrorPublic, "description": "Not allowed in the job's state"},
}


@router.post(
    "",
    response_model=JobPublic,
    status_code=status.HTTP_201_CREATED,
    dependencies=[Auth],
    responses={
        200: {"model": JobPublic, "description": "Known submission_id, same spec"},
        **UNAUTHORIZED,
        409: {
            "model": ErrorPublic,
            "description": "The model fits no device, a device id or dataset the server lacks, "
            "or a known submission_id with another spec",
        },
    },
)
def submit_job(spec: JobCreate, state: StateDep, response: Response) -> JobPublic:
    """Queue a job. A repeated ``submission_id`` answers 200 with the job it created when
    the spec is the same, and 409 when it is not (a retry never queues a second job, and
    a reused id never passes for another job)."""
    if spec.submission_id is not None:
        existing = state.store.get_by_submission(spec.submission_id)
        if existing is not None:
            response.status_code = status.HTTP_200_OK
            return job_public(_same_submission(existing, spec))
    model = model_from_ref(spec.model, data_dir=state.settings.data_dir)
    check_trainable(model)
    device_ids = check_devices(state.handle, spec.devices)
    cluster = state.handle.cluster
    check_device_counts(spec, len(cluster.ids) if cluster is not None else 0)
    if cluster is not None:  # a device that cannot run the precision: a one-line 422
        device_precisions((cluster.device(i) for i in device_ids), spec.precision)
    resolve_dataset(
        state.settings.data_dir,
        spec.dataset,
        seq_len=model.seq_len,
        vocab_size=model.vocab_size,
        global_batch=spec.global_batch,
    )
    if state.handle.simulated and state.handle.cluster is not None:
        check_simulated_fit(state.handle.cluster, model, device_ids)
    job, created = state.store.create_job(
        name=spec.name,
        model_name=model.name,
        spec=spec,
        submission_id=spec.submission_id,
    )
    if not created:  # a twin of this request won the race
        response.status_code = status.HTTP_200_OK
        return job_public(_same_submission(job, spec))
    if state.executor is not None:
        state.executor.wake()
    return job_public(job)


def _same_submission(existing: JobRecord, spec: JobCreate) -> JobRecord:
    """The job ``spec.submission_id`` created, if it was submitted with this spec (else 409)."""
    if existing.spec == spec:
        return existing
    theirs, ours = existing.spec.model_dump(), spec.model_dump()
    differ = sorted(k for k in ours if ours[k] != theirs.get(k))
    raise HTTPException(
        status.HTTP_409_CONFLICT,
        f"submission_id: {spec.submission_id!r} was used for job {existing.id} with another "
        f"spec (differs in {', '.join(differ)}); use a new submission_id",
    )


@router.get("", response_model=JobsPublic)
def list_jobs(
    store: StoreDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
    state: JobState | None = None,
) -> JobsPublic:
    """Jobs, newest first; ``count`` is the number matching over all pages."""
    jobs, count = store.list_jobs(state=state, limit=limit, offset=offset)
    return JobsPublic(data=[job_public(j) for j in jobs], count=count)


@router.get("/{job_id}", response_model=JobPublic, responses={404: ERRORS[404]})
def read_job(job: JobDep, store: StoreDep, request: Request) -> Response:
    """The job and what changed its plan while it ran.

    Dashboards poll this: it runs in the thread pool (its reads never hold up the event
    loop, and so every other request) and answers from :class:`api.views.JobPages`
    while the job and its events are unchanged."""
    pages: JobPages = request.app.state.job_pages
    return Response(pages.body(job, store.events(job.id)), media_type="application/json")


@router.get("/{job_id}/checkpoints", response_model=CheckpointsPublic, responses={404: ERRORS[404]})
def list_checkpoints(job: JobDep, store: StoreDep) -> CheckpointsPublic:
    """The job's checkpoints kept, oldest first; each loads into any plan or cluster."""
    data = [
        CheckpointPublic(
            step=c.step,
            created_at=c.created_at,
            url=f"{API_PREFIX}/jobs/{job.id}/checkpoints/{c.step}",
        )
        for c in store.checkpoints(job.id)
    ]
    return CheckpointsPublic(data=data, count=len(data))


@router.get(
    "/{job_id}/checkpoints/{step}",
    response_class=Response,
    responses={
        200: {"content": {"application/gzip": {}}, "description": "The checkpoint, .tar.gz"},
        404: {"model": ErrorPublic, "description": "No such job, or it never had this checkpoint"},
        410: {"model": ErrorPublic, "description": "Retention removed it, or its files are gone"},
    },
)
def download_checkpoint(
    job: JobDep, store: StoreDep, step: Annotated[int, Path(ge=0, le=10**9)]
) -> Response:
    """One checkpoint as a .tar.gz: its safetensors parts and manifest.json. Its files are
    opened (and pinned against retention) before the answer starts, so a checkpoint gone
    from storage is a 410, never an empty or truncated archive."""
    from workers.checkpoint import CheckpointStore  # torch: loaded on the first download

    record = store.checkpoint(job.id, step)
    if record is None:
        kept = ", ".join(str(c.step) for c in store.checkpoints(job.id)) or "none"
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, f"step: job {job.id} has no checkpoint {step}; kept: {kept}"
        )
    if record.pruned_at is not None:
        raise HTTPException(
            status.HTTP_410_GONE,
            f"step: job {job.id}'s checkpoint {step} was pruned at "
            f"{record.pruned_at:%Y-%m-%d %H:%M:%S} UTC (retention keeps the newest)",
        )
    root, _, folder = record.uri.rstrip("/").rpartition("/")
    opened = CheckpointStore(root).open_step(int(folder.removeprefix("step-")))
    if opened is None:
        raise HTTPException(
            status.HTTP_410_GONE,
            f"step: job {job.id}'s checkpoint {step} is gone from storage ({record.uri})",
        )
    name = f"{job.id}-step-{step:08d}"
    return StreamingResponse(
        stream_checkpoint(opened, name),
        media_type="application/gzip",
        headers={"Content-Disposition": f'attachment; filename="{name}.tar.gz"'},
    )


@router.get("/{job_id}/metrics", response_model=JobMetricsPublic, responses={404: ERRORS[404]})
def read_metrics(
    job: JobDep, store: StoreDep, since: Annotated[int, Query(ge=0, le=10**9)] = 0
) -> JobMetricsPublic:
    """Per-step loss (and validation loss where evaluated), step time, throughput and
    per-device busy/wait/peak, from ``since``."""
    steps = store.steps(job.id, since=since)
    data = [StepPublic.model_validate(s, from_attributes=True) for s in steps]
    return JobMetricsPublic(job_id=job.id, data=data, count=len(data))


@router.get("/{job_id}/logs", response_model=JobLogsPublic, responses={404: ERRORS[404]})
def read_logs(
    job: JobDep, store: StoreDep, since: Annotated[int, Query(ge=0, le=10**9)] = 0
) -> JobLogsPublic:
    """What the executor did with the job, from line ``since`` on."""
    lines = [
        LogLine(time=r.time, level=r.level, message=r.message)  # type: ignore[arg-type]
        for r in store.logs(job.id, since=since)
    ]
    return JobLogsPublic(job_id=job.id, data=lines, count=len(lines))


@router.post(
    "/{job_id}/stop",
    response_model=JobPublic,
    dependencies=[Auth],
    responses=ERRORS,
)
def stop_job(job: JobDep, state: StateDep) -> JobPublic:
    """A pending job stops at once; a running one stops after its current step."""
    if job.terminal:
        raise HTTPException(
            status.HTTP_409_CONFLICT, f"job: {job.id} is already {job.state}; nothing to stop"
        )
    updated = state.store.request_stop(job.id)
    assert updated is not None
    live = state.executor is not None and state.executor.request_stop(job.id)
    if updated.state == JobState.RUNNING and not live:
        # RUNNING with no runner of this service (one died, or a service before this one
        # left it): nothing would act on the flag, so the stop ends it here.
        state.store.finish(
            job.id,
            JobState.STOPPED,
            f"stopped on request after {updated.steps_done} steps (no runner was training it)",
        )
        updated = state.store.get(job.id) or updated
    return job_public(updated)


@router.delete(
    "/{job_id}",
    response_model=Message,
    dependencies=[Auth],
    responses=ERRORS,
)
def delete_job(job: JobDep, store: StoreDep) -> Message:
    """Delete a finished job with its metrics and logs; running ones must be stopped first."""
    if not job.terminal or not store.delete(job.id):
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"job: {job.id} is {job.state}; only STOPPED, SUCCEEDED or FAILED "
            "jobs can be deleted (stop it first)",
        )
    return Message(message=f"job {job.id} deleted")
