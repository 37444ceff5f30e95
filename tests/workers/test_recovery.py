"""Durable training on simulated devices: checkpoints across plans, recovery from failures.

Failures are real: a worker process is killed with SIGKILL between two steps.
"""

from __future__ import annotations

import os
import signal
from dataclasses import replace

import pytest

from scheduler.planning.plan import Plan
from tests.support import MIXED_CLUSTER, manual_plan, pipeline_stage, tiny_job
from workers.session import (
    Checkpointing,
    CheckpointStore,
    Recorder,
    RunConfig,
    TrainJob,
    WorkerError,
    train,
)

pytestmark = pytest.mark.usefixtures("local_ray")

SEED, STEPS, BATCH = 4, 8, 12
DP = manual_plan([("a/0", 6, 6), ("a/1", 2, 2), ("a/2", 4, 2)])
WITHOUT_T4 = manual_plan([("a/0", 8, 8), ("a/2", 4, 4)])


def pp_plan(strategy: str = "pp") -> Plan:
    """Two stages on a/0 and a/2 (pp), or two pipelines of one and two stages (hybrid)."""
    if strategy == "pp":
        layout = [("a/0", 0, 0, (0, 2), 0, 12), ("a/2", 0, 1, (2, 4), 0, 12)]
    else:
        layout = [
            ("a/0", 0, 0, (0, 4), 0, 6),
            ("a/1", 1, 0, (0, 2), 6, 6),
            ("a/2", 1, 1, (2, 4), 6, 6),
        ]
    devices = tuple(
        pipeline_stage(
            i, samples=n, offset=off, num_micro_batches=2, layers=layers, stage=stage, pipeline=pipe
        )
        for i, pipe, stage, layers, off, n in layout
    )
    return Plan(
        strategy=strategy,
        global_batch=BATCH,
        predicted_step_s=0.5,
        compute_s=0.5,
        comm_s=0.0,
        devices=devices,
    )


@pytest.fixture(scope="module")
def pool(mixed_pool):
    return mixed_pool


@pytest.fixture(scope="module")
def reference(pool, cache_dir):
    """The uninterrupted loss curve."""
    return train(_job(cache_dir), DP, pool=pool).losses


def _job(cache_dir, steps: int = STEPS) -> TrainJob:
    """What every run of this module trains: the cluster, model, seed and optimizer."""
    return tiny_job(MIXED_CLUSTER, cache_dir, steps=steps, seed=SEED)


def _durable(tmp_path, name: str, every: int = 2, max_failures: int = 0) -> RunConfig:
    return RunConfig(
        checkpointing=Checkpointing(root=str(tmp_path / name), every_steps=every, keep_last=2),
        max_failures=max_failures,
    )


def _lose_the_t4_once(pool, metrics, hooks: Recorder) -> None:
    """At step 2 of the first try: a/1 is marked lost and its worker killed, so the next
    step fails on it."""
    if metrics.step == 2 and not hooks.recoveries and "a/1" not in pool.lost():
        pid = pool.pids()["a/1"]
        pool.mark_lost(["a/1"])
        os.kill(pid, signal.SIGKILL)


def _train_dp_losing_the_t4(pool, cache_dir, tmp_path, name: str, *, hooks: Recorder, replan):
    """The dp run, checkpointing and allowed one failure; a/1 is back in the pool after."""
    try:
        return train(
            _job(cache_dir),
            DP,
            pool=pool,
            config=_durable(tmp_path, name, max_failures=1),
            hooks=hooks,
            replan=replan,
        )
    finally:
        pool.mark_lost(["a/1"], lost=False)


def test_a_checkpoint_moves_between_dp_pp_and_hybrid_and_training_goes_on_unchanged(
    pool, cache_dir, tmp_path, reference
) -> None:
    """dp writes at step 2, pp restores it and writes at step 5, hybrid restores that and
    finishes: the loss curve is the uninterrupted dp run's."""
    store = CheckpointStore(str(tmp_path / "moves"))
    first = train(_job(cache_dir, 3), DP, pool=pool, config=_durable(tmp_path, "moves", 3))
    second = train(
        _job(cache_dir, 6),
        pp_plan("pp"),
        pool=pool,
        restore=store.latest(),
        config=_durable(tmp_path, "moves", 3),
    )
    assert store.latest().step == 5 and store.latest().manifest["plan"]["strategy"] == "pp"
    third = train(_job(cache_dir), pp_plan("hybrid"), pool=pool, restore=store.latest())
    losses = first.losses + second.losses + third.losses
    assert len(losses) == STEPS
    assert losses == pytest.approx(reference, rel=1e-4)


