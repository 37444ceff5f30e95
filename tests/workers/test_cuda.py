"""CUDA devices (run with ``-m gpu`` on a machine with a GPU): the same code paths as simulated.

The actors are plain classes, so the profiler and the runtime's device are
exercised directly here, in this process, on ``cuda:0``.
"""

from __future__ import annotations

import pytest
import torch

from scheduler.hardware.capacity import gpu_budget_bytes
from tests.support import TINY
from workers.data.dataset import ByteDataset
from workers.devices.device import CudaDevice
from workers.errors import DeviceOutOfMemory
from workers.models.gpt import GPT, lm_loss_sum
from workers.records import OptimizerConfig
from workers.runtime.worker import DeviceWorker

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _forward(model: GPT, m: int):
    x, y = ByteDataset(None, seq_len=TINY.seq_len).device_batch(
        seed=0, step=0, global_batch=m, offset=0, samples=m
    )
    x, y = x.cuda(), y.cuda()
    return lambda: lm_loss_sum(model(x), y)


def test_cuda_device_times_with_events_and_reports_allocator_peak() -> None:
    device = CudaDevice(device_id="gpu/0")
    model = GPT(TINY, seed=0).cuda()
    small = device.run_micro_batch(_forward(model, 1), model=model, micro_batch=1)
    large = device.run_micro_batch(_forward(model, 32), model=model, micro_batch=32)
    assert 0 < small.busy_s < 5 and 0 < large.busy_s < 5
    assert large.peak_bytes > small.peak_bytes > 0
    assert device.capacity_bytes < torch.cuda.get_device_properties(0).total_memory


def test_cuda_device_over_its_budget_raises_oom_naming_the_device() -> None:
    device = CudaDevice(device_id="gpu/0")
    device.capacity_bytes = 20_000_000  # a small usable budget on a large GPU
    model = GPT(TINY, seed=0).cuda()
    with pytest.raises(DeviceOutOfMemory, match=r"^gpu/0: out of memory: micro-batch 64 needs"):
        device.run_micro_batch(_forward(model, 64), model=model, micro_batch=64)


def test_profiler_measures_a_gpu_through_the_same_code_path() -> None:
    figures = DeviceWorker("gpu/0", simulated=False).measure(TINY, 0, None, None)["figures"]
    assert figures["static_bytes"] >= 4 * 4 * TINY.num_params  # weights, grads, AdamW moments
    assert figures["per_sample_bytes"] > 0 and figures["per_sample_s"] > 0
    assert figures["max_micro_batch"] > 100  # gpt-tiny is small next to any GPU


def test_cuda_budget_is_free_memory_less_nccl_reserve_and_fragmentation_margin() -> None:
    free_bytes, _total = torch.cuda.mem_get_info(0)
    device = CudaDevice(device_id="gpu/0")
    assert device.capacity_bytes <= gpu_budget_bytes(free_bytes) < free_bytes


def test_a_one_rank_dp_and_pp_run_on_nccl() -> None:
    """The NCCL path end to end in this process: join, step, leave (one rank, world of one)."""
    from workers.runtime.spec import RankSpec, RunSpec

    worker = DeviceWorker("gpu/0", simulated=False)
    run = RunSpec(
        preset=TINY,
        seed=0,
        global_batch=4,
        optimizer=OptimizerConfig(),
        dataset=None,
        simulated=False,
    )
    rank = RankSpec(
        device_id="gpu/0", rank=0, world_size=1, offset=0, samples=4, micro_batch=2, accum_steps=2
    )
    addr, port = worker.rendezvous()
    worker.join(run, rank, addr, port)
    first = worker.step(0)
    second = worker.step(1)
    worker.leave()
    assert second.loss < first.loss + 1.0 and first.device.busy_s > 0
    assert first.device.peak_bytes > 0
