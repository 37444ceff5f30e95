"""How closely a simulated device keeps its paced time (the OS's wake-up lateness)."""

from __future__ import annotations

import statistics
import time

import pytest
import torch

from tests.support import TINY
from workers.data.dataset import ByteDataset
from workers.devices.calibration import HostCalibration
from workers.devices.device import SimulatedDevice
from workers.devices.pacing import Pacing
from workers.models.gpt import GPT, lm_loss_sum

pytestmark = pytest.mark.benchmark


def test_paced_time_lateness() -> None:
    torch.set_num_threads(1)
    model = GPT(TINY, seed=0)
    x, y = ByteDataset(None, seq_len=TINY.seq_len).device_batch(
        seed=0, step=0, global_batch=2, offset=0, samples=2
    )
    pacing = Pacing(
        margin=5.0, speed_ratio=3.0, host=HostCalibration(fixed_s=0.01, per_sample_s=0.02)
    )
    device = SimulatedDevice(device_id="d", capacity_bytes=2**40, pacing=pacing)
    target = pacing.target_s(2)
    late = []
    for _ in range(6):
        start = time.perf_counter()
        device.run_micro_batch(lambda: lm_loss_sum(model(x), y), model=model, micro_batch=2)
        late.append(time.perf_counter() - start - target)
    print(f"\npaced {target * 1e3:.0f} ms: median lateness {statistics.median(late) * 1e3:.1f} ms")
    assert statistics.median(late) < 0.1 * target
