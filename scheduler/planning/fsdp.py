"""Fully-sharded data parallelism (``fsdp``): shards sized to memory, batches sized to speed.

The plans: one sharding group over every device that fits, one group per node
(HSDP) when the nodes are alike, the fastest node alone; each searched by
:mod:`scheduler.planning.shards` and priced by :mod:`scheduler.cost.sharded`, whose
docstring states what the runtime does and so what a plan's time and memory are.
The plan gives every device its ``shard`` (fraction of every unit's flat buffer, in
rank order within its ``shard_group``) and one ``accum_steps`` per group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from scheduler.cost.costmodel import ceil_div
from scheduler.cost.costs import ShardingFigures
from scheduler.cost.profile import DeviceProfile, Profile
from scheduler.cost.sharded import (
    Classes,
    IntArray,
    classes_of,
    collectives,
    cross_group_s,
    evaluate_step,
    gathered_bytes,
    group_step_s,
    link_gbps_of,
    per_device,
    unit_counts,
)
from scheduler.errors import PlanError
from scheduler.hardware.cluster import Links
from scheduler.models.activations import RECOMPUTE_MODES
from scheduler.planning.plan import DevicePlan, Excluded, Plan, check_global_batch
from scheduler.planning.shards import Solution, best_for_group
from scheduler.units import format_bytes


def sharding_of_profile(profile: Profile) -> ShardingFigures:
    if profile.sharding is None:
        raise PlanError(
            f"profile: model {profile.model!r} has no sharding figures ('sharding'); "
            "fsdp plans need them: re-profile, or use a known preset"
        )
    return profile.sharding


def expand(sol: Solution, classes: IntArray, global_batch: int) -> tuple[list[int], list[int]]:
    """Samples and largest micro-batch per device: ``k·m`` each, the excess over the batch
    taken off the devices of the slowest classes first (their micro-batches never grow)."""
    k = sol.accum_steps
    micro = sol.micro[classes]
    samples = (k * micro).tolist()
    excess = sum(samples) - global_batch
    order = sorted(range(len(samples)), key=lambda i: -float(micro[i]))
    for i in order:
        if excess <= 0:
            break
        take = min(excess, samples[i])
        samples[i] -= take
        excess -= take
    return samples, [ceil_div(n, k) if n else 0 for n in samples]


def exclusion(d: DeviceProfile, sf: ShardingFigures, held: float) -> str | None:
    """Why ``d`` cannot take part: ``held`` (the gathered units at even shards) and one
    sample do not fit."""
    least = min(d.options(), key=lambda o: o.per_sample_bytes)
    need = held + sf.unsharded_bytes + least.per_sample_bytes
    if need <= d.capacity_bytes:
        return None
    how = f" with {least.recompute} recomputation" if least.recompute != "none" else ""
    return (
        f"two gathered units and one unsharded gradient {format_bytes(int(held))} + one sample "
        f"{format_bytes(least.per_sample_bytes)}{how} exceed capacity "
        f"{format_bytes(d.capacity_bytes)}"
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupPlan:
    """One sharding group's devices (in rank order), its solution and each device's part."""

    devices: tuple[DeviceProfile, ...]
    solution: Solution
    samples: list[int]
    micro: list[int]
    classes: IntArray
    """Each device's class in ``cl``."""
    cl: Classes

    def times(self, sf: ShardingFigures) -> tuple[float, float]:
        """``(step_s, compute_s)`` with every device's own micro-batch (after trimming)."""
        sol = self.solution
        return evaluate_step(
            per_device(self.cl, self.classes),
            np.array(self.micro, dtype=np.float64),
            sol.modes[self.classes],
            sol.comm,
            unit_counts(sf),
            sol.accum_steps,
        )


def plan_group(
    devices: Sequence[DeviceProfile], sf: ShardingFigures, links: Links, global_batch: int
) -> GroupPlan | None:
    cl, inverse = classes_of(devices, sf.num_blocks)
    sol = best_for_group(
        cl,
        sf,
        num_ranks=len(devices),
        link_gbps=link_gbps_of(links, devices),
        global_batch=global_batch,
    )
    if sol is None:
        return None
    samples, micro = expand(sol, inverse, global_batch)
    return GroupPlan(
        devices=tuple(devices), solution=sol, samples=samples, micro=micro, classes=inverse, cl=cl
    )


