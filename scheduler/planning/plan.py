"""Plans: what each device does in one training step (DESIGN.md, "Plan").

A plan is the contract between the planner, the runtimes, the API and the
dashboard. Data-parallel plans leave ``layers`` empty; pipeline plans give
each device its ``[first, last)`` block range, its ``stage`` within its
``pipeline``, and every device of a pipeline processes all of that
pipeline's samples. ``recompute`` says which activation recomputation the
device runs its blocks with (:mod:`scheduler.models.activations`); documents
written before it existed mean ``none``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from json.encoder import encode_basestring_ascii
from typing import Any, Literal

from scheduler.cost.table import ColumnRows
from scheduler.errors import PlanError
from scheduler.models.activations import RECOMPUTE_MODES, Recompute

Strategy = Literal["auto", "dp", "even", "proportional", "pp", "hybrid", "fsdp"]
DP_STRATEGIES: tuple[str, ...] = ("dp", "even", "proportional")
PIPELINE_STRATEGIES: tuple[str, ...] = ("pp", "hybrid")
"""Strategies whose plans give devices layer ranges; the pipeline runtime runs them."""
SHARDED_STRATEGIES: tuple[str, ...] = ("fsdp",)
"""Strategies whose plans give devices a ``shard`` of the model states."""

Precision = Literal["fp32", "bf16", "fp16"]
PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")
"""Compute precisions: ``bf16`` and ``fp16`` keep fp32 master weights and AdamW
state and sum gradients in fp32; ``fp16`` also scales the loss dynamically."""


def shard_bounds(numel: int, fractions: tuple[float, ...] | list[float]) -> list[tuple[int, int]]:
    """Cut a flat space of ``numel`` elements into consecutive ``[start, end)``
    slices in proportion to ``fractions`` (one per rank, in rank order).

    The cut points are the rounded cumulative fractions, so every element has
    exactly one owner, the slices tile ``[0, numel)`` in order, and the planner,
    the runtime and a checkpoint converter that call this agree on every offset.
    A rank with fraction 0 owns an empty slice.
    """
    if numel < 0:
        raise PlanError(f"shard: numel must be >= 0, got {numel}")
    if not fractions or any(f < 0 for f in fractions):
        raise PlanError(f"shard: fractions must be >= 0, one per rank, got {list(fractions)}")
    total = float(sum(fractions))
    if total <= 0:
        raise PlanError("shard: fractions sum to 0; some rank must own the states")
    bounds: list[tuple[int, int]] = []
    start, cumulative = 0, 0.0
    for i, fraction in enumerate(fractions):
        cumulative += fraction
        end = numel if i == len(fractions) - 1 else min(numel, round(numel * cumulative / total))
        bounds.append((start, max(start, end)))
        start = max(start, end)
    return bounds


@dataclass(frozen=True, kw_only=True, slots=True)
class DevicePlan:
    """What one device does in a step: its samples, micro-batches and, in a
    pipeline, its blocks, with the predicted time and memory."""

    id: str
    samples: int
    """Samples of the global batch this device computes per step."""
    micro_batch: int
    """Largest micro-batch it runs (micro-batches are as equal as integers allow)."""
    accum_steps: int
    """Micro-batches per step."""
    busy_s: float
    """Predicted compute time per step."""
    peak_bytes: int
    """Predicted peak memory."""
    offset: int = 0
    """Index of its first sample within the step's global batch (data parallel)."""
    layers: tuple[int, int] | None = None
    """Pipeline: the ``[first, last)`` range of transformer blocks this stage holds.
    Stage 0 also holds the embedding and the last stage the final norm and head,
    so a boundary stage may hold no block at all (``first == last``)."""
    stage: int | None = None
    pipeline: int | None = None
    recompute: Recompute = "none"
    """Activation recomputation of its blocks: ``none``, ``selective`` (the attention
    core) or ``full`` (each block from its input), with ``torch.utils.checkpoint``."""
    shard: float | None = None
    """Fully sharded: the fraction of every block's flat parameter (and gradient and
    AdamW) space this device owns; the fractions of one sharding group sum to 1 and
    :func:`shard_bounds` turns them into offsets in the group's rank order."""
    shard_group: int | None = None
    """Fully sharded with replicated groups (HSDP): which sharding group it is in."""
    precision: Precision = "fp32"

    def __post_init__(self) -> None:
        if self.recompute not in RECOMPUTE_MODES:
            raise PlanError(
                f"plan: device {self.id}: recompute {self.recompute!r} is not one of "
                f"{', '.join(RECOMPUTE_MODES)}"
            )
        if self.precision not in PRECISIONS:
            raise PlanError(
                f"plan: device {self.id}: precision {self.precision!r} is not one of "
                f"{', '.join(PRECISIONS)}"
            )
        if self.shard is not None and not 0.0 <= self.shard <= 1.0:
            raise PlanError(f"plan: device {self.id}: shard {self.shard} is not in [0, 1]")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "samples": self.samples,
            "micro_batch": self.micro_batch,
            "accum_steps": self.accum_steps,
            "busy_s": self.busy_s,
            "peak_bytes": self.peak_bytes,
            "offset": self.offset,
            "layers": list(self.layers) if self.layers is not None else None,
            "recompute": self.recompute,
            "precision": self.precision,
        }
        if self.stage is not None:
            out["stage"] = self.stage
            out["pipeline"] = self.pipeline
        if self.shard is not None:
            out["shard"] = self.shard
            out["shard_group"] = self.shard_group
        return out

    def to_json(self) -> str:
        """``json.dumps(self.to_dict())``, character for character, written by one format
        string for a plain data-parallel entry (3 times faster at 16,384 devices than
        building and encoding a dict each, issue 20)."""
        if self.layers is not None or self.stage is not None or self.shard is not None:
            return json.dumps(self.to_dict())
        if not math.isfinite(self.busy_s):
            return json.dumps(self.to_dict())
        return _PLAIN_DEVICE_JSON % (
            encode_basestring_ascii(self.id),
            self.samples,
            self.micro_batch,
            self.accum_steps,
            self.busy_s,
            self.peak_bytes,
            self.offset,
            encode_basestring_ascii(self.recompute),
            encode_basestring_ascii(self.precision),
        )


