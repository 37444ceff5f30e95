"""The warm worker pool: one device actor per device, started once, reused by every job.

Starting a Ray actor costs seconds (a process, torch's import, the first
allocation), far more than a small job's first step: hence :class:`WorkerPool`.
A service keeps one pool for its lifetime; ``hetsched simulate`` one per command;
:func:`workers.session.train` without a pool uses a temporary one.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from scheduler.hardware.cluster import Cluster
from workers.cluster.actors import actor_options, device_resource, gather
from workers.cluster.placement import live_nodes, resolve, selector_of
from workers.errors import WorkerError
from workers.runtime.worker import DeviceWorker

PING_TIMEOUT_S = 10.0
"""How long a pooled actor may take to answer before it is replaced."""
START_TIMEOUT_S = 180.0
"""A fresh actor's start (process, torch import), generous for a loaded host."""
SALVAGE_TIMEOUT_S = 10.0
"""How long a worker of a failed run may take to leave it before it is replaced."""


class WorkerPool:
    """Warm device actors of one cluster: owns one live actor per device, or none.

    The pool keeps one :class:`~workers.runtime.worker.DeviceWorker` per device and
    hands the live ones to each run; a run joins them into its own process group and
    leaves it when it ends. After a failed run the workers that can leave it cleanly
    stay warm (:meth:`WorkerPool.salvage`); an actor that died (a crash, a killed
    process, a lost node) or is stuck in a collective is killed and started again on the
    next :meth:`WorkerPool.acquire`.

    Placement: a device of the embedded local Ray lands by its ``hetsched:``
    resource (:func:`workers.cluster.actors.actor_options`); a device whose spec node
    names a Ray node (``ray_node``, a simulated cluster on an external Ray), or
    a real GPU, is pinned to the Ray node that name matches now
    (:mod:`workers.cluster.placement`). Such a device is lost while no live node
    matches it, and back once one does.
    """

    def __init__(self, cluster: Cluster, *, simulated: bool) -> None:
        self.cluster = cluster
        self.simulated = simulated
        self._actors: dict[str, Any] = {}
        self._lost: set[str] = set()
        self._lock = threading.Lock()
        self._remote = ray.remote(DeviceWorker)

    def acquire(self, device_ids: Sequence[str]) -> list[Any]:
        """Live actors for ``device_ids``, in order; dead or missing ones are started."""
        gone = sorted(set(device_ids) & self.lost())
        if gone:
            raise WorkerError(f"{', '.join(gone)}: device lost (its node is gone or it was failed)")
        with self._lock:
            known = [d for d in device_ids if d in self._actors]
            if known:
                self._drop_dead(known)
            for device_id in device_ids:
                if device_id not in self._actors:
                    self._actors[device_id] = self._spawn(device_id)
            actors = [self._actors[d] for d in device_ids]
        # A fresh actor answers once torch is imported: the run's setup then starts warm.
        gather(
            [a.pid.remote() for a in actors], device_ids, timeout_s=START_TIMEOUT_S, what="start"
        )
        return actors

    def warm(self, device_ids: Sequence[str] | None = None) -> None:
        """Start the actors of ``device_ids`` (all devices) now, ahead of the first job."""
        self.acquire(list(device_ids) if device_ids is not None else self.cluster.ids)

    def lost(self, *, probe: bool = False) -> set[str]:
        """Devices that cannot be used: marked lost, or placed on a Ray node (by name)
        that no live node answers to now (``probe``: whose raylet answers now,
        :func:`workers.cluster.placement.live_nodes`)."""
        named = self._placed_by_name(self.cluster.ids)
        gone: set[str] = set()
        if named:
            nodes = live_nodes(probe=probe)
            gone = {d for d, s in named.items() if not any(n.answers_to(s) for n in nodes)}
        with self._lock:
            return set(self._lost) | gone

    def mark_lost(self, device_ids: Sequence[str], lost: bool = True) -> None:
        """Take devices out of service (a simulated fault), or bring them back."""
        with self._lock:
            if lost:
                self._lost.update(device_ids)
            else:
                self._lost.difference_update(device_ids)
        if lost:
            self.discard(device_ids)

    def crash(self, device_id: str) -> None:
        """Kill the device's worker process now, as a crash would (fault injection)."""
        with self._lock:
            actor = self._actors.get(device_id)
        if actor is not None:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)

    def set_slowdown(self, device_id: str, factor: float) -> None:
        """Make a simulated device ``factor`` times slower (1.0: its own speed again)."""
        actor = self.acquire([device_id])[0]
        gather(
            [actor.set_slowdown.remote(factor)],
            [device_id],
            timeout_s=PING_TIMEOUT_S,
            what="slow-down",
        )

    def discard(self, device_ids: Sequence[str]) -> None:
        """Kill these actors; the next acquire starts new ones."""
        with self._lock:
            for device_id in device_ids:
                actor = self._actors.pop(device_id, None)
                if actor is not None:
                    with contextlib.suppress(Exception):  # already gone is fine
                        ray.kill(actor, no_restart=True)

    def salvage(self, device_ids: Sequence[str], timeout_s: float = SALVAGE_TIMEOUT_S) -> None:
        """After a failed run: keep the workers that leave it cleanly, replace the others.

        A worker whose peer died got an error from its collective and answers at
        once; it drops the run's engine and process group and stays warm, so a
        recovery does not wait for every process to start again. One that is
        dead, or still stuck in a collective past ``timeout_s``, is killed.
        """
        with self._lock:
            actors = {d: self._actors[d] for d in device_ids if d in self._actors}
        calls = {d: a.abandon.remote() for d, a in actors.items()}
        if not calls:
            return
        ready, _ = ray.wait(list(calls.values()), num_returns=len(calls), timeout=timeout_s)
        gone = []
        for device_id, call in calls.items():
            try:
                if call not in ready:
                    raise TimeoutError
                ray.get(call, timeout=0)
            except Exception:  # dead, stuck, or its cleanup failed
                gone.append(device_id)
        self.discard(gone)

    def pids(self) -> dict[str, int]:
        """Process id of each live pooled actor (for operators and tests)."""
        with self._lock:
            items = list(self._actors.items())
        return dict(
            zip(
                [d for d, _ in items],
                gather(
                    [a.pid.remote() for _, a in items],
                    [d for d, _ in items],
                    timeout_s=PING_TIMEOUT_S,
                    what="pid",
                ),
                strict=True,
            )
        )

    def shutdown(self) -> None:
        with self._lock:
            ids = list(self._actors)
        self.discard(ids)

    def _spawn(self, device_id: str) -> Any:
        device = self.cluster.device(device_id)
        options = actor_options(device, simulated=self.simulated)
        selector = self._placed_by_name([device_id]).get(device_id)
        if self.simulated and selector is not None:
            node = resolve(selector, live_nodes(), where=device_id)
            if node is None:
                raise WorkerError(f"{device_id}: device lost (no live Ray node is {selector!r})")
            options.pop("resources", None)
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                node.node_id, soft=False
            )
        return self._remote.options(**options).remote(
            device_id, simulated=self.simulated, gpu_index=None if self.simulated else device.index
        )

    def _placed_by_name(self, device_ids: Sequence[str]) -> dict[str, str]:
        """Device id -> the Ray node name that places it, for those placed by name
        (a local Ray's own ``hetsched:`` resources win over a spec's ``ray_node``)."""
        named = {
            d: s
            for d in device_ids
            if (s := selector_of(self.cluster.device(d), simulated=self.simulated)) is not None
        }
        if not named or not self.simulated:
            return named
        resources = ray.cluster_resources()
        return {d: s for d, s in named.items() if device_resource(d) not in resources}

    def _drop_dead(self, device_ids: list[str]) -> None:
        refs = {self._actors[d].pid.remote(): d for d in device_ids}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=PING_TIMEOUT_S)
        alive = set()
        for ref in ready:
            with contextlib.suppress(Exception):
                ray.get(ref, timeout=0)
                alive.add(refs[ref])
        for device_id in device_ids:
            if device_id not in alive:
                actor = self._actors.pop(device_id)
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)
