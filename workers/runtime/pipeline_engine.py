"""The pipeline engine: one stage of a ``pp`` or ``hybrid`` plan under 1F1B.

A rank holds blocks ``[first, last)`` (plus the embedding on stage 0, the
final norm and head on the last stage), built from the seed so the weights
equal the whole model's (:mod:`workers.models.gpt`). Per step its pipeline runs its
slice of the global batch in ``accum_steps`` micro-batches under the 1F1B
schedule (Narayanan et al., 2021: ``p − s − 1`` warm-up forwards on stage
``s``, then one forward and one backward alternately, then the remaining
backwards). Activations go forward and their gradients backward point to
point, each send paired with the receive it meets in one
``dist.batch_isend_irecv`` (as Megatron-LM's ``p2p_communication`` does):
on NCCL a lone send blocks until its receive is posted, so unpaired sends in
1F1B's steady state deadlock; gloo buffers them, which hides the problem on
the CPU.

Loss and gradients as in data parallelism (DESIGN.md, Correctness): the last
stage sums token cross-entropy and divides by ``global_batch · seq_len``.
Every piece of the model is SUM-all-reduced among the ranks that hold it
(:func:`workers.runtime.stages.sync_groups`): across pipelines in a hybrid plan, and
for the tied token embedding between the first stage and the last. Those
all-reduces, and the loss's on a group of its own, start once the stage's
last backward is done; all ranks then take the same AdamW step (lockstep).

Time and memory go through the rank's :class:`~workers.devices.device.TorchDevice`
like every other engine. A paced (simulated) device hands its output on only
once its paced time is over, as a real GPU's result exists only when its
kernels end, and starts its collectives before that so they overlap the
pacing; a real GPU posts the last send first and then the collectives.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch
import torch.distributed as dist

from workers.devices.device import SimulatedDevice, TorchDevice
from workers.models.families import piece_of_param
from workers.models.gpt import lm_loss_sum
from workers.records import RankStep
from workers.runtime.distributed import new_group
from workers.runtime.engine import Engine, micro_batches
from workers.runtime.spec import RankSpec, RunSpec


class PipelineEngine(Engine):
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
        role, model, device = self.role, self.model, self.device
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
                with device.autocast():
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
        role, model, device = self.role, self.model, self.device
        begin = time.perf_counter()
        model.train()
        self.optimizer.zero_grad(set_to_none=True)
        m = len(self.sizes)
        pairs = (
            micro_batches(*self.batch(step), self.sizes) if role.is_first or role.is_last else []
        )
        inputs: dict[int, torch.Tensor] = {}
        outputs: dict[int, torch.Tensor] = {}
        saved: dict[int, int] = {}
        syncing: list[Any] = []
        loss_part = [0.0]
        device.start_step()

        def first_input(i: int) -> torch.Tensor:
            return pairs[i][0]

        def forward(i: int, inp: torch.Tensor) -> torch.Tensor | None:
            """Compute micro-batch ``i``; returns what goes to the next stage."""
            size = self.sizes[i]

            def run() -> torch.Tensor:
                with device.autocast():
                    out = model(inp)
                    if role.is_last:
                        loss = lm_loss_sum(out, pairs[i][1])
                        loss_part[0] += float(loss.detach())
                        out = loss * self.loss_scale
                return out

            out, saved[i] = device.forward(run, model=model, micro_batch=size)
            inputs[i], outputs[i] = inp, out
            return None if role.is_last else out.detach().contiguous()

        def backward(i: int, grad: torch.Tensor | None) -> torch.Tensor | None:
            """Backward of micro-batch ``i``; returns the gradient for the previous stage."""
            out, inp = outputs.pop(i), inputs.pop(i)
            last = i == m - 1
            # A paced device overlaps its collectives with its pacing; a GPU starts them
            # after its last send (below), so no collective waits ahead of that send.
            overlap = last and self.paced
            device.backward(
                lambda: out.backward(None if grad is None else grad.to(out.dtype)),
                micro_batch=self.sizes[i],
                saved_bytes=saved.pop(i),
                after=(lambda: syncing.extend(self._start_sync(loss_part[0]))) if overlap else None,
            )
            if role.is_first:
                return None
            assert inp.grad is not None
            return inp.grad.contiguous()

        prev, nxt = role.prev_rank, role.next_rank
        warmup = min(role.num_stages - role.stage - 1, m)
        steady = m - warmup
        for i in range(warmup):
            inp = first_input(i) if prev is None else self._recv(i, prev)
            out = forward(i, inp)
            self._exchange((out, nxt) if out is not None and nxt is not None else None, None)
        if steady > 0:
            inp = first_input(warmup) if prev is None else self._recv(warmup, prev)
        for k in range(steady):
            out = forward(warmup + k, inp)
            grad = None if nxt is None else self._activation(k)
            self._exchange(
                (out, nxt) if out is not None and nxt is not None else None,
                (grad, nxt) if grad is not None and nxt is not None else None,
            )
            in_grad = backward(k, grad)
            more = k < steady - 1
            recv = None
            if more:
                if prev is None:
                    inp = first_input(warmup + k + 1)
                else:
                    inp = self._activation(warmup + k + 1)
                    recv = (inp, prev)
            self._exchange(
                (in_grad, prev) if in_grad is not None and prev is not None else None, recv
            )
            if recv is not None:
                inp.requires_grad_(True)
        for i in range(steady, m):
            grad = None
            if nxt is not None:
                grad = self._activation(i)
                self._exchange(None, (grad, nxt))
            in_grad = backward(i, grad)
            self._exchange(
                (in_grad, prev) if in_grad is not None and prev is not None else None, None
            )
        if not syncing:
            syncing.extend(self._start_sync(loss_part[0]))
        usage = device.finish_step()
        loss = self._finish_sync(syncing)
        self.update(step)
        device.synchronize()
        self.step_done = step
        wall = time.perf_counter() - begin
        return self.record(
            loss=float(loss.item()),
            busy_s=usage.busy_s,
            wait_s=max(wall - usage.busy_s, 0.0),
            peak_bytes=usage.peak_bytes,
        )

    def close(self) -> None:
        """Destroy this run's subgroups: the default group may serve the next run."""
        for group in [g for g, _ in self.mine] + [self.loss_group]:
            with contextlib.suppress(Exception):  # a peer that died must not stop the cleanup
                dist.destroy_process_group(group)
        self.mine = []

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
