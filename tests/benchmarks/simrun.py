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
from workers.session import (
    Checkpointing,
    Recorder,
    RunBuilder,
    TrainJob,
    TrainResult,
    WorkerPool,
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
    """Train ``plan`` as the service does (:class:`workers.session.RunBuilder`: a recovery
    re-plans on the devices left); returns the result, the re-plans that switched, the
    recoveries and the run's wall time in seconds."""
    builder = RunBuilder(
        job=TrainJob(cluster=CLUSTER, model=MODEL, steps=steps, seed=0, cache_dir=cache_dir),
        profile=profile,
        strategy=plan.strategy,
        global_batch=plan.global_batch,
    )
    hooks = Recorder()
    with tempfile.TemporaryDirectory(prefix="hetsched-bench-") as root:
        config = builder.config(
            checkpointing=Checkpointing(root=root, every_steps=checkpoint_every)
            if checkpoint_every
            else None,
            validation=None,
            max_failures=len(faults),
            follow_speed=replan,
            faults=FaultSchedule([parse_fault(f) for f in faults]),
        )
        begin = time.perf_counter()
        result = builder.train(plan, pool=pool, config=config, hooks=hooks)
        wall_s = time.perf_counter() - begin
    assert result.steps_done == steps
    switches = [d for d in hooks.replans if d.switch]
    return result, switches, list(hooks.recoveries), wall_s