def entries(
    group: GroupPlan, sf: ShardingFigures, *, offset: int, shard_group: int | None
) -> list[DevicePlan]:
    """The plan entries of one group's devices, in rank order."""
    sol, cl, c = group.solution, group.cl, group.classes
    k = sol.accum_steps
    micro = np.array(group.micro, dtype=np.float64)
    modes = sol.modes[c]
    busy = k * (
        unit_counts(sf)[:, None]
        * (cl.fixed_s[modes, :, c] + micro[:, None] * cl.per_sample_s[modes, :, c]).T
    ).sum(axis=0)
    act = np.where(micro > 0, cl.act_bytes[modes, c], 0.0)
    shards = np.minimum(sol.shards[c], 1.0)
    fixed = sf.unsharded_bytes + sol.comm.gathered_bytes
    peak = np.ceil(shards * sf.shardable_state_bytes + fixed + micro * act)
    offsets = offset + np.cumsum(group.samples) - np.array(group.samples)
    out = []
    for d, n, m, mode, b, pk, o, f in zip(
        group.devices,
        group.samples,
        group.micro,
        modes.tolist(),
        np.where(micro > 0, busy, 0.0).tolist(),
        peak.tolist(),
        offsets.tolist(),
        shards.tolist(),
        strict=True,
    ):
        out.append(
            DevicePlan(
                id=d.id,
                samples=n,
                micro_batch=m,
                accum_steps=k,
                busy_s=b,
                peak_bytes=int(pk),
                offset=int(o),
                recompute=RECOMPUTE_MODES[mode] if m > 0 else "none",
                shard=f,
                shard_group=shard_group,
                precision=d.precision,
            )
        )
    return out


def _node_groups(devices: Sequence[DeviceProfile]) -> list[list[DeviceProfile]] | None:
    """Nodes as HSDP groups when they are alike (same figures rank for rank), else None."""
    nodes: dict[str, list[DeviceProfile]] = {}
    for d in devices:
        nodes.setdefault(d.node, []).append(d)
    groups = list(nodes.values())
    if len(groups) < 2 or len({len(g) for g in groups}) != 1:
        return None
    key = [sorted((d.capacity_bytes, d.type, d.fixed_s, d.per_sample_s) for d in g) for g in groups]
    if any(k != key[0] for k in key[1:]):
        return None
    return [
        sorted(g, key=lambda d: (d.capacity_bytes, d.type, d.fixed_s, d.per_sample_s, d.id))
        for g in groups
    ]


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    name: str
    groups: list[GroupPlan]
    step_s: float
    compute_s: float
    sync_s: float = 0.0


def _hsdp(
    usable: Sequence[DeviceProfile], sf: ShardingFigures, links: Links, global_batch: int
) -> Candidate | None:
    groups = _node_groups(usable)
    if groups is None or global_batch < len(groups):
        return None
    per_group = ceil_div(global_batch, len(groups))
    template = plan_group(groups[0], sf, links, per_group)
    if template is None:
        return None
    plans = []
    left = global_batch
    for i, g in enumerate(groups):
        batch = min(per_group, left - (len(groups) - 1 - i))
        left -= batch
        samples, micro = expand(template.solution, template.classes, batch)
        plans.append(
            GroupPlan(
                devices=tuple(g),
                solution=template.solution,
                samples=samples,
                micro=micro,
                classes=template.classes,
                cl=template.cl,
            )
        )
    sync = cross_group_s(sf, links, len(groups), float(template.solution.shards.max()))
    step, compute = max(g.times(sf) for g in plans)
    return Candidate(
        name="HSDP, one group per node",
        groups=plans,
        step_s=step + sync,
        compute_s=compute,
        sync_s=sync,
    )


def _flat(
    devices: Sequence[DeviceProfile],
    sf: ShardingFigures,
    links: Links,
    global_batch: int,
    name: str,
) -> Candidate | None:
    group = plan_group(devices, sf, links, global_batch)
    if group is None:
        return None
    step, compute = group.times(sf)
    return Candidate(name=name, groups=[group], step_s=step, compute_s=compute)


def _no_fit(usable: Sequence[DeviceProfile], sf: ShardingFigures, links: Links) -> str:
    n = len(usable)
    held = collectives(sf, n, 1.0 / n, link_gbps_of(links, usable)).gathered_bytes
    free = sum(
        d.capacity_bytes - held - sf.unsharded_bytes - min(o.per_sample_bytes for o in d.options())
        for d in usable
    )
    return (
        f"fsdp: model states {format_bytes(sf.shardable_state_bytes)} do not fit {n} devices: "
        f"{format_bytes(int(max(free, 0)))} left in all after each holds two gathered units, "
        "one unsharded gradient and one sample"
    )


