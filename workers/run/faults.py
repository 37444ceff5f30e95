"""Fault injection on a simulated cluster: the schedule of ``simulation.faults``, done for real.

:class:`FaultInjector` carries out a :class:`scheduler.hardware.faults.FaultSchedule`
at step boundaries of a run: ``crash`` kills the device's worker process
(``ray.kill``, a real process death the job must survive), ``lost`` takes the
device out of the pool and kills its worker, ``restore`` brings a lost
device back and ends a slow-down, and ``slow`` stretches the simulated
device's pacing by its factor. Each crash, loss and restore fires once per
job, so the steps a recovery runs again do not crash again. When the job
ends, what it injected is undone, so the next job finds the devices whole.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import ray

from scheduler.hardware.faults import Fault, FaultSchedule
from workers.cluster.actors import gather
from workers.cluster.pool import WorkerPool

SET_TIMEOUT_S = 60.0


class FaultInjector:
    def __init__(self, schedule: FaultSchedule, pool: WorkerPool) -> None:
        self.schedule = schedule
        self.pool = pool
        self._fired: set[Fault] = set()
        self._sent: dict[str, float] = {}

    def start_run(self) -> None:
        """A run starts on fresh or re-joined workers: every slow-down is sent again."""
        self._sent = {}

    def finish(self) -> None:
        """The job ended: the devices it slowed are back at their own speed."""
        for device_id, factor in self._sent.items():
            if factor != 1.0 and device_id not in self.pool.lost():
                self.pool.set_slowdown(device_id, 1.0)
        for fault in self._fired:
            if fault.kind == "lost":
                self.pool.mark_lost([fault.device], lost=False)

    def before_step(self, step: int, actors: Sequence[Any], ids: Sequence[str]) -> None:
        for fault in self.schedule.firing(step):
            if fault in self._fired or fault.kind == "slow":
                continue
            self._fired.add(fault)
            if fault.kind == "lost":
                self.pool.mark_lost([fault.device])
            elif fault.kind == "restore":
                self.pool.mark_lost([fault.device], lost=False)
            elif fault.kind == "crash" and fault.device in ids:
                with contextlib.suppress(Exception):  # already gone is fine
                    ray.kill(actors[list(ids).index(fault.device)], no_restart=True)
        changed = []
        for actor, device_id in zip(actors, ids, strict=True):
            factor = self.schedule.slowdown(device_id, step)
            if self._sent.get(device_id, 1.0) != factor:
                changed.append((actor, device_id, factor))
        if changed:
            gather(
                [a.set_slowdown.remote(f) for a, _, f in changed],
                [d for _, d, _ in changed],
                timeout_s=SET_TIMEOUT_S,
                what="slow-down",
            )
            self._sent.update({d: f for _, d, f in changed})