_PLAIN_DEVICE_MIDDLE = (
    ', "samples": %d, "micro_batch": %d, "accum_steps": %d, "busy_s": %r, '
    '"peak_bytes": %d, "offset": '
)
_PLAIN_DEVICE_END = ', "layers": null, "recompute": %s, "precision": %s}'
_PLAIN_DEVICE_JSON = '{"id": %s' + _PLAIN_DEVICE_MIDDLE + "%d" + _PLAIN_DEVICE_END
""":meth:`DevicePlan.to_json` of an entry without layers, stage or shard: the keys of
:meth:`DevicePlan.to_dict` in its order, with ``json``'s default separators."""


class DevicePlanTable(ColumnRows[DevicePlan]):
    """Data-parallel plan entries as columns, one list per :class:`DevicePlan` field,
    in device order: what the ``dp``, ``even`` and ``proportional`` planners return.
    A :class:`DevicePlan` is built only for the devices someone reads, and
    :meth:`Plan.to_json` writes straight from the columns (issue 20: one object per
    device, then one dict per device, were most of a 16,384-device plan). To its
    readers it is a sequence of entries, equal to the tuple of the same entries."""

    __slots__ = (
        "accum_steps",
        "busy_s",
        "ids",
        "micro_batch",
        "offset",
        "peak_bytes",
        "precision",
        "recompute",
        "samples",
    )

    def __init__(
        self,
        *,
        ids: Sequence[str],
        samples: Sequence[int],
        micro_batch: Sequence[int],
        accum_steps: Sequence[int],
        busy_s: Sequence[float],
        peak_bytes: Sequence[int],
        offset: Sequence[int],
        recompute: Sequence[Recompute],
        precision: Sequence[Precision],
    ) -> None:
        columns = (samples, micro_batch, accum_steps, busy_s, peak_bytes, offset)
        if any(len(c) != len(ids) for c in (*columns, recompute, precision)):
            raise PlanError("plan: device columns of unequal length")
        for name, values, allowed in (
            ("recompute", recompute, RECOMPUTE_MODES),
            ("precision", precision, PRECISIONS),
        ):
            wrong = set(values) - set(allowed)
            if wrong:
                raise PlanError(
                    f"plan: {name} {sorted(wrong)[0]!r} is not one of {', '.join(allowed)}"
                )
        self.ids, self.samples, self.micro_batch = tuple(ids), tuple(samples), tuple(micro_batch)
        self.accum_steps, self.busy_s = tuple(accum_steps), tuple(busy_s)
        self.peak_bytes, self.offset = tuple(peak_bytes), tuple(offset)
        self.recompute, self.precision = tuple(recompute), tuple(precision)
        super().__init__()

    def _entry(self, i: int) -> DevicePlan:
        return DevicePlan(
            id=self.ids[i],
            samples=self.samples[i],
            micro_batch=self.micro_batch[i],
            accum_steps=self.accum_steps[i],
            busy_s=self.busy_s[i],
            peak_bytes=self.peak_bytes[i],
            offset=self.offset[i],
            recompute=self.recompute[i],
            precision=self.precision[i],
        )

    def json_entries(self) -> str:
        """The entries as the JSON array's contents, each as :meth:`DevicePlan.to_json`
        writes it, character for character. Entries differ mostly in their id and offset:
        the rest is written once per distinct set of values, then pasted per device."""
        if not all(math.isfinite(b) for b in self.busy_s):
            return ", ".join(d.to_json() for d in self.rows())
        distinct: dict[tuple[int, int, int, float, int, str, str], int] = {}
        codes = [
            distinct.setdefault(values, len(distinct))
            for values in zip(
                self.samples,
                self.micro_batch,
                self.accum_steps,
                self.busy_s,
                self.peak_bytes,
                self.recompute,
                self.precision,
                strict=True,
            )
        ]
        heads = [_PLAIN_DEVICE_MIDDLE % v[:5] for v in distinct]
        tails = [
            _PLAIN_DEVICE_END % (encode_basestring_ascii(v[5]), encode_basestring_ascii(v[6]))
            for v in distinct
        ]
        return ", ".join(
            [
                f'{{"id": {i}{heads[c]}{o}{tails[c]}'
                for i, c, o in zip(
                    map(encode_basestring_ascii, self.ids), codes, self.offset, strict=True
                )
            ]
        )

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return f"DevicePlanTable({len(self.ids)} devices)"

    def __reduce__(self) -> tuple[object, ...]:
        # pickled (to Ray workers, into the job store) as its columns
        return (_plan_table, tuple(getattr(self, name) for name in _PLAN_COLUMNS))


