"""Jobs: what a submission carries (``JobCreate``) and what a job, its events, steps, logs
and checkpoints read as."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from api.schemas.fields import (
    DatasetName,
    InitFrom,
    Name,
    Text,
)
from api.schemas.plans import OptimizerSpec, PlanCreate, PlanPublic, TrainableModelRef
from api.schemas.users import AccountName
from api.states import JobState
from scheduler.hardware.precision import JobPrecision


class JobCreate(PlanCreate):
    """A training job."""

    model: TrainableModelRef = "gpt-tiny"
    name: Name = "job"
    dataset: DatasetName = Field(
        default="default",
        description="'default' (the bundled corpus) or a file name inside the server's data "
        "directory (a relative path; no segment may start with '.').",
    )
    steps: int = Field(default=20, ge=1, le=1_000_000)
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    precision: JobPrecision = Field(
        default="fp32",
        description="Compute precision: fp32; bf16 (Ampere and newer) or fp16 (with dynamic "
        "loss scaling; V100, T4 and newer), both with fp32 master weights and AdamW state; "
        "or auto, per device type (bf16 where supported, fp16 on V100/T4-class GPUs, fp32 "
        "otherwise). A device that cannot run the precision asked for is a 422.",
    )
    seed: int = Field(default=0, ge=0, le=2**32 - 1)
    checkpoint_every: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Steps between checkpoints; default a tenth of the steps, at most 50.",
    )
    checkpoint_every_s: float | None = Field(
        default=None, gt=0, le=1e7, allow_inf_nan=False, description="Seconds between checkpoints."
    )
    max_failures: int = Field(
        default=3, ge=0, le=1000, description="Failures recovered from before the job fails."
    )
    replan: bool | None = Field(
        default=None,
        description="Follow a device's speed change by re-planning; default the service's.",
    )
    init_from: InitFrom | None = Field(
        default=None,
        description="Start from another job's checkpoint, 'JOB_ID' (its latest) or "
        "'JOB_ID@STEP', or from a Hugging Face model directory inside the server's data "
        "directory, 'hf:DIR' (GPT-2 or Llama weights; the job's model must match them).",
    )
    val_every: int | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        description="Steps between evaluations of the validation loss on the dataset's "
        "held-out split (its last 5 %), and after the last step. Default: a tenth of the "
        "job for jobs of 20 steps or more, never for shorter ones; 0: never.",
    )
    val_batches: int = Field(
        default=1,
        ge=1,
        le=1000,
        description="Validation samples per evaluation, in global batches (the same samples "
        "at every evaluation).",
    )
    submission_id: Text | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="Client-chosen key; submitting it again returns the existing job.",
    )
    priority: float = Field(
        default=1.0,
        gt=0,
        le=1000,
        allow_inf_nan=False,
        description="Weight under the fair and goodput policies: a job of priority 2 is "
        "valued as two of priority 1.",
    )
    min_devices: int = Field(
        default=1,
        ge=1,
        le=100_000,
        description="The job waits until the policy can give it this many devices; at most "
        "max_devices, the number of devices it names, and the cluster's devices.",
    )
    max_devices: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="Never more devices than this (at least min_devices, at most the "
        "cluster's devices); default as many as help (fifo: all).",
    )
    project: AccountName | None = Field(
        default=None,
        description="The project the job counts against (one the submitter belongs to); "
        "default the submitter's ('default' for the admin). Stored as resolved.",
    )


class JobEventPublic(BaseModel):
    time: datetime
    kind: Literal["recovery", "replan", "restart", "host_bound"]
    """``host_bound``: simulated devices could not keep their GPUs' pace for several steps
    in a row (this host's cores are taken); the job's speeds are the host's."""
    step: int
    """The step it happened at (a recovery: the first step run again)."""
    data: dict[str, Any]
    """Its record: error, devices lost, old and new plan, predicted gain, seconds taken;
    for ``host_bound`` its one-line ``message`` and each lagging device's ``compute_ratio``."""


class AllocationPublic(BaseModel):
    """One entry of a job's allocation history: it started, or the policy moved it."""

    time: datetime
    step: int
    """The first step it ran on ``devices``."""
    policy: str
    """The service's policy, or ``pinned`` for a job that named its devices."""
    from_devices: list[str]
    """What it held before (empty when it started)."""
    devices: list[str]
    reason: str
    """The policy's one-line reason."""


class CheckpointPublic(BaseModel):
    step: int
    created_at: datetime
    url: str
    """Where to download it (a .tar.gz of its safetensors parts and manifest)."""


class CheckpointsPublic(BaseModel):
    data: list[CheckpointPublic]
    count: int


class JobPublic(BaseModel):
    """A job as the API shows it: its request, state, progress, plan and history."""

    id: str
    name: str
    model_name: str
    state: JobState
    message: str = ""
    """Why a job failed or stopped; what a pending job waits for."""
    spec: JobCreate
    owner: str = "admin"
    """The user who submitted it."""
    project: str = "default"
    """The project it belongs to: its members see and act on it."""
    submission_id: str | None = None
    devices: list[str] = []
    """Devices allocated to the job (empty until it starts)."""
    plan: PlanPublic | None = None
    steps: int
    steps_done: int = 0
    progress: float = 0.0
    """steps_done / steps, in [0, 1]."""
    last_loss: float | None = None
    samples_per_s: float | None = None
    """Measured throughput: global_batch / measured_step_s."""
    predicted_step_s: float | None = None
    measured_step_s: float | None = None
    """Median step time after the first (warm-up) step."""
    stop_requested: bool = False
    created_at: datetime
    started_at: datetime | None = None
    ended_at: datetime | None = None
    events: list[JobEventPublic] = []
    """What changed the job's plan while it ran: recoveries, re-plans, restarts."""
    allocations: list[AllocationPublic] = []
    """Its allocation history: where the scheduling policy started and moved it."""


class JobsPublic(BaseModel):
    data: list[JobPublic]
    count: int
    """Jobs matching the filter, over all pages."""


class DeviceStepPublic(BaseModel):
    id: str
    busy_s: float
    wait_s: float
    peak_bytes: int


class StepPublic(BaseModel):
    step: int
    loss: float
    val_loss: float | None = Field(
        default=None, description="Validation loss after this step; null when not evaluated."
    )
    step_s: float
    samples_per_s: float
    devices: list[DeviceStepPublic]
    time: datetime


class JobMetricsPublic(BaseModel):
    job_id: str
    data: list[StepPublic]
    count: int


class LogLine(BaseModel):
    time: datetime
    level: Literal["INFO", "WARNING", "ERROR"]
    message: str


class JobLogsPublic(BaseModel):
    job_id: str
    data: list[LogLine]
    count: int
