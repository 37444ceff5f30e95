"""What a job does when a run fails: recover from the last checkpoint, or give up.

Decided from the error's type (as Ray Train's ``FailureDecision``), never from its
message: :class:`~workers.errors.RecurringFailure` (out of memory for the plan, a
diverged loss, a dataset, checkpoint or plan a worker rejects) would meet a retry
again; any other :class:`~workers.errors.WorkerError` (a dead worker, a lost node,
a collective that timed out) is recovered from, within the job's failure budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from workers.errors import RecurringFailure, WorkerError


class FailureAction(StrEnum):
    RETRY = "retry"
    """Re-plan on the devices still usable and go on from the last checkpoint."""
    RAISE = "raise"
    """The error itself ends the job: it would recur, or there is nothing to recover from."""
    GIVE_UP = "give_up"
    """The failure budget is spent: the job ends with an error listing every failure."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FailureDecision:
    action: FailureAction
    reason: str
    """One line: why (for ``GIVE_UP``, the message of the error the job ends with)."""


class FailurePolicy:
    """Owns a job's failure budget and the failures it was spent on.

    >>> policy = FailurePolicy(max_failures=1, durable=True)
    >>> policy.decide(WorkerError("a/1: worker process died"), step=3).action
    <FailureAction.RETRY: 'retry'>
    >>> policy.decide(WorkerError("a/1: lost"), step=5).reason
    '2 failures, more than max_failures 1: step 3: a/1: worker process died; step 5: a/1: lost'
    """

    def __init__(self, *, max_failures: int, durable: bool) -> None:
        self.max_failures = max_failures
        self.durable = durable
        """There are checkpoints to recover from."""
        self.failures: list[str] = []

    def decide(self, error: WorkerError, *, step: int) -> FailureDecision:
        """What to do about ``error``, which ended the run at ``step``."""
        if isinstance(error, RecurringFailure):
            return FailureDecision(action=FailureAction.RAISE, reason="a retry would meet it again")
        if not self.durable:
            return FailureDecision(action=FailureAction.RAISE, reason="no checkpointing")
        self.failures.append(f"step {step}: {error}")
        if len(self.failures) > self.max_failures:
            return FailureDecision(
                action=FailureAction.GIVE_UP,
                reason=f"{len(self.failures)} failures, more than max_failures "
                f"{self.max_failures}: " + "; ".join(self.failures),
            )
        return FailureDecision(
            action=FailureAction.RETRY,
            reason=f"failure {len(self.failures)} of at most {self.max_failures}",
        )
