"""A model's states cut into flat shards, gathered one unit at a time (fully-sharded DP).

The layout and the schedule behind :class:`workers.runtime.fsdp.FullyShardedEngine`,
after PyTorch FSDP (Zhao et al., 2023: flat parameters, storage freed and refilled
in place, prefetch of the next unit) but with per-rank slices of any size, cut by
:func:`scheduler.planning.plan.shard_bounds` as the planner cuts them.

A *unit* is one flat buffer: the embedding's parameters, each transformer block's,
and the final norm's and head's (GPT's tied head weight is the embedding's, so it
stays in the embedding's unit). A *root* is a top-level module of the model (the
embedding, each block, the head; Llama's final norm and output are two roots of one
unit) and needs the units its parameters are in. Autograd drives the schedule:

- forward, before root ``j`` runs: its units are all-gathered (waiting for the
  prefetch), root ``j + 1``'s are prefetched (issued asynchronously), every other
  gathered unit is freed, so at most two roots' units are resident; all are freed
  when the last root ends;
- backward, when the gradient of root ``j``'s output is ready (its backward is about
  to run): the same for root ``j`` and the next root of the backward order, except
  that a root made only of embedding tables needs no parameters in backward and
  gathers none;
- a unit's gradient is complete when its flat buffer's gradient is accumulated; it is
  then reduce-scattered (SUM) into this rank's slice and the unsharded gradient freed
  (one reduce-scatter in flight at a time). Reduce-scatters are issued in one fixed
  order on every rank, and all-gathers and reduce-scatters each have a process group
  of their own, so the ranks' collectives always meet in the same order.

A rank with fewer micro-batches than its group runs :meth:`ShardedModel.idle_pass`:
the same collectives, no compute, zero gradients.

The time a rank spends in its collectives is counted (:attr:`ShardComm.collective_s`:
issuing them, gloo's staging copies, blocked until they complete): inside a pass it is
communication and time spent on the group's slowest rank, not the compute a simulated
device is paced to, and its pace check leaves it out.

Collectives: ``nccl`` takes lists of unequal slices as they are; ``gloo`` (torch
2.13) takes an unequal ``reduce_scatter`` but rejects an unequal ``all_gather``, so
there every slice is padded to the largest and the padding is counted
(:attr:`ShardComm.padding_bytes`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scheduler.models.presets import ModelPreset
from scheduler.planning.plan import shard_bounds
from workers.checkpoint import global_name
from workers.devices.device import MODEL_STATE_COPIES, HeldStates
from workers.models.families import FAMILIES, piece_of_param


@dataclass(kw_only=True, slots=True)
class Slot:
    """One parameter inside its unit's flat space."""

    names: list[str]
    """Its local names (a tied parameter has two); the first is its global name."""
    locations: list[tuple[nn.Module, str]]
    """Every (module, attribute) that holds it."""
    shape: torch.Size
    offset: int

    @property
    def numel(self) -> int:
        return self.shape.numel()


@dataclass(kw_only=True, slots=True)
class Root:
    """A top-level module and the units it needs."""

    module: nn.Module
    units: tuple[int, ...]
    gathers_in_backward: bool
    """False for embedding tables: their backward reads no weights."""


@dataclass(kw_only=True, slots=True)
class Pending:
    """A collective in flight, the group whose clock times it, and what completes it."""

    work: Any
    comm: ShardComm
    finish: Callable[[], None] | None = None

    def wait(self) -> None:
        with self.comm.timing():
            self.work.wait()
            if self.finish is not None:
                self.finish()


