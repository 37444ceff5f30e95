"""The data-parallel runtime: one Ray actor per device, uneven batches, exact gradients.

Each actor (:class:`DataParallelWorker`, a plain class made remote where it is
spawned) holds a full model replica built from the seed, joins a
torch.distributed group (gloo on CPU, nccl on CUDA) at rank 0's address, and
per step computes its slice ``[offset, offset + samples)`` of the global batch
in ``accum_steps`` micro-batches. Its loss is the summed token cross-entropy
divided by ``global_batch · seq_len`` (DESIGN.md, Correctness), so a SUM
all-reduce of the gradients yields the full-batch mean gradient whatever the
split, and AdamW steps identically on every rank (lockstep).

Gradients live in one flat buffer (``p.grad`` are views into it, as DDP's
``gradient_as_bucket_view``), with one extra slot for the loss sum; the
all-reduce of that buffer starts as soon as the last micro-batch's backward is
done and overlaps the rest of the device's time (pacing, on a simulated
device). A step reports per device: busy time, time waiting at the
all-reduce, and peak memory.

Open for checkpoint/resume and re-planning: :func:`run_data_parallel` takes
``start_step`` and an optional ``initial_state``; the actors expose
``state_dict`` / ``load_state_dict``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import ray
import torch
import torch.distributed as dist

from scheduler.cluster import Cluster
from scheduler.models import ModelPreset
from scheduler.plan import DevicePlan, Plan
from workers.actors import actor_options, free_port, gather, kill_all
from workers.data import ByteDataset
from workers.devices import CudaDevice, Pacing, SimulatedDevice, TorchDevice
from workers.driver import SETUP_TIMEOUT_S, form_group, run_steps, shut_down, train_result
from workers.errors import WorkerError
from workers.model import GPT, lm_loss_sum
from workers.records import OptimizerConfig, StepMetrics, TrainResult

DTYPES = {"float32": torch.float32, "float64": torch.float64}
COLLECTIVE_TIMEOUT_S = 120.0
"""torch.distributed's own timeout; the driver kills stuck actors long before."""


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerSpec:
    """Everything one actor needs; plain data so that it crosses Ray as is."""

    device_id: str
    rank: int
    world_size: int
    preset: ModelPreset
    seed: int
    global_batch: int
    offset: int
    samples: int
    micro_batch: int
    accum_steps: int
    optimizer: OptimizerConfig
    dataset: Path | None
    simulated: bool
    capacity_bytes: int = 0
    pacing: Pacing | None = None
    dtype: str = "float32"
    """Parameter and gradient precision; ``float64`` for exact verification runs."""


def build_device(spec: WorkerSpec) -> TorchDevice:
    if spec.simulated:
        assert spec.pacing is not None
        return SimulatedDevice(
            device_id=spec.device_id, capacity_bytes=spec.capacity_bytes, pacing=spec.pacing
        )
    return CudaDevice(device_id=spec.device_id)


