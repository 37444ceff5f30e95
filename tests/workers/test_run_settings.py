"""A run's settings and its failure decisions, checked without Ray or a worker."""

from __future__ import annotations

import pytest

from scheduler.errors import HetschedError
from tests.support import MIXED_CLUSTER, TINY
from workers.errors import RecurringFailure, WorkerError
from workers.run.config import Checkpointing, RunConfig, TrainJob
from workers.run.failures import FailureAction, FailurePolicy


def test_a_run_config_names_the_field_it_rejects() -> None:
    with pytest.raises(HetschedError, match=r"^max_failures: must be >= 0, got -1$"):
        RunConfig(max_failures=-1)
    with pytest.raises(HetschedError, match=r"^max_failures: 2 recoveries need checkpointing"):
        RunConfig(max_failures=2)
    with pytest.raises(HetschedError, match=r"^checkpointing.every_steps: must be >= 1, got 0$"):
        Checkpointing(root="/tmp/x", every_steps=0)
    with pytest.raises(HetschedError, match=r"^checkpointing.every_s: must be > 0, got 0.0$"):
        Checkpointing(root="/tmp/x", every_s=0.0)
    with pytest.raises(HetschedError, match=r"^checkpointing.keep_last: must be >= 1, got 0$"):
        Checkpointing(root="/tmp/x", keep_last=0)
    durable = RunConfig(checkpointing=Checkpointing(root="/tmp/x"), max_failures=2)
    assert durable.max_failures == 2 and RunConfig().checkpointing is None


def test_a_train_job_refuses_a_negative_step_count_before_any_worker_starts() -> None:
    with pytest.raises(WorkerError, match=r"^steps: must be >= 0, got -1$"):
        TrainJob(cluster=MIXED_CLUSTER, model=TINY, steps=-1, seed=0)
    assert TrainJob(cluster=MIXED_CLUSTER, model=TINY, steps=0, seed=0).steps == 0  # allowed


def test_an_error_that_would_recur_is_raised_whatever_the_budget() -> None:
    policy = FailurePolicy(max_failures=5, durable=True)
    oom = RecurringFailure("a/1: out of memory: micro-batch 6 needs 31.2 MB, capacity 24.0 MB")
    assert policy.decide(oom, step=3).action is FailureAction.RAISE
    assert policy.failures == [], "a recurring error spends no budget"
    # The type decides, not the words: a dead worker whose message says "out of memory"
    # is still recovered from.
    died = WorkerError("a/1: worker process died (actor lost: out of memory)")
    assert policy.decide(died, step=3).action is FailureAction.RETRY


def test_failures_are_retried_until_the_budget_is_spent_then_listed() -> None:
    policy = FailurePolicy(max_failures=2, durable=True)
    actions = [
        policy.decide(WorkerError(f"a/{i}: worker process died"), step=i).action for i in range(3)
    ]
    assert actions == [FailureAction.RETRY, FailureAction.RETRY, FailureAction.GIVE_UP]
    last = policy.decide(WorkerError("a/9: device lost"), step=9)
    assert last.reason.startswith("4 failures, more than max_failures 2: step 0: a/0: worker")
    assert last.reason.endswith("; step 9: a/9: device lost")


def test_without_checkpoints_nothing_is_retried() -> None:
    policy = FailurePolicy(max_failures=0, durable=False)
    decision = policy.decide(WorkerError("a/1: worker process died"), step=1)
    assert decision.action is FailureAction.RAISE and policy.failures == []


def test_what_a_worker_rejects_is_marked_recurring_when_it_crosses_ray() -> None:
    from ray.exceptions import RayActorError, RayTaskError

    from workers.cluster.actors import recurs
    from workers.errors import DeviceOutOfMemory

    def raised_in_a_worker(cause: Exception) -> RayTaskError:
        return RayTaskError("DeviceWorker.step", "Traceback ...", cause)

    assert recurs(raised_in_a_worker(DeviceOutOfMemory("a/1", 6, 31_200_000, 24_000_000)))
    assert recurs(raised_in_a_worker(HetschedError("dataset: x.bin holds no tokens")))
    assert not recurs(raised_in_a_worker(RuntimeError("gloo: connection closed by peer")))
    assert not recurs(RayActorError())
