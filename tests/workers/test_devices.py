"""Simulated devices in this process: pacing and memory accounting, no Ray."""

from __future__ import annotations

import time

import pytest
import torch

from tests.support import TINY
from workers.data.dataset import ByteDataset
from workers.devices.calibration import HostCalibration
from workers.devices.device import SimulatedDevice, model_state_bytes
from workers.devices.pacing import Pacing
from workers.errors import DeviceOutOfMemory
from workers.models.gpt import GPT, lm_loss_sum
from workers.runtime.measure import Measurement

HOST = HostCalibration(fixed_s=0.01, per_sample_s=0.02)


def _forward(model: GPT, m: int):
    x, y = ByteDataset(None, seq_len=TINY.seq_len).device_batch(
        seed=0, step=0, global_batch=m, offset=0, samples=m
    )
    return lambda: lm_loss_sum(model(x), y)


def test_a_micro_batch_over_capacity_raises_a_cuda_like_oom_naming_the_device() -> None:
    model = GPT(TINY, seed=0)
    capacity = model_state_bytes(model) + 3 * 2_300_000  # room for about three samples
    device = SimulatedDevice(
        device_id="node-b/1",
        capacity_bytes=capacity,
        pacing=Pacing(margin=1.0, speed_ratio=1.0, host=HOST),
    )
    fits = device.run_micro_batch(_forward(model, 2), model=model, micro_batch=2)
    assert model_state_bytes(model) < fits.peak_bytes <= capacity
    with pytest.raises(
        DeviceOutOfMemory,
        match=r"^node-b/1: out of memory: micro-batch 8 needs "
        r"3\d\.\d MB, capacity 20\.\d MB$",
    ) as info:
        device.run_micro_batch(_forward(model, 8), model=model, micro_batch=8)
    assert info.value.need_bytes > capacity


def test_activation_memory_grows_linearly_with_the_micro_batch() -> None:
    model = GPT(TINY, seed=0)
    device = SimulatedDevice(
        device_id="d", capacity_bytes=2**40, pacing=Pacing(margin=1.0, speed_ratio=1.0, host=HOST)
    )
    static = model_state_bytes(model)
    act = [
        device.run_micro_batch(_forward(model, m), model=model, micro_batch=m).peak_bytes - static
        for m in (1, 2, 4)
    ]
    assert act[1] == pytest.approx(2 * act[0], rel=0.01)
    assert act[2] == pytest.approx(4 * act[0], rel=0.01)


def test_a_simulated_device_takes_at_least_its_paced_time() -> None:
    torch.set_num_threads(1)
    model = GPT(TINY, seed=0)
    pacing = Pacing(margin=5.0, speed_ratio=3.0, host=HOST)  # 15 × (0.01 + 2 × 0.02) = 0.75 s
    device = SimulatedDevice(device_id="d", capacity_bytes=2**40, pacing=pacing)
    forward = _forward(model, 2)
    device.run_micro_batch(forward, model=model, micro_batch=2)  # warm-up
    start = time.perf_counter()
    result = device.run_micro_batch(forward, model=model, micro_batch=2)
    elapsed = time.perf_counter() - start
    assert not result.overran  # 2 samples of gpt-tiny compute in far less than 0.75 s
    assert 0.75 <= result.busy_s <= elapsed  # never faster than the emulated GPU


def test_a_pass_that_overran_is_paid_back_by_the_next_ones() -> None:
    """Forward a third, backward two thirds of the target; an overrun shortens what follows."""
    model = GPT(TINY, seed=0)
    pacing = Pacing(margin=1.0, speed_ratio=1.0, host=HostCalibration(fixed_s=0.9, per_sample_s=0))
    device = SimulatedDevice(device_id="d", capacity_bytes=2**40, pacing=pacing)
    device.start_step()

    def slow_forward() -> torch.Tensor:
        time.sleep(0.45)  # overruns the forward's 0.3 s target by 0.15 s
        return _forward(model, 1)()

    loss, saved = device.forward(slow_forward, model=model, micro_batch=1)
    assert device._overrun_s >= 0.15
    device.backward(loss.backward, micro_batch=1, saved_bytes=saved)
    # The backward's 0.6 s target shrinks by the overrun; what is left is only how late the
    # OS woke the sleeper (milliseconds), not the 0.15 s.
    assert device._overrun_s < 0.05, "the backward slept less to pay the overrun back"
    usage = device.finish_step()
    assert usage.overran
    assert usage.busy_s >= 0.9


def test_a_device_reported_unmeasured_counts_activations_on_the_safe_side() -> None:
    """A GPU that runs out of memory while being measured is reported with the analytic
    fp32 activations (fsdp may still give it samples), at least what a device counts."""
    model = GPT(TINY, seed=0)
    device = SimulatedDevice(
        device_id="d", capacity_bytes=2**40, pacing=Pacing(margin=1.0, speed_ratio=1.0, host=HOST)
    )
    counted = (
        device.run_micro_batch(_forward(model, 2), model=model, micro_batch=2).peak_bytes
        - model_state_bytes(model)
    ) / 2
    reported = Measurement(device, TINY)._no_fit(capacity=10**6)
    assert reported.max_micro_batch == 0 and reported.static_bytes > 10**6
    assert counted <= reported.per_sample_bytes < 1.2 * counted
