"""Devices: where a pass runs, how long it takes and what memory it needs.

One abstraction, :class:`TorchDevice`, with a real GPU (:class:`CudaDevice`) and
one emulated on the CPU (:class:`SimulatedDevice`, DESIGN.md "Simulated devices"),
used by every runtime and by the profiler.
"""

from __future__ import annotations

import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn

from scheduler.hardware.capacity import gpu_budget_bytes
from workers.devices.pacing import FORWARD_SHARE, Pacing
from workers.errors import DeviceOutOfMemory

POLL_S = 0.001
"""How often a pacing simulated device polls its ``while_paced`` work."""
MODEL_STATE_COPIES = 4
"""Weights, gradients and AdamW's exp_avg and exp_avg_sq, all in fp32."""

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True, slots=True)
class StepUsage:
    busy_s: float
    """Device time of the step's passes (paced time on a simulated device)."""
    peak_bytes: int
    """Model states plus the activations in flight at their largest."""
    overran: bool = False
    """A simulated device's real compute took longer than a target (host contention):
    its time is then the host's, not the emulated GPU's."""
    compute_s: float = 0.0
    """A simulated device's real compute, wall time (the rest of ``busy_s`` is paced sleep)."""
    cpu_s: float = 0.0
    """The same compute's thread CPU time: well under ``compute_s``, the host starved it."""


def model_state_bytes(model: nn.Module) -> int:
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return MODEL_STATE_COPIES * params


class HeldStates(ABC):
    """What a rank's model states take on a simulated device beside the activations.

    The whole model for data parallelism and pipeline stages (:class:`WholeModel`); a
    fully-sharded rank's owned slices plus the parameters it has gathered, which come
    and go within a pass (:class:`workers.runtime.shards.ShardedModel`).
    """

    @abstractmethod
    def reset_peak(self) -> None:
        """Start a pass: the peak starts again from what is held now."""

    @abstractmethod
    def peak_bytes(self) -> int:
        """The most held at once since :meth:`reset_peak`."""

    @abstractmethod
    def holds(self, storage: torch.UntypedStorage) -> bool:
        """Whether a tensor autograd saves is one of these states (not an activation)."""


class WholeModel(HeldStates):
    """Every parameter with its gradient and AdamW's two moments, for the whole pass."""

    def __init__(self, model: nn.Module) -> None:
        self.bytes = model_state_bytes(model)
        self.storages = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def reset_peak(self) -> None:
        return None

    def peak_bytes(self) -> int:
        return self.bytes

    def holds(self, storage: torch.UntypedStorage) -> bool:
        return storage.data_ptr() in self.storages


class TorchDevice(ABC):
    """Runs forward and backward passes; times them and accounts their memory.

    A step is ``start_step()``, any interleaving of ``forward``/``backward``
    (1F1B for pipelines), then ``finish_step()`` for the device time and peak.
    """

    id: str
    capacity_bytes: int
    torch_device: torch.device

    @abstractmethod
    def start_step(self) -> None:
        """Reset the step's time, peak and activations in flight."""

    @abstractmethod
    def forward(self, fn: Callable[[], T], *, model: nn.Module, micro_batch: int) -> tuple[T, int]:
        """Run ``fn()`` (a forward pass); returns its output and the bytes it saved."""

    @abstractmethod
    def backward(
        self,
        fn: Callable[[], None],
        *,
        micro_batch: int,
        saved_bytes: int,
        after: Callable[[], None] | None = None,
        while_paced: Callable[[], bool] | None = None,
    ) -> None:
        """Run ``fn()`` (a backward pass) and release the forward's ``saved_bytes``.

        ``after`` runs as soon as the gradients exist (to start an all-reduce)
        and before a simulated device sleeps out its pacing, so communication
        overlaps the rest of the device's time. ``while_paced`` is polled about
        every millisecond while a simulated device sleeps, until it returns
        True: host work the emulated GPU would do in no time (the optimizer
        step of a tiny model) hides in the pacing. Real devices ignore it.
        """

    @abstractmethod
    def finish_step(self) -> StepUsage:
        """The step's device time and peak memory."""

    def synchronize(self) -> None:
        """Wait for the device's queued work (a no-op on the CPU)."""
        return None

    def autocast(self) -> contextlib.AbstractContextManager[object]:
        """The precision forward passes run in: fp32 here (the CPU simulation)."""
        return contextlib.nullcontext()

    def run_micro_batch(
        self,
        loss_fn: Callable[[], torch.Tensor],
        *,
        model: nn.Module,
        micro_batch: int,
    ) -> StepUsage:
        """One forward and backward of ``loss_fn()`` as a step of its own (the profiler)."""
        self.start_step()
        loss, saved = self.forward(loss_fn, model=model, micro_batch=micro_batch)
        self.backward(loss.backward, micro_batch=micro_batch, saved_bytes=saved)
        usage = self.finish_step()
        if usage.peak_bytes > self.capacity_bytes:  # a real GPU that got by past its budget
            raise self._oom(micro_batch, usage.peak_bytes)
        return usage

    def _oom(self, micro_batch: int, need_bytes: int) -> DeviceOutOfMemory:
        return DeviceOutOfMemory(self.id, micro_batch, need_bytes, self.capacity_bytes)


