"""An existing plan's cost under another profile, and live profiles of slowed devices.

Re-planning (:mod:`scheduler.replan.decision`) compares the running plan with a new
one under the job's *live* profile; :func:`predict_step_s` prices the running one
with the same cost functions the planners use, so the two figures are comparable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from scheduler.cost.costmodel import busy_s, num_micro_batches, ring_allreduce_s, slowest_link_gbps
from scheduler.cost.costs import RecomputeCost
from scheduler.cost.profile import DeviceProfile, LayerCost, LayerProfile, Profile
from scheduler.errors import PlanError
from scheduler.planning.fsdp import predict_fsdp_step_s
from scheduler.planning.hybrid import sync_s
from scheduler.planning.pipeline import stage_plans
from scheduler.planning.plan import SHARDED_STRATEGIES, DevicePlan, Plan
from scheduler.planning.stages import (
    Chain,
    Stage,
    boundary_s,
    exchange_s,
    layers_of,
    stage_time_s,
    tied_embedding,
    tied_sync_s,
)


def _scale_recompute(cost: RecomputeCost | None, factor: float) -> RecomputeCost | None:
    if cost is None:
        return None
    fixed_s = None if cost.fixed_s is None else cost.fixed_s * factor
    return replace(cost, fixed_s=fixed_s, per_sample_s=cost.per_sample_s * factor)


def _scale_cost(cost: LayerCost, factor: float) -> LayerCost:
    return replace(
        cost,
        fixed_s=cost.fixed_s * factor,
        per_sample_s=cost.per_sample_s * factor,
        selective=_scale_recompute(cost.selective, factor),
        full=_scale_recompute(cost.full, factor),
    )


def scale_device(device: DeviceProfile, factor: float) -> DeviceProfile:
    """``device`` running ``factor`` times slower (times scaled, memory unchanged)."""
    layers: LayerProfile | None = None
    if device.layers is not None:
        lp = device.layers
        layers = replace(
            lp,
            embed=_scale_cost(lp.embed, factor),
            block=_scale_cost(lp.block, factor),
            head=_scale_cost(lp.head, factor),
        )
    return replace(
        device,
        fixed_s=device.fixed_s * factor,
        per_sample_s=device.per_sample_s * factor,
        layers=layers,
        selective=_scale_recompute(device.selective, factor),
        full=_scale_recompute(device.full, factor),
    )


def live_profile(base: Profile, factors: Mapping[str, float]) -> Profile:
    """``base`` with each device in ``factors`` slowed by its factor (1.0: unchanged)."""
    return replace(
        base,
        devices=tuple(
            scale_device(d, factors[d.id]) if factors.get(d.id, 1.0) != 1.0 else d
            for d in base.devices
        ),
    )


def missing_devices(plan: Plan, profile: Profile) -> list[str]:
    """Active devices of ``plan`` that ``profile`` no longer has (lost devices); for a
    sharded plan every device counts, since one without samples still owns a shard."""
    known = {d.id for d in profile.devices}
    devices = plan.devices if plan.strategy in SHARDED_STRATEGIES else plan.active
    return [d.id for d in devices if d.id not in known]


def _by_id(plan: Plan, profile: Profile) -> dict[str, DeviceProfile]:
    """``profile``'s devices by id (one pass: plans span thousands of devices); the
    plan's active devices must all be there."""
    missing = missing_devices(plan, profile)
    if missing:
        raise PlanError(
            f"plan: device(s) {', '.join(missing)} not in the profile; "
            "a plan that uses a lost device cannot run"
        )
    return {d.id: d for d in profile.devices}


