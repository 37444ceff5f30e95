"""The fully-sharded engine: one rank of an ``fsdp`` plan (uneven ZeRO-3 / FSDP, and HSDP).

What it runs, and what the planner models (DESIGN.md, "Sharded states"):

- Every unit (the embedding, each transformer block, final norm + head) is one flat
  fp32 space cut by :func:`scheduler.planning.plan.shard_bounds` over the sharding
  group's fractions, in rank order. The rank owns its slice of the parameters, of
  the gradient and of AdamW's two moments; AdamW (the job's settings, one weight
  decay for every parameter as in ``dp``) steps on the owned slice alone.
- Forward: a unit is all-gathered just before its module runs, the next module's
  units are prefetched (depth 1, asynchronously, while this one computes), and each
  gathered copy is freed after use: at most two roots' units are resident (GPT's
  head needs the tied embedding as well as its own norm). Backward: the same again
  (embedding tables excepted: their backward reads no weights), and after each
  unit's backward its gradient is reduce-scattered (SUM) into the owned fp32 slice,
  for every micro-batch; no unsharded gradient outlives its unit's backward.
  :mod:`workers.runtime.shards` has the schedule and the collectives.
- Micro-batches: the ranks of a group run the same number of rounds (the largest
  number of micro-batches among them); a rank with fewer, or with no samples, joins
  the remaining rounds' collectives with zero gradients.
- Loss scaled by ``1 / (global_batch · seq_len)`` and gradients summed, as in ``dp``
  (DESIGN.md, Correctness); clipping by the global norm, the squared norms of the
  slices summed over the group; validation as the other engines.
- HSDP (several sharding groups, ``shard_group``): each group shards as above, then
  the ranks owning one slice SUM-all-reduce their gradient slices once per step.
- The pace check (:meth:`FullyShardedEngine.compute_ratio`): a pass's all-gathers and
  reduce-scatters run inside it and wait there for the group's slowest rank, so the
  time its paced passes spent in them
  (:attr:`workers.runtime.shards.ShardComm.collective_s`) is taken off the device's
  compute before it is compared with its paced time.
- Checkpoints are the plan-independent format: the group gathers each unit's
  parameters and moments and one rank per unit (round robin) writes them under
  their whole-model names, so a job moves between ``dp``, ``fsdp`` and ``pp``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any

import torch
import torch.distributed as dist

from workers.checkpoint import read_states, write_part
from workers.devices.device import SimulatedDevice, StepUsage, TorchDevice
from workers.errors import DeviceOutOfMemory
from workers.models.gpt import lm_loss_sum
from workers.records import RankStep
from workers.runtime.distributed import backend_for, new_group
from workers.runtime.engine import Engine, adamw, micro_batches
from workers.runtime.shards import ShardComm, ShardedModel
from workers.runtime.spec import RankSpec, RunSpec, ShardRole

MOMENTS = ("exp_avg", "exp_avg_sq")


class FullyShardedEngine(Engine):
    """One rank of a fully-sharded plan (module docstring).

    Owns, beyond :class:`Engine`'s: the rank's :class:`~workers.runtime.spec.ShardRole`,
    its :class:`~workers.runtime.shards.ShardedModel` (slices, gathered units and their
    schedule; AdamW steps its flat slice), the sharding group's two process groups
    (all-gathers and reduce-scatters) and, with several groups, its replica group; and
    the step's time in collectives inside its paced passes (:attr:`pass_collective_s`).
    """

    def __init__(self, run: RunSpec, rank: RankSpec, device: TorchDevice) -> None:
        if rank.shard is None:
            raise RuntimeError(f"{rank.device_id}: a fully-sharded rank needs its shard role")
        self.role: ShardRole = rank.shard
        self.groups: list[Any] = []
        self.comm = self._form_groups(rank, device)
        self.pass_collective_s = 0.0
        """This step's wall time in collectives inside the device's paced passes (its idle
        rounds' are outside them: not counted)."""
        super().__init__(run, rank, device)
        if isinstance(device, SimulatedDevice):
            device.states = self.sharded

    def _form_groups(self, rank: RankSpec, device: TorchDevice) -> ShardComm:
        """Every rank creates every group's subgroups, in one order, and keeps its own."""
        role = self.role
        mine: dict[str, Any] = {}
        for g, members in enumerate(role.groups):
            for kind in ("gather", "reduce"):
                group = new_group(list(members))
                self.groups.append(group)
                if g == role.group:
                    mine[kind] = group
        self.replica_group = None
        if len(role.groups) > 1:
            for i, ranks in enumerate(role.replicas):
                group = new_group(list(ranks))
                self.groups.append(group)
                if i == role.index:
                    self.replica_group = group
        return ShardComm(
            gather_group=mine["gather"],
            reduce_group=mine["reduce"],
            padded=backend_for(device.torch_device) == "gloo",
        )

    def place_states(self) -> torch.optim.Optimizer:
        """Cut the model (built whole on the CPU) into units; keep only this rank's slice
        on the device."""
        self.sharded = ShardedModel(
            self.model,
            self.run.preset,
            fractions=self.role.fractions,
            index=self.role.index,
            comm=self.comm,
            dtype=self.dtype,
            device=self.device.torch_device,
        )
        return adamw([self.sharded.params], self.run.optimizer)

    # --- the step ------------------------------------------------------------------------

    def _rounds(self, count: int) -> int:
        """The group's number of micro-batch rounds: the most any of its ranks has."""
        most = torch.tensor([count], dtype=torch.int64, device=self.device.torch_device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX, group=self.comm.gather_group)
        return int(most.item())

    def _micro_batch(self, xi: torch.Tensor, yi: torch.Tensor) -> float:
        """Forward and backward of one micro-batch: the one place the model computes."""
        model, device, size = self.model, self.device, len(xi)

        def forward() -> torch.Tensor:
            with self.autocast():
                return lm_loss_sum(model(xi), yi)

        def backward() -> None:
            (loss * self.backward_scale).backward()
            self.sharded.finish_backward()

        before_s = self.comm.collective_s
        loss, saved = device.forward(forward, model=model, micro_batch=size)
        device.backward(backward, micro_batch=size, saved_bytes=saved)
        self.pass_collective_s += self.comm.collective_s - before_s
        return float(loss.detach())

    def step(self, step: int) -> RankStep:
        device = self.device
        self.model.train()
        self.sharded.grads.zero_()
        pairs = micro_batches(*self.batch(step), self.sizes) if self.sizes else []
        rounds = self._rounds(len(pairs))
        device.start_step()
        self.sharded.step_peak = 0
        self.pass_collective_s = 0.0
        loss_sum = 0.0
        for i in range(rounds):
            if i < len(pairs):
                loss_sum += self._micro_batch(*pairs[i])
            else:
                self.sharded.idle_pass()
        if self.replica_group is not None:
            dist.all_reduce(self.sharded.grads, op=dist.ReduceOp.SUM, group=self.replica_group)
        usage = device.finish_step()
        # A rank without samples holds its states and gathered units all the same.
        peak = max(usage.peak_bytes, self.sharded.state_bytes() + self.sharded.step_peak)
        if isinstance(device, SimulatedDevice) and peak > device.capacity_bytes:
            raise DeviceOutOfMemory(device.id, self.rank.micro_batch, peak, device.capacity_bytes)
        wait_start = time.perf_counter()
        # The loss's SUM is also where a rank that finished early waits for the slowest.
        loss = torch.tensor(
            [loss_sum * self.loss_scale], dtype=self.dtype, device=device.torch_device
        )
        dist.all_reduce(loss, op=dist.ReduceOp.SUM)
        device.synchronize()
        wait_s = time.perf_counter() - wait_start
        self.update(step)
        self.step_done = step
        return self.record(loss=float(loss.item()), usage=usage, wait_s=wait_s, peak_bytes=peak)

    def compute_ratio(self, usage: StepUsage) -> float | None:
        """As :meth:`Engine.compute_ratio`, on the compute less the passes' time in
        collectives: they wait for the group's slowest rank, so a fast rank's raw
        compute includes its peers' pacing (1.7x its own paced time on an idle host) and
        would read as a host that cannot keep up; and issuing them is communication,
        which the pacing never paced."""
        own_s = max(0.0, usage.compute_s - self.pass_collective_s)
        return super().compute_ratio(dataclasses.replace(usage, compute_s=own_s))

    def gradients(self) -> list[torch.Tensor]:
        """The owned gradient slice: what the optimizer steps on and loss scaling checks."""
        return [self.sharded.grads]

    def grad_sq_norm(self) -> float:
        """The slices' squared norms summed over the group (after HSDP's sum every
        group holds the same gradient, so one group's sum is the global norm)."""
        local = self.sharded.grads.double().pow(2).sum().reshape(1)
        dist.all_reduce(local, op=dist.ReduceOp.SUM, group=self.comm.gather_group)
        return float(local.item())

    def evaluate(self, val_batches: int) -> float:
        _, pairs = self.val_micro_batches(val_batches)
        rounds = self._rounds(len(pairs))
        loss_sum = 0.0
        self.model.eval()
        with torch.no_grad():
            for i in range(rounds):
                if i < len(pairs):
                    xi, yi = pairs[i]
                    with self.autocast():
                        loss_sum += float(lm_loss_sum(self.model(xi), yi))
                else:
                    self.sharded.idle_pass(backward=False)
        self.model.train()
        return self.mean_val_loss(loss_sum, val_batches)

    def reshard(self, rank: RankSpec) -> None:
        if rank.shard != self.role:
            raise RuntimeError("shards change through a checkpoint, not in place")
        super().reshard(rank)

    def close(self) -> None:
        """Destroy this run's subgroups: the default group may serve the next run."""
        for group in self.groups:
            with contextlib.suppress(Exception):  # a peer that died must not stop the cleanup
                dist.destroy_process_group(group)
        self.groups = []

    # --- states under whole-model names ------------------------------------------------------

    def _whole_units(self, *, moments: bool) -> dict[str, torch.Tensor]:
        """Gather every unit (a collective of the group); keep the units this rank writes
        (unit ``u`` goes to position ``u mod group size``), under every local name."""
        out: dict[str, torch.Tensor] = {}
        state = self.optimizer.state.get(self.sharded.params, {})
        size = len(self.role.members)
        for u, unit in enumerate(self.sharded.units):
            sources = {"model": self.sharded.params}
            if moments:
                sources |= {f"optim/{m}": state[m] for m in MOMENTS if m in state}
            gathered = {k: self.sharded.gather_full(u, v) for k, v in sources.items()}
            if u % size != self.role.index:
                continue
            for slot in unit.slots:
                for kind, flat in gathered.items():
                    value = flat[slot.offset : slot.offset + slot.numel].view(slot.shape).cpu()
                    names = slot.names if kind == "model" and not moments else slot.names[:1]
                    for name in names:
                        out[f"{kind}/{name}"] = value.clone()
        return out

    def save_part(self, uri: str, part: str) -> list[str]:
        return write_part(uri, part, self._whole_units(moments=True))

    def model_state(self) -> dict[str, torch.Tensor]:
        """The units this rank writes, under their whole-model names (a collective)."""
        return {k.removeprefix("model/"): v for k, v in self._whole_units(moments=False).items()}

    def load_checkpoint(self, uri: str, manifest: dict[str, Any]) -> None:
        """Take this rank's slices of a checkpoint written by any plan."""
        sharded = self.sharded
        shapes = {s.names[0]: tuple(s.shape) for unit in sharded.units for s in unit.slots}
        states = read_states(uri, manifest, shapes)
        steps = int(manifest.get("optimizer_steps", 0))
        with_moments = steps > 0 and all(len(v) == 1 + len(MOMENTS) for v in states.values())
        kinds = ["model", *(MOMENTS if with_moments else ())]
        flats = {k: torch.empty_like(sharded.params.data) for k in kinds}
        for u, unit in enumerate(sharded.units):
            for kind, flat in flats.items():
                whole = torch.cat([states[s.names[0]][kind].reshape(-1) for s in unit.slots])
                sharded.owned(flat, u).copy_(whole[unit.start : unit.end])
        with torch.no_grad():
            sharded.params.copy_(flats["model"])
        if len(kinds) > 1:
            self.optimizer.state[sharded.params] = {
                "step": torch.tensor(float(steps)),
                **{m: flats[m] for m in MOMENTS},
            }
        self.step_done = int(manifest["step"])
