"""``auto``: plan every strategy that fits and keep the fastest predicted.

Candidates are ``dp`` (the optimal uneven data-parallel split of
:mod:`scheduler.planning.dp`), ``fsdp`` (sharded states, :mod:`scheduler.planning.fsdp`),
``pp`` (:mod:`scheduler.planning.pipeline`) and ``hybrid``
(:mod:`scheduler.planning.hybrid`); ``even`` and ``proportional`` are what DDP-style
trainers would do and are reported as baselines, never chosen. A strategy
that cannot plan (nothing fits, no per-layer figures) is listed with its
reason. A more elaborate strategy must be predicted at least
:data:`PREFERENCE_MARGIN` faster than a simpler one to win (order: dp, fsdp, pp,
hybrid): predictions carry errors of a few percent, and a simpler runtime
communicates less (``fsdp`` runs the data-parallel program with a gather and a
reduce-scatter per block; pipelines add stages and a schedule). The returned
plan carries the winner's concrete strategy (what the runtime runs) and notes
saying what was considered and why it won.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from scheduler.cost.profile import Profile
from scheduler.errors import PlanError
from scheduler.planning.dp import baseline_of, plan_dp
from scheduler.planning.fsdp import plan_fsdp
from scheduler.planning.hybrid import plan_hybrid
from scheduler.planning.pipeline import plan_pp
from scheduler.planning.plan import Baseline, Plan

PREFERENCE_MARGIN = 0.01
"""Relative predicted speed-up a later (more elaborate) candidate needs to win."""

Planner = Callable[[Profile, int], Plan]


def _candidates() -> list[tuple[str, Planner]]:
    return [("dp", plan_dp), ("fsdp", plan_fsdp), ("pp", plan_pp), ("hybrid", plan_hybrid)]


def _summary(plan: Plan) -> str:
    used = len(plan.active)
    pipelines = {d.pipeline for d in plan.active if d.pipeline is not None}
    shape = ""
    if plan.strategy == "pp":
        shape = f", {used} stages"
    elif plan.strategy == "hybrid":
        shape = f", {len(pipelines)} pipeline(s)"
    elif plan.strategy == "fsdp":
        groups = {d.shard_group for d in plan.devices}
        largest = max((d.shard or 0.0) for d in plan.devices)
        shape = f", largest shard {largest:.1%}" + (
            f", {len(groups)} replicated groups" if len(groups) > 1 else ""
        )
    left = f", {len(plan.excluded)} left out" if plan.excluded else ""
    noun = "device" if used == 1 else "devices"
    return (
        f"{plan.strategy} {plan.predicted_step_s:.4g} s/step "
        f"({plan.predicted_samples_per_s:.4g} samples/s, {used} {noun}{shape}{left})"
    )


def _why(winner: Plan, others: dict[str, Plan]) -> str:
    rivals = [p for name, p in others.items() if name != winner.strategy]
    if not rivals:
        return f"{winner.strategy} wins: the only strategy that fits"
    runner_up = min(rivals, key=lambda p: p.predicted_step_s)
    speedup = runner_up.predicted_step_s / winner.predicted_step_s
    if speedup >= 1:
        why = (
            f"{winner.strategy} wins: predicted {speedup:.2f}× the throughput of "
            f"{runner_up.strategy}"
        )
    else:
        why = (
            f"{winner.strategy} wins: {runner_up.strategy} is predicted only "
            f"{1 / speedup - 1:.1%} faster, under the {PREFERENCE_MARGIN:.0%} margin a more "
            "elaborate strategy needs, and is not simpler"
        )
    dp = others.get("dp")
    if dp is not None and winner.strategy != "dp":
        if runner_up is not dp:
            why += f", {dp.predicted_step_s / winner.predicted_step_s:.2f}× that of dp"
        if len(winner.active) > len(dp.active):
            why += (
                f"; it uses {len(winner.active)} devices where dp uses {len(dp.active)} "
                "(model states or activations do not fit the others under dp)"
            )
    elif dp is None and winner.strategy == "fsdp":
        why += "; dp cannot run: no device holds the whole model's states, fsdp shards them"
    return why


def plan_candidates(profile: Profile, global_batch: int) -> tuple[dict[str, Plan], dict[str, str]]:
    """Every candidate's plan, and the reason of those that cannot plan."""
    plans: dict[str, Plan] = {}
    failed: dict[str, str] = {}
    for name, planner in _candidates():
        try:
            plans[name] = planner(profile, global_batch)
        except PlanError as exc:
            failed[name] = str(exc)
    return plans, failed


def choose(plans: dict[str, Plan]) -> Plan:
    """The fastest plan; a later candidate must beat earlier ones by the margin."""
    best: Plan | None = None
    for name in ("dp", "fsdp", "pp", "hybrid"):
        plan = plans.get(name)
        if plan is None:
            continue
        if best is None or plan.predicted_step_s < best.predicted_step_s / (1 + PREFERENCE_MARGIN):
            best = plan
    if best is None:
        raise PlanError("auto: no candidate plan")
    return best


def plan_auto(profile: Profile, global_batch: int) -> Plan:
    plans, failed = plan_candidates(profile, global_batch)
    if not plans:
        # A planner's own message may already name it ("fsdp: model states ...").
        reasons = "; ".join(
            f"{name}: {why.removeprefix(f'{name}: ')}" for name, why in failed.items()
        )
        raise PlanError(f"no strategy fits ({reasons})")
    winner = choose(plans)
    considered = [_summary(p) for p in plans.values()]
    considered += [f"{name} infeasible: {why}" for name, why in failed.items()]
    notes = (f"auto considered: {'; '.join(considered)}", _why(winner, plans), *winner.notes)
    baselines: dict[str, Baseline] = dict(winner.baselines)
    for name, plan in plans.items():
        baselines[name] = baseline_of(plan)
    return replace(winner, baselines=baselines, notes=notes)
