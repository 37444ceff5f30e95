"""Process groups: formed and destroyed in one place for every runtime and the profiler.

As Ray Train's torch backend does: rank 0 names an address and a free port on
its node (:func:`free_port`), every rank joins with :func:`join_group`, and
:func:`leave_group` destroys what the rank joined. A warm worker keeps its
group between runs: the next run on the same devices, ranks in the same
order, reuses it (:func:`workers.run.driver.form_group`), any other run's
:func:`join_group` leaves it first. The backend follows the device: gloo on the CPU (the
simulation), nccl on CUDA. With nccl the default group is bound to the
rank's GPU (``device_id``), which makes NCCL create communicators eagerly,
at setup, for the default group and for every subgroup split from it; lazy
creation on first use blocks until every member arrives, which deadlocks a
pipeline whose ranks reach their first collective at different times.
"""

from __future__ import annotations

import contextlib
import socket
from datetime import timedelta

import ray
import torch
import torch.distributed as dist

COLLECTIVE_TIMEOUT_S = 120.0
"""torch.distributed's own timeout on a collective; the driver's step timeout
(:func:`workers.run.driver.step_timeout_s`) usually ends a stuck run first."""


def backend_for(device: torch.device) -> str:
    """``nccl`` for CUDA devices, ``gloo`` otherwise."""
    return "nccl" if device.type == "cuda" else "gloo"


def free_port() -> tuple[str, int]:
    """An address of this node and a free TCP port on it (rank 0's rendezvous)."""
    host = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return host, int(sock.getsockname()[1])


def join_group(
    *,
    device: torch.device,
    master_addr: str,
    master_port: int,
    rank: int,
    world_size: int,
    timeout_s: float = COLLECTIVE_TIMEOUT_S,
) -> None:
    """Join the job's default process group (leaving any earlier one first)."""
    leave_group()
    backend = backend_for(device)
    dist.init_process_group(
        backend,
        init_method=f"tcp://{master_addr}:{master_port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
        device_id=device if backend == "nccl" else None,
    )


def new_group(ranks: list[int]) -> dist.ProcessGroup:
    """A subgroup; every rank of the default group must call this, in one order."""
    group = dist.new_group(ranks)
    assert group is not None
    return group


def leave_group() -> None:
    """Destroy this process's groups; safe to call when there are none."""
    if dist.is_initialized():
        with contextlib.suppress(Exception):  # a peer that died must not stop the cleanup
            dist.destroy_process_group()
