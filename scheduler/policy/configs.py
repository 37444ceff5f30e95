"""Candidate allocations per job, and the equal share its rate is normalised by.

A job's rate depends only on its :class:`~scheduler.policy.rates.Config`, so the
policies choose among a few configurations per job (a heuristic set,
:func:`candidates`) instead of among device subsets; the choice over that set is
exact (:mod:`scheduler.policy.solve`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from scheduler.hardware.cluster import Cluster
from scheduler.policy.rates import Config, DeviceClass

LADDER_BASE = (1, 2, 3, 4, 6, 8, 12)
SINGLE_CLASS_FAMILIES = 3
"""Single-class candidates for this many of the job's fastest classes (plus the largest class)."""

Rate = Callable[[Config], float]


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterClasses:
    """The cluster by device class: ids per class and the largest count on one node."""

    ids: dict[DeviceClass, tuple[str, ...]]
    node_max: dict[DeviceClass, int]
    num_devices: int
    class_of: dict[str, DeviceClass]
    node_of: dict[str, str]

    @classmethod
    def of(cls, cluster: Cluster) -> ClusterClasses:
        ids: dict[DeviceClass, list[str]] = {}
        per_node: dict[tuple[DeviceClass, str], int] = {}
        for d in cluster.devices:
            c = DeviceClass.of(d)
            ids.setdefault(c, []).append(d.id)
            per_node[c, d.node] = per_node.get((c, d.node), 0) + 1
        node_max: dict[DeviceClass, int] = {}
        for (c, _), n in per_node.items():
            node_max[c] = max(node_max.get(c, 0), n)
        return cls(
            ids={c: tuple(v) for c, v in sorted(ids.items())},
            node_max=node_max,
            num_devices=len(cluster.devices),
            class_of={d.id: DeviceClass.of(d) for d in cluster.devices},
            node_of={d.id: d.node for d in cluster.devices},
        )

    def capacity(self, device_class: DeviceClass) -> int:
        return len(self.ids.get(device_class, ()))

    def config(self, counts: dict[DeviceClass, int]) -> Config:
        """A configuration, on one node when one class fits on one node."""
        used = [c for c, n in counts.items() if n > 0]
        single = len(used) == 1 and counts[used[0]] <= self.node_max.get(used[0], 0)
        return Config.make(counts, multi_node=not single and sum(counts.values()) > 1)

    def config_of(self, ids: Iterable[str]) -> Config:
        """The configuration of a concrete device set (one node or more, as placed)."""
        counts: dict[DeviceClass, int] = {}
        nodes = set()
        for i in ids:
            counts[self.class_of[i]] = counts.get(self.class_of[i], 0) + 1
            nodes.add(self.node_of[i])
        return Config.make(counts, multi_node=len(nodes) > 1)


def ladder(lo: int, hi: int) -> list[int]:
    """Sizes from ``lo`` to ``hi``: 1, 2, 3, 4, 6, 8, 12, then x1.5/x1.33 steps, ends included.

    >>> ladder(1, 20)
    [1, 2, 3, 4, 6, 8, 12, 16, 20]
    """
    sizes = set(LADDER_BASE)
    n = 16
    while n <= hi:
        sizes.update((n, n * 3 // 2))
        n *= 2
    return sorted({s for s in sizes if lo <= s <= hi} | {lo, hi})


def single_rates(
    classes: ClusterClasses, allowed: Iterable[DeviceClass], rate: Rate
) -> dict[DeviceClass, float]:
    """Each allowed class's one-device rate, fastest first; classes the model does not fit drop."""
    rates = {c: rate(Config.make({c: 1}, multi_node=False)) for c in allowed}
    return {c: r for c, r in sorted(rates.items(), key=lambda kv: -kv[1]) if r > 0}


def equal_share_rate(
    classes: ClusterClasses, singles: dict[DeviceClass, float], share_devices: float
) -> float:
    """Rate on ``share_devices`` spread over the cluster's mix, counted as single-device rates.

    The equal share of Gavel's fairness policy: a job's rate on ``1/n`` of every
    class. Linear in the share (no all-reduce), so it is defined below one device too.
    """
    total = classes.num_devices
    return sum(share_devices * classes.capacity(c) / total * r for c, r in singles.items())


def _fill(order: list[DeviceClass], caps: dict[DeviceClass, int], n: int) -> dict[DeviceClass, int]:
    counts: dict[DeviceClass, int] = {}
    for c in order:
        take = min(caps[c], n)
        if take:
            counts[c] = take
            n -= take
    return counts if n == 0 else {}


def candidates(
    *,
    classes: ClusterClasses,
    singles: dict[DeviceClass, float],
    lo: int,
    hi: int,
    rate: Rate,
    min_gain: float,
    extra: Iterable[Config] = (),
) -> list[Config]:
    """The configurations offered to one job, with ``extra`` always in:

    - sizes on a roughly geometric ladder (1, 2, 3, 4, 6, 8, 12, 16, …) between
      the job's ``min_devices`` and the smallest of its ``max_devices``, its global
      batch (a device without a sample adds nothing), the devices it may use and
      ``size_cap_share`` equal shares of the cluster;
    - for each size: all devices of one class (the fastest few classes for this
      model and the most plentiful one), the fastest classes first (mixed types,
      spilling to the next class when one runs out), the same without the fastest
      class (left to jobs that fit nowhere else), and half-and-half of the two
      fastest classes;
    - the job's current configuration, so keeping what it holds is always an option.

    Along each family a larger size is offered only if it adds ``min_gain`` of
    rate; a job whose batch is too small to use more devices is offered no more.
    """
    order = list(singles)  # fastest class first
    caps = {c: classes.capacity(c) for c in order}
    if not order or lo > sum(caps.values()):
        return list(dict.fromkeys(extra))
    hi = max(lo, min(hi, sum(caps.values())))
    plentiful = max(order, key=lambda c: caps[c])
    families = [_only(c, caps) for c in dict.fromkeys([*order[:SINGLE_CLASS_FAMILIES], plentiful])]
    families.append(lambda n: _fill(order, caps, n))
    if len(order) > 2:
        # Mixed types without the fastest class, which jobs that fit nowhere else may need.
        families.append(lambda n: _fill(order[1:], caps, n))
    if len(order) > 1:
        a, b = order[0], order[1]
        families.append(lambda n: _fill([a, b], caps, n) if n < 2 else _half(a, b, caps, n))
    out: list[Config] = list(extra)
    sizes = ladder(lo, hi)
    for family in families:
        best = 0.0
        for n in sizes:
            counts = family(n)
            if not counts:
                continue
            config = classes.config(counts)
            r = rate(config)
            if r > best * (1 + min_gain) or (n == lo and r > 0):
                out.append(config)
                best = max(best, r)
    return list(dict.fromkeys(out))


def _only(c: DeviceClass, caps: dict[DeviceClass, int]) -> Callable[[int], dict[DeviceClass, int]]:
    def counts(n: int) -> dict[DeviceClass, int]:
        return {c: n} if n <= caps[c] else {}

    return counts


def _half(
    a: DeviceClass, b: DeviceClass, caps: dict[DeviceClass, int], n: int
) -> dict[DeviceClass, int]:
    first = min(caps[a], math.ceil(n / 2))
    second = n - first
    return {a: first, b: second} if second <= caps[b] else {}
