"""Profiles: what each device costs per micro-batch and per sample.

A profile (DESIGN.md, "Profile") is the planner's only input about hardware. It
comes either from measurement (``workers/`` profiler) or, to plan for clusters one
does not have, from the GPU catalogue and a model preset (:func:`analytic_profile`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from scheduler.cost.costs import (
    DeviceProfile,
    LayerCost,
    LayerProfile,
    Option,
    RecomputeCost,
    ShardingFigures,
    sharding_of,
    with_derived_recompute,
)
from scheduler.cost.precision import device_precision, layers_at, rates_at, with_precision
from scheduler.cost.roofline import PieceTime, Rates, block_time, embed_time, head_time
from scheduler.cost.table import DeviceTable
from scheduler.errors import ProfileError
from scheduler.hardware.capacity import usable_capacity_bytes
from scheduler.hardware.catalogue import DEFAULT_FLOPS_SHARE, lookup
from scheduler.hardware.cluster import Cluster, Device, Links, NodeLinks
from scheduler.hardware.precision import PRECISIONS, JobPrecision, Precision
from scheduler.models.activations import RECOMPUTE_MODES, Recompute, Stored
from scheduler.models.presets import MIXED_PRECISION_STATE_BYTES_PER_PARAM, PRESETS, ModelPreset

__all__ = [
    "DEFAULT_EFFICIENCY",
    "DeviceProfile",
    "LayerCost",
    "LayerProfile",
    "Option",
    "Profile",
    "RecomputeCost",
    "ShardingFigures",
    "analytic_layers",
    "analytic_profile",
    "load_profile",
    "profile_from_dict",
    "save_profile",
    "with_derived_recompute",
]

DEFAULT_EFFICIENCY = DEFAULT_FLOPS_SHARE
"""Share of peak FLOP/s ``--efficiency`` suggests; by default each GPU's own share applies."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Profile:
    """A cluster's devices profiled for one model, with the links between them and
    the gradient bytes a data-parallel step all-reduces: what every planner reads."""

    model: str
    devices: Sequence[DeviceProfile]
    """In order; a tuple, or a :class:`~scheduler.cost.table.DeviceTable` (analytic
    profiles) that stores them by kind."""
    links: Links = field(default_factory=Links)
    gradient_bytes: int = 0
    """Bytes all-reduced per data-parallel step."""
    source: str = "analytic"
    """``analytic`` (catalogue) or ``measured`` (profiler)."""
    sharding: ShardingFigures | None = None
    """The model's flat-buffer sizes for fully-sharded plans; derived from the preset
    when a document lacks them and its model is known (with gloo's collectives)."""

    def device(self, device_id: str) -> DeviceProfile:
        for d in self.devices:
            if d.id == device_id:
                return d
        raise ProfileError(f"profile: no device {device_id!r}")

    def subset(self, device_ids: list[str]) -> Profile:
        wanted = set(device_ids)
        return replace(self, devices=tuple(d for d in self.devices if d.id in wanted))

    def without_recompute(self) -> Profile:
        """This profile with no recomputation figures: plans then never recompute
        (for a runtime or a user that does not checkpoint activations)."""

        def plain(d: DeviceProfile) -> DeviceProfile:
            layers = d.layers
            if layers is not None:
                block = replace(layers.block, selective=None, full=None)
                layers = replace(layers, block=block)
            return replace(d, selective=None, full=None, layers=layers)

        return replace(self, devices=tuple(plain(d) for d in self.devices))

    def at_precision(self, requested: str) -> Profile:
        """Each device labelled with the precision it trains in when a job asks
        ``requested`` (``auto``: per device type); its figures stay as measured.
        Raises a one-line ``precision:`` error for a device that cannot."""
        return replace(self, devices=with_precision(self.devices, requested))

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "source": self.source,
            "devices": [d.to_dict() for d in self.devices],
            "links": self.links.to_dict(),
            "gradient_bytes": self.gradient_bytes,
            **({"sharding": self.sharding.to_dict()} if self.sharding is not None else {}),
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


def _node_links(raw: Any) -> tuple[tuple[str, NodeLinks], ...]:
    """``links.nodes``: each node whose links differ, by name, with either figure."""
    if not isinstance(raw, dict):
        raise ProfileError("profile: links.nodes must be an object of node name to links")
    out = []
    for name, own in raw.items():
        where = f"links.nodes.{name}"
        if not isinstance(own, dict):
            raise ProfileError(f"profile: {where} must be an object")
        figures = {
            k: float(_num(where, own, k, positive=True))
            for k in ("intra_node_gbps", "inter_node_gbps")
            if k in own
        }
        out.append((str(name), NodeLinks(**figures)))
    return tuple(out)


