"""What the profiler measures inside a device's worker: memory, the largest fit, time.

Through the device's :class:`~workers.devices.device.TorchDevice`, so simulated
and real devices are measured by one code path (DESIGN.md, "Simulated devices").
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from scheduler.cost.roofline import BYTES_16BIT
from scheduler.hardware.precision import ACTIVATION_BYTES
from scheduler.models.presets import ModelPreset
from workers.data.dataset import ByteDataset
from workers.devices.calibration import fit_line
from workers.devices.device import SimulatedDevice, TorchDevice, model_state_bytes
from workers.errors import DeviceOutOfMemory
from workers.models.families import build_model
from workers.models.gpt import lm_loss_sum
from workers.runtime.engine import micro_batches, set_recompute

TIMING_SIZES = (1, 2, 4, 8, 16)
"""Micro-batch sizes a GPU is timed at."""
SIMULATED_TIMING_SIZES = (1, 2, 4, 8)
"""... and a simulated device: its time is its pacing, a line in the micro-batch by
construction, so a 16-sample run would only prove the line again, at twice the cost of all
the others (the slowest device's timing is most of a profile)."""
TIMING_REPEATS = 3
MAX_RETRY_FACTOR = 3
MEMORY_SIZES = (1, 2, 4)
RECOMPUTE = ("selective", "full")
HOST_CHECK_BYTES = 64 * 2**20
"""Host memory a simulated device's fit check may use for activations: about 30 samples of
gpt-tiny. Its count is exact arithmetic on the model, so a larger check proves nothing more
and costs seconds of host time per device (512 MiB took 5 s of a 10 s A100 profile)."""
MAX_CHECKED_MICRO_BATCH = 1024
"""The largest micro-batch a real GPU's fit check tries; plans use fewer per device."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceFigures:
    """What one measurement of a device yields (the cached part of its profile)."""

    capacity_bytes: int
    static_bytes: int
    per_sample_bytes: int
    fixed_s: float
    per_sample_s: float
    max_micro_batch: int
    """The largest micro-batch seen to fit (0: not even the model states)."""
    recompute: dict[str, dict[str, float]] | None = None
    """Per recomputation mode (``selective``, ``full``): per-sample bytes and time."""


class Measurement:
    """One device's figures for one model, measured in its worker; owns the device,
    the preset and the synthetic data it measures with.

    :meth:`run` measures, in order:

    1. model states ``static_bytes``: weights, gradients and AdamW moments (on a
       GPU read while the optimizer that owns the moments is still alive);
    2. saved activations ``per_sample_bytes``: per sample, the largest of the
       ratios at 1, 2 and 4 samples, so ``static + m · per_sample`` over-counts
       rather than under-counts at any ``m``;
    3. the largest micro-batch that fits, checked by running it. A simulated
       device accounts memory rather than using it, so its check is bounded by
       the host memory the check itself would need (``HOST_CHECK_BYTES``), never
       by the emulated capacity: simulating an 80 GB GPU at ``memory_scale: 1``
       must not need 80 GB of host memory. Above that bound the simulated
       device's count is exact arithmetic on the same model. A real GPU is
       checked up to ``MAX_CHECKED_MICRO_BATCH``, the largest that plans use;
    4. forward+backward time at several micro-batch sizes (median of repeats
       after a warm-up) and a least-squares fit of ``fixed_s + m · per_sample_s``;
    5. the same memory and time under ``selective`` and ``full`` activation
       recomputation (:func:`workers.runtime.engine.set_recompute`), which the
       planners may choose per device.

    A device that cannot hold the whole model states is reported with no fitting
    micro-batch (``dp`` leaves it out) but measured all the same, its budget lifted:
    a fully-sharded rank holds a slice of the states and needs the device's
    activations and speed. Only a device that truly runs out of memory doing so
    (a GPU) is reported unmeasured, instead of failing the profile.
    """

    def __init__(self, device: TorchDevice, preset: ModelPreset) -> None:
        self.device = device
        self.preset = preset
        self.data = ByteDataset(None, seq_len=preset.seq_len, vocab_size=preset.vocab_size)
        simulated = isinstance(device, SimulatedDevice)
        self.timing_sizes = SIMULATED_TIMING_SIZES if simulated else TIMING_SIZES

    def _loss_fn(self, model: nn.Module, m: int, step: int) -> Callable[[], torch.Tensor]:
        x, y = self.data.device_batch(seed=0, step=step, global_batch=m, offset=0, samples=m)
        ((x, y),) = micro_batches(
            x.to(self.device.torch_device), y.to(self.device.torch_device), [m]
        )
        scale = 1.0 / (m * self.preset.seq_len)

        def loss() -> torch.Tensor:
            with self.device.autocast():
                return lm_loss_sum(model(x), y) * scale

        return loss

    @contextlib.contextmanager
    def _unpaced(self) -> Iterator[None]:
        """Memory checks need no pacing: a simulated device counts before it sleeps."""
        device = self.device
        if not isinstance(device, SimulatedDevice):
            yield
            return
        slowdown, device.slowdown = device.slowdown, 0.0
        try:
            yield
        finally:
            device.slowdown = slowdown

    def _need(self, model: nn.Module, m: int) -> int:
        """Peak bytes of a micro-batch of ``m`` (the device's count even when it does not fit)."""
        try:
            with self._unpaced():
                return self.device.run_micro_batch(
                    self._loss_fn(model, m, 0), model=model, micro_batch=m
                ).peak_bytes
        except DeviceOutOfMemory as exc:
            return exc.need_bytes

    def run(self) -> DeviceFigures:
        capacity = self.device.capacity_bytes
        try:
            model = build_model(self.preset, seed=0).to(self.device.torch_device)
            static, optimizer = self._static_bytes(model)
        except torch.OutOfMemoryError:
            return self._no_fit(capacity)
        whole_fits = static < capacity
        if not whole_fits:
            # The whole states do not fit, but a fully-sharded rank holds a slice of them
            # and still needs this device's activations and speed: measure those with the
            # budget lifted (a simulated device only counts; a GPU that truly runs out
            # of memory is reported as holding nothing).
            self.device.capacity_bytes = 2**62
        try:
            per_sample = self._per_sample_bytes(model, static)
            max_m = self._largest_fit(model, static, per_sample) if whole_fits else 0
            # budget lifted (the whole states do not fit): every size, as on a roomy device
            sizes = [m for m in self.timing_sizes if m <= max(max_m, 1) or not whole_fits]
            # Nothing fits: time anyway, without the memory limit, so the profile still
            # says how fast the device is; the planner excludes it for its memory.
            self.device.capacity_bytes = capacity if max_m >= 1 else 2**62
            times = [self._time(model, m) for m in sizes]
            fixed_s, per_sample_s = self._fit(sizes, times)
            plain = (fixed_s, per_sample_s)
            recompute = {m: self._with_recompute(model, static, m, plain) for m in RECOMPUTE}
        except (torch.OutOfMemoryError, DeviceOutOfMemory):
            if whole_fits:  # within its own budget: a real failure, not a small device
                raise
            return self._no_fit(capacity)
        finally:
            self.device.capacity_bytes = capacity
            del optimizer
        return DeviceFigures(
            capacity_bytes=capacity,
            static_bytes=static,
            per_sample_bytes=per_sample,
            fixed_s=fixed_s,
            per_sample_s=per_sample_s,
            max_micro_batch=max_m,
            recompute=recompute,
        )

    def _per_sample_bytes(self, model: nn.Module, static: int) -> int:
        """Saved activations per sample: the largest ratio over ``MEMORY_SIZES``."""
        return max(1, *(-(-(self._need(model, m) - static) // m) for m in MEMORY_SIZES))

    @staticmethod
    def _fit(sizes: list[int], times: list[float]) -> tuple[float, float]:
        if len(sizes) == 1:
            return 0.0, times[0]
        return fit_line([float(m) for m in sizes], times)

    def _with_recompute(
        self, model: nn.Module, static: int, mode: str, plain: tuple[float, float]
    ) -> dict[str, float]:
        """Memory and time of a micro-batch when the model recomputes as ``mode`` says.

        Memory is measured. Time is measured on a GPU; a simulated device is paced
        for the forward work it repeats (:func:`workers.devices.pacing.with_recompute`), so
        its time is the plain ``(fixed_s, per_sample_s)`` times that ratio exactly.
        """
        set_recompute(model, mode)
        try:
            per_sample = self._per_sample_bytes(model, static)
            if isinstance(self.device, SimulatedDevice):
                ratio = self.preset.flops_per_sample_with(mode) / self.preset.flops_per_sample  # type: ignore[arg-type]
                fixed_s, per_sample_s = plain[0] * ratio, plain[1] * ratio
            else:
                room = self.device.capacity_bytes - static
                sizes = [m for m in MEMORY_SIZES if m * per_sample <= room] or [1]
                fixed_s, per_sample_s = self._fit(sizes, [self._time(model, m) for m in sizes])
        finally:
            set_recompute(model, "none")
        return {"per_sample_bytes": per_sample, "per_sample_s": per_sample_s, "fixed_s": fixed_s}

    def _no_fit(self, capacity: int) -> DeviceFigures:
        """The model states alone exceed the device: reported, not measured. Its
        activations are the analytic fp32 count (the most any precision saves), not
        nothing: a fully-sharded plan may still give the device a shard and samples."""
        return DeviceFigures(
            capacity_bytes=capacity,
            static_bytes=max(self.preset.model_state_bytes, capacity + 1),
            per_sample_bytes=self.preset.activation_bytes_per_sample
            * ACTIVATION_BYTES["fp32"]
            // BYTES_16BIT,
            fixed_s=0.0,
            per_sample_s=1.0,
            max_micro_batch=0,
        )

    def _static_bytes(self, model: nn.Module) -> tuple[int, Any]:
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        if self.device.torch_device.type != "cuda":
            return model_state_bytes(model), None
        # One step materialises the AdamW moments; read the allocator while they live.
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.0)
        optimizer.step()
        torch.cuda.synchronize(self.device.torch_device)
        return int(torch.cuda.memory_allocated(self.device.torch_device)), optimizer

    def _largest_fit(self, model: nn.Module, static: int, per_sample: int) -> int:
        """The largest micro-batch that fits, checked by running it (see :class:`Measurement`)."""
        max_m = max(0, (self.device.capacity_bytes - static) // per_sample)
        if isinstance(self.device, SimulatedDevice):
            check = min(max_m, max(1, HOST_CHECK_BYTES // per_sample))
        else:
            check = max_m = min(max_m, MAX_CHECKED_MICRO_BATCH)
        while check >= 1:
            try:
                with self._unpaced():
                    self.device.run_micro_batch(
                        self._loss_fn(model, check, 1), model=model, micro_batch=check
                    )
                return max_m if check < max_m else check
            except DeviceOutOfMemory:
                check = check * 9 // 10 if check > 10 else check - 1
                max_m = check
        return 0

    def _time(self, model: nn.Module, m: int) -> float:
        """Median device time of a micro-batch of ``m`` after a warm-up.

        Runs whose real compute overran a simulated device's target (another
        process took the cores) measure the host, not the emulated GPU: they
        are repeated, up to a bound, and used only if nothing better comes.
        """
        loss_fn = self._loss_fn(model, m, m)
        self.device.run_micro_batch(loss_fn, model=model, micro_batch=m)  # warm-up
        kept, overran = [], []
        for _ in range(TIMING_REPEATS * MAX_RETRY_FACTOR):
            result = self.device.run_micro_batch(loss_fn, model=model, micro_batch=m)
            (overran if result.overran else kept).append(result.busy_s)
            if len(kept) == TIMING_REPEATS:
                break
        return statistics.median(kept or overran)
