"""Devices: where a micro-batch runs, how long it takes and what memory it needs.

One abstraction, two kinds (DESIGN.md, "Simulated devices"):

- :class:`CudaDevice`, a real GPU: time from CUDA events around forward and
  backward, memory from the caching allocator's peak, the usable budget
  what the driver reports free less NCCL's reserve and a fragmentation
  margin (:func:`scheduler.capacity.gpu_budget_bytes`).
- :class:`SimulatedDevice`, a GPU emulated on the CPU: the real forward and
  backward run, then the device sleeps out the rest of its *target* time
  ``K · (speed_max / speed_i) · t_host(m)``, where ``t_host(m) = fixed +
  m · per_sample`` is this host's uncontended forward+backward time, fitted
  once (:func:`workers.calibration.calibrate_host`), and ``K`` is a contention
  margin so that several actors sharing few cores still finish their real
  compute inside the target. Memory is counted: model states (weights,
  gradients, AdamW's two moments, all fp32) plus every tensor autograd saves
  for backward (``torch.autograd.graph.saved_tensors_hooks``), each storage
  once and parameters excluded. A micro-batch over ``memory_gb ×
  memory_scale`` raises :class:`DeviceOutOfMemory`, as CUDA would.

Speed is the catalogue's peak dense TFLOP/s (``Device.peak_tflops``).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from scheduler.capacity import gpu_budget_bytes, simulated_budget_bytes
from scheduler.cluster import Cluster, Device
from workers.errors import DeviceOutOfMemory

POLL_S = 0.001
"""How often a pacing simulated device polls its ``while_paced`` work."""
MODEL_STATE_COPIES = 4
"""Weights, gradients and AdamW's exp_avg and exp_avg_sq, all in fp32."""


@dataclass(frozen=True, kw_only=True, slots=True)
class HostCalibration:
    """This host's uncontended, single-thread forward+backward time of one model."""

    fixed_s: float
    per_sample_s: float

    def time_s(self, micro_batch: int) -> float:
        return self.fixed_s + micro_batch * self.per_sample_s


@dataclass(frozen=True, kw_only=True, slots=True)
class Pacing:
    """How a simulated device stretches host time into its GPU's time."""

    margin: float
    """Contention margin ``K``: host time is multiplied by it even on the fastest device."""
    speed_ratio: float
    """``speed_max / speed_i`` over the cluster's devices (>= 1)."""
    host: HostCalibration

    @property
    def slowdown(self) -> float:
        return self.margin * self.speed_ratio

    def target_s(self, micro_batch: int) -> float:
        return self.slowdown * self.host.time_s(micro_batch)


def default_margin(num_devices: int, num_cpus: int) -> float:
    """Contention margin ``K``: two simulated devices per core get 4, at least 2.5.

    DESIGN.md finds 2–3 enough for four actors on two otherwise idle cores;
    the extra keeps the fastest devices on pace while other processes share
    the machine (measured: at 3, a busy 2-core host made them overrun).

    >>> default_margin(4, 2)
    4.0
    >>> default_margin(2, 8)
    2.5
    """
    return max(2.5, 2.0 * num_devices / max(num_cpus, 1))


def speed_ratio(cluster: Cluster, device: Device) -> float:
    fastest = max(d.peak_tflops for d in cluster.devices)
    return fastest / device.peak_tflops


def simulated_capacity_bytes(cluster: Cluster, device: Device) -> int:
    return simulated_budget_bytes(device.memory_bytes, cluster.simulation.memory_scale)


@dataclass(frozen=True, kw_only=True, slots=True)
class MicroBatchResult:
    busy_s: float
    """Device time of forward+backward (paced time on a simulated device)."""
    peak_bytes: int
    """Model states plus this micro-batch's activations."""
    overran: bool = False
    """A simulated device's real compute took longer than its target (host contention):
    its time is then the host's, not the emulated GPU's."""


def model_state_bytes(model: nn.Module) -> int:
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return MODEL_STATE_COPIES * params


