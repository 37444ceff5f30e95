"""Engines: what a warm device worker runs for one job, one per kind of rank.

:class:`Engine` holds what every kind shares; :class:`DataParallelEngine` is the
data-parallel step, :class:`workers.runtime.pipeline_engine.PipelineEngine` the
pipeline's. Loss and gradients follow DESIGN.md, "Correctness".
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

from workers.checkpoint import load_part, part_tensors, read_scaler, scaler_tensors, write_part
from workers.data.dataset import TokenDataset, open_dataset
from workers.devices.device import SimulatedDevice, StepUsage, TorchDevice
from workers.models.families import build_model
from workers.models.gpt import lm_loss_sum
from workers.records import DeviceStep, OptimizerConfig, RankStep
from workers.runtime.precision import LossScaler, agree_overflow, autocast, nonfinite
from workers.runtime.spec import RankSpec, RunSpec


def micro_batch_sizes(samples: int, accum_steps: int) -> list[int]:
    """Sizes of ``accum_steps`` micro-batches as equal as integers allow.

    >>> micro_batch_sizes(10, 3)
    [4, 3, 3]
    """
    if samples == 0:
        return []
    k = max(1, min(accum_steps, samples))
    return [samples // k + (1 if i < samples % k else 0) for i in range(k)]


def set_recompute(model: torch.nn.Module, mode: str) -> None:
    """Recompute activations in backward instead of keeping them (Korthikanti et al., 2022).

    ``full``: each block keeps only its input and runs its forward again in
    backward; ``selective``: each block's attention sub-layer does (a coarser
    cut than the paper's attention core, so it keeps no more than the planner
    counts); ``none``: everything is kept. Through ``torch.utils.checkpoint``
    (non-reentrant), so a simulated device's count of saved tensors sees it.
    Parameter names do not change, so checkpoints are unaffected.
    """
    for block in getattr(model, "blocks", {}).values():
        for module in (block, block.attn):
            module.__dict__.pop("forward", None)  # back to the class's forward
        target = {"full": block, "selective": block.attn}.get(mode)
        if target is not None:
            inner = target.forward
            target.forward = functools.partial(checkpoint, inner, use_reentrant=False)


def micro_batches(
    x: torch.Tensor, y: torch.Tensor, sizes: list[int]
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Inputs and targets of each micro-batch as tensors of their own.

    Copies, not views: autograd saves the token ids, and a simulated device
    counts each saved storage whole, so a view would count the whole device
    batch (or inputs and targets as one shared storage) rather than this
    micro-batch. The profiler slices the same way, so both count alike.
    """
    out, start = [], 0
    for size in sizes:
        out.append((x[start : start + size].clone(), y[start : start + size].clone()))
        start += size
    return out


def adamw(params: Iterable[torch.Tensor], opt: OptimizerConfig) -> torch.optim.AdamW:
    """The job's AdamW over ``params`` (one weight decay for every parameter)."""
    return torch.optim.AdamW(
        params, lr=opt.lr, betas=(opt.beta1, opt.beta2), weight_decay=opt.weight_decay
    )


