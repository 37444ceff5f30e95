"""Durable runs on the default simulation, for the benchmarks that time them.

The bundled ``deploy/clusters/local-sim.yaml``, gpt-tiny, warm workers kept in
one pool per module (the ``sim_pool`` fixture of ``conftest.py``: the service's
case), each run checkpointing into a temporary directory.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scheduler.cost.profile import Profile
from scheduler.hardware.cluster import load_cluster
from scheduler.hardware.faults import FaultSchedule, parse_fault
from scheduler.models.presets import get_preset
from scheduler.planning.plan import Plan
from scheduler.planning.planner import make_plan
from workers.session import (
    Checkpointing,
    LiveReplanning,
    Recorder,
    RunConfig,
    TrainResult,
    WorkerPool,
    train,
)

CLUSTER = load_cluster(Path(__file__).resolve().parents[2] / "deploy/clusters/local-sim.yaml")
MODEL = get_preset("gpt-tiny")


def durable_run(
    pool: WorkerPool,
    profile: Profile,
    *,
    plan: Plan,
    steps: int,
    cache_dir: Path,
    checkpoint_every: int | None = 5,
    faults: Sequence[str] = (),
    replan: bool = False,
) -> tuple[TrainResult, list[Any], list[Any], float]:
    """Train ``plan``; returns the result, the re-plans that switched, the recoveries and
    the run's wall time in seconds."""
    hooks = Recorder()
    with tempfile.TemporaryDirectory(prefix="hetsched-bench-") as root:
        begin = time.perf_counter()
        result = train(
            cluster=CLUSTER,
            model=MODEL,
            plan=plan,
            steps=steps,
            seed=0,
            cache_dir=cache_dir,
            pool=pool,
            config=RunConfig(
                checkpointing=Checkpointing(root=root, every_steps=checkpoint_every)
                if checkpoint_every
                else None,
                max_failures=len(faults),
                faults=FaultSchedule([parse_fault(f) for f in faults]),
                live=LiveReplanning(profile=profile, strategy=plan.strategy, total_steps=steps)
                if replan
                else None,
            ),
            hooks=hooks,
            replan=lambda lost: make_plan(
                profile.subset([d.id for d in profile.devices if d.id not in lost]),
                plan.global_batch,
                plan.strategy,
            ),
        )
        wall_s = time.perf_counter() - begin
    assert result.steps_done == steps
    switches = [d for d in hooks.replans if d.switch]
    return result, switches, list(hooks.recoveries), wall_s
