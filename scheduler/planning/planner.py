"""Every strategy behind one call: :func:`make_plan`.

The planners live in their own modules and import nothing from here:
data parallelism (``dp``, ``even``, ``proportional``) in :mod:`scheduler.planning.dp`,
pipelines in :mod:`scheduler.planning.pipeline` (``pp``) and :mod:`scheduler.planning.hybrid`
(``hybrid``), sharded states in :mod:`scheduler.planning.fsdp` (``fsdp``), and the choice
among them in :mod:`scheduler.planning.auto` (``auto``).
This module dispatches and adds the ``even`` and ``proportional`` baselines (and
``dp`` for pipeline and sharded plans) to every plan.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from scheduler.cost.profile import Profile
from scheduler.errors import PlanError
from scheduler.planning.auto import plan_auto
from scheduler.planning.dp import DP_PLANNERS, dp_baselines, plan_with_baselines
from scheduler.planning.fsdp import plan_fsdp
from scheduler.planning.hybrid import plan_hybrid
from scheduler.planning.pipeline import plan_pp
from scheduler.planning.plan import (
    DP_STRATEGIES,
    PIPELINE_STRATEGIES,
    SHARDED_STRATEGIES,
    Baseline,
    Plan,
    check_global_batch,
)

__all__ = ["STRATEGIES", "make_plan"]

STRATEGIES: tuple[str, ...] = ("auto", *DP_STRATEGIES, *PIPELINE_STRATEGIES, *SHARDED_STRATEGIES)
"""Strategies :func:`make_plan` accepts, in the order the command line and API
offer them."""

OTHER_PLANNERS: dict[str, Callable[[Profile, int], Plan]] = {
    "auto": plan_auto,
    "pp": plan_pp,
    "hybrid": plan_hybrid,
    "fsdp": plan_fsdp,
}
"""The planners that do not replicate the model: the pipelines, fully-sharded data
parallelism, and ``auto``, which chooses among every strategy."""


def make_plan(profile: Profile, global_batch: int, strategy: str = "dp") -> Plan:
    """Plan ``strategy`` and report the ``even`` and ``proportional`` baselines with it."""
    if strategy not in STRATEGIES:
        raise PlanError(f"strategy: unknown {strategy!r}; allowed: {', '.join(STRATEGIES)}")
    check_global_batch(global_batch)
    if strategy in DP_PLANNERS:
        return plan_with_baselines(profile, global_batch, strategy)
    plan = OTHER_PLANNERS[strategy](profile, global_batch)
    baselines: dict[str, Baseline] = {}
    # No device holds the whole model: data-parallel baselines do not exist.
    with contextlib.suppress(PlanError):
        # auto already reports dp among the candidates it considered
        baselines = dp_baselines(profile, global_batch, with_dp=strategy != "auto")
    return plan.with_baselines({**baselines, **plan.baselines})