def _chains(plan: Plan, profile: Profile) -> list[tuple[Chain, list[DevicePlan]]]:
    """Each pipeline of ``plan`` rebuilt with ``profile``'s device figures, stages in order."""
    by_id = _by_id(plan, profile)
    pipelines: dict[int, list[DevicePlan]] = {}
    for entry in plan.active:
        if entry.layers is None or entry.stage is None or entry.pipeline is None:
            raise PlanError(f"plan: {plan.strategy} entry {entry.id} has no stage or layers")
        pipelines.setdefault(entry.pipeline, []).append(entry)
    out = []
    for _, entries in sorted(pipelines.items()):
        entries.sort(key=lambda e: e.stage if e.stage is not None else 0)
        stages = []
        for s, entry in enumerate(entries):
            device = by_id[entry.id]
            first, last = entry.layers if entry.layers is not None else (0, 0)
            flags = {"first": s == 0, "last": s == len(entries) - 1}
            stages.append(
                Stage(
                    device=device,
                    first=first,
                    last=last,
                    time_s=stage_time_s(
                        layers_of(device),
                        last - first,
                        entry.micro_batch,
                        recompute=entry.recompute,
                        **flags,
                    )
                    + exchange_s(**flags),
                    peak_bytes=entry.peak_bytes,
                    recompute=entry.recompute,  # rebuilt busy times use the mode's figures
                )
            )
        out.append((Chain(stages=tuple(stages), micro_batch=entries[0].micro_batch), entries))
    return out


def _dp_busy_s(device: DeviceProfile, entry: DevicePlan) -> float:
    """``k·fixed_s + n·per_sample_s`` with the figures of the recomputation the plan chose."""
    option = next((o for o in device.options() if o.recompute == entry.recompute), None)
    if option is None:  # the live profile lacks that mode's figures: the plain ones
        return busy_s(device, entry.samples, entry.micro_batch)
    k = num_micro_batches(entry.samples, entry.micro_batch)
    return k * option.fixed_s + entry.samples * option.per_sample_s


def predicted_busy_s(plan: Plan, profile: Profile) -> dict[str, float]:
    """Compute time per step of each active device of ``plan`` under ``profile``."""
    by_id = _by_id(plan, profile)
    if not plan.active or plan.active[0].layers is None:
        return {d.id: _dp_busy_s(by_id[d.id], d) for d in plan.active}
    busy: dict[str, float] = {}
    for chain, entries in _chains(plan, profile):
        head = entries[0]
        rebuilt = stage_plans(
            chain,
            pipeline=head.pipeline or 0,
            samples=head.samples,
            num_micro_batches=head.accum_steps,
            offset=head.offset,
        )
        busy.update({d.id: d.busy_s for d in rebuilt})
    return busy


def predict_step_s(plan: Plan, profile: Profile) -> float:
    """Step time of ``plan``'s split under ``profile``.

    Raises :class:`~scheduler.errors.PlanError` when the plan uses a device the
    profile lacks.

    - data parallel (``dp``, ``even``, ``proportional``): each device busy
      ``k·fixed_s + n·per_sample_s`` (:func:`scheduler.cost.costmodel.busy_s`), the
      step the slowest device plus the ring all-reduce among active devices;
    - pipelines (``pp``, ``hybrid``): each pipeline's stages rebuilt from the
      plan's block ranges with the live device figures
      (:func:`scheduler.planning.stages.stage_time_s`), 1F1B compute
      (:meth:`scheduler.planning.stages.Chain.compute_s`), boundary transfers, and the
      tied-embedding sync (``pp``) or the gradient sync among piece holders
      (``hybrid``, :func:`scheduler.planning.hybrid.sync_s`).

    Under the profile a plan was made with, :func:`predict_step_s` returns the
    plan's own ``predicted_step_s`` (tested), so differences come from the
    profile alone.
    """
    by_id = _by_id(plan, profile)
    if not plan.active:
        return 0.0
    if plan.strategy in SHARDED_STRATEGIES:  # per-unit collectives: scheduler.planning.fsdp
        return predict_fsdp_step_s(plan, profile)
    if plan.active[0].layers is None:
        busy = predicted_busy_s(plan, profile)
        devices = [by_id[d.id] for d in plan.active]
        comm = ring_allreduce_s(
            len(devices),
            profile.gradient_bytes,
            slowest_link_gbps(profile.links, [d.node for d in devices]),
        )
        return max(busy.values()) + comm
    tied = tied_embedding(profile)
    chains = _chains(plan, profile)
    if plan.strategy == "pp" and len(chains) == 1:
        chain, entries = chains[0]
        return (
            chain.compute_s(entries[0].accum_steps)
            + boundary_s(chain, profile.links)
            + tied_sync_s(chain, profile.links, tied)
        )
    slowest = max(
        chain.compute_s(entries[0].accum_steps) + boundary_s(chain, profile.links)
        for chain, entries in chains
    )
    return slowest + sync_s([chain for chain, _ in chains], profile, tied)
