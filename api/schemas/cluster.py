"""The cluster as the API shows it, and the simulated faults a request may inject into it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from api.schemas.fields import (
    RequestModel,
)


class DeviceFailure(RequestModel):
    """A fault injected on a simulated device."""

    kind: Literal["crash", "lost"] = Field(
        default="crash",
        description="crash: its worker process dies and is restarted; lost: the device is gone "
        "until restored.",
    )


class DeviceSlowdown(RequestModel):
    factor: float = Field(
        gt=0, le=1000, allow_inf_nan=False, description="Times its own time; 1 restores it."
    )


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
    links: dict[str, float] = {}
    """The node's own links where the spec gives them (``intra_node_gbps``,
    ``inter_node_gbps``); the cluster's ``links`` hold for the rest."""


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