class TorchDevice(ABC):
    """Runs micro-batches: forward, memory check, backward, then an optional hook."""

    id: str
    capacity_bytes: int
    torch_device: torch.device

    @abstractmethod
    def run_micro_batch(
        self,
        forward: Callable[[], torch.Tensor],
        *,
        model: nn.Module,
        micro_batch: int,
        after_backward: Callable[[], None] | None = None,
        while_paced: Callable[[], bool] | None = None,
    ) -> MicroBatchResult:
        """``forward()`` returns the scaled loss; backward is run here.

        ``after_backward`` runs as soon as the gradients exist (to start the
        all-reduce) and before a simulated device sleeps out its pacing, so
        communication overlaps the rest of the device's time. ``while_paced``
        is polled every millisecond or so while a simulated device sleeps out
        its pacing, until it returns True: host work the emulated GPU would do
        in no time (the optimizer step of a tiny model) then hides in the
        pacing as the forward and backward passes do. Real devices ignore it.
        """

    def _oom(self, micro_batch: int, need_bytes: int) -> DeviceOutOfMemory:
        return DeviceOutOfMemory(self.id, micro_batch, need_bytes, self.capacity_bytes)


class _SavedBytes:
    """Counts bytes autograd saves for backward, each storage once, parameters excluded."""

    def __init__(self, model: nn.Module) -> None:
        self.skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.seen: set[int] = set()
        self.bytes = 0

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in self.skip and key not in self.seen:
            self.seen.add(key)
            self.bytes += storage.nbytes()
        return tensor

    @staticmethod
    def unpack(tensor: torch.Tensor) -> torch.Tensor:
        return tensor


class SimulatedDevice(TorchDevice):
    def __init__(self, *, device_id: str, capacity_bytes: int, pacing: Pacing) -> None:
        self.id = device_id
        self.capacity_bytes = capacity_bytes
        self.pacing = pacing
        self.torch_device = torch.device("cpu")

    def run_micro_batch(
        self,
        forward: Callable[[], torch.Tensor],
        *,
        model: nn.Module,
        micro_batch: int,
        after_backward: Callable[[], None] | None = None,
        while_paced: Callable[[], bool] | None = None,
    ) -> MicroBatchResult:
        start = time.perf_counter()
        saved = _SavedBytes(model)
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            loss = forward()
        need = model_state_bytes(model) + saved.bytes
        if need > self.capacity_bytes:
            raise self._oom(micro_batch, need)
        loss.backward()
        if after_backward is not None:
            after_backward()
        deadline = start + self.pacing.target_s(micro_batch)
        overran = time.perf_counter() >= deadline
        while (remaining := deadline - time.perf_counter()) > 0:
            if while_paced is not None and while_paced():
                while_paced = None
                continue
            time.sleep(remaining if while_paced is None else min(remaining, POLL_S))
        return MicroBatchResult(
            busy_s=time.perf_counter() - start, peak_bytes=need, overran=overran
        )


class CudaDevice(TorchDevice):
    """A real GPU; the actor sees it as ``cuda:index`` (Ray sets CUDA_VISIBLE_DEVICES)."""

    def __init__(self, *, device_id: str, index: int = 0) -> None:
        self.id = device_id
        self.torch_device = torch.device("cuda", index)
        free_bytes, _total = torch.cuda.mem_get_info(self.torch_device)
        self.capacity_bytes = gpu_budget_bytes(free_bytes)

    def run_micro_batch(
        self,
        forward: Callable[[], torch.Tensor],
        *,
        model: nn.Module,
        micro_batch: int,
        after_backward: Callable[[], None] | None = None,
        while_paced: Callable[[], bool] | None = None,
    ) -> MicroBatchResult:
        torch.cuda.reset_peak_memory_stats(self.torch_device)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        try:
            loss = forward()
            loss.backward()
        except torch.cuda.OutOfMemoryError as exc:
            reserved = torch.cuda.memory_reserved(self.torch_device)
            raise self._oom(micro_batch, max(reserved, self.capacity_bytes + 1)) from exc
        end.record()
        if after_backward is not None:
            after_backward()
        end.synchronize()
        peak = int(torch.cuda.max_memory_allocated(self.torch_device))
        if peak > self.capacity_bytes:
            raise self._oom(micro_batch, peak)
        return MicroBatchResult(busy_s=start.elapsed_time(end) / 1000.0, peak_bytes=peak)
