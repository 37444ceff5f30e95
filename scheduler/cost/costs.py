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

from dataclasses import asdict, dataclass, replace
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


GLOO_COLLECTIVE_LATENCY_S = 1e-3
"""One gloo collective on loopback with Python around it: 0.3–2 ms (as a pipeline message,
:data:`scheduler.planning.stages.P2P_LATENCY_S`)."""
NCCL_COLLECTIVE_LATENCY_S = 5e-5
"""One small NCCL all-gather or reduce-scatter inside a node: tens of µs (nccl-tests)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardingFigures:
    """What fully-sharded plans (``fsdp``) need about the model, the same on every device
    (profile JSON: ``sharding``).

    The runtime keeps one flat parameter buffer per *unit*: the embedding, each
    transformer block, and the final norm with the head, in that order. Each rank
    owns a slice of every unit's buffer and of its gradient and AdamW moments
    (:func:`scheduler.planning.plan.shard_bounds`); anything outside the buffers
    (``unsharded_bytes``: rotary tables and other buffers) every rank holds whole.
    Bytes per element are settings rather than constants so that another precision
    (bf16 gathers, fp32 master state) changes the figures, not the formulas.
    """

    num_blocks: int
    block_numel: int
    """Elements of one block's flat parameter buffer."""
    embed_numel: int
    head_numel: int
    """The final norm and, when untied, the output projection."""
    tied_head: bool = False
    """The head reuses the token embedding (GPT): the embedding's token table is
    gathered again for the head, so it counts in the head's gathers too."""
    tied_numel: int = 0
    """Elements of the tied token table (counted in ``embed_numel``)."""
    unsharded_bytes: int = 0
    """Held whole by every rank: buffers that are not parameters."""
    state_bytes_per_element: int = 16
    """Owned state per element: fp32 parameter, fp32 gradient, both AdamW moments."""
    gather_bytes_per_element: int = 4
    """Bytes an all-gather moves, and the gathered copy holds, per element (fp32)."""
    grad_bytes_per_element: int = 4
    """Bytes a reduce-scatter moves per element (fp32 gradients)."""
    padded_collectives: bool = False
    """Unequal all-gathers and reduce-scatters are padded to the largest shard (gloo):
    gathered buffers then hold ``ranks × largest shard`` elements."""
    collective_latency_s: float = GLOO_COLLECTIVE_LATENCY_S
    """Cost of one collective besides its bytes (three per unit and micro-batch)."""

    def __post_init__(self) -> None:
        for name in ("num_blocks", "block_numel"):
            if getattr(self, name) < 1:
                raise ValueError(f"sharding.{name}: must be >= 1, got {getattr(self, name)}")
        for name in ("embed_numel", "head_numel", "tied_numel", "unsharded_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"sharding.{name}: must be >= 0, got {getattr(self, name)}")
        for name in ("state_bytes_per_element", "gather_bytes_per_element"):
            if getattr(self, name) < 1:
                raise ValueError(f"sharding.{name}: must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.collective_latency_s < 1:
            raise ValueError(
                f"sharding.collective_latency_s: must be in [0, 1), got {self.collective_latency_s}"
            )
        if self.grad_bytes_per_element < 1:
            raise ValueError(
                f"sharding.grad_bytes_per_element: must be >= 1, got {self.grad_bytes_per_element}"
            )

    @property
    def numel(self) -> int:
        """Elements of every flat buffer together: what the group shards."""
        return self.embed_numel + self.num_blocks * self.block_numel + self.head_numel

    @property
    def shardable_state_bytes(self) -> int:
        """Model states the group divides among its ranks."""
        return self.state_bytes_per_element * self.numel

    @property
    def gathered_head_numel(self) -> int:
        """Elements the head's all-gathers move: its own and, tied, the embedding's whole
        unit (the runtime gathers units, and the token table shares one with the positions)."""
        return self.head_numel + (self.embed_numel if self.tied_head else 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # every field, in order: plain numbers and flags


def sharding_of(model: ModelPreset, *, padded_collectives: bool = False) -> ShardingFigures:
    """The sharding figures of ``model`` from its shape (fp32 states and collectives);
    ``padded_collectives``: gloo (the CPU simulation), else NCCL's latency."""
    tied = model.family == "gpt"
    # llama's rotary cosines and sines, (max_seq_len, head_dim) each, fp32
    rotary = 0 if tied else 2 * model.max_seq_len * model.head_dim * 4
    return ShardingFigures(
        num_blocks=model.num_layers,
        block_numel=model.block_params,
        embed_numel=model.embed_params,
        head_numel=model.head_params,
        tied_head=tied,
        tied_numel=model.vocab_size * model.d_model if tied else 0,
        unsharded_bytes=rotary,
        padded_collectives=padded_collectives,
        collective_latency_s=GLOO_COLLECTIVE_LATENCY_S
        if padded_collectives
        else NCCL_COLLECTIVE_LATENCY_S,
    )