_PLAN_COLUMNS = (
    "ids",
    "samples",
    "micro_batch",
    "accum_steps",
    "busy_s",
    "peak_bytes",
    "offset",
    "recompute",
    "precision",
)
"""The columns of a :class:`DevicePlanTable`, in the order it pickles them."""


def _plan_table(*columns: Any) -> DevicePlanTable:
    return DevicePlanTable(**dict(zip(_PLAN_COLUMNS, columns, strict=True)))


@dataclass(frozen=True, kw_only=True, slots=True)
class Excluded:
    id: str
    reason: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Baseline:
    predicted_step_s: float
    predicted_samples_per_s: float


PRETTY_JSON_MAX_DEVICES = 64
"""Plans of at most this many devices print indented (:meth:`Plan.to_json`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """One step of training across the cluster: every device's part, the devices
    left out and why, the predicted step time and the baselines it beats."""

    strategy: str
    global_batch: int
    predicted_step_s: float
    compute_s: float
    comm_s: float
    devices: Sequence[DevicePlan]
    """In device order: a tuple, or a :class:`DevicePlanTable` (data-parallel plans)."""
    excluded: tuple[Excluded, ...] = ()
    baselines: dict[str, Baseline] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    """Why this plan: for ``auto``, which strategies were considered and why this one won."""

    @property
    def predicted_samples_per_s(self) -> float:
        return self.global_batch / self.predicted_step_s if self.predicted_step_s > 0 else 0.0

    @property
    def active(self) -> tuple[DevicePlan, ...]:
        """Devices that compute something this step."""
        return tuple(d for d in self.devices if d.samples > 0)

    def with_baselines(self, baselines: dict[str, Baseline]) -> Plan:
        return replace(self, baselines=baselines)

    def to_dict(self, *, with_devices: bool = True) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "global_batch": self.global_batch,
            "predicted_step_s": self.predicted_step_s,
            "predicted_samples_per_s": self.predicted_samples_per_s,
            "compute_s": self.compute_s,
            "comm_s": self.comm_s,
            "devices": [d.to_dict() for d in self.devices] if with_devices else [],
            "excluded": [asdict(e) for e in self.excluded],
            "baselines": {k: asdict(b) for k, b in self.baselines.items()},
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        """The plan document: indented while a person could read it (up to
        :data:`PRETTY_JSON_MAX_DEVICES` devices), compact beyond. Indenting switches
        ``json`` from its C encoder to the Python one, which took half a second at
        16,384 devices (issue 20); nobody reads such a plan by eye, and ``jq .``
        indents it when wanted."""
        pretty = len(self.devices) + len(self.excluded) <= PRETTY_JSON_MAX_DEVICES
        if pretty:
            return json.dumps(self.to_dict(), indent=2)
        # compact: the document without its devices, then their entries written in place
        # of the empty list (the first "devices" key: only numbers and the strategy
        # name come before it)
        frame = json.dumps(self.to_dict(with_devices=False))
        if isinstance(self.devices, DevicePlanTable):
            entries = self.devices.json_entries()
        else:
            entries = ", ".join([d.to_json() for d in self.devices])
        return frame.replace('"devices": []', f'"devices": [{entries}]', 1)


def plan_from_dict(data: Any) -> Plan:
    """Rebuild a plan from its JSON document (as stored by the API)."""
    try:
        devices = tuple(
            DevicePlan(
                id=d["id"],
                samples=int(d["samples"]),
                micro_batch=int(d["micro_batch"]),
                accum_steps=int(d["accum_steps"]),
                busy_s=float(d["busy_s"]),
                peak_bytes=int(d["peak_bytes"]),
                offset=int(d.get("offset", 0)),
                layers=(int(d["layers"][0]), int(d["layers"][1]))
                if d.get("layers") is not None
                else None,
                stage=d.get("stage"),
                pipeline=d.get("pipeline"),
                recompute=d.get("recompute", "none"),
                shard=float(d["shard"]) if d.get("shard") is not None else None,
                shard_group=d.get("shard_group"),
                precision=d.get("precision", "fp32"),
            )
            for d in data["devices"]
        )
        return Plan(
            strategy=str(data["strategy"]),
            global_batch=int(data["global_batch"]),
            predicted_step_s=float(data["predicted_step_s"]),
            compute_s=float(data["compute_s"]),
            comm_s=float(data["comm_s"]),
            devices=devices,
            excluded=tuple(
                Excluded(id=e["id"], reason=e["reason"]) for e in data.get("excluded", [])
            ),
            baselines={k: Baseline(**v) for k, v in data.get("baselines", {}).items()},
            notes=tuple(data.get("notes", [])),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanError(f"plan: malformed plan document ({exc})") from exc


MAX_GLOBAL_BATCH = 1_000_000
"""The largest global batch a plan is made for (samples per step): far above any
transformer run's, and planned in about a second; beyond it the search's integers grow
without bound (10^10 samples ran for minutes, 10^20 overflowed numpy)."""


def check_global_batch(global_batch: int) -> None:
    if (
        isinstance(global_batch, bool)
        or not isinstance(global_batch, int)
        or not 1 <= global_batch <= MAX_GLOBAL_BATCH
    ):
        raise PlanError(
            f"global_batch: must be an integer from 1 to {MAX_GLOBAL_BATCH:,}, got {global_batch!r}"
        )
