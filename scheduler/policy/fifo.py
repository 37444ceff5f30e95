"""``fifo``: the executor's queue as a policy, the baseline the others are measured against.

Jobs in arrival order. A running job keeps its devices. A waiting job asks for
``max_devices`` devices of the types it may use and fits on (all of them when
it names no maximum) and starts only when that many are free; otherwise it
waits and reserves the free ones, so later jobs use only what is left and
cannot starve it by taking devices one at a time. Among free devices it takes
the fullest-fitting node first (best fit), so it spans as few nodes as it can;
it does not look at which type would suit it best.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.hardware.cluster import Cluster
from scheduler.policy.configs import ClusterClasses
from scheduler.policy.rates import DeviceClass, RateFn
from scheduler.policy.types import Allocation, JobDemand


def decide_fifo(
    cluster: Cluster,
    classes: ClusterClasses,
    jobs: Sequence[JobDemand],
    rate_fn: RateFn,
    singles: dict[str, dict[DeviceClass, float]],
) -> Allocation:
    present = set(cluster.ids)
    taken: set[str] = set()
    devices: dict[str, tuple[str, ...]] = {}
    reasons: dict[str, str] = {}
    for job in jobs:
        if job.held:
            kept = tuple(i for i in job.held if i in present)
            devices[job.name] = kept
            taken.update(kept)
            reasons[job.name] = "keeps its devices: fifo never moves a running job"
    ahead = 0
    for job in sorted((j for j in jobs if not j.held), key=lambda j: (j.arrival_s, j.name)):
        usable_classes = set(singles[job.name])
        usable = [d.id for d in cluster.devices if classes.class_of[d.id] in usable_classes]
        devices[job.name] = ()
        if not usable:
            reasons[job.name] = "cannot run: its model fits no device it may use in this cluster"
            continue
        want = min(job.max_devices or len(usable), len(usable))
        if want < job.min_devices:
            reasons[job.name] = (
                f"cannot run: needs {job.min_devices} devices, the cluster has {len(usable)} "
                "it can use"
            )
            continue
        free = [i for i in usable if i not in taken]
        if len(free) < want:
            taken.update(free)
            reasons[job.name] = (
                f"waits: needs {want} devices, {len(free)} free (reserved for it)"
                + (f"; {ahead} job(s) ahead of it" if ahead else "")
            )
            ahead += 1
            continue
        ids = _best_fit(free, want, classes.node_of)
        taken.update(ids)
        devices[job.name] = ids
        reasons[job.name] = f"first in line: got the {want} device(s) it asked for"
    rates: dict[str, float] = {}
    for job in jobs:
        ids = devices[job.name]
        config = classes.config_of(ids)
        rates[job.name] = (
            rate_fn(model=job.model, global_batch=job.global_batch, config=config) if ids else 0.0
        )
    for job in jobs:
        if devices[job.name]:
            config = classes.config_of(devices[job.name])
            reasons[job.name] = (
                f"{config.describe()}, {rates[job.name]:,.1f} samples/s; {reasons[job.name]}"
            )
    return Allocation(
        policy="fifo",
        devices={j.name: devices[j.name] for j in jobs},
        samples_per_s=rates,
        reasons={j.name: reasons[j.name] for j in jobs},
        solver="exact: fifo takes jobs in arrival order, nothing to optimise",
    )


def _best_fit(free: list[str], want: int, node_of: dict[str, str]) -> tuple[str, ...]:
    by_node: dict[str, list[str]] = {}
    for i in free:
        by_node.setdefault(node_of[i], []).append(i)
    fitting = [n for n, ids in by_node.items() if len(ids) >= want]
    if fitting:
        node = min(fitting, key=lambda n: len(by_node[n]))
        return tuple(by_node[node][:want])
    picked: list[str] = []
    for node in sorted(by_node, key=lambda n: -len(by_node[n])):
        picked.extend(by_node[node][: want - len(picked)])
        if len(picked) == want:
            break
    return tuple(picked)
