"""``/api/v1/jobs``: submit, list, inspect, stop and delete training jobs."""

from __future__ import annotations

import functools
import re
from typing import Annotated

import fsspec
from fastapi import APIRouter, HTTPException, Path, Query, Request, Response, status
from fastapi.responses import StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from api.accounts import Principal, ProjectRecord, may, may_use_dataset, visible_projects
from api.core.settings import API_PREFIX
from api.core.telemetry import ROUTE_KEY
from api.deps import (
    JOB_ID,
    UNAUTHORIZED,
    ActJobDep,
    ActorDep,
    AppState,
    Auth,
    JobDep,
    ReadAuth,
    ReaderDep,
    StateDep,
    StoreDep,
    check_project,
    principal_without_lookup,
)
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
from api.schemas.users import ACCOUNT_PATTERN
from api.services import (
    NotOnServer,
    check_devices,
    check_simulated_fit,
    model_from_ref,
    resolve_dataset,
    stream_checkpoint,
)
from api.states import JobState
from api.store import JobRecord, JobStore
from api.views import JobPages, job_public
from scheduler.hardware.precision import device_precisions
from scheduler.models.presets import check_trainable

router = APIRouter(prefix="/jobs", tags=["jobs"])

ERRORS = {
    **UNAUTHORIZED,
    404: {"model": ErrorPublic, "description": "No such job (or another project's)"},
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
            "description": "The model fits no device, or a device lacks its precision; a "
            "device id, dataset, init_from job or project the server lacks (or the caller may "
            "not use); the project's max_queued; or a known submission_id with another spec",
        },
    },
)
def submit_job(
    spec: JobCreate, state: StateDep, response: Response, principal: ActorDep
) -> JobPublic:
    """Queue a job in one of the submitter's projects, within its quotas (``max_priority``:
    422; ``max_queued``: 409). A repeated ``submission_id`` answers 200 with the job it
    created when the spec is the same, and 409 when it is not (a retry never queues a
    second job, and a reused id never passes for another job)."""
    if spec.submission_id is not None:
        existing = state.store.get_by_submission(spec.submission_id)
        if existing is not None and not may(principal, existing.project, "read"):
            raise HTTPException(
                status.HTTP_409_CONFLICT,
                "submission_id: already used by another project's job; pick another",
            )
        if existing is not None:
            response.status_code = status.HTTP_200_OK
            return job_public(_same_submission(existing, spec))
    project = _project_for(spec, principal, state.store)
    spec = spec.model_copy(update={"project": project.name})
    _check_sources(spec, principal, state.store)
    model = model_from_ref(spec.model, data_dir=state.settings.data_dir)
    check_trainable(model)
    device_ids = check_devices(state.handle, spec.devices)
    cluster = state.handle.cluster
    check_device_counts(spec, len(cluster.ids) if cluster is not None else 0)
    if cluster is not None:  # a device that cannot run the precision: a one-line 409
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
        owner=principal.name or "",
        project=project.name,
    )
    if not created:  # a twin of this request won the race
        response.status_code = status.HTTP_200_OK
        return job_public(_same_submission(job, spec))
    state.store.accounts.audit(principal, "job.submit", job.id, project=project.name)
    if state.executor is not None:
        state.executor.wake()
    return job_public(job)


def _unprocessable(detail: str) -> HTTPException:
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail)


def _project_for(spec: JobCreate, principal: Principal, store: JobStore) -> ProjectRecord:
    """The project the job counts against, once its quotas let it in."""
    name = spec.project or principal.default_project
    project = store.accounts.project(name)
    check_project(principal, name, known=project is not None)
    assert project is not None
    if project.max_priority is not None and spec.priority > project.max_priority:
        raise _unprocessable(
            f"priority: {spec.priority:g} is above project {name}'s max_priority "
            f"{project.max_priority:g}"
        )
    need = len(spec.devices) if spec.devices is not None else spec.min_devices
    if project.max_devices is not None and need > project.max_devices:
        field = "devices" if spec.devices is not None else "min_devices"
        raise _unprocessable(
            f"{field}: {need} device(s) are more than project {name}'s max_devices "
            f"{project.max_devices}; the job could never start"
        )
    if project.max_queued is not None:
        queued = store.queued_by_project().get(name, 0)
        if queued >= project.max_queued:
            raise HTTPException(
                status.HTTP_409_CONFLICT,
                f"quota: project {name} has {queued} job(s) queued, its max_queued; "
                "submit again once one has started, or stop one",
            )
    return project