def micro_batch_sizes(samples: int, accum_steps: int) -> list[int]:
    """Sizes of ``accum_steps`` micro-batches as equal as integers allow.

    >>> micro_batch_sizes(10, 3)
    [4, 3, 3]
    """
    if samples == 0:
        return []
    k = max(1, min(accum_steps, samples))
    return [samples // k + (1 if i < samples % k else 0) for i in range(k)]


class DataParallelWorker:
    """One device's share of data-parallel training (made remote by the driver)."""

    def __init__(self, spec: WorkerSpec) -> None:
        torch.set_num_threads(1)
        self.spec = spec
        self.device = build_device(spec)
        self.model: GPT | None = None
        self.step_done = -1

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0's address and a free port on its node."""
        return free_port()

    def setup(self, master_addr: str, master_port: int) -> None:
        spec = self.spec
        backend = "gloo" if spec.simulated else "nccl"
        dist.init_process_group(
            backend,
            init_method=f"tcp://{master_addr}:{master_port}",
            rank=spec.rank,
            world_size=spec.world_size,
            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
        )
        device = self.device.torch_device
        dtype = DTYPES[spec.dtype]
        self.model = GPT(spec.preset, seed=spec.seed).to(device=device, dtype=dtype)
        params = list(self.model.parameters())
        total = sum(p.numel() for p in params)
        # One flat buffer: every gradient is a view into it, the last slot holds the loss sum.
        self.flat = torch.zeros(total + 1, device=device, dtype=dtype)
        self.lockstep = torch.zeros(1, device=device)
        offset = 0
        for p in params:
            p.grad = self.flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        opt = spec.optimizer
        self.optimizer = torch.optim.AdamW(
            params, lr=opt.lr, betas=(opt.beta1, opt.beta2), weight_decay=opt.weight_decay
        )
        self.data = ByteDataset(
            spec.dataset, seq_len=spec.preset.seq_len, vocab_size=spec.preset.vocab_size
        )

    def step(self, step: int) -> dict[str, Any]:
        """Run step ``step``; returns loss, busy, wait and peak memory."""
        spec, model = self.spec, self.model
        assert model is not None, "setup() first"
        model.train()
        self.flat.zero_()
        x, y = self.data.device_batch(
            seed=spec.seed,
            step=step,
            global_batch=spec.global_batch,
            offset=spec.offset,
            samples=spec.samples,
        )
        device = self.device.torch_device
        x, y = x.to(device), y.to(device)
        scale = 1.0 / (spec.global_batch * spec.preset.seq_len)
        sizes = micro_batch_sizes(spec.samples, spec.accum_steps)
        loss_sum = torch.zeros((), device=device, dtype=self.flat.dtype)
        work: list[Any] = []

        def start_all_reduce() -> None:
            self.flat[-1] = loss_sum * scale
            work.append(dist.all_reduce(self.flat, op=dist.ReduceOp.SUM, async_op=True))

        updated: list[bool] = []

        def update_when_reduced() -> bool:
            # Once every device's gradients are summed, the update needs no one else.
            if not work[0].is_completed():
                return False
            work[0].wait()
            self.optimizer.step()
            updated.append(True)
            return True

        busy_s, peak_bytes, start = 0.0, 0, 0
        for i, size in enumerate(sizes):
            xi, yi = x[start : start + size], y[start : start + size]
            start += size

            def forward(xi: torch.Tensor = xi, yi: torch.Tensor = yi) -> torch.Tensor:
                nonlocal loss_sum
                loss = lm_loss_sum(model(xi), yi)
                loss_sum = loss_sum + loss.detach()
                return loss * scale

            last = i == len(sizes) - 1
            result = self.device.run_micro_batch(
                forward,
                model=model,
                micro_batch=size,
                after_backward=start_all_reduce if last else None,
                while_paced=update_when_reduced if last else None,
            )
            busy_s += result.busy_s
            peak_bytes = max(peak_bytes, result.peak_bytes)
        wait_start = time.perf_counter()
        if not updated:  # a real GPU, or a device whose peers were still computing
            work[0].wait()
        # This one-element all-reduce is where a device that finished early waits for the
        # slowest (lockstep), so wait_s shows it.
        dist.all_reduce(self.lockstep)
        wait_s = time.perf_counter() - wait_start
        if not updated:
            self.optimizer.step()
        self.step_done = step
        return {
            "loss": float(self.flat[-1].item()),
            "busy_s": busy_s,
            "wait_s": wait_s,
            "peak_bytes": peak_bytes,
        }

    def state_dict(self) -> dict[str, Any]:
        """Model and optimizer state on the CPU, and the last step done (for checkpoints)."""
        assert self.model is not None
        return {
            "step": self.step_done,
            "model": {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        assert self.model is not None
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step_done = int(state.get("step", -1))

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    def pid(self) -> int:
        return os.getpid()


def make_specs(
    *,
    cluster: Cluster,
    preset: ModelPreset,
    plan: Plan,
    seed: int,
    dataset: Path | None,
    optimizer: OptimizerConfig,
    simulated: bool,
    pacing_of: Callable[[str], tuple[int, Pacing | None]],
    dtype: str = "float32",
) -> list[WorkerSpec]:
    if dtype not in DTYPES:
        raise WorkerError(f"dtype: must be one of {', '.join(DTYPES)}, got {dtype!r}")
    active: list[DevicePlan] = list(plan.active)
    specs = []
    for rank, d in enumerate(active):
        capacity, pacing = pacing_of(d.id)
        specs.append(
            WorkerSpec(
                device_id=d.id,
                rank=rank,
                world_size=len(active),
                preset=preset,
                seed=seed,
                global_batch=plan.global_batch,
                offset=d.offset,
                samples=d.samples,
                micro_batch=d.micro_batch,
                accum_steps=d.accum_steps,
                optimizer=optimizer,
                dataset=dataset,
                simulated=simulated,
                capacity_bytes=capacity,
                pacing=pacing,
                dtype=dtype,
            )
        )
    return specs


def run_data_parallel(
    *,
    cluster: Cluster,
    specs: list[WorkerSpec],
    plan: Plan,
    steps: int,
    start_step: int = 0,
    initial_state: dict[str, Any] | None = None,
    on_step: Callable[[StepMetrics], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    actor_name_prefix: str | None = None,
    keep_state: bool = False,
) -> TrainResult:
    """Spawn one actor per spec, train ``steps`` steps from ``start_step``, tear down."""
    if not specs:
        raise WorkerError("plan: no device has any samples")
    ids = [s.device_id for s in specs]
    remote_cls = ray.remote(DataParallelWorker)
    actors = []
    state = None
    try:
        for spec in specs:
            name = f"{actor_name_prefix}{spec.device_id}" if actor_name_prefix else None
            options = actor_options(
                cluster.device(spec.device_id), simulated=spec.simulated, name=name
            )
            actors.append(remote_cls.options(**options).remote(spec))
        form_group(actors, ids)
        if initial_state is not None:
            gather(
                [a.load_state_dict.remote(initial_state) for a in actors],
                ids,
                timeout_s=SETUP_TIMEOUT_S,
                what="state restore",
            )
        history, stopped = run_steps(
            actors,
            ids,
            plan=plan,
            steps=steps,
            start_step=start_step,
            on_step=on_step,
            should_stop=should_stop,
        )
        if keep_state and history:
            state = gather(
                [actors[0].state_dict.remote()],
                ids[:1],
                timeout_s=SETUP_TIMEOUT_S,
                what="state save",
            )[0]
        shut_down(actors, ids)
    finally:
        kill_all(actors)
    return train_result(history, stopped=stopped, state=state)
