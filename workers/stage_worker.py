"""One pipeline stage: the Ray actor that runs its blocks under 1F1B (see :mod:`workers.pipeline`).

One Ray actor per active device of the plan holds its stage's blocks
``[first, last)`` (plus the embedding on stage 0, the final norm and head on
the last stage), built from the seed so the weights equal the whole model's
(:mod:`workers.model`). Ranks are ordered by pipeline, then stage. Per step
each pipeline runs its slice ``[offset, offset + samples)`` of the global
batch in ``accum_steps`` micro-batches, as equal as integers allow, under the
1F1B schedule (Narayanan et al., 2021: ``p − s − 1`` warm-up forwards on stage
``s``, then one forward and one backward alternately, then the remaining
backwards). Activations go forward and their gradients backward with
torch.distributed point-to-point operations on the job's process group (gloo
on CPU, nccl on CUDA): sends are asynchronous, receives blocking, which keeps
the schedule free of deadlock.

Loss and gradients as in data parallelism (DESIGN.md, Correctness): the last
stage sums token cross-entropy and divides by ``global_batch · seq_len``.
Then every piece of the model (token embedding, position embedding, each
block, the final norm) is SUM-all-reduced among the devices that hold it,
one all-reduce per distinct set of holders on its own subgroup: across
pipelines in a hybrid plan, and for the tied token embedding between the
first stage (embedding) and the last (head copy) — which keeps the two copies
equal and their update the one single-device training makes. These
all-reduces (and the loss's, on a group of its own so that collectives never
share a group with the point-to-point traffic) start as soon as a stage's last
backward is done and overlap the rest of its paced time, as the data-parallel
runtime does. All ranks then take the same AdamW step (lockstep).

Simulated devices are paced like the data-parallel ones: a stage's
micro-batch takes ``K · (speed_max / speed_i) · t_host(stage, m)`` where the
stage's host time is the sum of its pieces' (:mod:`workers.layer_profile`),
a third for the forward and two thirds for the backward; a pass that overruns
its target is paid back by the next ones. Memory is counted as
the model states plus the saved activations of the micro-batches in flight,
and an excess raises the same out-of-memory error as data parallelism.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from scheduler.models import ModelPreset
from workers.actors import free_port
from workers.data import ByteDataset
from workers.devices import CudaDevice, Pacing, _SavedBytes, model_state_bytes
from workers.errors import DeviceOutOfMemory
from workers.model import GPT, lm_loss_sum
from workers.records import OptimizerConfig
from workers.runtime import COLLECTIVE_TIMEOUT_S, DTYPES, micro_batch_sizes

FORWARD_SHARE = 1 / 3
"""Share of a micro-batch's paced time spent in the forward pass (backward ≈ 2× forward)."""

SyncGroup = tuple[tuple[int, ...], tuple[str, ...]]
"""Ranks holding the same pieces, and those pieces' names."""


def piece_of_param(name: str) -> str:
    """The piece a stage module's parameter belongs to (its global name)."""
    if name in ("embed.wte.weight", "head.weight"):
        return "wte"
    if name.startswith("embed."):
        return "wpe"
    if name.startswith("blocks."):
        return f"block{name.split('.')[1]}"
    return "ln_f"


# --- the stage actor -------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class StageSpec:
    device_id: str
    rank: int
    world_size: int
    preset: ModelPreset
    seed: int
    global_batch: int
    offset: int
    samples: int
    accum_steps: int
    first: int
    last: int
    stage: int
    num_stages: int
    prev_rank: int | None
    next_rank: int | None
    groups: tuple[SyncGroup, ...]
    optimizer: OptimizerConfig
    dataset: Path | None
    simulated: bool
    capacity_bytes: int = 0
    pacing: Pacing | None = None
    """The stage's pacing (host time of its pieces), simulated devices only."""
    dtype: str = "float32"
    """Parameter, activation and gradient precision (``float64`` for exactness checks)."""


