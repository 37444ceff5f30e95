"""Benchmark: what durability costs and how fast a job comes back from a failure.

The default simulation (``deploy/clusters/local-sim.yaml``, gpt-tiny, global
batch 64, the ``dp`` plan), on warm workers (the service's case: its pool is
warmed when it starts). Side by side in one run:

- checkpoint overhead: 60 steps with a checkpoint at the service's default
  interval (:func:`api.execution.job_runner.checkpoint_every`: a tenth of the job, here
  every 6 steps): the seconds spent writing checkpoints as a share of the
  run's wall time, and the run's wall time against the same 60 steps
  without checkpoints;
- recovery: a worker's process killed (``crash``) and a device lost for good
  (``lost``) at step 15 of 30: seconds from noticing the failure to the end of
  the first step after it, and the steps run again (those after the checkpoint).

    pytest -m benchmark -s tests/benchmarks/test_recovery_speed.py
"""

from __future__ import annotations

import time

import pytest

from api.execution.job_runner import checkpoint_every
from scheduler.planning.planner import make_plan
from tests.benchmarks.simrun import CLUSTER, MODEL, durable_run
from workers.run import driver
from workers.session import profile_cluster

BATCH, STEPS, FAULT_STEPS = 64, 60, 30
EVERY = checkpoint_every(STEPS, None)


@pytest.mark.benchmark
def test_checkpoint_overhead_and_recovery_time(sim_pool, tmp_path, monkeypatch) -> None:
    cache_dir = tmp_path / "cache"
    profile = profile_cluster(CLUSTER, MODEL, cache_dir=cache_dir, layers=None, pool=sim_pool)
    plan = make_plan(profile, BATCH, "dp")
    durable_run(sim_pool, profile, plan=plan, steps=3, cache_dir=cache_dir)  # the first group

    writes: list[float] = []
    save = driver.save_checkpoint

    def timed_save(*args, **kwargs):  # the driver's own function, timed
        begin = time.perf_counter()
        info = save(*args, **kwargs)
        writes.append(time.perf_counter() - begin)
        return info

    monkeypatch.setattr(driver, "save_checkpoint", timed_save)
    common = dict(plan=plan, steps=STEPS, cache_dir=cache_dir)
    plain_s = durable_run(sim_pool, profile, checkpoint_every=None, **common)[3]
    durable_s = durable_run(sim_pool, profile, checkpoint_every=EVERY, **common)[3]
    print(
        f"\n{STEPS} steps, dp on {CLUSTER.name}, a checkpoint every {EVERY} steps: "
        f"{len(writes)} written in {sum(writes):.2f} s in all "
        f"({sum(writes) / durable_s:.1%} of the run's {durable_s:.1f} s; "
        f"longest {max(writes):.2f} s); the same steps without checkpoints {plain_s:.1f} s "
        f"(wall-time difference {durable_s / plain_s - 1:+.1%})"
    )

    slowest = max(profile.devices, key=lambda d: d.per_sample_s).id
    at = FAULT_STEPS // 2
    for kind in ("crash", "lost"):
        _, _, recoveries, wall_s = durable_run(
            sim_pool,
            profile,
            plan=plan,
            steps=FAULT_STEPS,
            cache_dir=cache_dir,
            checkpoint_every=checkpoint_every(FAULT_STEPS, None),
            faults=[f"{slowest}@{at}:{kind}"],
        )
        (recovery,) = recoveries
        print(
            f"{kind} of {slowest} at step {at}: first step after it done "
            f"{recovery.recover_s:.2f} s after the failure was noticed; "
            f"resumed at step {recovery.resumed_step}, {recovery.steps_redone} steps redone "
            f"(checkpoint every {checkpoint_every(FAULT_STEPS, None)} steps)"
        )
