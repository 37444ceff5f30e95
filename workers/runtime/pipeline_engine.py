"""The pipeline engine: one stage of a ``pp`` or ``hybrid`` plan under 1F1B.

The schedule follows Narayanan et al., 2021; point-to-point transfers are paired
as in Megatron-LM's ``p2p_communication``; loss and gradients are those of data
parallelism (DESIGN.md, Correctness).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from workers.devices.device import SimulatedDevice, TorchDevice
from workers.models.families import piece_of_param
from workers.models.gpt import lm_loss_sum
from workers.records import RankStep
from workers.runtime.distributed import new_group
from workers.runtime.engine import Engine, micro_batches
from workers.runtime.precision import agree_overflow, nonfinite
from workers.runtime.spec import RankSpec, RunSpec


@dataclass(kw_only=True, slots=True)
class _InFlight:
    """One step's micro-batches on this stage between their forward and backward."""

    pairs: list[tuple[torch.Tensor, torch.Tensor]]
    """Inputs and targets per micro-batch on the first and last stage; empty elsewhere."""
    inputs: dict[int, torch.Tensor] = field(default_factory=dict)
    outputs: dict[int, torch.Tensor] = field(default_factory=dict)
    """What backward starts from: the activations sent on, or the scaled loss."""
    saved_bytes: dict[int, int] = field(default_factory=dict)
    """Activation bytes each forward saved, released by its backward."""
    loss_sum: float = 0.0
    """Summed token cross-entropy of the last stage's micro-batches so far."""
    syncing: list[Any] = field(default_factory=list)
    """The all-reduces once started: by the last backward on a paced device."""


def _to(tensor: torch.Tensor | None, peer: int | None) -> tuple[torch.Tensor, int] | None:
    """A transfer of ``tensor`` with ``peer``, or none when either is missing."""
    return None if tensor is None or peer is None else (tensor, peer)


