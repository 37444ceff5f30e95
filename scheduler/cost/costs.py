"""What a device, or one piece of the model on it, costs: the figures a profile carries.

A piece (embedding, one transformer block, head) or a whole device has plain
figures (per micro-batch, per sample, memory) and, optionally, figures under
``selective`` and ``full`` activation recomputation (:mod:`scheduler.models.activations`):
less memory per sample, more time. :meth:`DeviceProfile.options` and
:meth:`LayerCost.options` list them for the planners, plain first.

Where a measured profile lacks recomputation figures and its model is a known
preset, :func:`with_derived_recompute` scales the measured plain figures by the
preset's analytic ratios (bytes and FLOPs under the mode over those without),
so the measurement stays the base and only the ratio is a model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from scheduler.hardware.precision import Precision
from scheduler.models.activations import Recompute
from scheduler.models.presets import ModelPreset


@dataclass(frozen=True, kw_only=True, slots=True)
class RecomputeCost:
    """Figures under one recomputation mode, replacing the plain ones."""

    per_sample_bytes: int
    """Activations kept per sample (a device: its peak, the recomputed block included)."""
    per_sample_s: float
    fixed_s: float | None = None
    """Per micro-batch, when recomputation changes it (a second weight read)."""
    transient_bytes_per_sample: int = 0
    """A block only: held while it is recomputed, once per stage rather than per block."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "per_sample_bytes": self.per_sample_bytes,
            "per_sample_s": self.per_sample_s,
        }
        if self.fixed_s is not None:
            out["fixed_s"] = self.fixed_s
        if self.transient_bytes_per_sample:
            out["transient_bytes_per_sample"] = self.transient_bytes_per_sample
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class Option:
    """One way to run a piece: its recomputation mode and what it costs."""

    recompute: Recompute
    fixed_s: float
    per_sample_s: float
    per_sample_bytes: int
    transient_bytes_per_sample: int = 0


def _options(
    fixed_s: float,
    per_sample_s: float,
    per_sample_bytes: int,
    selective: RecomputeCost | None,
    full: RecomputeCost | None,
) -> tuple[Option, ...]:
    out = [
        Option(
            recompute="none",
            fixed_s=fixed_s,
            per_sample_s=per_sample_s,
            per_sample_bytes=per_sample_bytes,
        )
    ]
    modes: tuple[tuple[Recompute, RecomputeCost | None], ...] = (
        ("selective", selective),
        ("full", full),
    )
    for mode, cost in modes:
        if cost is not None:
            out.append(
                Option(
                    recompute=mode,
                    fixed_s=fixed_s if cost.fixed_s is None else cost.fixed_s,
                    per_sample_s=cost.per_sample_s,
                    per_sample_bytes=cost.per_sample_bytes,
                    transient_bytes_per_sample=cost.transient_bytes_per_sample,
                )
            )
    return tuple(out)