class Engine(ABC):
    """One rank's model, optimizer and data for one run.

    Built inside a :class:`workers.runtime.worker.DeviceWorker` when the worker
    joins a run and dropped when it leaves. Owns the model slice the rank holds
    (the whole model, or a pipeline stage's blocks) built from the seed, its AdamW
    optimizer, the data, the loss scale, the dynamic loss scaler of fp16 runs
    (:mod:`workers.runtime.precision`), and its state under whole-model
    parameter names.
    """

    def __init__(self, run: RunSpec, rank: RankSpec, device: TorchDevice) -> None:
        self.run, self.rank, self.device = run, rank, device
        role = rank.stage
        self.model = build_model(
            run.preset,
            seed=run.seed,
            first=role.first if role else 0,
            last=role.last if role else None,
            embed=role.is_first if role else True,
            head=role.is_last if role else True,
        )
        self.dtype = getattr(torch, run.dtype)
        self.optimizer = self.place_states()
        set_recompute(self.model, rank.recompute)
        self.data = open_dataset(
            run.dataset, seq_len=run.preset.seq_len, vocab_size=run.preset.vocab_size
        )
        self.loss_scale = 1.0 / (run.global_batch * run.preset.seq_len)
        self.scaler = LossScaler(enabled=rank.loss_scaling)
        self.sizes = micro_batch_sizes(rank.samples, rank.accum_steps)
        self.val_data: TokenDataset | None = None
        """The held-out split, opened at the first evaluation."""
        self.step_done = -1

    def place_states(self) -> torch.optim.Optimizer:
        """Move the model to the device; AdamW over the parameters this rank updates."""
        self.model.to(device=self.device.torch_device, dtype=self.dtype)
        return adamw(self.model.parameters(), self.run.optimizer)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's inputs and targets ``(samples, T)`` of global step ``step``."""
        x, y = self.data.device_batch(
            seed=self.run.seed,
            step=step,
            global_batch=self.run.global_batch,
            offset=self.rank.offset,
            samples=self.rank.samples,
        )
        return x.to(self.device.torch_device), y.to(self.device.torch_device)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The precision this rank's forward passes compute in (its plan entry's)."""
        return autocast(self.rank.precision, self.device.torch_device)

    @property
    def backward_scale(self) -> float:
        """What a micro-batch's summed token loss is multiplied by before backward:
        ``1 / (global_batch · seq_len)`` (DESIGN.md, Correctness) times the loss scale."""
        return self.loss_scale * self.scaler.scale

    def gradients(self) -> list[torch.Tensor]:
        """The summed gradients this rank's optimizer steps on (a sharded engine: its slice)."""
        return [p.grad for p in self.model.parameters() if p.grad is not None]

    def overflowed(self) -> bool:
        """Whether any rank's summed gradients hold an inf or a NaN (the same on every rank)."""
        local = nonfinite(self.gradients())
        return agree_overflow(local, device=self.device.torch_device)

    def update(self, step: int) -> None:
        """The optimizer step once the gradients are summed: with loss scaling, the
        overflow verdict (a skipped step changes nothing but the scale) and the
        unscaled gradients; then the schedule's learning rate, clipping by the global
        norm (:meth:`grad_sq_norm`), and AdamW."""
        if self.scaler.enabled:
            used = self.scaler.scale
            if self.scaler.update(self.overflowed()):
                return
            self.scaler.unscale(self.gradients(), used)
        opt = self.run.optimizer
        for group in self.optimizer.param_groups:
            group["lr"] = opt.lr_at(step)
        if opt.grad_clip is not None:
            norm = math.sqrt(self.grad_sq_norm())
            if norm > opt.grad_clip:
                factor = opt.grad_clip / (norm + 1e-6)
                for group in self.optimizer.param_groups:
                    for p in group["params"]:
                        if p.grad is not None:
                            p.grad.mul_(factor)
        self.optimizer.step()

    def close(self) -> None:
        """Release what the engine holds beyond its tensors (subgroups); the run ended."""
        return None

    # --- validation -----------------------------------------------------------------

    def val_micro_batches(
        self, val_batches: int, *, load: bool = True
    ) -> tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]]:
        """This rank's (its pipeline's) share of the validation samples, in micro-batches.

        ``val_batches × global_batch`` samples
        (:meth:`workers.data.dataset.TokenDataset.batch_starts`
        of the ``val`` split: the same windows at every evaluation); a rank that computes
        samples ``[o, o + n)`` of the global batch takes ``[o·k, (o + n)·k)`` of them, so
        the shares of any plan cover every sample once. Micro-batches are no larger than
        the plan's, so evaluation fits wherever training does. ``load=False``: the sizes
        alone (a middle pipeline stage reads no tokens).
        """
        first, count = self.rank.offset * val_batches, self.rank.samples * val_batches
        if count == 0:
            return [], []
        sizes = micro_batch_sizes(count, -(-count // max(1, self.rank.micro_batch)))
        if not load:
            return sizes, []
        if self.val_data is None:
            self.val_data = open_dataset(
                self.run.dataset,
                seq_len=self.run.preset.seq_len,
                vocab_size=self.run.preset.vocab_size,
                split="val",
            )
        x, y = self.val_data.device_batch(
            seed=self.run.seed,
            step=0,
            global_batch=val_batches * self.run.global_batch,
            offset=first,
            samples=count,
        )
        device = self.device.torch_device
        return sizes, micro_batches(x.to(device), y.to(device), sizes)

    def mean_val_loss(self, loss_sum: float, val_batches: int, group: Any = None) -> float:
        """SUM-reduce the ranks' summed token losses (float64, so the order of the
        additions barely shows) into the mean over every validation token."""
        total = torch.tensor([loss_sum], dtype=torch.float64, device=self.device.torch_device)
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
        tokens = val_batches * self.run.global_batch * self.run.preset.seq_len
        return float(total.item()) / tokens

    @abstractmethod
    def evaluate(self, val_batches: int) -> float:
        """Mean token loss of the current model on the validation samples, forward only
        (every rank returns the same)."""

    @abstractmethod
    def grad_sq_norm(self) -> float:
        """The squared norm of the whole model's summed gradient (the same on every rank)."""

    @abstractmethod
    def step(self, step: int) -> RankStep:
        """Run global step ``step`` in lockstep with the other ranks."""

    def record(
        self, *, loss: float, usage: StepUsage, wait_s: float, peak_bytes: int | None = None
    ) -> RankStep:
        """What the rank reports of a step: ``usage`` from the device (``peak_bytes``
        where the engine knows better), the wait, and how the compute kept its pace."""
        return RankStep(
            loss=loss,
            device=DeviceStep(
                id=self.rank.device_id,
                busy_s=usage.busy_s,
                wait_s=wait_s,
                peak_bytes=usage.peak_bytes if peak_bytes is None else peak_bytes,
                compute_ratio=self.compute_ratio(usage),
            ),
        )

    def compute_ratio(self, usage: StepUsage) -> float | None:
        """A simulated device's real compute this step over the time it was paced to: each
        of the step's micro-batches is paced to its target (forward and backward together,
        slow-down included). None on a real GPU, or a rank without samples."""
        device = self.device
        if not isinstance(device, SimulatedDevice) or not self.sizes:
            return None
        paced_s = device.slowdown * sum(device.pacing.target_s(m) for m in self.sizes)
        return usage.compute_s / paced_s if paced_s > 0 else None

    def reshard(self, rank: RankSpec) -> None:
        """Take another share of the global batch; the model and optimizer stay."""
        if rank.stage is not None or self.rank.stage is not None:
            raise RuntimeError("pipeline stages change through a checkpoint, not in place")
        self.rank = rank
        self.sizes = micro_batch_sizes(rank.samples, rank.accum_steps)
        set_recompute(self.model, rank.recompute)
        if rank.pacing is not None and hasattr(self.device, "pacing"):
            self.device.pacing = rank.pacing

    def save_part(self, uri: str, part: str) -> list[str]:
        """Write this rank's model and optimizer slice into checkpoint ``uri``; rank 0
        (a writer under every plan) adds the loss scale, the same on every rank."""
        tensors = part_tensors(self.model, self.optimizer)
        if self.scaler.enabled and self.rank.rank == 0:
            tensors.update(scaler_tensors(self.scaler.state()))
        return write_part(uri, part, tensors)

    def load_checkpoint(self, uri: str, manifest: dict[str, Any]) -> None:
        """Load this rank's slice from a checkpoint written by any plan."""
        load_part(uri, manifest, self.model, self.optimizer)
        if self.scaler.enabled:
            self.scaler.load(read_scaler(uri, manifest))
        self.step_done = int(manifest["step"])

    def model_state(self) -> dict[str, torch.Tensor]:
        """This rank's parameters on the CPU, under their whole-model names."""
        return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}


class DataParallelEngine(Engine):
    """A data-parallel rank: owns the flat gradient buffer its all-reduce sums.

    The rank computes its slice ``[offset, offset + samples)`` of the global batch
    in ``accum_steps`` micro-batches; its loss is the summed token cross-entropy
    divided by ``global_batch · seq_len``, so a SUM all-reduce of the gradients
    yields the full-batch mean gradient whatever the split, and AdamW steps
    identically on every rank (lockstep). Gradients live in one flat buffer
    (``p.grad`` are views into it, as DDP's ``gradient_as_bucket_view``), with one
    extra slot for the loss sum; its all-reduce starts as soon as the last
    micro-batch's backward is done and overlaps the rest of the device's time.
    """

    def __init__(self, run: RunSpec, rank: RankSpec, device: TorchDevice) -> None:
        super().__init__(run, rank, device)
        params = list(self.model.parameters())
        total = sum(p.numel() for p in params)
        # One flat buffer: every gradient is a view into it, the last slot holds the loss sum.
        self.flat = torch.zeros(total + 1, device=device.torch_device, dtype=self.dtype)
        self.lockstep = torch.zeros(1, device=device.torch_device)
        offset = 0
        for p in params:
            p.grad = self.flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()

    def grad_sq_norm(self) -> float:
        # Every rank holds the whole summed gradient; the last slot is the loss.
        return float(self.flat[:-1].double().pow(2).sum())

    def overflowed(self) -> bool:
        # The SUM all-reduce was the agreement: a non-finite summand on any rank
        # leaves the sum non-finite on all of them, so no collective is needed here
        # (and none may be: the update can run while this rank is still paced).
        return nonfinite([self.flat[:-1]])

    def evaluate(self, val_batches: int) -> float:
        model = self.model
        _, pairs = self.val_micro_batches(val_batches)
        loss_sum = 0.0
        model.eval()
        with torch.no_grad():
            for xi, yi in pairs:
                with self.autocast():
                    loss_sum += float(lm_loss_sum(model(xi), yi))
        model.train()
        return self.mean_val_loss(loss_sum, val_batches)

    def step(self, step: int) -> RankStep:
        model, device = self.model, self.device
        model.train()
        self.flat.zero_()
        x, y = self.batch(step)
        loss_sum = torch.zeros((), device=device.torch_device, dtype=self.flat.dtype)
        work: list[Any] = []
        updated: list[bool] = []

        def start_all_reduce() -> None:
            self.flat[-1] = loss_sum * self.loss_scale
            work.append(dist.all_reduce(self.flat, op=dist.ReduceOp.SUM, async_op=True))

        def update_when_reduced() -> bool:
            # Once every device's gradients are summed, the update needs no one else.
            if not work[0].is_completed():
                return False
            work[0].wait()
            self.update(step)
            updated.append(True)
            return True

        device.start_step()
        for i, (xi, yi) in enumerate(micro_batches(x, y, self.sizes)):
            size = len(xi)

            def forward(xi: torch.Tensor = xi, yi: torch.Tensor = yi) -> torch.Tensor:
                with self.autocast():
                    return lm_loss_sum(model(xi), yi)

            loss, saved = device.forward(forward, model=model, micro_batch=size)
            loss_sum = loss_sum + loss.detach()
            scaled = loss * self.backward_scale
            last = i == len(self.sizes) - 1
            device.backward(
                scaled.backward,
                micro_batch=size,
                saved_bytes=saved,
                after=start_all_reduce if last else None,
                while_paced=update_when_reduced if last else None,
            )
        if not work:  # no samples in this plan: add zeros, keep the group in lockstep
            start_all_reduce()
        usage = device.finish_step()
        wait_start = time.perf_counter()
        if not updated:  # a real GPU, or a device whose peers were still computing
            work[0].wait()
        # This one-element all-reduce is where a device that finished early waits for the
        # slowest (lockstep); synchronising makes the CPU's clock see it on a GPU too.
        dist.all_reduce(self.lockstep)
        device.synchronize()
        wait_s = time.perf_counter() - wait_start
        if not updated:
            self.update(step)
        self.step_done = step
        return self.record(loss=float(self.flat[-1].item()), usage=usage, wait_s=wait_s)
