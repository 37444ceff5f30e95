"""A job's planned samples/s on a candidate allocation, by device class and cached.

The scheduling policies ask, thousands of times per decision, "how fast would
this job train on these devices?". The answer is the data-parallel planner's
prediction (DESIGN.md "The cost model"), evaluated per device class
(:func:`class_step_s`) and cached by ``(model, global batch, config)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from scheduler.cost.costmodel import ring_allreduce_s
from scheduler.cost.profile import DeviceProfile, Profile, analytic_profile
from scheduler.hardware.cluster import Cluster, Device, Links, Simulation
from scheduler.models.presets import ModelPreset, get_preset


@dataclass(frozen=True, kw_only=True, slots=True, order=True)
class DeviceClass:
    """Devices a job cannot tell apart: same type, memory and speed."""

    type: str
    memory_gb: float
    peak_tflops: float

    @classmethod
    def of(cls, device: Device) -> DeviceClass:
        return cls(type=device.type, memory_gb=device.memory_gb, peak_tflops=device.peak_tflops)

    @property
    def label(self) -> str:
        return self.type


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    """A candidate allocation up to renaming devices: counts per class, one node or more."""

    parts: tuple[tuple[DeviceClass, int], ...]
    """``(class, count)`` with count >= 1, sorted by class."""
    multi_node: bool

    @classmethod
    def make(cls, counts: dict[DeviceClass, int], *, multi_node: bool) -> Config:
        parts = tuple(sorted((c, n) for c, n in counts.items() if n > 0))
        return cls(parts=parts, multi_node=multi_node)

    @property
    def num_devices(self) -> int:
        return sum(n for _, n in self.parts)

    def count(self, device_class: DeviceClass) -> int:
        for c, n in self.parts:
            if c == device_class:
                return n
        return 0

    def describe(self) -> str:
        """``4× A100-40GB + 2× T4-16GB``."""
        return " + ".join(f"{n}× {c.label}" for c, n in self.parts) or "no devices"


class RateFn(Protocol):
    """Planned samples/s of ``job`` on ``config`` (0 when it cannot run there)."""

    def __call__(self, *, model: str, global_batch: int, config: Config) -> float: ...


def job_rate(rate_fn: RateFn, *, model: str, global_batch: int) -> Callable[[Config], float]:
    """``rate_fn`` with the job's model and batch bound: config -> samples/s."""

    def rate(config: Config) -> float:
        return rate_fn(model=model, global_batch=global_batch, config=config)

    return rate


