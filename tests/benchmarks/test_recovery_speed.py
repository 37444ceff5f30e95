"""Benchmark: what durability costs and how fast a job comes back from a failure.

The default simulation (``deploy/clusters/local-sim.yaml``, gpt-tiny, global
batch 64, the ``dp`` plan), 60 steps, on warm workers (the service's case:
its pool is warmed when it starts). Side by side in one run:

- checkpoint overhead: the same 60 steps without checkpoints and with the
  service's default interval (:func:`api.job_runner.checkpoint_every`: a
  tenth of the job, here every 6 steps), twice each, interleaved; the
  overhead is the extra wall time as a share of the run without;
- recovery: a worker's process killed (``crash``) and a device lost for good
  (``lost``) at step 30: seconds from noticing the failure to the end of the
  first step after it, and the steps run again (those after the checkpoint).

    pytest -m benchmark -s tests/benchmarks/test_recovery_speed.py
"""

from __future__ import annotations

import statistics

import pytest

from api.job_runner import checkpoint_every
from scheduler.planner import make_plan
from tests.benchmarks.simrun import CLUSTER, MODEL, durable_run
from workers.session import profile_cluster

BATCH, STEPS, FAIL_AT = 64, 60, 30
EVERY = checkpoint_every(STEPS, None)


@pytest.mark.benchmark
def test_checkpoint_overhead_and_recovery_time(sim_pool, tmp_path) -> None:
    cache_dir = tmp_path / "cache"
    profile = profile_cluster(CLUSTER, MODEL, cache_dir=cache_dir, layers=None, pool=sim_pool)
    plan = make_plan(profile, BATCH, "dp")
    common = dict(plan=plan, steps=STEPS, cache_dir=cache_dir)
    durable_run(sim_pool, profile, checkpoint_every=None, **common)  # warm-up: the first group

    walls: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(2):
        for checkpoints in (False, True):
            every = EVERY if checkpoints else None
            walls[checkpoints].append(
                durable_run(sim_pool, profile, checkpoint_every=every, **common)[3]
            )
    plain, durable = statistics.median(walls[False]), statistics.median(walls[True])
    print(
        f"\n{STEPS} steps, dp on {CLUSTER.name}: without checkpoints {plain:.1f} s, "
        f"with one every {EVERY} steps {durable:.1f} s "
        f"(runs: {[round(w, 1) for w in walls[False]]} vs {[round(w, 1) for w in walls[True]]}); "
        f"overhead {durable / plain - 1:+.1%}"
    )

    slowest = max(profile.devices, key=lambda d: d.per_sample_s).id
    for kind in ("crash", "lost"):
        _, _, recoveries, wall_s = durable_run(
            sim_pool,
            profile,
            checkpoint_every=EVERY,
            faults=[f"{slowest}@{FAIL_AT}:{kind}"],
            **common,
        )
        (recovery,) = recoveries
        print(
            f"{kind} of {slowest} at step {FAIL_AT}: first step after it done "
            f"{recovery.recover_s:.2f} s after the failure was noticed; "
            f"resumed at step {recovery.resumed_step}, {recovery.steps_redone} steps redone; "
            f"run {wall_s:.1f} s (vs {plain:.1f} s without failure or checkpoints)"
        )