def _check_sources(spec: JobCreate, principal: Principal, store: JobStore) -> None:
    """A job may start from the checkpoints of jobs, and train on datasets, its submitter
    may read; another project's are as absent as missing ones."""
    if spec.dataset != "default":
        owner = store.accounts.dataset(spec.dataset)
        if not may_use_dataset(principal, owner, "read"):
            raise NotOnServer(f"dataset: no file {spec.dataset!r} in the server's data directory")
    if spec.init_from is None or spec.init_from.startswith("hf:"):
        return
    other_id = spec.init_from.partition("@")[0]
    other = store.get(other_id)
    if other is None and principal.is_admin:
        return  # the job fails when it starts, as before users (the runner says why)
    if other is None or not may(principal, other.project, "read"):
        raise NotOnServer(f"init_from: no job {other_id!r}")


def _same_submission(existing: JobRecord, spec: JobCreate) -> JobRecord:
    """The job ``spec.submission_id`` created, if it was submitted with this spec (else 409);
    a spec naming no project means the one the job was queued in."""
    if spec.project is None:
        spec = spec.model_copy(update={"project": existing.project})
    if existing.spec == spec:
        return existing
    theirs, ours = existing.spec.model_dump(), spec.model_dump()
    differ = sorted(k for k in ours if ours[k] != theirs.get(k))
    raise HTTPException(
        status.HTTP_409_CONFLICT,
        f"submission_id: {spec.submission_id!r} was used for job {existing.id} with another "
        f"spec (differs in {', '.join(differ)}); use a new submission_id",
    )


@router.get("", response_model=JobsPublic, dependencies=[ReadAuth], responses=UNAUTHORIZED)
def list_jobs(
    store: StoreDep,
    principal: ReaderDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
    state: JobState | None = None,
    owner: Annotated[str | None, Query(max_length=64, pattern=ACCOUNT_PATTERN)] = None,
) -> JobsPublic:
    """The jobs of the caller's projects (an admin's: all), newest first; ``owner``: only
    that user's. ``count`` is the number matching over all pages."""
    jobs, count = store.list_jobs(
        state=state,
        limit=limit,
        offset=offset,
        projects=visible_projects(principal),
        owner=owner,
    )
    return JobsPublic(data=[job_public(j) for j in jobs], count=count)


@router.get("/{job_id}", response_model=JobPublic, responses={**UNAUTHORIZED, 404: ERRORS[404]})
async def read_job(
    job_id: str, principal: ReaderDep, state: StateDep, request: Request
) -> Response:
    """The job and what changed its plan while it ran.

    Dashboards poll this: :class:`JobPolls` answers them before routing wherever who
    asks needs no lookup; here the rest (a user's token looked up first) get the same
    :meth:`api.views.JobPages.answer`, which reads in the thread pool (never holding up
    the event loop, and so every other request), once for every poll that comes
    meanwhile. Another project's job is as absent as a missing one."""
    pages: JobPages = request.app.state.job_pages
    page = None
    if JOB_ID.fullmatch(job_id):
        readable = functools.partial(may, principal, action="read")
        page = await pages.answer(state.store, job_id, readable)
    if page is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job: no job with id {job_id!r}")
    return Response(page, media_type="application/json")


JOB_ROUTE = f"{API_PREFIX}/jobs/{{job_id}}"
JOB_PATH = re.compile(rf"{API_PREFIX}/jobs/({JOB_ID.pattern})")