def plan_fsdp(profile: Profile, global_batch: int) -> Plan:
    """Shards, samples, micro-batches and accumulation for every device (module docstring).

    Candidates: one sharding group over every device that fits; one group per node
    (HSDP) when the nodes are alike; the fastest node alone when it holds the model.
    The fastest predicted is kept and the others named in the notes."""
    check_global_batch(global_batch)
    sf = sharding_of_profile(profile)
    devices = list(profile.devices)
    held = gathered_bytes(sf, len(devices), 1.0 / len(devices))
    excluded: list[Excluded] = []
    usable = []
    for d in devices:
        reason = exclusion(d, sf, held)
        if reason is None:
            usable.append(d)
        else:
            excluded.append(Excluded(id=d.id, reason=reason))
    if not usable:
        raise PlanError(
            "fsdp: no device fits: " + "; ".join(f"{e.id}: {e.reason}" for e in excluded[:3])
        )
    states = sf.shardable_state_bytes
    candidates = [
        c
        for c in (
            _flat(usable, sf, profile.links, global_batch, f"one group of {len(usable)}"),
            _hsdp(usable, sf, profile.links, global_batch),
        )
        if c is not None
    ]
    if len({d.node for d in usable}) > 1:
        # the fastest node that could hold the states alone: intra-node collectives
        nodes: dict[str, list[DeviceProfile]] = {}
        for d in usable:
            nodes.setdefault(d.node, []).append(d)
        roomy = [ds for ds in nodes.values() if sum(d.capacity_bytes for d in ds) > states]
        if roomy:
            fastest = max(roomy, key=lambda ds: sum(1 / d.per_sample_s for d in ds))
            name = f"{fastest[0].node} alone"
            if (c := _flat(fastest, sf, profile.links, global_batch, name)) is not None:
                candidates.append(c)
    if not candidates:
        raise PlanError(_no_fit(usable, sf, profile.links))
    best = min(candidates, key=lambda c: c.step_s)
    return _to_plan(best, candidates, usable, excluded, sf, global_batch)


def _to_plan(
    best: Candidate,
    candidates: list[Candidate],
    usable: Sequence[DeviceProfile],
    excluded: list[Excluded],
    sf: ShardingFigures,
    global_batch: int,
) -> Plan:
    hsdp = len(best.groups) > 1
    out: list[DevicePlan] = []
    offset = 0
    for g, group in enumerate(best.groups):
        out += entries(group, sf, offset=offset, shard_group=g if hsdp else None)
        offset += sum(group.samples)
    used = {e.id for e in out}
    excluded = excluded + [
        Excluded(id=d.id, reason=f"idle: fsdp is predicted faster without it ({best.name})")
        for d in usable
        if d.id not in used
    ]
    sol = best.groups[0].solution
    shards = sorted({round(e.shard or 0.0, 4) for e in out})
    notes = [
        f"fsdp: {'HSDP, ' + str(len(best.groups)) + ' groups (one per node), ' if hsdp else ''}"
        f"{len(best.groups[0].devices)} ranks per group, "
        f"{sol.accum_steps} micro-batch(es) per step, "
        f"shards {shards[0]:.3g} to {shards[-1]:.3g} of every unit, "
        f"collectives {sol.comm.comm_s[1] * 1e3:.3g} ms per block per micro-batch"
        + (f", {best.sync_s:.3g} s cross-group all-reduce per step" if hsdp else ""),
    ]
    others = [c for c in candidates if c is not best]
    if others:
        notes.append(
            "fsdp also considered: " + "; ".join(f"{c.name}, {c.step_s:.4g} s/step" for c in others)
        )
    return Plan(
        strategy="fsdp",
        global_batch=global_batch,
        predicted_step_s=best.step_s,
        compute_s=best.compute_s,
        comm_s=best.step_s - best.compute_s,
        devices=tuple(out),
        excluded=tuple(excluded),
        notes=tuple(notes),
    )


def predict_fsdp_step_s(plan: Plan, profile: Profile) -> float:
    """Step time of an fsdp plan's shards and split under ``profile`` (re-planning);
    under the profile it was planned with, the plan's own prediction."""
    sf = sharding_of_profile(profile)
    by_id = {d.id: d for d in profile.devices}
    groups: dict[int | None, list[DevicePlan]] = {}
    for e in plan.devices:
        groups.setdefault(e.shard_group, []).append(e)
    slowest = 0.0
    for members in groups.values():
        step, _ = group_step_s(
            [by_id[e.id] for e in members],
            sf,
            profile.links,
            micro=[e.micro_batch for e in members],
            recompute=[e.recompute for e in members],
            theta=max(e.shard or 0.0 for e in members),
            accum_steps=max(e.accum_steps for e in members),
        )
        slowest = max(slowest, step)
    if len(groups) > 1:
        theta = max(e.shard or 0.0 for e in plan.devices)
        slowest += cross_group_s(sf, profile.links, len(groups), theta)
    return slowest
