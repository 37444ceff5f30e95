"""The embedded local Ray's processes: recorded in the data directory, stopped with the service.

``ray.shutdown()`` kills the raylet outright, and Ray's dashboard and
runtime-env agents (the raylet's children) then outlive it, re-parented to
init; a service killed with -9 leaves them too. So the service that starts
a local Ray writes down every process of that Ray (pid and start time, so a
reused pid is never mistaken for it) in ``<data_dir>/ray-processes.json``,
stops the whole tree itself when it stops, and on its next start ends what
a predecessor recorded and could not stop. Only processes recorded by this
data directory's service are touched, never another Ray on the machine.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil  # type: ignore[import-untyped]

log = logging.getLogger("hetsched.ray")
RECORD_NAME = "ray-processes.json"
GRACE_S = 3.0
"""How long a process has to exit after SIGTERM before it gets SIGKILL."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RayProcess:
    pid: int
    create_time: float
    """psutil's start time: with the pid, it names one process for good."""
    name: str


def _describe(process: psutil.Process) -> RayProcess | None:
    try:
        return RayProcess(pid=process.pid, create_time=process.create_time(), name=process.name())
    except psutil.Error:
        return None


def own_ray_processes() -> list[RayProcess]:
    """Every descendant of this process: right after ``ray.init``, that is the local Ray
    (GCS, raylet, monitors, API server, agents, workers); the service starts no others."""
    children = psutil.Process(os.getpid()).children(recursive=True)
    return [p for p in (_describe(c) for c in children) if p is not None]


def _alive(recorded: RayProcess) -> psutil.Process | None:
    try:
        process = psutil.Process(recorded.pid)
        if abs(process.create_time() - recorded.create_time) > 0.01:
            return None  # the pid was reused by another process
        return process if process.is_running() else None
    except psutil.Error:
        return None


def _with_descendants(processes: list[psutil.Process]) -> list[psutil.Process]:
    found = {p.pid: p for p in processes}
    for process in processes:
        try:
            found.update({c.pid: c for c in process.children(recursive=True)})
        except psutil.Error:
            continue
    return list(found.values())


def terminate(processes: list[psutil.Process]) -> int:
    """SIGTERM, then SIGKILL whatever is left after :data:`GRACE_S`; how many were alive."""
    alive = [p for p in processes if p.is_running()]
    for process in alive:
        try:
            process.terminate()
        except psutil.Error:
            continue
    _gone, left = psutil.wait_procs(alive, timeout=GRACE_S)
    for process in left:
        try:
            process.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(left, timeout=GRACE_S)
    return len(alive)


class LocalRaySession:
    """The record of one data directory's local Ray: write at start, reap, stop."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / RECORD_NAME

    def reap_predecessor(self) -> int:
        """End what a previous service on this data directory left running; how many."""
        if not self.path.exists():
            return 0
        try:
            document = json.loads(self.path.read_text())
            recorded = [RayProcess(**p) for p in document["processes"]]
            service = RayProcess(**document["service"])
        except (OSError, ValueError, TypeError, KeyError):
            log.warning("ignoring unreadable %s", self.path)
            self.path.unlink(missing_ok=True)
            return 0
        if _alive(service) is not None:
            log.warning(
                "another service (pid %d) still runs on this data directory; leaving its Ray alone",
                service.pid,
            )
            return 0
        alive = [p for p in (_alive(r) for r in recorded) if p is not None]
        count = terminate(_with_descendants(alive)) if alive else 0
        if count:
            log.warning("stopped %d Ray process(es) left by a previous service", count)
        self.path.unlink(missing_ok=True)
        return count

    def record(self) -> list[RayProcess]:
        """Write down this process's Ray processes (call right after ``ray.init``)."""
        processes = own_ray_processes()
        service = _describe(psutil.Process(os.getpid()))
        document = {
            "service": asdict(service) if service else None,
            "processes": [asdict(p) for p in processes],
        }
        self.path.write_text(json.dumps(document))
        return processes

    def stop(self) -> int:
        """``ray.shutdown()`` and end every process of this Ray it leaves; how many were left."""
        import ray  # only a service that started Ray gets here; others never import it

        tree = psutil.Process(os.getpid()).children(recursive=True)
        ray.shutdown()
        count = terminate(tree)
        self.path.unlink(missing_ok=True)
        return count