def _recompute(where: str, raw: Any) -> dict[str, RecomputeCost]:
    """The optional ``recompute`` object: figures per mode, such as
    ``{"full": {"per_sample_bytes": …, "per_sample_s": …}}`` (less memory per
    sample, more time); where a document lacks them they may be derived
    (:func:`scheduler.cost.costs.with_derived_recompute`)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ProfileError(f"profile: {where} must be an object")
    out = {}
    for mode, cost in raw.items():
        here = f"{where}.{mode}"
        if mode not in RECOMPUTE_MODES[1:]:
            raise ProfileError(
                f"profile: {here}: unknown recomputation mode; allowed: "
                f"{', '.join(RECOMPUTE_MODES[1:])}"
            )
        if not isinstance(cost, dict):
            raise ProfileError(f"profile: {here} must be an object")
        out[mode] = RecomputeCost(
            per_sample_bytes=int(_num(here, cost, "per_sample_bytes", integer=True)),
            per_sample_s=float(_num(here, cost, "per_sample_s", positive=True)),
            fixed_s=float(_num(here, cost, "fixed_s")) if "fixed_s" in cost else None,
            transient_bytes_per_sample=int(
                _num(here, cost, "transient_bytes_per_sample", integer=True)
            )
            if "transient_bytes_per_sample" in cost
            else 0,
        )
    return out


def _precision(where: str, raw: dict[str, Any]) -> Precision:
    value = raw.get("precision", "fp32")
    if value not in PRECISIONS:
        raise ProfileError(
            f"profile: {where}.precision must be one of {', '.join(PRECISIONS)}, got {value!r}"
        )
    return value  # type: ignore[no-any-return]


def _layer_cost(where: str, raw: Any) -> LayerCost:
    if not isinstance(raw, dict):
        raise ProfileError(f"profile: {where} must be an object")
    recompute = _recompute(f"{where}.recompute", raw.get("recompute"))
    return LayerCost(
        fixed_s=float(_num(where, raw, "fixed_s")),
        per_sample_s=float(_num(where, raw, "per_sample_s")),
        static_bytes=int(_num(where, raw, "static_bytes", integer=True)),
        per_sample_bytes=int(_num(where, raw, "per_sample_bytes", integer=True)),
        selective=recompute.get("selective"),
        full=recompute.get("full"),
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
        recompute = _recompute(f"{where}.recompute", raw.get("recompute"))
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
                selective=recompute.get("selective"),
                full=recompute.get("full"),
                precision=_precision(where, raw),
            )
        )
    preset = PRESETS.get(model)
    if preset is not None:
        devices = _with_derived_recompute_all(devices, preset)
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
        nodes=_node_links(raw_links.get("nodes") or {}),
    )
    gradient_bytes = (
        int(_num("profile", data, "gradient_bytes", integer=True))
        if "gradient_bytes" in data
        else 0
    )
    source = data.get("source", "measured")
    sharding = _sharding(data.get("sharding"))
    if sharding is None and preset is not None:
        # a document without them: the preset's sizes, collectives priced as gloo's
        # (padded, 1 ms each), the cautious side for a profile that does not say
        sharding = sharding_of(preset, padded_collectives=True)
    return Profile(
        model=model,
        devices=tuple(devices),
        links=links,
        gradient_bytes=gradient_bytes,
        source=str(source),
        sharding=sharding,
    )


def _with_derived_recompute_all(
    devices: list[DeviceProfile], preset: ModelPreset
) -> list[DeviceProfile]:
    """:func:`with_derived_recompute` for every device, derived once per distinct set of
    the figures it reads: they depend on those figures and the model, not on the
    device, and a large cluster has many devices of each type."""
    derived: dict[tuple[Any, ...], DeviceProfile] = {}
    out = []
    for d in devices:
        b = d.layers.block if d.layers is not None else None
        block_key = None if b is None else (b.per_sample_bytes, b.per_sample_s, b.selective, b.full)
        key = (d.per_sample_bytes, d.per_sample_s, d.selective, d.full, block_key)
        done = derived.get(key)
        if done is None:
            done = derived[key] = with_derived_recompute(d, preset)
        layers = d.layers
        if layers is not None and done.layers is not None:
            layers = replace(layers, block=done.layers.block)
        out.append(replace(d, layers=layers, selective=done.selective, full=done.full))
    return out


_SHARDING_INTS = (
    "num_blocks",
    "block_numel",
    "embed_numel",
    "head_numel",
    "tied_numel",
    "unsharded_bytes",
    "state_bytes_per_element",
    "gather_bytes_per_element",
    "grad_bytes_per_element",
)


def _sharding(raw: Any) -> ShardingFigures | None:
    """The optional ``sharding`` object (:class:`ShardingFigures`); every error names its field."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ProfileError("profile: sharding must be an object")
    known = {*_SHARDING_INTS, "tied_head", "padded_collectives", "collective_latency_s"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ProfileError(f"profile: sharding.{unknown[0]} is not a known field")
    ints = {k: int(_num("sharding", raw, k, integer=True)) for k in _SHARDING_INTS if k in raw}
    flags: dict[str, bool] = {}
    for key in ("tied_head", "padded_collectives"):
        if key in raw:
            if not isinstance(raw[key], bool):
                raise ProfileError(f"profile: sharding.{key} must be true or false")
            flags[key] = raw[key]
    latency = (
        {"collective_latency_s": float(_num("sharding", raw, "collective_latency_s"))}
        if "collective_latency_s" in raw
        else {}
    )
    for key in ("num_blocks", "block_numel", "embed_numel", "head_numel"):
        if key not in ints:
            raise ProfileError(f"profile: sharding.{key} is missing")
    try:
        return ShardingFigures(**ints, **flags, **latency)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ProfileError(f"profile: {exc}") from exc


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


def _cost(
    params: int,
    plain: PieceTime,
    per_sample_bytes: int,
    recompute: dict[str, tuple[PieceTime, Stored]] | None = None,
) -> LayerCost:
    costs = {
        mode: RecomputeCost(
            per_sample_bytes=kept.bytes,
            per_sample_s=time.per_sample_s,
            fixed_s=time.fixed_s,
            transient_bytes_per_sample=kept.transient_bytes,
        )
        for mode, (time, kept) in (recompute or {}).items()
    }
    return LayerCost(
        fixed_s=plain.fixed_s,
        per_sample_s=plain.per_sample_s,
        static_bytes=MIXED_PRECISION_STATE_BYTES_PER_PARAM * params,
        per_sample_bytes=per_sample_bytes,
        selective=costs.get("selective"),
        full=costs.get("full"),
    )


def analytic_layers(model: ModelPreset, rates: Rates) -> LayerProfile:
    """Per-layer costs of ``model`` on a device sustaining ``rates`` (the roofline model)."""
    modes: tuple[Recompute, ...] = ("selective", "full")
    return LayerProfile(
        num_blocks=model.num_layers,
        embed=_cost(
            model.embed_params, embed_time(model, rates), 2 * model.seq_len * model.d_model
        ),
        block=_cost(
            model.block_params,
            block_time(model, rates),
            model.activation_bytes_per_sample_per_layer,
            {m: (block_time(model, rates, m), model.block_stored(m)) for m in modes},
        ),
        head=_cost(
            model.head_params, head_time(model, rates), 4 * model.seq_len * model.vocab_size
        ),
        boundary_bytes_per_sample=model.boundary_bytes_per_sample,
    )


def _whole(layers: LayerProfile, option: Option) -> tuple[float, float, int]:
    """``(fixed_s, per_sample_s, per_sample_bytes)`` of the whole model with ``option``'s block."""
    ends = (layers.embed, layers.head)
    n = layers.num_blocks
    return (
        sum(c.fixed_s for c in ends) + n * option.fixed_s,
        sum(c.per_sample_s for c in ends) + n * option.per_sample_s,
        sum(c.per_sample_bytes for c in ends)
        + n * option.per_sample_bytes
        + option.transient_bytes_per_sample,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class _DeviceFigures:
    """What every device of one kind shares in an analytic profile."""

    layers: LayerProfile
    fixed_s: float
    per_sample_s: float
    per_sample_bytes: int
    selective: RecomputeCost | None
    full: RecomputeCost | None

    @classmethod
    def of(cls, layers: LayerProfile) -> _DeviceFigures:
        plain, *recompute = layers.block.options()
        fixed_s, per_sample_s, per_sample_bytes = _whole(layers, plain)
        costs = {}
        for option in recompute:
            fixed, per_sample, nbytes = _whole(layers, option)
            costs[option.recompute] = RecomputeCost(
                per_sample_bytes=nbytes, per_sample_s=per_sample, fixed_s=fixed
            )
        return cls(
            layers=layers,
            fixed_s=fixed_s,
            per_sample_s=per_sample_s,
            per_sample_bytes=per_sample_bytes,
            selective=costs.get("selective"),
            full=costs.get("full"),
        )


class _KindFigures:
    """Derives the :class:`DeviceProfile` of each kind of an analytic profile, sharing
    the figures of one type and precision, and the capacity of one memory size, between
    kinds (one spec may override a type's memory or peak)."""

    def __init__(
        self,
        *,
        model: ModelPreset,
        cluster: Cluster,
        efficiency: float | None,
        simulated: bool,
        precision: JobPrecision,
    ) -> None:
        self.model, self.cluster = model, cluster
        self.efficiency, self.simulated, self.precision = efficiency, simulated, precision
        self._figures: dict[tuple[str, float, str], _DeviceFigures] = {}
        self._capacities: dict[int, int] = {}
        # the precision depends on the type alone: resolved at the first device of each
        # type, so an error still names the first device (in order) that cannot run it
        self._precisions: dict[str, Precision] = {}

    def device(self, d: Device) -> DeviceProfile:
        chosen = self._precisions.get(d.type)
        if chosen is None:
            chosen = device_precision(d.type, self.precision, device=d.id)
            self._precisions[d.type] = chosen
        kind = (d.type, d.peak_tflops, chosen)
        if kind not in self._figures:
            rates = rates_at(
                lookup(d.type), chosen, tensor_tflops=d.peak_tflops, flops_share=self.efficiency
            )
            self._figures[kind] = _DeviceFigures.of(
                layers_at(analytic_layers(self.model, rates), chosen)
            )
        memory_bytes = d.memory_bytes
        if memory_bytes not in self._capacities:
            self._capacities[memory_bytes] = usable_capacity_bytes(
                memory_bytes,
                simulated=self.simulated,
                memory_scale=self.cluster.simulation.memory_scale,
            )
        f = self._figures[kind]
        return DeviceProfile(
            id=d.id,
            node=d.node,
            type=d.type,
            capacity_bytes=self._capacities[memory_bytes],
            static_bytes=self.model.model_state_bytes,
            per_sample_bytes=f.per_sample_bytes,
            fixed_s=f.fixed_s,
            per_sample_s=f.per_sample_s,
            layers=f.layers,
            selective=f.selective,
            full=f.full,
            precision=chosen,
        )


def analytic_profile(
    cluster: Cluster,
    model: ModelPreset,
    *,
    efficiency: float | None = None,
    simulated: bool = False,
    precision: JobPrecision | None = None,
) -> Profile:
    """A profile of ``cluster`` training ``model``, from the catalogue alone.

    Every piece of the model (embedding, block, head) is a roofline on the device's
    sustained FLOP/s and memory bandwidth (:mod:`scheduler.cost.roofline`), with its
    saved activations for the attention kernel the model runs
    (:mod:`scheduler.models.activations`).

    ``efficiency``: one share of peak FLOP/s for every device instead of each GPU's
    own sustained rate (:func:`scheduler.cost.roofline.sustained_gemm_tflops`).
    ``simulated``: capacities are those of the cluster's simulated devices
    (:func:`scheduler.hardware.capacity.usable_capacity_bytes`).
    ``precision``: what the job trains in (``auto``: per device type,
    :mod:`scheduler.hardware.precision`); each device's compute rate and activation
    bytes are that precision's (:mod:`scheduler.cost.precision`) and its plans run
    in it. None: fp32, what a job trains in unless it asks for another precision
    (fp32 peak and 4-byte activations; this used to price 16-bit figures and label
    them fp32, which promised a default job twice the speed and half the activations).
    """
    if efficiency is not None and not 0 < efficiency <= 1:
        raise ProfileError(f"efficiency: must be in (0, 1], got {efficiency}")
    # A device's figures depend only on its type (and a spec's peak override) and its
    # memory: derive them once per kind, keep them once per kind in a DeviceTable, and
    # give each device only its id and node (issue 20: at 16,384 devices the per-device
    # derivation, then the per-device DeviceProfile, was most of what `hetsched plan` took).
    derive = _KindFigures(
        model=model,
        cluster=cluster,
        efficiency=efficiency,
        simulated=simulated,
        precision=precision or "fp32",
    )
    devices = DeviceTable.grouped(
        cluster.devices,
        key=lambda d: (d.type, d.peak_tflops, d.memory_gb),
        figures=derive.device,
    )
    return Profile(
        model=model.name,
        devices=devices,
        links=cluster.links,
        gradient_bytes=model.gradient_bytes,
        source="analytic",
        # simulated devices run gloo, which pads unequal collectives to the largest shard
        sharding=sharding_of(model, padded_collectives=simulated),
    )
