"""Errors raised by the workers: one line naming the device and the numbers."""

from __future__ import annotations

from scheduler.errors import HetschedError
from scheduler.units import format_bytes


class WorkerError(HetschedError):
    """A device failed during profiling or training (OOM, crash, lost actor).

    The message is one line naming the device, e.g.
    ``node-b/1: out of memory: micro-batch 6 needs 31.2 MB, capacity 24.0 MB``.
    """


class RecurringFailure(WorkerError):
    """A failure a retry would meet again: the plan, data, checkpoint or model is at fault,
    not a device (out of memory for the plan, a diverged loss, a dataset a worker rejects).

    A job never recovers from one (:mod:`workers.run.failures`).
    """


class DeviceOutOfMemory(RuntimeError):
    """A micro-batch needs more memory than the device has, as CUDA's OOM error says.

    Raised inside a device's actor; crosses Ray intact (``__reduce__``) so the
    driver can report the numbers.
    """

    def __init__(self, device_id: str, micro_batch: int, need_bytes: int, capacity_bytes: int):
        self.device_id = device_id
        self.micro_batch = micro_batch
        self.need_bytes = need_bytes
        self.capacity_bytes = capacity_bytes
        super().__init__(
            f"{device_id}: out of memory: micro-batch {micro_batch} needs "
            f"{format_bytes(need_bytes)}, capacity {format_bytes(capacity_bytes)}"
        )

    def __reduce__(self) -> tuple[type, tuple[str, int, int, int]]:
        return (
            DeviceOutOfMemory,
            (self.device_id, self.micro_batch, self.need_bytes, self.capacity_bytes),
        )