@dataclass(frozen=True, kw_only=True, slots=True)
class _Mode:
    """One way a device runs (no, selective or full activation recomputation)."""

    fixed_s: float
    per_sample_s: float
    max_micro: int
    """Largest micro-batch that fits in this mode (>= 1)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class _ClassCost:
    modes: tuple[_Mode, ...]
    """The modes in which one sample fits; empty when the model does not fit at all."""


def _mode_cap(t: float, mode: _Mode, global_batch: int) -> int:
    f, p, m = mode.fixed_s, mode.per_sample_s, min(mode.max_micro, global_batch)
    full = math.floor(t / (f + m * p))
    more = math.floor((t - (full + 1) * f) / p)
    more = min(max(more, 0), (full + 1) * m)
    return int(min(max(full * m, more), global_batch))


def _caps(t: float, cost: _ClassCost, global_batch: int) -> int:
    """Most samples one device of this class finishes within ``t`` seconds, in its best
    mode (the planner's ``cap``)."""
    return max((_mode_cap(t, mode, global_batch) for mode in cost.modes), default=0)


def _busy_s(cost: _ClassCost, samples: int) -> float:
    return min(
        math.ceil(samples / m.max_micro) * m.fixed_s + samples * m.per_sample_s for m in cost.modes
    )


def class_step_s(
    costs: Sequence[tuple[_ClassCost, int]],
    global_batch: int,
    gradient_bytes: int,
    link_gbps: float,
) -> float:
    """Predicted step time of the dp planner's optimal split over classes; inf if none fits.

    Evaluating per class rather than per device: identical devices have identical
    capacities ``cap_t(T)`` (most samples finished within ``T`` seconds), so the
    planner's optimality condition ``Σ_i cap_i(T) ≥ B`` becomes
    ``Σ_t n_t·cap_t(T) ≥ B`` and its bisection runs over a handful of classes
    instead of thousands of devices (each class in its best activation-recomputation
    mode, ``cap_t = max_r cap_tr``, as the planner does per device). The optimum
    ``T*`` is the same number, so the
    rate equals :func:`scheduler.planning.dp.plan_dp`'s ``predicted_samples_per_s`` on
    the expanded device set (``tests/scheduler/test_policy.py`` checks it), except
    that the planner may additionally drop to the fastest node alone on a
    multi-node set, which here is a separate single-node candidate instead.
    """
    usable = [(c, n) for c, n in costs if c.modes and n >= 1]
    if not usable:
        return math.inf
    lo = 0.0
    hi = min(_busy_s(c, global_batch) for c, _ in usable)
    # To a relative 1e-12: the planner's exact T* lies in (lo, hi], so hi is T* to that precision.
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid <= lo or mid >= hi or hi - lo <= 1e-12 * hi:
            break
        if sum(n * _caps(mid, c, global_batch) for c, n in usable) >= global_batch:
            hi = mid
        else:
            lo = mid
    # Devices that take part: every device whose class finishes a sample within T*.
    active = sum(n for c, n in usable if _caps(hi, c, global_batch) > 0)
    return hi + ring_allreduce_s(min(active, global_batch), gradient_bytes, link_gbps)


@dataclass(kw_only=True, slots=True)
class PlannedRates:
    """The default :class:`RateFn`: the dp planner on analytic (or measured) profiles.

    Keep one per cluster for the service's lifetime: its cache is what makes
    later decisions cheap. ``measured`` maps a model name to a measured profile;
    its devices' median figures per type stand in for the catalogue's.
    """

    links: Links = field(default_factory=Links)
    simulation: Simulation = field(default_factory=Simulation)
    efficiency: float | None = None
    """One share of peak FLOP/s for every GPU; ``None``: each GPU's own (the catalogue's)."""
    measured: dict[str, Profile] = field(default_factory=dict)
    models: dict[str, ModelPreset] = field(default_factory=dict)
    """Models that are not presets (given by dimensions or a config file), by the name
    jobs use for them; presets need no entry."""
    _costs: dict[tuple[str, DeviceClass], _ClassCost] = field(default_factory=dict)
    _rates: dict[tuple[str, int, Config], float] = field(default_factory=dict)

    @classmethod
    def for_cluster(cls, cluster: Cluster, **kwargs: object) -> PlannedRates:
        return cls(links=cluster.links, simulation=cluster.simulation, **kwargs)  # type: ignore[arg-type]

    def __call__(self, *, model: str, global_batch: int, config: Config) -> float:
        key = (model, global_batch, config)
        rate = self._rates.get(key)
        if rate is None:
            rate = self._compute(model, global_batch, config)
            self._rates[key] = rate
        return rate

    def set_measured(self, model: str, profile: Profile) -> None:
        """Use ``profile``'s figures for ``model`` from now on (its cached rates are dropped)."""
        self.measured[model] = profile
        self._costs = {k: v for k, v in self._costs.items() if k[0] != model}
        self._rates = {k: v for k, v in self._rates.items() if k[0] != model}

    def _preset(self, model: str) -> ModelPreset:
        known = self.models.get(model)
        return known if known is not None else get_preset(model)

    def _compute(self, model: str, global_batch: int, config: Config) -> float:
        costs = [(self._cost(model, c), n) for c, n in config.parts]
        # A configuration is counts per class, not nodes: the slowest links of the cluster.
        link = self.links.slowest_card if config.multi_node else self.links.slowest_within
        step_s = class_step_s(costs, global_batch, self._preset(model).gradient_bytes, link)
        return global_batch / step_s if step_s > 0 and math.isfinite(step_s) else 0.0

    def _cost(self, model: str, device_class: DeviceClass) -> _ClassCost:
        key = (model, device_class)
        cost = self._costs.get(key)
        if cost is None:
            cost = _class_cost(self._profile_of(model, device_class))
            self._costs[key] = cost
        return cost

    def _profile_of(self, model: str, device_class: DeviceClass) -> DeviceProfile:
        measured = self.measured.get(model)
        if measured is not None:
            same = sorted(
                (d for d in measured.devices if d.type == device_class.type),
                key=lambda d: d.per_sample_s,
            )
            if same:
                return same[len(same) // 2]
        device = Device(
            id="class/0",
            node="class",
            index=0,
            type=device_class.type,
            memory_gb=device_class.memory_gb,
            peak_tflops=device_class.peak_tflops,
        )
        one = Cluster(name="class", devices=(device,), links=self.links, simulation=self.simulation)
        return analytic_profile(one, self._preset(model), efficiency=self.efficiency).devices[0]


def _class_cost(device: DeviceProfile) -> _ClassCost:
    modes = []
    for option in device.options():
        max_micro = device.max_micro_batch(option.per_sample_bytes)
        if max_micro >= 1:
            modes.append(
                _Mode(fixed_s=option.fixed_s, per_sample_s=option.per_sample_s, max_micro=max_micro)
            )
    return _ClassCost(modes=tuple(modes))
