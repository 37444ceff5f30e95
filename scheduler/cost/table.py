"""A profile's devices stored by kind: one set of figures per kind, an id and a node per device.

Devices of one kind (same type, memory and figures) share every number a planner
reads, so a cluster of 16,384 GPUs has a few dozen kinds. :class:`DeviceTable` keeps
one :class:`DeviceProfile` per kind and, per device, only its id, node and kind; the
planners work on the kinds, and a device's own :class:`DeviceProfile` is built only
when something asks for it (issue 20: building one per device was a third of what
``hetsched plan`` took at that size). To its readers it is a sequence of devices,
equal to the tuple of the same devices: :class:`ColumnRows`, which the plan's
columns of data-parallel entries (:class:`scheduler.planning.plan.DevicePlanTable`)
share.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Protocol, TypeVar, overload

from scheduler.cost.costs import DeviceProfile


def figures_key(d: DeviceProfile) -> tuple[object, ...]:
    """What the data-parallel search tells kinds apart by: the figures it reads and the
    precision its entries carry; not the type, id, node or per-layer figures (a measured
    profile has an object of those per device). Nested figures count by identity: an
    analytic profile shares one object per kind, and equal figures in distinct objects
    only make more kinds, never wrong ones."""
    return (
        d.capacity_bytes,
        d.static_bytes,
        d.per_sample_bytes,
        d.fixed_s,
        d.per_sample_s,
        d.micro_batch_limit,
        d.precision,
        id(d.selective),
        id(d.full),
    )


def kind_key(d: DeviceProfile) -> tuple[object, ...]:
    """Every figure of ``d`` but its id and node: its type, its per-layer figures (by
    identity) and :func:`figures_key`."""
    return (d.type, id(d.layers), *figures_key(d))


class Placed(Protocol):
    """A device of a cluster spec or of a profile: what a table keeps of each."""

    @property
    def id(self) -> str: ...

    @property
    def node(self) -> str: ...


P = TypeVar("P", bound=Placed)


T = TypeVar("T")


class ColumnRows(Sequence[T]):
    """A read-only sequence stored as columns, each item built from them when first read.

    Subclasses say how many items there are and how to build item ``i``; this class
    builds them all at once when iterated, and compares equal to any sequence of the
    same items (a tuple of them included)."""

    __slots__ = ("_rows",)

    def __init__(self) -> None:
        self._rows: tuple[T, ...] | None = None

    def _entry(self, i: int) -> T:
        raise NotImplementedError

    def rows(self) -> tuple[T, ...]:
        """Every item, built once."""
        if self._rows is None:
            self._rows = tuple(self._entry(i) for i in range(len(self)))
        return self._rows

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[T, ...]: ...

    def __getitem__(self, index: int | slice) -> T | tuple[T, ...]:
        if isinstance(index, slice):
            return self.rows()[index]
        if self._rows is not None:
            return self._rows[index]
        return self._entry(range(len(self))[index])

    def __iter__(self) -> Iterator[T]:
        return iter(self.rows())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return self.rows() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.rows())


class DeviceTable(ColumnRows[DeviceProfile]):
    """Devices as kinds: ``kinds[kind_of[i]]`` holds device ``i``'s figures, ``ids[i]`` and
    ``nodes[i]`` its identity. Read-only; equal to any sequence of the same devices."""

    __slots__ = ("ids", "kind_of", "kinds", "nodes")

    def __init__(
        self,
        *,
        kinds: Sequence[DeviceProfile],
        kind_of: Sequence[int],
        ids: Sequence[str],
        nodes: Sequence[str],
    ) -> None:
        if not len(kind_of) == len(ids) == len(nodes):
            raise ValueError(
                f"device table: {len(kind_of)} kinds, {len(ids)} ids and {len(nodes)} nodes"
            )
        self.kinds: tuple[DeviceProfile, ...] = tuple(kinds)
        self.kind_of: tuple[int, ...] = tuple(kind_of)
        self.ids: tuple[str, ...] = tuple(ids)
        self.nodes: tuple[str, ...] = tuple(nodes)
        super().__init__()

    @classmethod
    def grouped(
        cls,
        devices: Sequence[P],
        *,
        key: Callable[[P], Hashable],
        figures: Callable[[P], DeviceProfile],
    ) -> DeviceTable:
        """``devices`` (a spec's or a profile's) grouped by ``key``, kinds in order of first
        appearance: each kind's figures are ``figures(d)`` of its first device ``d``."""
        kinds: dict[Hashable, int] = {}
        firsts: list[P] = []
        kind_of: list[int] = []
        for d in devices:
            k = key(d)
            kind = kinds.get(k)
            if kind is None:
                kind = kinds[k] = len(firsts)
                firsts.append(d)
            kind_of.append(kind)
        return cls(
            kinds=[figures(d) for d in firsts],
            kind_of=kind_of,
            ids=[d.id for d in devices],
            nodes=[d.node for d in devices],
        )

    @classmethod
    def of(
        cls,
        devices: Sequence[DeviceProfile],
        key: Callable[[DeviceProfile], Hashable] = kind_key,
    ) -> DeviceTable:
        """``devices`` grouped by kind (itself when it already is a table). A ``key`` that
        leaves figures out groups by what a reader of ``kinds`` tells apart (the dp search
        ignores per-layer figures: :func:`figures_key`); the table's items stay the
        devices given."""
        if isinstance(devices, DeviceTable):
            return devices
        table = cls.grouped(devices, key=key, figures=_itself)
        table._rows = tuple(devices)  # already built: keep them
        return table

    def with_kinds(self, kinds: Sequence[DeviceProfile]) -> DeviceTable:
        """The same devices with each kind's figures replaced (one per kind, in order)."""
        if len(kinds) != len(self.kinds):
            raise ValueError(f"device table: {len(kinds)} kinds for {len(self.kinds)}")
        return DeviceTable(kinds=kinds, kind_of=self.kind_of, ids=self.ids, nodes=self.nodes)

    def _entry(self, i: int) -> DeviceProfile:
        kind = self.kinds[self.kind_of[i]]
        if kind.id == self.ids[i] and kind.node == self.nodes[i]:
            return kind
        # every field spelled out (twice as fast as dataclasses.replace); a test checks
        # that these are all of DeviceProfile's fields
        return DeviceProfile(
            id=self.ids[i],
            node=self.nodes[i],
            type=kind.type,
            capacity_bytes=kind.capacity_bytes,
            static_bytes=kind.static_bytes,
            per_sample_bytes=kind.per_sample_bytes,
            fixed_s=kind.fixed_s,
            per_sample_s=kind.per_sample_s,
            layers=kind.layers,
            micro_batch_limit=kind.micro_batch_limit,
            selective=kind.selective,
            full=kind.full,
            precision=kind.precision,
        )

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return f"DeviceTable({len(self.ids)} devices of {len(self.kinds)} kinds)"

    def __reduce__(self) -> tuple[object, ...]:
        # pickled (to Ray workers) as its columns, not as built devices
        return (_table, (self.kinds, self.kind_of, self.ids, self.nodes))


def _itself(d: DeviceProfile) -> DeviceProfile:
    return d


def _table(
    kinds: tuple[DeviceProfile, ...],
    kind_of: tuple[int, ...],
    ids: tuple[str, ...],
    nodes: tuple[str, ...],
) -> DeviceTable:
    return DeviceTable(kinds=kinds, kind_of=kind_of, ids=ids, nodes=nodes)
