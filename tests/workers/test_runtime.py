"""Data-parallel training on simulated devices: the same training whatever the split."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace
from typing import Any

import pytest
import torch

from tests.reference import single_device_training
from tests.support import MIXED_CLUSTER, TINY, manual_plan, tiny_job
from workers.models.gpt import GPT
from workers.session import (
    OptimizerConfig,
    Recorder,
    RunConfig,
    TrainJob,
    WorkerError,
    WorkerPool,
    train,
)

pytestmark = pytest.mark.usefixtures("local_ray")


def _job(cache_dir, *, steps: int, seed: int, **fields: Any) -> TrainJob:
    """gpt-tiny on this module's cluster; ``fields`` as :class:`TrainJob`'s."""
    return tiny_job(MIXED_CLUSTER, cache_dir, steps=steps, seed=seed, **fields)


def test_uneven_three_device_split_matches_single_process_training(cache_dir, mixed_pool) -> None:
    """Parameters after 4 AdamW steps of a 7/2/3 split (with accumulation) equal full batch."""
    plan = manual_plan([("a/0", 7, 4), ("a/1", 2, 1), ("a/2", 3, 3)])
    result = train(
        _job(cache_dir, steps=4, seed=5, dtype="float64"),
        plan,
        pool=mixed_pool,
        config=RunConfig(keep_state=True),
    )
    assert result.steps_done == 4 and result.state is not None
    model = GPT(TINY, seed=5).double()
    model.load_state_dict(result.state["model"])
    got = torch.cat([p.detach().flatten() for p in model.parameters()])
    reference, _ = single_device_training(
        TINY, OptimizerConfig(), seed=5, steps=4, global_batch=12, dtype=torch.float64
    )
    want = torch.cat([p.detach().flatten() for p in reference.parameters()])
    assert (got - want).abs().max().item() < 1e-5


def test_dp_and_even_splits_give_the_same_loss_curve(cache_dir, mixed_pool) -> None:
    uneven = manual_plan([("a/0", 8, 8), ("a/1", 1, 1), ("a/2", 3, 2)], strategy="dp")
    even = manual_plan([("a/0", 4, 4), ("a/1", 4, 2), ("a/2", 4, 4)], strategy="even")
    job = _job(cache_dir, steps=3, seed=11)
    a = train(job, uneven, pool=mixed_pool)
    b = train(job, even, pool=mixed_pool)
    assert a.losses == pytest.approx(b.losses, rel=1e-4, abs=1e-5)
    assert a.losses[0] > a.losses[-1]  # training happened, not a constant
    assert [d.id for d in a.devices] == ["a/0", "a/1", "a/2"]
    assert all(d.peak_bytes > 0 and d.busy_s > 0 for d in a.devices)


def test_micro_batch_over_capacity_raises_oom_naming_the_device(cache_dir, mixed_pool) -> None:
    """The T4 here has 16 GiB × 0.01 = 172 MB; 200 samples in one micro-batch do not fit."""
    plan = manual_plan([("a/0", 2, 2), ("a/1", 200, 200)])
    start = time.monotonic()
    with pytest.raises(
        WorkerError,
        match=r"^a/1: out of memory: micro-batch 200 needs [\d.]+ MB, "
        r"capacity 171\.8 MB$",
    ):
        train(_job(cache_dir, steps=2, seed=0), plan, pool=mixed_pool)
    assert time.monotonic() - start < 90


def test_warm_workers_serve_runs_and_a_killed_one_fails_its_run_and_is_replaced(
    cache_dir,
) -> None:
    """Runs reuse the pool's processes; SIGKILL of one ends that run in bounded time with an
    error naming the device, and the next run gets a fresh worker for it."""
    plan = manual_plan([("a/0", 4, 4), ("a/1", 2, 2), ("a/2", 2, 2)])
    pool = WorkerPool(MIXED_CLUSTER, simulated=True)
    try:
        job = _job(cache_dir, steps=2, seed=0)
        first = train(job, plan, pool=pool)
        pids = pool.pids()
        assert first.steps_done == 2 and set(pids) == {"a/0", "a/1", "a/2"}

        def kill_the_t4(metrics) -> None:
            if metrics.step == 1:
                os.kill(pids["a/1"], signal.SIGKILL)

        start = time.monotonic()
        with pytest.raises(WorkerError, match=r"^a/1: worker process died"):
            train(replace(job, steps=50), plan, pool=pool, hooks=Recorder(watch=kill_the_t4))
        assert time.monotonic() - start < 120

        again = train(job, plan, pool=pool)
        assert again.losses == pytest.approx(first.losses, rel=1e-5)
        assert pool.pids()["a/1"] != pids["a/1"]
    finally:
        pool.shutdown()


def test_loss_really_falls_and_should_stop_ends_the_run_between_steps(
    cache_dir, mixed_pool
) -> None:
    plan = manual_plan([("a/0", 12, 12), ("a/2", 4, 4)])

    class StopAt30(Recorder):
        def should_stop(self) -> bool:
            return len(self.steps) >= 30

    hooks = StopAt30()
    result = train(
        _job(cache_dir, steps=1000, seed=1, optimizer=OptimizerConfig(lr=1e-2)),
        plan,
        pool=mixed_pool,
        hooks=hooks,
    )
    assert result.stopped and result.steps_done == 30 and len(result.losses) == 30
    assert [m.step for m in hooks.steps] == list(range(30))
    first, last = result.losses[0], sum(result.losses[-5:]) / 5
    assert first == pytest.approx(5.55, abs=0.2)  # ln 256: uniform over bytes at init
    assert last < 0.7 * first, result.losses
