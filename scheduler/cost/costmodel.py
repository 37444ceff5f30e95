"""The data-parallel cost model of DESIGN.md.

A device that processes ``n`` samples in ``k = ceil(n / m)`` micro-batches of
at most ``m`` samples is busy ``k·fixed_s + n·per_sample_s`` and peaks at
``static_bytes + m·per_sample_bytes``. A step takes the slowest device's busy
time plus a ring all-reduce of the gradients, ``2(N−1)/N · bytes / bandwidth``
over the slowest link of the ring (Patarasuk & Yuan, "Bandwidth optimal
all-reduce algorithms for clusters of workstations", 2009). With activation
recomputation a device has one ``(fixed_s, per_sample_s, per_sample_bytes)``
per mode (:meth:`DeviceProfile.options`); the planner runs each device in the
fastest mode that fits (:mod:`scheduler.planning.planner`).
"""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.cost.profile import DeviceProfile
from scheduler.hardware.cluster import Links


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def num_micro_batches(samples: int, max_micro_batch: int) -> int:
    return ceil_div(samples, max_micro_batch) if samples > 0 else 0


def busy_s(device: DeviceProfile, samples: int, max_micro_batch: int) -> float:
    """Compute time of ``samples`` in micro-batches of at most ``max_micro_batch``."""
    k = num_micro_batches(samples, max_micro_batch)
    return k * device.fixed_s + samples * device.per_sample_s


def balanced_micro_batch(samples: int, max_micro_batch: int) -> tuple[int, int]:
    """``(micro_batch, accum_steps)``: fewest micro-batches, as equal as integers allow.

    >>> balanced_micro_batch(10, 4)   # 4+3+3 rather than 4+4+2: same time, less memory
    (4, 3)
    >>> balanced_micro_batch(8, 4)
    (4, 2)
    """
    if samples == 0:
        return 0, 0
    k = ceil_div(samples, max_micro_batch)
    return ceil_div(samples, k), k


def peak_bytes(device: DeviceProfile, micro_batch: int) -> int:
    return device.static_bytes + micro_batch * device.per_sample_bytes


def slowest_link_gbps(links: Links, nodes: Iterable[str]) -> float:
    """Bandwidth of the slowest hop of a ring over devices on ``nodes``."""
    return links.between(nodes)


def ring_allreduce_s(num_devices: int, gradient_bytes: int, link_gbps: float) -> float:
    """Time of a bandwidth-optimal ring all-reduce; zero for a single device."""
    if num_devices <= 1 or gradient_bytes <= 0:
        return 0.0
    return 2 * (num_devices - 1) / num_devices * gradient_bytes * 8 / (link_gbps * 1e9)