class JobPolls:
    """ASGI middleware: ``GET /jobs/{id}`` answered before routing, the cost of fifty
    dashboards polling one job.

    It answers what :func:`read_job` would, byte for byte, from :meth:`JobPages.answer`
    (no read while nothing was written since the last answer; after a write, one read
    in the thread pool shared by every poll that comes meanwhile), where who is asking
    needs no read either (:func:`api.deps.principal_without_lookup`). Every training
    step writes, so answering after a write here too keeps fifty dashboards' next polls
    out of routing and dependency resolution. Only a user's token still to be looked
    up, a missing job or one the caller may not read goes on to the route. Installed
    inside :class:`api.core.guards.RequestGuard`, so the host check holds.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await self._answer(scope) if scope["type"] == "http" else None
        if body is None:
            await self.app(scope, receive, send)
            return
        scope[ROUTE_KEY] = JOB_ROUTE
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    @staticmethod
    async def _answer(scope: Scope) -> bytes | None:
        match = JOB_PATH.fullmatch(scope["path"]) if scope["method"] == "GET" else None
        state: AppState | None = getattr(scope["app"].state, "hetsched", None)
        if match is None or state is None:
            return None
        name = state.settings.identity_header
        identity_key = name.lower().encode("latin-1") if name else None
        authorization = identity = None
        for key, value in scope["headers"]:
            if key == b"authorization":
                authorization = value.decode("latin-1")
            elif key == identity_key:
                identity = value.decode("latin-1")
        principal = principal_without_lookup(state, authorization, identity)
        if principal is None or not (principal.authenticated or principal.reads_all):
            return None  # looked up, or refused (401), by the route's dependencies
        pages: JobPages = scope["app"].state.job_pages
        readable = functools.partial(may, principal, action="read")
        return await pages.answer(state.store, match[1], readable)


@router.get(
    "/{job_id}/checkpoints",
    response_model=CheckpointsPublic,
    responses={**UNAUTHORIZED, 404: ERRORS[404]},
)
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
        **UNAUTHORIZED,
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


@router.get(
    "/{job_id}/metrics",
    response_model=JobMetricsPublic,
    responses={**UNAUTHORIZED, 404: ERRORS[404]},
)
def read_metrics(
    job: JobDep, store: StoreDep, since: Annotated[int, Query(ge=0, le=10**9)] = 0
) -> JobMetricsPublic:
    """Per-step loss (and validation loss where evaluated), step time, throughput and
    per-device busy/wait/peak, from ``since``."""
    steps = store.steps(job.id, since=since)
    data = [StepPublic.model_validate(s, from_attributes=True) for s in steps]
    return JobMetricsPublic(job_id=job.id, data=data, count=len(data))


@router.get(
    "/{job_id}/logs", response_model=JobLogsPublic, responses={**UNAUTHORIZED, 404: ERRORS[404]}
)
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
def stop_job(job: ActJobDep, state: StateDep, principal: ActorDep) -> JobPublic:
    """A pending job stops at once; a running one stops after its current step."""
    if job.terminal:
        raise HTTPException(
            status.HTTP_409_CONFLICT, f"job: {job.id} is already {job.state}; nothing to stop"
        )
    updated = state.store.request_stop(job.id)
    state.store.accounts.audit(principal, "job.stop", job.id, project=job.project)
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
def delete_job(job: ActJobDep, state: StateDep, principal: ActorDep) -> Message:
    """Delete a finished job with its metrics, logs and checkpoint files; running ones must
    be stopped first, and one whose checkpoints an unfinished job starts from (its
    ``init_from``) is kept until that job ends (409)."""
    store = state.store
    _check_not_needed(job, principal, store)
    if not job.terminal or not store.delete(job.id):
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"job: {job.id} is {job.state}; only STOPPED, SUCCEEDED or FAILED "
            "jobs can be deleted (stop it first)",
        )
    removed = _remove_files(state.settings.job_checkpoints(job.id))
    store.accounts.audit(principal, "job.delete", job.id, project=job.project, detail=removed)
    return Message(message=f"job {job.id} deleted")


def _check_not_needed(job: JobRecord, principal: Principal, store: JobStore) -> None:
    for other in store.unfinished():
        init_from = other.spec.init_from or ""
        if init_from.partition("@")[0] == job.id and other.id != job.id:
            visible = may(principal, other.project, "read")
            who = f"job {other.id}" if visible else "a job of another project"
            raise HTTPException(
                status.HTTP_409_CONFLICT,
                f"job: {job.id}'s checkpoints are still needed: {who} starts from them "
                "(init_from) and has not ended; delete it once that job ends",
            )


def _remove_files(uri: str) -> str:
    """Remove a job's checkpoint folder (any fsspec location); says what went."""
    fs, root = fsspec.core.url_to_fs(uri)
    if not fs.exists(root):
        return "no checkpoint files"
    fs.rm(root, recursive=True)
    return f"removed {uri}"