def _recompute_dict(
    selective: RecomputeCost | None, full: RecomputeCost | None
) -> dict[str, Any] | None:
    out = {m: c.to_dict() for m, c in (("selective", selective), ("full", full)) if c is not None}
    return out or None


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerCost:
    """Cost of one piece of the model (embedding, one block, head) on a device."""

    fixed_s: float
    per_sample_s: float
    static_bytes: int
    """Parameters, gradients and optimizer state of this piece."""
    per_sample_bytes: int
    """Saved activations per sample."""
    selective: RecomputeCost | None = None
    full: RecomputeCost | None = None

    def options(self) -> tuple[Option, ...]:
        """The plain figures, then those of each recomputation mode it has."""
        return _options(
            self.fixed_s, self.per_sample_s, self.per_sample_bytes, self.selective, self.full
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "fixed_s": self.fixed_s,
            "per_sample_s": self.per_sample_s,
            "static_bytes": self.static_bytes,
            "per_sample_bytes": self.per_sample_bytes,
        }
        if (recompute := _recompute_dict(self.selective, self.full)) is not None:
            out["recompute"] = recompute
        return out


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
    """One device's figures for one model: its memory budget, what the model states
    and each sample take of it, and its time per micro-batch and per sample, with
    the same under each recomputation mode and per layer where measured."""

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
    analytic profiles. A recomputation mode's cap scales it by the plain
    per-sample bytes over the mode's."""
    selective: RecomputeCost | None = None
    """Figures with selective recomputation (module docstring), when known."""
    full: RecomputeCost | None = None
    """Figures with full recomputation, when known."""
    precision: Precision = "fp32"
    """The compute precision these figures are for, and the device's plans run in
    (:func:`scheduler.cost.precision.with_precision`)."""

    def max_micro_batch(self, per_sample_bytes: int | None = None) -> int:
        """Largest micro-batch that fits; 0 when the model states alone do not.

        ``per_sample_bytes``: that of a recomputation option instead of the plain one."""
        per_sample = self.per_sample_bytes if per_sample_bytes is None else per_sample_bytes
        free = self.capacity_bytes - self.static_bytes
        if free < per_sample:
            return 0
        by_memory = 2**31 if per_sample == 0 else free // per_sample
        if self.micro_batch_limit is None:
            return by_memory
        limit = self.micro_batch_limit
        if 0 < per_sample < self.per_sample_bytes:
            limit = limit * self.per_sample_bytes // per_sample
        return min(by_memory, limit)

    def options(self) -> tuple[Option, ...]:
        """The plain figures, then those of each recomputation mode it has."""
        return _options(
            self.fixed_s, self.per_sample_s, self.per_sample_bytes, self.selective, self.full
        )

    def per_sample_bytes_with(self, recompute: Recompute) -> int | None:
        """Activation bytes per sample under ``recompute``; ``None`` if it has no figures."""
        if recompute == "none":
            return self.per_sample_bytes
        cost = self.selective if recompute == "selective" else self.full
        return None if cost is None else cost.per_sample_bytes

    def fits_one_sample(self) -> bool:
        """Whether a micro-batch of one fits in some mode (the planners' hot path)."""
        least = self.per_sample_bytes
        for cost in (self.selective, self.full):
            if cost is not None and cost.per_sample_bytes < least:
                least = cost.per_sample_bytes
        return self.static_bytes + least <= self.capacity_bytes

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
        if (recompute := _recompute_dict(self.selective, self.full)) is not None:
            out["recompute"] = recompute
        if self.precision != "fp32":
            out["precision"] = self.precision
        return out


def _derived(
    model: ModelPreset,
    mode: Recompute,
    *,
    per_sample_bytes: int,
    per_sample_s: float,
    block_only: bool,
) -> RecomputeCost:
    """Figures under ``mode`` scaled from measured plain ones by the preset's analytic ratios."""
    if block_only:
        plain, under = model.block_stored("none"), model.block_stored(mode)
        bytes_ratio = under.bytes / plain.bytes
        transient_ratio = under.transient_bytes / plain.bytes
        time_ratio = 1 + under.extra_forward_flops / model.block_flops_per_sample
    else:
        bytes_ratio = (
            model.activation_bytes_per_sample_with(mode) / model.activation_bytes_per_sample
        )
        transient_ratio = 0.0
        time_ratio = model.flops_per_sample_with(mode) / model.flops_per_sample
    return RecomputeCost(
        per_sample_bytes=round(per_sample_bytes * bytes_ratio),
        per_sample_s=per_sample_s * time_ratio,
        transient_bytes_per_sample=round(per_sample_bytes * transient_ratio),
    )


def with_derived_recompute(device: DeviceProfile, model: ModelPreset) -> DeviceProfile:
    """``device`` with the recomputation figures it lacks, derived (module docstring)."""

    def fill(
        cost: DeviceProfile | LayerCost, mode: Recompute, given: RecomputeCost | None
    ) -> RecomputeCost | None:
        if given is not None or cost.per_sample_bytes == 0:
            return given
        return _derived(
            model,
            mode,
            per_sample_bytes=cost.per_sample_bytes,
            per_sample_s=cost.per_sample_s,
            block_only=isinstance(cost, LayerCost),
        )

    layers = device.layers
    if layers is not None:
        b = layers.block
        block = replace(
            b, selective=fill(b, "selective", b.selective), full=fill(b, "full", b.full)
        )
        layers = replace(layers, block=block)
    return replace(
        device,
        layers=layers,
        selective=fill(device, "selective", device.selective),
        full=fill(device, "full", device.full),
    )
