"""The JSON the REST API speaks (``/api/v1``), as pydantic models.

Layered per resource in the manner of full-stack-fastapi-template: ``JobCreate``
comes in, ``JobPublic`` goes out, lists are ``JobsPublic(data, count)``. The
plan and profile documents follow DESIGN.md ("Plan", "Profile") field for
field, so a plan read from ``GET /jobs/{id}`` is the same document
``hetsched plan`` prints. Everything inside the service uses the frozen
dataclasses of ``scheduler/``; conversion happens in ``api/`` only.

Routes (all JSON; errors are ``{"detail": "<field>: <what is allowed>"}``)::

    GET    /api/v1/cluster                 ClusterPublic
    POST   /api/v1/cluster/profile         ProfileCreate -> ProfilePublic
    GET    /api/v1/profiles                ProfilesPublic
    GET    /api/v1/options                 Options (presets, strategies, datasets, device ids)
    POST   /api/v1/plans                   PlanCreate -> PlanPreview (409: nothing fits)
    POST   /api/v1/jobs                    JobCreate -> JobPublic (201 new, 200 same submission_id)
    GET    /api/v1/jobs?limit&offset&state JobsPublic (newest first)
    GET    /api/v1/jobs/{id}               JobPublic
    GET    /api/v1/jobs/{id}/metrics?since StepPublic list (steps >= since)
    GET    /api/v1/jobs/{id}/logs?since    LogLine list
    POST   /api/v1/jobs/{id}/stop          JobPublic
    DELETE /api/v1/jobs/{id}               Message (409 unless terminal)
    GET    /api/v1/schedule                SchedulePublic (policy, allocation, queue, reasons)
    GET    /healthz                        Health
    GET    /metrics                        Prometheus text

Mutating calls need ``Authorization: Bearer <token>`` when HETSCHED_API_TOKEN is set.

Strings that end up in the database are checked to be printable UTF-8, so a
client cannot store something a later read would choke on.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from api.states import TERMINAL_STATES, JobState
from scheduler import planner
from scheduler.activations import Recompute
from scheduler.models import PRESETS


def allowed_strategies() -> tuple[str, ...]:
    """Strategies the scheduler offers (``auto``, ``pp`` and ``hybrid`` once they land)."""
    offered = getattr(planner, "STRATEGIES", None)
    return tuple(offered) if offered else tuple(planner.DP_PLANNERS)


def _printable(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid UTF-8 text") from None
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise ValueError("must not contain control characters")
    return value


def _strategy(value: str) -> str:
    allowed = allowed_strategies()
    if value not in allowed:
        raise ValueError(f"must be one of {', '.join(allowed)}")
    return value


PRINTABLE = r"^[^\x00-\x1f\x7f]*$"
"""What :func:`_printable` allows, for the OpenAPI document (pydantic checks with it)."""
_printable_schema = Field(json_schema_extra={"pattern": PRINTABLE})
Text = Annotated[str, _printable_schema, AfterValidator(_printable)]
Name = Annotated[
    str, Field(min_length=1, max_length=100), _printable_schema, AfterValidator(_printable)
]
DeviceId = Annotated[
    str, Field(min_length=1, max_length=200), _printable_schema, AfterValidator(_printable)
]


def _device_list(value: list[str]) -> list[str]:
    if not value:
        raise ValueError("must list at least one device id, or be omitted for all")
    if len(set(value)) != len(value):
        raise ValueError("lists a device twice")
    return value


DeviceIds = Annotated[
    list[DeviceId],
    Field(max_length=4096, json_schema_extra={"minItems": 1, "uniqueItems": True}),
    AfterValidator(_device_list),
]
"""Device ids, each once; omit the field (not ``[]``) for the whole cluster."""
PresetName = Annotated[
    str,
    Field(
        json_schema_extra={"enum": list(PRESETS)},
        description=f"A model preset: {', '.join(PRESETS)}.",
    ),
]
# A relative path whose segments do not start with '.': never absolute, never '..'.
_SEGMENT = r"[^/.\x00-\x1f\x7f][^/\x00-\x1f\x7f]*"
DATASET_PATTERN = rf"^{_SEGMENT}(/{_SEGMENT})*$"


def _dataset_name(value: str) -> str:
    if not re.fullmatch(DATASET_PATTERN, value):
        raise ValueError(
            "must be 'default' or a file name inside the server's data directory "
            "(relative, no segment starting with '.')"
        )
    return value


DatasetName = Annotated[
    str,
    Field(min_length=1, max_length=255, json_schema_extra={"pattern": DATASET_PATTERN}),
    AfterValidator(_printable),
    AfterValidator(_dataset_name),
]
INIT_FROM_PATTERN = rf"^([0-9a-f]{{1,32}}(@[0-9]{{1,9}})?|hf:{_SEGMENT}(/{_SEGMENT})*)$"


def _init_from(value: str) -> str:
    if not re.fullmatch(INIT_FROM_PATTERN, value):
        raise ValueError(
            "must be a job id ('JOB_ID' or 'JOB_ID@STEP') or 'hf:DIR', a Hugging Face "
            "model directory inside the server's data directory (relative, no segment "
            "starting with '.')"
        )
    return value


InitFrom = Annotated[
    str,
    Field(min_length=1, max_length=255, json_schema_extra={"pattern": INIT_FROM_PATTERN}),
    AfterValidator(_printable),
    AfterValidator(_init_from),
]
StrategyName = Annotated[
    str,
    Field(json_schema_extra={"enum": list(allowed_strategies())}),
    AfterValidator(_strategy),
]


class _In(BaseModel):
    """Request bodies: unknown keys are errors (a typo must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid")


# --- requests ---------------------------------------------------------------


class ModelDims(_In):
    """A model given by its dimensions instead of a preset name."""

    name: Name = "custom"
    family: Literal["gpt", "llama"] = "gpt"
    num_layers: int = Field(ge=1, le=1024)
    d_model: int = Field(ge=1, le=65536, description="A multiple of num_heads.")
    num_heads: int = Field(ge=1, le=1024, description="Must divide d_model.")
    d_ff: int = Field(ge=1, le=262144)
    vocab_size: int = Field(ge=2, le=1_000_000)
    seq_len: int = Field(ge=1, le=131072)
    num_kv_heads: int = Field(
        default=0,
        ge=0,
        le=1024,
        description="Key/value heads (grouped-query attention, llama only); num_heads must be "
        "a multiple of it. 0 (the default): num_heads.",
    )

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelDims:
        if self.d_model % self.num_heads:
            raise ValueError(
                f"d_model {self.d_model} must be divisible by num_heads {self.num_heads}"
            )
        if self.num_kv_heads and self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads {self.num_heads} must be a multiple of num_kv_heads {self.num_kv_heads}"
            )
        if self.family == "gpt" and self.num_kv_heads not in (0, self.num_heads):
            raise ValueError(
                f"num_kv_heads: the gpt family has no grouped-query attention; "
                f"must be 0 or num_heads {self.num_heads}, got {self.num_kv_heads}"
            )
        return self