class PipelineWorker:
    """One pipeline stage (made remote by the driver)."""

    def __init__(self, spec: StageSpec) -> None:
        torch.set_num_threads(1)
        self.spec = spec
        self.torch_device = (
            torch.device("cpu")
            if spec.simulated
            else CudaDevice(device_id=spec.device_id).torch_device
        )
        self.model: GPT | None = None
        self._overrun_s = 0.0
        self.mine: list[tuple[Any, list[torch.nn.Parameter]]] = []

    def rendezvous(self) -> tuple[str, int]:
        return free_port()

    def setup(self, master_addr: str, master_port: int) -> None:
        spec = self.spec
        dist.init_process_group(
            "gloo" if spec.simulated else "nccl",
            init_method=f"tcp://{master_addr}:{master_port}",
            rank=spec.rank,
            world_size=spec.world_size,
            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
        )
        self.model = GPT(
            spec.preset,
            seed=spec.seed,
            first=spec.first,
            last=spec.last,
            embed=spec.stage == 0,
            head=spec.stage == spec.num_stages - 1,
        )
        self.dtype = DTYPES[spec.dtype]
        self.model.to(device=self.torch_device, dtype=self.dtype)
        named = dict(self.model.named_parameters())
        for ranks, pieces in spec.groups:  # every rank creates every group, in one order
            group = dist.new_group(list(ranks))
            if spec.rank in ranks:
                params = [
                    p
                    for n, p in sorted(named.items(), key=lambda kv: (piece_of_param(kv[0]), kv[0]))
                    if piece_of_param(n) in pieces
                ]
                self.mine.append((group, params))
        # The loss gets its own group: collectives never share one with the p2p traffic.
        self.loss_group = dist.new_group(list(range(spec.world_size)))
        opt = spec.optimizer
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=opt.lr,
            betas=(opt.beta1, opt.beta2),
            weight_decay=opt.weight_decay,
        )
        self.states = model_state_bytes(self.model)
        self.data = ByteDataset(
            spec.dataset, seq_len=spec.preset.seq_len, vocab_size=spec.preset.vocab_size
        )

    def _pace(self, start: float, share: float, size: int) -> float:
        """Sleep out a simulated device's target; the device time of this pass.

        A pass that overran its target (contention, a late wake-up) is paid back
        by sleeping that much less in the next ones, so that a step's many short
        passes add up to the paced total rather than to the sum of overruns.
        """
        if not self.spec.simulated:
            torch.cuda.synchronize(self.torch_device)
            return time.perf_counter() - start
        assert self.spec.pacing is not None
        target = share * self.spec.pacing.target_s(size)
        remaining = target - self._overrun_s - (time.perf_counter() - start)
        if remaining > 0:
            time.sleep(remaining)
        elapsed = time.perf_counter() - start
        self._overrun_s = max(0.0, self._overrun_s + elapsed - target)
        return elapsed

    def step(self, step: int) -> dict[str, Any]:
        spec, model = self.spec, self.model
        assert model is not None, "setup() first"
        begin = time.perf_counter()
        self._overrun_s = 0.0
        model.train()
        self.optimizer.zero_grad(set_to_none=True)
        is_first, is_last = spec.stage == 0, spec.stage == spec.num_stages - 1
        sizes = micro_batch_sizes(spec.samples, spec.accum_steps)
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        x = y = None
        if is_first or is_last:
            x, y = self.data.device_batch(
                seed=spec.seed,
                step=step,
                global_batch=spec.global_batch,
                offset=spec.offset,
                samples=spec.samples,
            )
            x, y = x.to(self.torch_device), y.to(self.torch_device)
        scale = 1.0 / (spec.global_batch * spec.preset.seq_len)
        T, C = spec.preset.seq_len, spec.preset.d_model
        inputs: dict[int, torch.Tensor] = {}
        outputs: dict[int, torch.Tensor] = {}
        saved: dict[int, int] = {}
        sends: list[Any] = []
        syncing: list[Any] = []
        acc = {"busy": 0.0, "peak": 0, "flight": 0, "loss": 0.0}
        if not spec.simulated:
            torch.cuda.reset_peak_memory_stats(self.torch_device)

        def forward(i: int) -> None:
            size = sizes[i]
            if is_first:
                assert x is not None
                inp = x[starts[i] : starts[i] + size]
            else:
                inp = torch.empty(
                    size, T, C, device=self.torch_device, dtype=self.dtype
                )  # (B, T, C)
                dist.recv(inp, src=spec.prev_rank)
                inp.requires_grad_(True)
            start = time.perf_counter()
            counter = _SavedBytes(model)
            try:
                with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
                    out = model(inp)
                    if is_last:
                        assert y is not None
                        loss = lm_loss_sum(out, y[starts[i] : starts[i] + size])
                        acc["loss"] += float(loss.detach())
                        out = loss * scale
            except torch.cuda.OutOfMemoryError as exc:
                raise DeviceOutOfMemory(
                    spec.device_id, size, spec.capacity_bytes + 1, spec.capacity_bytes
                ) from exc
            saved[i] = counter.bytes
            acc["flight"] += counter.bytes
            if spec.simulated:
                need = self.states + int(acc["flight"])
                if need > spec.capacity_bytes:
                    raise DeviceOutOfMemory(spec.device_id, size, need, spec.capacity_bytes)
                acc["peak"] = max(acc["peak"], need)
            # A simulated device hands its output on only once its paced time
            # is over, as a real GPU's result exists only when its kernels end.
            acc["busy"] += self._pace(start, FORWARD_SHARE, size)
            if not is_last:
                sends.append(dist.isend(out.detach().contiguous(), dst=spec.next_rank))
            inputs[i], outputs[i] = inp, out

        def backward(i: int) -> None:
            out, inp = outputs.pop(i), inputs.pop(i)
            grad = None
            if not is_last:
                grad = torch.empty_like(out)
                dist.recv(grad, src=spec.next_rank)
            start = time.perf_counter()
            out.backward(grad)
            acc["flight"] -= saved.pop(i)
            if i == len(sizes) - 1:  # gradients complete: overlap their sync with pacing
                syncing.extend(self._start_sync(acc["loss"] * scale))
            acc["busy"] += self._pace(start, 1 - FORWARD_SHARE, sizes[i])
            if not is_first:  # after the paced time, as in forward
                assert inp.grad is not None
                sends.append(dist.isend(inp.grad.contiguous(), dst=spec.prev_rank))

        m = len(sizes)
        warmup = min(spec.num_stages - spec.stage - 1, m)
        for i in range(warmup):
            forward(i)
        for i in range(m - warmup):
            forward(warmup + i)
            backward(i)
        for i in range(m - warmup, m):
            backward(i)
        for work in sends:
            work.wait()
        loss = self._finish_sync(syncing)
        self.optimizer.step()
        peak = (
            int(acc["peak"])
            if spec.simulated
            else int(torch.cuda.max_memory_allocated(self.torch_device))
        )
        wall = time.perf_counter() - begin
        return {
            "loss": float(loss.item()),
            "busy_s": acc["busy"],
            "wait_s": max(wall - acc["busy"], 0.0),
            "peak_bytes": peak,
        }

    def _start_sync(self, loss_part: float) -> list[Any]:
        """Start the SUM all-reduces: each piece among its holders, then the loss."""
        pending: list[Any] = []
        for group, params in self.mine:
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            flat = torch.cat([g.reshape(-1) for g in grads])
            work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group, async_op=True)
            pending.append((work, flat, params))
        loss = torch.tensor([loss_part], device=self.torch_device, dtype=self.dtype)
        work = dist.all_reduce(loss, op=dist.ReduceOp.SUM, group=self.loss_group, async_op=True)
        pending.append((work, loss, None))
        return pending

    @staticmethod
    def _finish_sync(pending: list[Any]) -> torch.Tensor:
        """Wait for the all-reduces, put the summed gradients back; the step's loss."""
        loss = None
        for work, flat, params in pending:
            work.wait()
            if params is None:
                loss = flat
                continue
            offset = 0
            for p in params:
                n = p.numel()
                p.grad = flat[offset : offset + n].view_as(p).clone()
                offset += n
        assert loss is not None
        return loss

    def state_dict(self) -> dict[str, Any]:
        """This stage's parameters under their whole-model names."""
        assert self.model is not None
        return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    def pid(self) -> int:
        return os.getpid()