@dataclass(kw_only=True, slots=True)
class ShardComm:
    """The collectives of one sharding group: all-gathers and reduce-scatters on groups
    of their own, padded where the backend needs it; counts what it sends and the time
    this rank spends in them."""

    gather_group: Any
    reduce_group: Any
    padded: bool
    """gloo: pad every slice of an all-gather to the largest."""
    comm_bytes: int = 0
    """Bytes this rank has received by all-gather and sent by reduce-scatter, padding included."""
    padding_bytes: int = 0
    collective_s: float = 0.0
    """Wall time this rank has spent in its collectives, from issuing each (gloo's staging
    copies included) and from awaiting its handle to its completion: the transfer, and
    its peers' compute and pacing while it waits for them."""

    @contextmanager
    def timing(self) -> Iterator[None]:
        """Count the time inside as time in this group's collectives."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.collective_s += time.perf_counter() - start

    def wait(self, work: Any) -> None:
        """Block until ``work`` (a collective's handle) completes."""
        with self.timing():
            work.wait()

    def all_gather(
        self, out: torch.Tensor, shard: torch.Tensor, bounds: list[tuple[int, int]]
    ) -> tuple[Pending, int]:
        """Start gathering every rank's slice into ``out``; the handle and the bytes of
        its staging buffer (held until it completes)."""
        with self.timing():
            return self._all_gather(out, shard, bounds)

    def _all_gather(
        self, out: torch.Tensor, shard: torch.Tensor, bounds: list[tuple[int, int]]
    ) -> tuple[Pending, int]:
        esize = out.element_size()
        if not self.padded:
            outs = [out[s:e] for s, e in bounds]
            work = dist.all_gather(outs, shard, group=self.gather_group, async_op=True)
            self.comm_bytes += (out.numel() - shard.numel()) * esize
            return Pending(work=work, comm=self), 0
        width = max(e - s for s, e in bounds)
        staging = torch.zeros((len(bounds) + 1) * width, dtype=out.dtype, device=out.device)
        chunks = list(staging.split(width))
        send = chunks.pop()
        send[: shard.numel()] = shard
        work = dist.all_gather(chunks, send, group=self.gather_group, async_op=True)

        def finish() -> None:
            for (s, e), chunk in zip(bounds, chunks, strict=True):
                out[s:e] = chunk[: e - s]

        self.comm_bytes += (len(bounds) - 1) * width * esize
        self.padding_bytes += (len(bounds) * width - out.numel()) * esize
        return Pending(work=work, comm=self, finish=finish), staging.numel() * esize

    def reduce_scatter(
        self, full: torch.Tensor, bounds: list[tuple[int, int]], index: int
    ) -> tuple[Any, torch.Tensor]:
        """Start summing ``full`` over the group into this rank's slice; handle and output."""
        start, end = bounds[index]
        out = torch.empty(end - start, dtype=full.dtype, device=full.device)
        inputs = [full[s:e] for s, e in bounds]
        with self.timing():
            work = dist.reduce_scatter(
                out, inputs, op=dist.ReduceOp.SUM, group=self.reduce_group, async_op=True
            )
        self.comm_bytes += (full.numel() - out.numel()) * full.element_size()
        return work, out


class FlatUnit:
    """One unit's parameters as one flat space: its layout, this rank's slice of it and
    the gathered buffer, whose storage exists only while the unit is in use."""

    def __init__(
        self, *, name: str, slots: list[Slot], bounds: list[tuple[int, int]], index: int
    ) -> None:
        self.name, self.slots, self.bounds = name, slots, bounds
        self.numel = sum(s.numel for s in slots)
        self.start, self.end = bounds[index]
        self.full: torch.Tensor = torch.empty(0)
        """The gathered parameters: a leaf whose gradient is the unit's unsharded one."""
        self.pending: Pending | None = None
        self.resident = False

    def make_buffer(self, dtype: torch.dtype, device: torch.device) -> None:
        self.full = torch.zeros(self.numel, dtype=dtype, device=device, requires_grad=True)
        self.full.untyped_storage().resize_(0)

    @property
    def nbytes(self) -> int:
        return self.numel * self.full.element_size()

    def install(self) -> None:
        """Point the modules' parameter attributes at views of the gathered buffer.

        One ``split`` for the unit (its slots are contiguous, in order), not a slice per
        parameter: autograd then builds the unit's gradient as one concatenation, where a
        slice's backward pads each parameter's gradient to the whole unit, zeros and an
        addition of the unit's size per parameter (3.5 of gpt-tiny's 26 ms a pass)."""
        views = self.full.split([slot.numel for slot in self.slots])
        for slot, flat in zip(self.slots, views, strict=True):
            view = flat.view(slot.shape)
            for module, attr in slot.locations:
                setattr(module, attr, view)


def _unit_name(preset: ModelPreset, name: str) -> str:
    piece = piece_of_param(preset, name)
    if piece.startswith("block"):
        return piece
    return "embed" if piece in FAMILIES[preset.family].embed_pieces else "head"


def _slots(model: nn.Module, preset: ModelPreset) -> dict[str, list[Slot]]:
    """Every parameter's slot, by unit name, units and slots in forward order."""
    where: dict[int, list[tuple[nn.Module, str, str]]] = {}
    for prefix, module in model.named_modules():
        for attr, p in module._parameters.items():
            if p is not None:
                local = f"{prefix}.{attr}" if prefix else attr
                where.setdefault(id(p), []).append((module, attr, local))
    units: dict[str, list[Slot]] = {}
    for name, p in model.named_parameters():
        slots = units.setdefault(_unit_name(preset, global_name(name)), [])
        offset = sum(s.numel for s in slots)
        found = where[id(p)]
        names = [global_name(name)] + [n for _, _, n in found if n != global_name(name)]
        slots.append(
            Slot(
                names=names,
                locations=[(m, a) for m, a, _ in found],
                shape=p.shape,
                offset=offset,
            )
        )
    return units


def _roots(model: nn.Module, unit_of: dict[int, int]) -> list[Root]:
    """The model's top-level modules (blocks one by one) that hold parameters, in order."""
    tops: list[nn.Module] = []
    for child in model.children():
        nested = isinstance(child, nn.ModuleDict | nn.ModuleList)
        tops.extend(child.children() if nested else [child])
    roots = []
    for module in tops:
        params = list(module.parameters())
        if not params:
            continue
        owners = [m for m in module.modules() if any(True for _ in m.parameters(recurse=False))]
        roots.append(
            Root(
                module=module,
                units=tuple(dict.fromkeys(unit_of[id(p)] for p in params)),
                gathers_in_backward=not all(isinstance(m, nn.Embedding) for m in owners),
            )
        )
    return roots


@dataclass(kw_only=True, slots=True)
class _Reducing:
    """The gradient reduce-scatters of one backward pass, issued in one order."""

    order: list[int]
    ready: set[int] = field(default_factory=set)
    issued: int = 0
    in_flight: tuple[int, Any, torch.Tensor] | None = None


class ShardedModel(HeldStates):
    """A model whose parameters live as this rank's slices of flat units.

    Owns the units, the rank's parameter slices (:attr:`params`, one flat tensor AdamW
    steps) and gradient slices (:attr:`grads`, the same layout), the forward and
    backward schedule (module docstring) and the count of what is gathered, which
    :class:`~workers.devices.device.SimulatedDevice` reads as :class:`HeldStates`.
    """

    def __init__(
        self,
        model: nn.Module,
        preset: ModelPreset,
        *,
        fractions: tuple[float, ...],
        index: int,
        comm: ShardComm,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.comm, self.index = comm, index
        self.units = []
        for name, slots in _slots(model, preset).items():
            bounds = shard_bounds(sum(s.numel for s in slots), fractions)
            self.units.append(FlatUnit(name=name, slots=slots, bounds=bounds, index=index))
        named = dict(model.named_parameters())
        unit_of = {id(named[s.names[0]]): u for u, un in enumerate(self.units) for s in un.slots}
        self.roots = _roots(model, unit_of)
        owned = [unit.end - unit.start for unit in self.units]
        self.params = nn.Parameter(torch.empty(sum(owned), dtype=dtype, device=device))
        self.grads = torch.zeros_like(self.params, requires_grad=False)
        self.params.grad = self.grads
        self._views: list[tuple[int, int]] = []
        first = 0
        with torch.no_grad():
            for unit, n in zip(self.units, owned, strict=True):
                self._views.append((first, first + n))
                flat = torch.cat([named[s.names[0]].detach().reshape(-1) for s in unit.slots])
                self.params[first : first + n] = flat[unit.start : unit.end].to(dtype)
                first += n
        for unit in self.units:
            for slot in unit.slots:
                for module, attr in slot.locations:
                    del module._parameters[attr]
            unit.make_buffer(dtype, device)
        self.transient_bytes = 0
        """Gathered parameters, unsharded gradients and staging buffers held now."""
        self._peak = 0
        self.step_peak = 0
        """The most gathered at once since the step began (idle rounds included)."""
        self.first_root = [
            min(j for j, r in enumerate(self.roots) if u in r.units) for u in range(len(self.units))
        ]
        """Per unit, the first root that uses it: its gradient is complete after that
        root's backward."""
        self.rs_order = sorted(range(len(self.units)), key=lambda u: (-self.first_root[u], u))
        """The order the units' gradients complete in backward."""
        self._reducing = _Reducing(order=self.rs_order)
        self._hook()

    # --- what a simulated device counts ------------------------------------------------

    def state_bytes(self) -> int:
        """The owned slices: parameters, gradients and AdamW's two moments."""
        return MODEL_STATE_COPIES * self.params.numel() * self.params.element_size()

    def reset_peak(self) -> None:
        self._peak = self.transient_bytes

    def peak_bytes(self) -> int:
        return self.state_bytes() + self._peak

    def holds(self, storage: torch.UntypedStorage) -> bool:
        ptr = storage.data_ptr()
        return any(u.resident and u.full.untyped_storage().data_ptr() == ptr for u in self.units)

    def _add(self, nbytes: int) -> None:
        self.transient_bytes += nbytes
        self._peak = max(self._peak, self.transient_bytes)
        self.step_peak = max(self.step_peak, self._peak)

    # --- slices ---------------------------------------------------------------------------

    def owned(self, tensor: torch.Tensor, u: int) -> torch.Tensor:
        """Unit ``u``'s part of a tensor laid out like :attr:`params`."""
        first, last = self._views[u]
        return tensor[first:last]

    def gather_full(self, u: int, shard: torch.Tensor) -> torch.Tensor:
        """Unit ``u``'s whole flat space of a state laid out like :attr:`params` (a
        collective of the group; for checkpoints)."""
        unit = self.units[u]
        out = torch.empty(unit.numel, dtype=shard.dtype, device=shard.device)
        pending, _ = self.comm.all_gather(out, self.owned(shard, u).detach(), unit.bounds)
        pending.wait()
        return out

    # --- the schedule ---------------------------------------------------------------------

    def _hook(self) -> None:
        for j, root in enumerate(self.roots):
            root.module.register_forward_pre_hook(lambda _m, _a, j=j: self._pre_forward(j))
            root.module.register_forward_hook(lambda _m, _a, out, j=j: self._post_forward(j, out))
        for u, unit in enumerate(self.units):
            unit.full.register_post_accumulate_grad_hook(lambda _t, u=u: self._grad_ready(u))

    def _gather(self, u: int) -> None:
        unit = self.units[u]
        unit.full.untyped_storage().resize_(unit.nbytes)
        self._add(unit.nbytes)
        pending, staging = self.comm.all_gather(
            unit.full.data, self.owned(self.params, u).detach(), unit.bounds
        )
        self._add(staging)

        def done(inner: Callable[[], None] | None = pending.finish) -> None:
            if inner is not None:
                inner()
            self._add(-staging)

        unit.pending = replace(pending, finish=done)

    def _ensure(self, units: tuple[int, ...]) -> None:
        for u in units:
            unit = self.units[u]
            if unit.pending is None and not unit.resident:
                self._gather(u)
            if unit.pending is not None:
                unit.pending.wait()
                unit.pending, unit.resident = None, True

    def _prefetch(self, units: tuple[int, ...]) -> None:
        for u in units:
            if self.units[u].pending is None and not self.units[u].resident:
                self._gather(u)

    def _keep(self, keep: set[int]) -> None:
        """Free every gathered unit not in ``keep``."""
        for u, unit in enumerate(self.units):
            if u in keep or not (unit.resident or unit.pending is not None):
                continue
            if unit.pending is not None:
                unit.pending.wait()
                unit.pending = None
            unit.full.untyped_storage().resize_(0)
            unit.resident = False
            self._add(-unit.nbytes)

    def _forward_collectives(self, j: int) -> None:
        nxt = self.roots[j + 1].units if j + 1 < len(self.roots) else ()
        self._ensure(self.roots[j].units)
        self._keep(set(self.roots[j].units) | set(nxt))
        self._prefetch(nxt)

    def _pre_forward(self, j: int) -> None:
        self._forward_collectives(j)
        for u in self.roots[j].units:
            self.units[u].install()

    def _post_forward(self, j: int, out: Any) -> None:
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda _grad, j=j: self._pre_backward(j))
        if j == len(self.roots) - 1:
            self._keep(set())

    def _pre_backward(self, j: int) -> None:
        # Autograd runs a root's gradient accumulation before the next root's backward
        # (AccumulateGrad goes first in its ready queue), so every rank issues its
        # reduce-scatters between the same all-gathers; an idle round relies on it.
        done = sum(1 for u in self.rs_order if self.first_root[u] > j)
        if self._reducing.issued < done:
            late = self.units[self.rs_order[self._reducing.issued]].name
            raise RuntimeError(f"fsdp: the gradient of {late} was not complete in time")
        need = self.roots[j].units if self.roots[j].gathers_in_backward else ()
        later = [r for r in self.roots[:j] if r.gathers_in_backward]
        nxt = later[-1].units if later else ()
        self._ensure(need)
        self._keep(set(need) | set(nxt))
        self._prefetch(nxt)

    def _grad_ready(self, u: int) -> None:
        self._reducing.ready.add(u)
        self._flush()

    def _flush(self) -> None:
        """Issue the reduce-scatters whose turn has come, one in flight at a time."""
        r = self._reducing
        while r.issued < len(r.order) and r.order[r.issued] in r.ready:
            self._land()
            u = r.order[r.issued]
            unit = self.units[u]
            if unit.full.grad is None:  # no gradient reached it: it adds zeros
                unit.full.grad = unit.full.new_zeros(unit.numel)
            self._add(unit.nbytes)
            work, out = self.comm.reduce_scatter(unit.full.grad, unit.bounds, self.index)
            r.in_flight = (u, work, out)
            r.issued += 1

    def _land(self) -> None:
        """Wait for the reduce-scatter in flight, add it to the owned gradient."""
        r = self._reducing
        if r.in_flight is None:
            return
        u, work, out = r.in_flight
        self.comm.wait(work)
        self.owned(self.grads, u).add_(out)
        self.units[u].full.grad = None
        self._add(-self.units[u].nbytes)
        r.in_flight = None

    def finish_backward(self) -> None:
        """After a micro-batch's backward: every unit's gradient reduced into its slice,
        every gathered buffer freed."""
        self._reducing.ready.update(range(len(self.units)))
        self._flush()
        self._land()
        self._reducing = _Reducing(order=self.rs_order)
        self._keep(set())

    def idle_pass(self, *, backward: bool = True) -> None:
        """A micro-batch round without samples: the collectives alone, zero gradients."""
        for j in range(len(self.roots)):
            self._forward_collectives(j)
        self._keep(set())
        if backward:
            for j in reversed(range(len(self.roots))):
                self._pre_backward(j)
                self._reducing.ready.update(u for u in self.rs_order if self.first_root[u] == j)
                self._flush()
            self.finish_backward()