ModelRef = Annotated[
    PresetName | ModelDims,
    Field(description=f"A preset name ({', '.join(PRESETS)}) or explicit dimensions."),
]


class TrainableModelDims(ModelDims):
    """Dimensions of a model to train: training reads byte tokens, so at least 256 of them."""

    vocab_size: int = Field(ge=256, le=1_000_000)


TrainableModelRef = Annotated[
    PresetName | TrainableModelDims,
    Field(description=f"A preset name ({', '.join(PRESETS)}) or explicit dimensions."),
]


class OptimizerSpec(_In):
    """AdamW settings, the learning-rate schedule and gradient clipping."""

    lr: float = Field(default=3e-3, gt=0, le=10, allow_inf_nan=False)
    weight_decay: float = Field(default=0.0, ge=0, le=1, allow_inf_nan=False)
    warmup_steps: int = Field(default=0, ge=0, le=1_000_000, description="Linear warm-up.")
    decay_steps: int = Field(
        default=0,
        ge=0,
        le=1_000_000,
        description="Cosine decay ends at this step; 0 keeps the rate after the warm-up.",
    )
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1, allow_inf_nan=False)
    grad_clip: float | None = Field(
        default=None,
        gt=0,
        le=1e6,
        allow_inf_nan=False,
        description="Largest global gradient norm (over every device and stage); null: off.",
    )


class PlanCreate(_In):
    """A dry run: what would this job's split be? Nothing is trained."""

    model: ModelRef = "gpt-tiny"
    global_batch: int = Field(default=32, ge=1, le=1_000_000)
    strategy: StrategyName = "auto"
    devices: DeviceIds | None = Field(
        default=None, description="Device ids to use; all when absent."
    )


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


class DeviceFailure(_In):
    """A fault injected on a simulated device."""

    kind: Literal["crash", "lost"] = Field(
        default="crash",
        description="crash: its worker process dies and is restarted; lost: the device is gone "
        "until restored.",
    )


class DeviceSlowdown(_In):
    factor: float = Field(
        gt=0, le=1000, allow_inf_nan=False, description="Times its own time; 1 restores it."
    )


class ProfileCreate(_In):
    """Measure (or re-measure) the cluster's devices for a model."""

    model: ModelRef = "gpt-tiny"
    devices: DeviceIds | None = None
    refresh: bool = Field(default=False, description="Measure again even when cached.")


# --- documents (DESIGN.md) --------------------------------------------------


class DevicePlanPublic(BaseModel):
    id: str
    samples: int
    micro_batch: int
    accum_steps: int
    busy_s: float
    peak_bytes: int
    offset: int = 0
    layers: list[int] | None = None
    stage: int | None = None
    pipeline: int | None = None
    recompute: Recompute = "none"
    """Activation recomputation the plan chose for this device."""


