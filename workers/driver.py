"""The driver's side of a training run, shared by the data-parallel and pipeline runtimes.

Both runtimes spawn one actor per device whose ``rendezvous()`` (rank 0
only) returns an address and free port on its node, whose ``setup(addr,
port)`` joins the job's process group, whose ``step(t)`` runs global step
``t`` in lockstep and returns ``{"loss", "busy_s", "wait_s", "peak_bytes"}``,
and whose ``shutdown()`` destroys the group. This module forms the group,
drives the steps (``should_stop`` between steps, each step to ``on_step``),
and turns the history into a :class:`TrainResult`. Keeping the loop in one
place lets resume-from-checkpoint and re-planning be added once for both.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from scheduler.plan import Plan
from workers.actors import gather
from workers.errors import WorkerError
from workers.records import DeviceStep, StepMetrics, TrainResult, median_devices

SETUP_TIMEOUT_S = 180.0
"""Actor start-up and process-group formation, generous for a loaded host."""
SHUTDOWN_TIMEOUT_S = 30.0


def step_timeout_s(plan: Plan) -> float:
    """Generous bound on one step: a slow step is fine, a hung one is an error."""
    return max(60.0, 20.0 * plan.predicted_step_s)


def form_group(actors: Sequence[Any], ids: Sequence[str]) -> None:
    """Hand rank 0's address and port to every actor and join the process group."""
    addr, port = gather(
        [actors[0].rendezvous.remote()], ids[:1], timeout_s=SETUP_TIMEOUT_S, what="rendezvous"
    )[0]
    gather(
        [a.setup.remote(addr, port) for a in actors],
        ids,
        timeout_s=SETUP_TIMEOUT_S,
        what="process-group setup",
    )


def run_steps(
    actors: Sequence[Any],
    ids: Sequence[str],
    *,
    plan: Plan,
    steps: int,
    start_step: int = 0,
    on_step: Callable[[StepMetrics], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[list[StepMetrics], bool]:
    """Run steps ``start_step …`` in lockstep; returns the history and whether it was stopped."""
    history: list[StepMetrics] = []
    timeout = step_timeout_s(plan)
    for step in range(start_step, start_step + steps):
        if should_stop is not None and should_stop():
            return history, True
        begin = time.perf_counter()
        out = gather(
            [a.step.remote(step) for a in actors], ids, timeout_s=timeout, what=f"step {step}"
        )
        step_s = time.perf_counter() - begin
        loss = out[0]["loss"]
        if not math.isfinite(loss):
            raise WorkerError(f"{ids[0]}: loss became {loss} at step {step} (diverged)")
        metrics = StepMetrics(
            step=step,
            loss=loss,
            step_s=step_s,
            samples_per_s=plan.global_batch / step_s,
            devices=tuple(
                DeviceStep(
                    id=i, busy_s=o["busy_s"], wait_s=o["wait_s"], peak_bytes=int(o["peak_bytes"])
                )
                for i, o in zip(ids, out, strict=True)
            ),
        )
        history.append(metrics)
        if on_step is not None:
            on_step(metrics)
    return history, False


def shut_down(actors: Sequence[Any], ids: Sequence[str]) -> None:
    """Destroy the process groups; the run's results stand even if this fails
    (the caller kills the actors afterwards anyway)."""
    with contextlib.suppress(WorkerError):
        gather(
            [a.shutdown.remote() for a in actors],
            ids,
            timeout_s=SHUTDOWN_TIMEOUT_S,
            what="shutdown",
        )


def train_result(
    history: list[StepMetrics], *, stopped: bool, state: dict[str, Any] | None
) -> TrainResult:
    return TrainResult(
        steps_done=len(history),
        losses=[m.loss for m in history],
        step_times_s=[m.step_s for m in history],
        devices=median_devices(history),
        stopped=stopped,
        state=state,
    )
