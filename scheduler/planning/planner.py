"""Every strategy behind one call: :func:`make_plan`.

The planners live in their own modules and import nothing from here:
data parallelism (``dp``, ``even``, ``proportional``) in :mod:`scheduler.planning.dp`,
pipelines in :mod:`scheduler.planning.pipeline` (``pp``) and :mod:`scheduler.planning.hybrid`
(``hybrid``), and the choice among them in :mod:`scheduler.planning.auto` (``auto``).
This module imports them all and dispatches, adding the ``even`` and
``proportional`` baselines (and ``dp`` for pipeline plans) to every plan.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduler.cost.profile import Profile
from scheduler.errors import PlanError
from scheduler.planning.auto import plan_auto
from scheduler.planning.dp import (
    DP_PLANNERS,
    _baselines,
    _dp,
    _plan,
    _prepare,
    baseline_of,
    optimal_split,
    plan_dp,
    plan_even,
    plan_proportional,
    proportional_split,
)
from scheduler.planning.hybrid import plan_hybrid
from scheduler.planning.pipeline import plan_pp
from scheduler.planning.plan import (
    DP_STRATEGIES,
    PIPELINE_STRATEGIES,
    Baseline,
    Plan,
    check_global_batch,
)

__all__ = [
    "STRATEGIES",
    "check_global_batch",
    "make_plan",
    "optimal_split",
    "plan_dp",
    "plan_even",
    "plan_proportional",
    "proportional_split",
]

STRATEGIES: tuple[str, ...] = ("auto", *DP_STRATEGIES, *PIPELINE_STRATEGIES)
"""Strategies :func:`make_plan` accepts, in the order the command line and API
offer them. A module that adds strategies extends this tuple with them."""

PIPELINE_PLANNERS: dict[str, Callable[[Profile, int], Plan]] = {
    "auto": plan_auto,
    "pp": plan_pp,
    "hybrid": plan_hybrid,
}


def make_plan(profile: Profile, global_batch: int, strategy: str = "dp") -> Plan:
    """Plan ``strategy`` and report the ``even`` and ``proportional`` baselines with it."""
    if strategy not in STRATEGIES:
        raise PlanError(f"strategy: unknown {strategy!r}; allowed: {', '.join(STRATEGIES)}")
    check_global_batch(global_batch)
    if strategy not in DP_PLANNERS:
        return _make_pipeline_plan(profile, global_batch, strategy)
    group, excluded = _prepare(profile)
    plan = _plan(strategy, profile, group, excluded, global_batch)
    return plan.with_baselines(_baselines(profile, group, global_batch))


def _make_pipeline_plan(profile: Profile, global_batch: int, strategy: str) -> Plan:
    """``auto``, ``pp`` or ``hybrid``, with the dp baselines where the model fits dp."""
    plan = PIPELINE_PLANNERS[strategy](profile, global_batch)
    baselines: dict[str, Baseline] = {}
    try:
        group, excluded = _prepare(profile)
    except PlanError:
        pass  # no device holds the whole model: data-parallel baselines do not exist
    else:
        baselines = _baselines(profile, group, global_batch)
        if strategy != "auto":
            baselines["dp"] = baseline_of(_dp(profile, group, excluded, global_batch))
    return plan.with_baselines({**baselines, **plan.baselines})