class SavedBytes:
    """Counts bytes autograd saves for backward, each storage once, model states excluded."""

    def __init__(self, states: HeldStates) -> None:
        self.states = states
        self.seen: set[int] = set()
        self.bytes = 0

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in self.seen and not self.states.holds(storage):
            self.seen.add(key)
            self.bytes += storage.nbytes()
        return tensor

    @staticmethod
    def unpack(tensor: torch.Tensor) -> torch.Tensor:
        return tensor


class SimulatedDevice(TorchDevice):
    """A GPU emulated on the CPU: owns the step's paced time, its overrun and its
    memory count.

    The real pass runs, then the device sleeps out the rest of its *target* time
    (:mod:`workers.devices.pacing`): a forward pass takes a third of
    ``target_s(m)``, a backward two thirds, and a pass that overran its target
    (host contention, a late wake-up) is paid back by the following passes of the
    step. Memory is counted: model states (weights, gradients, AdamW's two
    moments, all fp32; :attr:`states` when a sharded engine sets it, else the
    model's) plus every tensor autograd saves for backward (:class:`SavedBytes`),
    summed over the micro-batches in flight. A pass over the capacity raises
    :class:`DeviceOutOfMemory`, as CUDA would: a forward at its end; with sharded
    states also a backward, whose gathered parameters come on top of the
    activations still held at its start.
    """

    def __init__(self, *, device_id: str, capacity_bytes: int, pacing: Pacing) -> None:
        self.id = device_id
        self.capacity_bytes = capacity_bytes
        self.pacing = pacing
        self.slowdown = 1.0
        """Injected slow-down (``simulation.faults`` kind ``slow``): targets stretch by it."""
        self.states: HeldStates | None = None
        """A sharded engine's states; None: the model passed to :meth:`forward`, whole."""
        self.torch_device = torch.device("cpu")
        self.start_step()

    def start_step(self) -> None:
        self._busy_s = 0.0
        self._compute_s = 0.0
        self._cpu_s = 0.0
        self._overrun_s = 0.0
        self._peak = 0
        self._in_flight = 0
        self._overran = False

    def forward(self, fn: Callable[[], T], *, model: nn.Module, micro_batch: int) -> tuple[T, int]:
        start, cpu_start = time.perf_counter(), time.thread_time()
        states = self.states or WholeModel(model)
        states.reset_peak()
        counter = SavedBytes(states)
        with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
            out = fn()
        self._count(micro_batch, states.peak_bytes() + self._in_flight + counter.bytes)
        self._in_flight += counter.bytes
        self._pace(start, cpu_start, FORWARD_SHARE * self._target_s(micro_batch), None)
        return out, counter.bytes

    def backward(
        self,
        fn: Callable[[], None],
        *,
        micro_batch: int,
        saved_bytes: int,
        after: Callable[[], None] | None = None,
        while_paced: Callable[[], bool] | None = None,
    ) -> None:
        start, cpu_start = time.perf_counter(), time.thread_time()
        if self.states is not None:
            self.states.reset_peak()
        fn()
        if self.states is not None:  # gathered parameters on top of the activations held
            self._count(micro_batch, self.states.peak_bytes() + self._in_flight)
        self._in_flight -= saved_bytes
        if after is not None:
            after()
        target = (1 - FORWARD_SHARE) * self._target_s(micro_batch)
        self._pace(start, cpu_start, target, while_paced)

    def _count(self, micro_batch: int, need_bytes: int) -> None:
        if need_bytes > self.capacity_bytes:
            raise self._oom(micro_batch, need_bytes)
        self._peak = max(self._peak, need_bytes)

    def _target_s(self, micro_batch: int) -> float:
        return self.slowdown * self.pacing.target_s(micro_batch)

    def _pace(
        self,
        start: float,
        cpu_start: float,
        target_s: float,
        while_paced: Callable[[], bool] | None,
    ) -> None:
        """Sleep out the pass's target, less what earlier passes overran."""
        compute_s = time.perf_counter() - start
        self._compute_s += compute_s
        self._cpu_s += time.thread_time() - cpu_start
        if compute_s > target_s:
            self._overran = True
        deadline = start + target_s - self._overrun_s
        while (remaining := deadline - time.perf_counter()) > 0:
            if while_paced is not None and while_paced():
                while_paced = None
                continue
            time.sleep(remaining if while_paced is None else min(remaining, POLL_S))
        if while_paced is not None:
            while_paced()  # the pass ended with no time to hide the work in: try once more
        elapsed = time.perf_counter() - start
        self._overrun_s = max(0.0, self._overrun_s + elapsed - target_s)
        self._busy_s += elapsed

    def finish_step(self) -> StepUsage:
        return StepUsage(
            busy_s=self._busy_s,
            peak_bytes=self._peak,
            overran=self._overran,
            compute_s=self._compute_s,
            cpu_s=self._cpu_s,
        )