def test_a_worker_killed_mid_job_is_replaced_and_the_job_finishes_unchanged(
    pool, cache_dir, tmp_path, reference
) -> None:
    def kill_once(metrics) -> None:
        seen = [m.step for m in hooks.steps]
        if metrics.step == 4 and len(hooks.recoveries) == 0 and seen.count(4) == 1:
            os.kill(pool.pids()["a/1"], signal.SIGKILL)

    hooks = Recorder(watch=kill_once)
    result = train(
        _job(cache_dir),
        DP,
        pool=pool,
        config=_durable(tmp_path, "kill", max_failures=2),
        hooks=hooks,
    )
    assert result.losses == pytest.approx(reference, rel=1e-4)
    assert result.steps_done == STEPS, "one record per step"
    (recovery,) = hooks.recoveries
    assert "a/1" in recovery.error and recovery.lost == ()
    assert recovery.resumed_step == 4 and recovery.failed_step == 5  # checkpoint after step 3
    assert recovery.recover_s > 0 and recovery.new_plan == DP.to_dict()


def test_a_lost_device_is_planned_around_and_the_loss_curve_is_unchanged(
    pool, cache_dir, tmp_path, reference
) -> None:
    def replan(lost: set[str]) -> Plan:
        assert lost == {"a/1"}
        return WITHOUT_T4

    hooks = Recorder(watch=lambda metrics: _lose_the_t4_once(pool, metrics, hooks))
    result = _train_dp_losing_the_t4(pool, cache_dir, tmp_path, "lost", hooks=hooks, replan=replan)
    assert result.losses == pytest.approx(reference, rel=1e-4)
    (recovery,) = hooks.recoveries
    assert recovery.lost == ("a/1",) and recovery.new_plan == WITHOUT_T4.to_dict()
    assert [d.id for d in result.devices] == ["a/0", "a/2"]


def test_a_lost_device_that_comes_back_is_taken_back_at_the_next_checkpoint(
    pool, cache_dir, tmp_path, reference
) -> None:
    # Without the T4 the job is predicted far slower (a stand-in figure), so taking it back
    # pays for the restart whatever this host's setup time.
    slower = replace(WITHOUT_T4, predicted_step_s=100.0)

    def lose_then_restore(metrics) -> None:
        _lose_the_t4_once(pool, metrics, hooks)
        if metrics.step == 4:
            pool.mark_lost(["a/1"], lost=False)  # its node is back

    hooks = Recorder(watch=lose_then_restore)
    result = _train_dp_losing_the_t4(
        pool,
        cache_dir,
        tmp_path,
        "back",
        hooks=hooks,
        replan=lambda lost: slower if "a/1" in lost else DP,
    )
    assert result.losses == pytest.approx(reference, rel=1e-4)
    (recovery,) = hooks.recoveries
    assert recovery.lost == ("a/1",)
    (back,) = hooks.replans
    assert back.step == 5 and back.reason.startswith("a/1 came back")  # checkpoint after step 5
    assert back.new_plan == DP and [d.id for d in result.devices] == ["a/0", "a/1", "a/2"]


def test_more_failures_than_allowed_fail_the_job_naming_them(pool, cache_dir, tmp_path) -> None:
    def kill_every_time(metrics) -> None:
        os.kill(pool.pids()["a/2"], signal.SIGKILL)

    with pytest.raises(WorkerError, match=r"^2 failures, more than max_failures 1: step 1: a/2"):
        train(
            _job(cache_dir),
            DP,
            pool=pool,
            config=_durable(tmp_path, "many", max_failures=1),
            hooks=Recorder(watch=kill_every_time),
        )