class PipelineEngine(Engine):
    """One pipeline stage of a rank: its blocks, its place and its groups.

    Owns, beyond :class:`Engine`'s model slice and optimizer: the rank's
    :class:`~workers.runtime.spec.StageRole` (stage, neighbours, pipeline); one
    process subgroup per model piece it shares with other ranks
    (:func:`workers.runtime.stages.sync_groups`: across pipelines in a hybrid plan,
    and the tied token embedding between the first stage and the last), with the
    parameters each SUM-all-reduces; the loss's group of its own; and which
    parameters count in the global gradient norm.

    A step runs the stage's micro-batches under 1F1B: ``p − s − 1`` warm-up
    forwards on stage ``s``, then one forward and one backward alternately, then
    the remaining backwards. Each send is paired with the receive it meets in one
    ``dist.batch_isend_irecv``: on NCCL a lone send blocks until its receive is
    posted, so unpaired sends in 1F1B's steady state deadlock (gloo buffers them,
    which hides the problem on the CPU). The last stage sums token cross-entropy
    and scales it by ``1 / (global_batch · seq_len)``. The all-reduces start once
    the stage's last backward is done; all ranks then take the same AdamW step.
    A paced (simulated) device hands its output on only once its paced time is
    over, as a real GPU's result exists only when its kernels end, and starts its
    collectives before that so they overlap the pacing; a real GPU posts the last
    send first and then the collectives.
    """

    def __init__(self, run: RunSpec, rank: RankSpec, device: TorchDevice) -> None:
        super().__init__(run, rank, device)
        assert rank.stage is not None
        self.role = rank.stage
        named = dict(self.model.named_parameters())
        self.mine: list[tuple[Any, list[torch.nn.Parameter]]] = []
        # A piece held by several ranks counts once in the global gradient norm: its lowest rank's.
        self.counted = list(named.values())
        for ranks, pieces in self.role.groups:  # every rank creates every group, in one order
            group = new_group(list(ranks))
            if rank.rank in ranks:
                params = [
                    p
                    for n, p in sorted(
                        named.items(), key=lambda kv: (piece_of_param(run.preset, kv[0]), kv[0])
                    )
                    if piece_of_param(run.preset, n) in pieces
                ]
                self.mine.append((group, params))
                if rank.rank != min(ranks):
                    shared = {id(p) for p in params}
                    self.counted = [p for p in self.counted if id(p) not in shared]
        # The loss gets its own group: collectives never share one with the p2p traffic.
        self.loss_group = new_group(list(range(rank.world_size)))
        self.paced = isinstance(device, SimulatedDevice)

    # --- point to point ---------------------------------------------------------

    def _exchange(
        self, send: tuple[torch.Tensor, int] | None, recv: tuple[torch.Tensor, int] | None
    ) -> None:
        """Post a send and/or a receive together and wait for both."""
        ops = []
        if send is not None:
            ops.append(dist.P2POp(dist.isend, send[0], send[1]))
        if recv is not None:
            ops.append(dist.P2POp(dist.irecv, recv[0], recv[1]))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()

    def _activation(self, i: int, size: int | None = None) -> torch.Tensor:
        """A buffer for micro-batch ``i``'s activations (``size`` samples when given)."""
        T, C = self.run.preset.seq_len, self.run.preset.d_model
        n = self.sizes[i] if size is None else size
        return torch.empty(n, T, C, device=self.device.torch_device, dtype=self.dtype)

    # --- validation ----------------------------------------------------------------

    def evaluate(self, val_batches: int) -> float:
        """Forward only, stage after stage: each micro-batch's activations go to the next
        stage (a lone send in one direction cannot deadlock), the last stage sums the
        loss, and the sum is reduced over every rank as in training."""
        role, model = self.role, self.model
        sizes, pairs = self.val_micro_batches(val_batches, load=role.is_first or role.is_last)
        loss_sum = 0.0
        model.eval()
        with torch.no_grad():
            for i, size in enumerate(sizes):
                if role.prev_rank is None:
                    inp = pairs[i][0]
                else:
                    inp = self._activation(i, size)
                    self._exchange(None, (inp, role.prev_rank))
                with self.autocast():
                    out = model(inp)
                if role.is_last:
                    loss_sum += float(lm_loss_sum(out, pairs[i][1]))
                else:
                    assert role.next_rank is not None
                    self._exchange((out.to(self.dtype).contiguous(), role.next_rank), None)
        model.train()
        return self.mean_val_loss(loss_sum, val_batches, self.loss_group)

    # --- the step ----------------------------------------------------------------

    def step(self, step: int) -> RankStep:
        role, device = self.role, self.device
        begin = time.perf_counter()
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loads = role.is_first or role.is_last
        flight = _InFlight(pairs=micro_batches(*self.batch(step), self.sizes) if loads else [])
        device.start_step()
        warmup = min(role.num_stages - role.stage - 1, len(self.sizes))
        self._warmup(flight, warmup)
        self._steady(flight, warmup)
        self._cooldown(flight, warmup)
        if not flight.syncing:
            flight.syncing.extend(self._start_sync(flight.loss_sum))
        usage = device.finish_step()
        loss = self._finish_sync(flight.syncing)
        self.update(step)
        device.synchronize()
        self.step_done = step
        wall = time.perf_counter() - begin
        return self.record(
            loss=float(loss.item()), usage=usage, wait_s=max(wall - usage.busy_s, 0.0)
        )

    # --- the three phases of 1F1B ---------------------------------------------------

    def _warmup(self, flight: _InFlight, warmup: int) -> None:
        """The first ``warmup`` forwards, each output sent on alone."""
        for i in range(warmup):
            out = self._forward(flight, i, self._first_input(flight, i))
            self._exchange(_to(out, self.role.next_rank), None)

    def _steady(self, flight: _InFlight, warmup: int) -> None:
        """One forward and one backward alternately: a forward's output goes out with
        the receive of the oldest micro-batch's gradient, that backward's input
        gradient with the receive of the next input."""
        prev, nxt = self.role.prev_rank, self.role.next_rank
        steady = len(self.sizes) - warmup
        if steady <= 0:
            return
        inp = self._first_input(flight, warmup)
        for k in range(steady):
            out = self._forward(flight, warmup + k, inp)
            grad = None if nxt is None else self._activation(k)
            self._exchange(_to(out, nxt), _to(grad, nxt))
            in_grad = self._backward(flight, k, grad)
            recv = None
            if k < steady - 1:
                if prev is None:
                    inp = flight.pairs[warmup + k + 1][0]
                else:
                    inp = self._activation(warmup + k + 1)
                    recv = (inp, prev)
            self._exchange(_to(in_grad, prev), recv)
            if recv is not None:
                inp.requires_grad_(True)

    def _cooldown(self, flight: _InFlight, warmup: int) -> None:
        """The backwards of the last ``warmup`` micro-batches."""
        prev, nxt = self.role.prev_rank, self.role.next_rank
        m = len(self.sizes)
        for i in range(m - warmup, m):
            grad = None
            if nxt is not None:
                grad = self._activation(i)
                self._exchange(None, (grad, nxt))
            in_grad = self._backward(flight, i, grad)
            self._exchange(_to(in_grad, prev), None)

    # --- one micro-batch ------------------------------------------------------------

    def _first_input(self, flight: _InFlight, i: int) -> torch.Tensor:
        """Micro-batch ``i``'s input: its tokens on stage 0, else received."""
        prev = self.role.prev_rank
        return flight.pairs[i][0] if prev is None else self._recv(i, prev)

    def _forward(self, flight: _InFlight, i: int, inp: torch.Tensor) -> torch.Tensor | None:
        """Compute micro-batch ``i``; returns what goes to the next stage."""
        role, model, device = self.role, self.model, self.device

        def run() -> torch.Tensor:
            with self.autocast():
                out = model(inp)
                if role.is_last:
                    loss = lm_loss_sum(out, flight.pairs[i][1])
                    flight.loss_sum += float(loss.detach())
                    out = loss * self.backward_scale
            return out

        out, flight.saved_bytes[i] = device.forward(run, model=model, micro_batch=self.sizes[i])
        flight.inputs[i], flight.outputs[i] = inp, out
        return None if role.is_last else out.detach().contiguous()

    def _backward(
        self, flight: _InFlight, i: int, grad: torch.Tensor | None
    ) -> torch.Tensor | None:
        """Backward of micro-batch ``i``; returns the gradient for the previous stage."""
        out, inp = flight.outputs.pop(i), flight.inputs.pop(i)
        # A paced device overlaps its collectives with its pacing; a GPU starts them
        # after its last send (in step), so no collective waits ahead of that send.
        overlap = i == len(self.sizes) - 1 and self.paced
        self.device.backward(
            lambda: out.backward(None if grad is None else grad.to(out.dtype)),
            micro_batch=self.sizes[i],
            saved_bytes=flight.saved_bytes.pop(i),
            after=(
                (lambda: flight.syncing.extend(self._start_sync(flight.loss_sum)))
                if overlap
                else None
            ),
        )
        if self.role.is_first:
            return None
        assert inp.grad is not None
        return inp.grad.contiguous()

    def close(self) -> None:
        """Destroy this run's subgroups: the default group may serve the next run."""
        for group in [g for g, _ in self.mine] + [self.loss_group]:
            with contextlib.suppress(Exception):  # a peer that died must not stop the cleanup
                dist.destroy_process_group(group)
        self.mine = []

    def overflowed(self) -> bool:
        """Every stage's verdict on its own gradients, agreed by one all-reduce over the
        whole job (in the loss's group, which spans every rank and carries no p2p)."""
        local = nonfinite(p.grad for p in self.model.parameters())
        return agree_overflow(local, device=self.device.torch_device, group=self.loss_group)

    def grad_sq_norm(self) -> float:
        """Each rank's share of the squared norm, summed over the whole group."""
        local = sum(float(p.grad.double().pow(2).sum()) for p in self.counted if p.grad is not None)
        total = torch.tensor([local], dtype=torch.float64, device=self.device.torch_device)
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=self.loss_group)
        return float(total.item())

    def _recv(self, i: int, src: int) -> torch.Tensor:
        inp = self._activation(i)
        self._exchange(None, (inp, src))
        return inp.requires_grad_(True)

    def _start_sync(self, loss_part: float) -> list[Any]:
        """Start the SUM all-reduces: each piece among its holders, then the loss."""
        pending: list[Any] = []
        for group, params in self.mine:
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            flat = torch.cat([g.reshape(-1) for g in grads])
            work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group, async_op=True)
            pending.append((work, flat, params))
        loss = torch.tensor(
            [loss_part * self.loss_scale], device=self.device.torch_device, dtype=self.dtype
        )
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
