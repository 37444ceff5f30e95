"""Profiles: what each device costs per micro-batch and per sample.

A profile (DESIGN.md, "Profile") is the planner's only input about hardware.
It comes either from measurement (``workers/`` profiler) or, to plan for
clusters one does not have, from the GPU catalogue and a model preset
(:func:`analytic_profile`): per-sample time is the model's FLOPs over the
device's peak times an efficiency factor (MFU), and the fixed time per
micro-batch is the weights read three times (forward, two backward GEMMs)
at memory bandwidth plus a launch overhead per layer.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from scheduler.capacity import usable_capacity_bytes
from scheduler.cluster import Cluster, Links
from scheduler.errors import ProfileError
from scheduler.models import ModelPreset

DEFAULT_EFFICIENCY = 0.4
"""Model FLOP utilisation assumed by analytic profiles; 30–50 % is typical."""
LAUNCH_OVERHEAD_PER_LAYER_S = 50e-6


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerCost:
    """Cost of one piece of the model (embedding, one block, head) on a device."""

    fixed_s: float
    per_sample_s: float
    static_bytes: int
    """Parameters, gradients and optimizer state of this piece."""
    per_sample_bytes: int
    """Saved activations per sample."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "fixed_s": self.fixed_s,
            "per_sample_s": self.per_sample_s,
            "static_bytes": self.static_bytes,
            "per_sample_bytes": self.per_sample_bytes,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerProfile:
    """Per-layer figures for pipeline planning (profile JSON: device ``layers``)."""

    num_blocks: int
    embed: LayerCost
    block: LayerCost
    head: LayerCost
    boundary_bytes_per_sample: int
    """Activation bytes sent between consecutive stages, per sample."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_blocks": self.num_blocks,
            "embed": self.embed.to_dict(),
            "block": self.block.to_dict(),
            "head": self.head.to_dict(),
            "boundary_bytes_per_sample": self.boundary_bytes_per_sample,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceProfile:
    id: str
    node: str
    type: str
    capacity_bytes: int
    """Usable memory budget (headroom already taken off)."""
    static_bytes: int
    """Model states: weights, gradients, optimizer state."""
    per_sample_bytes: int
    """Saved activations per sample of a micro-batch."""
    fixed_s: float
    """Time per micro-batch independent of its size."""
    per_sample_s: float
    """Forward + backward time per sample."""
    layers: LayerProfile | None = None
    micro_batch_limit: int | None = None
    """The largest micro-batch the profiler ran and saw fit (a hard cap on top of
    the memory model, which a real allocator may not follow exactly); None for
    analytic profiles."""

    def max_micro_batch(self) -> int:
        """Largest micro-batch that fits; 0 when the model states alone do not."""
        free = self.capacity_bytes - self.static_bytes
        if free < self.per_sample_bytes:
            return 0
        by_memory = 2**31 if self.per_sample_bytes == 0 else free // self.per_sample_bytes
        if self.micro_batch_limit is not None:
            return min(by_memory, self.micro_batch_limit)
        return by_memory

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "node": self.node,
            "type": self.type,
            "capacity_bytes": self.capacity_bytes,
            "static_bytes": self.static_bytes,
            "per_sample_bytes": self.per_sample_bytes,
            "fixed_s": self.fixed_s,
            "per_sample_s": self.per_sample_s,
        }
        if self.micro_batch_limit is not None:
            out["micro_batch_limit"] = self.micro_batch_limit
        if self.layers is not None:
            out["layers"] = self.layers.to_dict()
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class Profile:
    model: str
    devices: tuple[DeviceProfile, ...]
    links: Links = field(default_factory=Links)
    gradient_bytes: int = 0
    """Bytes all-reduced per data-parallel step."""
    source: str = "analytic"
    """``analytic`` (catalogue) or ``measured`` (profiler)."""

    def device(self, device_id: str) -> DeviceProfile:
        for d in self.devices:
            if d.id == device_id:
                return d
        raise ProfileError(f"profile: no device {device_id!r}")

    def subset(self, device_ids: list[str]) -> Profile:
        wanted = set(device_ids)
        return replace(self, devices=tuple(d for d in self.devices if d.id in wanted))

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "source": self.source,
            "devices": [d.to_dict() for d in self.devices],
            "links": self.links.to_dict(),
            "gradient_bytes": self.gradient_bytes,
        }


def _num(
    where: str, raw: dict[str, Any], key: str, *, integer: bool = False, positive: bool = False
) -> Any:
    if key not in raw:
        raise ProfileError(f"profile: {where}.{key} is missing")
    value = raw[key]
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok or not math.isfinite(value) or value < 0:
        kind = "a non-negative integer" if integer else "a non-negative number"
        raise ProfileError(f"profile: {where}.{key} must be {kind}, got {value!r}")
    if positive and value <= 0:
        raise ProfileError(f"profile: {where}.{key} must be > 0, got {value!r}")
    return value


def _layer_cost(where: str, raw: Any) -> LayerCost:
    if not isinstance(raw, dict):
        raise ProfileError(f"profile: {where} must be an object")
    return LayerCost(
        fixed_s=float(_num(where, raw, "fixed_s")),
        per_sample_s=float(_num(where, raw, "per_sample_s")),
        static_bytes=int(_num(where, raw, "static_bytes", integer=True)),
        per_sample_bytes=int(_num(where, raw, "per_sample_bytes", integer=True)),
    )


def _layer_profile(where: str, raw: Any) -> LayerProfile:
    if not isinstance(raw, dict):
        raise ProfileError(f"profile: {where} must be an object")
    num_blocks = int(_num(where, raw, "num_blocks", integer=True, positive=True))
    return LayerProfile(
        num_blocks=num_blocks,
        embed=_layer_cost(f"{where}.embed", raw.get("embed")),
        block=_layer_cost(f"{where}.block", raw.get("block")),
        head=_layer_cost(f"{where}.head", raw.get("head")),
        boundary_bytes_per_sample=int(_num(where, raw, "boundary_bytes_per_sample", integer=True)),
    )


def profile_from_dict(data: Any) -> Profile:
    """Validate a parsed profile document; every error names the field."""
    if not isinstance(data, dict):
        raise ProfileError("profile: must be a JSON object")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise ProfileError("profile: model must be a non-empty string")
    raw_devices = data.get("devices")
    if not isinstance(raw_devices, list) or not raw_devices:
        raise ProfileError("profile: devices must be a non-empty list")
    devices = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_devices):
        where = f"devices[{i}]"
        if not isinstance(raw, dict):
            raise ProfileError(f"profile: {where} must be an object")
        device_id = raw.get("id")
        if not isinstance(device_id, str) or not device_id:
            raise ProfileError(f"profile: {where}.id must be a non-empty string")
        if device_id in seen:
            raise ProfileError(f"profile: {where}.id {device_id!r} appears twice")
        seen.add(device_id)
        devices.append(
            DeviceProfile(
                id=device_id,
                node=str(raw.get("node", device_id.split("/")[0])),
                type=str(raw.get("type", "unknown")),
                capacity_bytes=int(_num(where, raw, "capacity_bytes", integer=True)),
                static_bytes=int(_num(where, raw, "static_bytes", integer=True)),
                per_sample_bytes=int(_num(where, raw, "per_sample_bytes", integer=True)),
                fixed_s=float(_num(where, raw, "fixed_s")),
                per_sample_s=float(_num(where, raw, "per_sample_s", positive=True)),
                layers=_layer_profile(f"{where}.layers", raw["layers"])
                if raw.get("layers")
                else None,
                micro_batch_limit=int(_num(where, raw, "micro_batch_limit", integer=True))
                if raw.get("micro_batch_limit") is not None
                else None,
            )
        )
    raw_links = data.get("links") or {}
    if not isinstance(raw_links, dict):
        raise ProfileError("profile: links must be an object")
    defaults = Links()
    links = Links(
        intra_node_gbps=float(_num("links", raw_links, "intra_node_gbps", positive=True))
        if "intra_node_gbps" in raw_links
        else defaults.intra_node_gbps,
        inter_node_gbps=float(_num("links", raw_links, "inter_node_gbps", positive=True))
        if "inter_node_gbps" in raw_links
        else defaults.inter_node_gbps,
    )
    gradient_bytes = (
        int(_num("profile", data, "gradient_bytes", integer=True))
        if "gradient_bytes" in data
        else 0
    )
    source = data.get("source", "measured")
    return Profile(
        model=model,
        devices=tuple(devices),
        links=links,
        gradient_bytes=gradient_bytes,
        source=str(source),
    )


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ProfileError(f"profile: cannot read {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise ProfileError(f"profile: {path} is not valid JSON (line {exc.lineno})") from exc
    return profile_from_dict(data)


def save_profile(profile: Profile, path: str | Path) -> None:
    Path(path).write_text(json.dumps(profile.to_dict(), indent=2) + "\n")


def analytic_layers(
    model: ModelPreset, *, peak_flops: float, bandwidth_bytes_s: float, bytes_per_param: int = 16
) -> LayerProfile:
    """Per-layer costs of ``model`` on a device of the given effective speed."""

    def cost(params: int, flops: float, act_bytes: int) -> LayerCost:
        return LayerCost(
            fixed_s=LAUNCH_OVERHEAD_PER_LAYER_S + 3 * 2 * params / bandwidth_bytes_s,
            per_sample_s=flops / peak_flops,
            static_bytes=bytes_per_param * params,
            per_sample_bytes=act_bytes,
        )

    embed_flops = 0.0  # a gather, negligible next to the blocks
    return LayerProfile(
        num_blocks=model.num_layers,
        embed=cost(model.embed_params, embed_flops, 2 * model.seq_len * model.d_model),
        block=cost(
            model.block_params,
            model.block_flops_per_sample,
            model.activation_bytes_per_sample_per_layer,
        ),
        head=cost(
            model.head_params, model.head_flops_per_sample, 4 * model.seq_len * model.vocab_size
        ),
        boundary_bytes_per_sample=model.boundary_bytes_per_sample,
    )


def analytic_profile(
    cluster: Cluster,
    model: ModelPreset,
    *,
    efficiency: float = DEFAULT_EFFICIENCY,
    simulated: bool = False,
) -> Profile:
    """A profile of ``cluster`` training ``model``, from the catalogue alone.

    ``simulated``: capacities are those of the cluster's simulated devices
    (:func:`scheduler.capacity.usable_capacity_bytes`).
    """
    if not 0 < efficiency <= 1:
        raise ProfileError(f"efficiency: must be in (0, 1], got {efficiency}")
    from scheduler.catalogue import lookup

    devices = []
    for d in cluster.devices:
        bandwidth_bytes_s = lookup(d.type).bandwidth_gbps * 1e9
        peak_flops = d.peak_tflops * 1e12 * efficiency
        layers = analytic_layers(model, peak_flops=peak_flops, bandwidth_bytes_s=bandwidth_bytes_s)
        devices.append(
            DeviceProfile(
                id=d.id,
                node=d.node,
                type=d.type,
                capacity_bytes=usable_capacity_bytes(
                    d.memory_bytes,
                    simulated=simulated,
                    memory_scale=cluster.simulation.memory_scale,
                ),
                static_bytes=model.model_state_bytes,
                per_sample_bytes=model.activation_bytes_per_sample,
                fixed_s=LAUNCH_OVERHEAD_PER_LAYER_S * model.num_layers
                + 3 * 2 * model.num_params / bandwidth_bytes_s,
                per_sample_s=model.flops_per_sample / peak_flops,
                layers=layers,
            )
        )
    return Profile(
        model=model.name,
        devices=tuple(devices),
        links=cluster.links,
        gradient_bytes=model.gradient_bytes,
        source="analytic",
    )