class ExcludedPublic(BaseModel):
    id: str
    reason: str


class BaselinePublic(BaseModel):
    predicted_step_s: float
    predicted_samples_per_s: float


class PlanPublic(BaseModel):
    """The plan document of DESIGN.md."""

    strategy: str
    global_batch: int
    predicted_step_s: float
    predicted_samples_per_s: float
    compute_s: float
    comm_s: float
    devices: list[DevicePlanPublic]
    excluded: list[ExcludedPublic] = []
    baselines: dict[str, BaselinePublic] = {}
    notes: list[str] = []


class PlanPreview(BaseModel):
    """Answer of ``POST /plans``."""

    model: str
    profile_source: Literal["measured", "analytic"]
    """``measured`` on the live cluster; ``analytic`` (catalogue) when it is unavailable."""
    plan: PlanPublic


class ProfilePublic(BaseModel):
    id: int
    model: str
    cluster: str
    source: str
    created_at: datetime
    profile: dict[str, Any]
    """The profile document of DESIGN.md."""


class ProfilesPublic(BaseModel):
    data: list[ProfilePublic]
    count: int


# --- cluster ----------------------------------------------------------------


class MeasuredSpeed(BaseModel):
    model: str
    fixed_s: float
    per_sample_s: float
    samples_per_s: float
    """``1 / per_sample_s``: samples per second at a large micro-batch."""


class DevicePublic(BaseModel):
    id: str
    node: str
    type: str
    memory_gb: float
    """As sold (catalogue or spec override)."""
    capacity_bytes: int
    """What the device really offers: scaled memory for simulated devices."""
    peak_tflops: float
    status: Literal["idle", "busy", "unavailable", "lost"]
    """``lost``: its node is gone (or a simulated loss) until it comes back."""
    job_id: str | None = None
    measured: MeasuredSpeed | None = None
    """From the most recent profile of this device."""
    busy_ratio: float | None = None
    """busy_s / step_s of the running job's latest step."""
    memory_bytes: int | None = None
    """Peak bytes in the running job's latest step."""


class NodePublic(BaseModel):
    name: str
    devices: list[DevicePublic]


class ClusterPublic(BaseModel):
    name: str
    available: bool
    message: str = ""
    """Why the cluster is unavailable, when it is."""
    simulated: bool
    ray_address: str | None = None
    links: dict[str, float]
    nodes: list[NodePublic]
    num_devices: int


# --- jobs -------------------------------------------------------------------


class JobEventPublic(BaseModel):
    time: datetime
    kind: Literal["recovery", "replan", "restart"]
    step: int
    """The step it happened at (a recovery: the first step run again)."""
    data: dict[str, Any]
    """Its record: error, devices lost, old and new plan, predicted gain, seconds taken."""


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
    id: str
    name: str
    model_name: str
    state: JobState
    message: str = ""
    """Why a job failed or stopped; what a pending job waits for."""
    spec: JobCreate
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


class ScheduledJobPublic(BaseModel):
    """A job in the latest scheduling round."""

    id: str
    name: str
    status: Literal["running", "moving", "waiting", "pinned"]
    """``moving``: checkpointing to go to ``devices``; ``pinned``: it named its devices."""
    held: list[str]
    """Devices it runs on now."""
    devices: list[str]
    """Devices the round gave it (for a waiting job: those it waits for, if any)."""
    samples_per_s: float
    """The policy's planned rate on ``devices``."""
    reason: str
    """Why it got these devices, or why it waits."""
    priority: float
    waiting_s: float


class SchedulePublic(BaseModel):
    """``GET /schedule``: the policy in force and its latest round."""

    policy: str
    round_s: float
    decided_at: datetime | None
    """When the latest round ran (null before the first, or with the executor off)."""
    solver: str
    """What was exact and what heuristic in the latest decision."""
    rates: dict[str, str]
    """Model -> ``measured`` or ``analytic``: where the policy's rates came from."""
    allocation: dict[str, list[str]]
    """Job id -> devices it holds now."""
    devices: dict[str, str | None]
    """Device id -> job id holding it (null: free)."""
    queue: list[ScheduledJobPublic]
    """Waiting jobs, each with why it waits."""
    jobs: list[ScheduledJobPublic]
    """Every running and waiting job with the round's reason."""


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


class Message(BaseModel):
    message: str


class ErrorPublic(BaseModel):
    detail: str
    """One line naming the field or object and what is allowed."""


# --- service ----------------------------------------------------------------


class Options(BaseModel):
    """What a submit form may offer, and the job states a client may see."""

    models: list[str]
    strategies: list[str]
    datasets: list[str]
    devices: list[str]
    job_states: list[JobState] = list(JobState)
    terminal_states: list[JobState] = sorted(TERMINAL_STATES)


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    database: Literal["ok", "error"]
    cluster: Literal["available", "unavailable"]
    executor: Literal["running", "disabled"]
    version: str
