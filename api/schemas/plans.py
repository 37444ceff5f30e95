"""Plan requests and the plan document of DESIGN.md (``POST /plans``), field for field."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, model_validator

from api.schemas.fields import (
    DeviceIds,
    Name,
    PresetName,
    RequestModel,
    StrategyName,
)
from scheduler.hardware.precision import JobPrecision
from scheduler.models.activations import Recompute
from scheduler.models.presets import PRESETS
from scheduler.planning.plan import MAX_GLOBAL_BATCH, Precision
from workers.records import OptimizerConfig


class ModelDims(RequestModel):
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


class OptimizerSpec(RequestModel):
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
        default=1.0,
        gt=0,
        le=1e6,
        allow_inf_nan=False,
        description="Largest global gradient norm (over every device and stage); null: off. "
        "The default, 1.0, is GPT-2's and nanoGPT's: without it a rare batch whose gradient "
        "norm is a hundred times the usual kicked the README's demo from loss 3.2 to 8.",
    )

    def runtime(self) -> OptimizerConfig:
        """What a run trains with: a service job and ``hetsched simulate`` alike (the
        runtime's own default is no clipping; the job's is 1.0)."""
        return OptimizerConfig(**self.model_dump())


class PlanCreate(RequestModel):
    """A dry run: what would this job's split be? Nothing is trained."""

    model: ModelRef = "gpt-tiny"
    global_batch: int = Field(default=32, ge=1, le=MAX_GLOBAL_BATCH)
    strategy: StrategyName = "auto"
    devices: DeviceIds | None = Field(
        default=None, description="Device ids to use; all when absent."
    )
    precision: JobPrecision = Field(
        default="fp32",
        description="What the job would compute in, as a job's precision: each device's "
        "speed and activation memory are that precision's (model states are 16 bytes a "
        "parameter in every one). A device that cannot run it is a 422.",
    )


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
    precision: Precision = "fp32"
    """Compute precision (fp32 master weights and AdamW state in every case)."""
    shard: float | None = None
    """Fully sharded plans: the fraction of the model states this device owns."""
    shard_group: int | None = None
    """Fully sharded plans with replicated groups: this device's sharding group."""


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