class CudaDevice(TorchDevice):
    """A real GPU; the actor sees it as ``cuda:index`` (Ray sets CUDA_VISIBLE_DEVICES).

    Owns the step's CUDA events: time comes from events around each forward and
    backward pass, read once per step (synchronising in between would also wait
    for NCCL's streams); memory from the caching allocator's peak; the usable
    budget from :func:`scheduler.hardware.capacity.gpu_budget_bytes`.
    """

    def __init__(self, *, device_id: str, index: int = 0) -> None:
        self.id = device_id
        self.torch_device = torch.device("cuda", index)
        torch.cuda.set_device(self.torch_device)
        free_bytes, _total = torch.cuda.mem_get_info(self.torch_device)
        self.capacity_bytes = gpu_budget_bytes(free_bytes)
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def start_step(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.torch_device)
        self._events = []

    def _timed(self, fn: Callable[[], T], micro_batch: int) -> T:
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        begin.record()
        try:
            out = fn()
        except torch.cuda.OutOfMemoryError as exc:
            reserved = torch.cuda.memory_reserved(self.torch_device)
            raise self._oom(micro_batch, max(reserved, self.capacity_bytes + 1)) from exc
        end.record()
        self._events.append((begin, end))
        return out

    def forward(self, fn: Callable[[], T], *, model: nn.Module, micro_batch: int) -> tuple[T, int]:
        return self._timed(fn, micro_batch), 0

    def backward(
        self,
        fn: Callable[[], None],
        *,
        micro_batch: int,
        saved_bytes: int,
        after: Callable[[], None] | None = None,
        while_paced: Callable[[], bool] | None = None,
    ) -> None:
        self._timed(fn, micro_batch)
        if after is not None:
            after()

    def finish_step(self) -> StepUsage:
        if self._events:
            self._events[-1][1].synchronize()
        busy_s = sum(b.elapsed_time(e) for b, e in self._events) / 1000.0
        peak = int(torch.cuda.max_memory_allocated(self.torch_device))
        return StepUsage(busy_s=busy_s, peak_bytes=peak)

    def synchronize(self) -> None:
        torch.cuda.current_stream(self.torch_device).synchronize()

    def autocast(self) -> contextlib.AbstractContextManager[object]:
        """bf16 autocast where the GPU has it (Ampere and newer), as the analytic
        plans assume 16-bit throughput; fp32 with TF32 matmuls off otherwise."""
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()
