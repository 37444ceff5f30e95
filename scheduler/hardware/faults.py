"""Fault injection for the simulation: which device fails or slows, and when.

A cluster spec's ``simulation.faults`` (DESIGN.md, "Cluster spec") and the command
line's repeatable ``--fault`` both become :class:`Fault` records; a
:class:`FaultSchedule` answers, step by step, what the simulated devices and the
job driver need.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

from scheduler.errors import SpecError

FaultKind = Literal["crash", "lost", "slow", "restore"]
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)
FAULT_SYNTAX = "DEVICE@STEP:KIND with KIND one of crash, lost, slow=FACTOR, restore"
_FAULT_RE = re.compile(
    r"^(?P<device>[^@\s]+)@(?P<step>[^:\s]+):(?P<kind>[A-Za-z]+)(?:=(?P<factor>\S+))?$"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Fault:
    """One injected event on one simulated device.

    A cluster spec's ``simulation.faults`` (DESIGN.md, "Cluster spec") and the
    command line's repeatable ``--fault`` both become :class:`Fault` records::

        simulation:
          faults:
            - {device: node-b/1, at_step: 40, kind: lost}
            - {device: node-a/0, at_step: 10, kind: slow, factor: 3.0}
            - {device: node-a/0, at_step: 30, kind: restore}

        hetsched simulate --fault node-b/1@40:lost --fault node-a/0@10:slow=3

    Kinds: ``crash`` (the device's process dies during the step; the device itself
    stays usable and its worker can be restarted), ``lost`` (the device is gone
    until a ``restore``), ``slow`` (every step takes ``factor`` times as long on
    it, until a ``restore``; a factor below 1 speeds it up) and ``restore`` (the
    device is back at its profiled speed; a lost device is back in the cluster).
    """

    device: str
    """Device id, ``NODE/INDEX``."""
    at_step: int
    """First step the fault touches (0-based, like the job's step counter)."""
    kind: FaultKind
    factor: float | None = None
    """``slow`` only: how many times longer each step takes on the device (> 0)."""

    def __post_init__(self) -> None:
        if self.at_step < 0:
            raise SpecError(f"at_step: must be an integer >= 0, got {self.at_step!r}")
        if self.kind not in FAULT_KINDS:
            raise SpecError(f"kind: unknown {self.kind!r}; allowed: {', '.join(FAULT_KINDS)}")
        if self.kind == "slow":
            if self.factor is None or not math.isfinite(self.factor) or self.factor <= 0:
                raise SpecError(f"factor: kind slow needs a number > 0, got {self.factor!r}")
        elif self.factor is not None:
            raise SpecError(f"factor: only kind slow takes a factor, not kind {self.kind}")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"device": self.device, "at_step": self.at_step, "kind": self.kind}
        if self.factor is not None:
            out["factor"] = self.factor
        return out

    def __str__(self) -> str:
        """The ``--fault`` form: ``node-a/0@10:slow=3``."""
        factor = f"={self.factor:g}" if self.factor is not None else ""
        return f"{self.device}@{self.at_step}:{self.kind}{factor}"


def _check_device(where: str, device: str, known_ids: Collection[str] | None) -> None:
    if known_ids is not None and device not in known_ids:
        raise SpecError(f"{where}: unknown device {device!r}; known: {', '.join(known_ids)}")


def fault_from_dict(where: str, raw: Any, known_ids: Collection[str] | None = None) -> Fault:
    """Validate one ``simulation.faults`` entry; errors name ``where`` and the field."""
    if not isinstance(raw, dict):
        got = "nothing" if raw is None else type(raw).__name__
        raise SpecError(f"{where}: must be a mapping, got {got}")
    allowed = {"device", "at_step", "kind", "factor"}
    for key in raw:
        if key not in allowed:
            raise SpecError(f"{where}.{key}: unknown key; allowed: {', '.join(sorted(allowed))}")
    device = raw.get("device")
    if not isinstance(device, str) or not device:
        raise SpecError(f"{where}.device: required, a device id like node-a/0, got {device!r}")
    _check_device(f"{where}.device", device, known_ids)
    at_step = raw.get("at_step")
    if isinstance(at_step, bool) or not isinstance(at_step, int) or at_step < 0:
        raise SpecError(f"{where}.at_step: must be an integer >= 0, got {at_step!r}")
    kind = raw.get("kind")
    if kind not in FAULT_KINDS:
        raise SpecError(f"{where}.kind: unknown {kind!r}; allowed: {', '.join(FAULT_KINDS)}")
    factor = raw.get("factor")
    if kind != "slow" and "factor" in raw:
        raise SpecError(f"{where}.factor: only kind slow takes a factor, not kind {kind}")
    if kind == "slow" and (
        isinstance(factor, bool)
        or not isinstance(factor, int | float)
        or not math.isfinite(factor)
        or factor <= 0
    ):
        raise SpecError(f"{where}.factor: kind slow needs a number > 0, got {factor!r}")
    return Fault(
        device=device,
        at_step=at_step,
        kind=cast(FaultKind, kind),
        factor=float(factor) if isinstance(factor, int | float) and kind == "slow" else None,
    )


def parse_fault(text: str, known_ids: Collection[str] | None = None) -> Fault:
    """One ``--fault``: ``node-b/1@40:lost``, ``node-a/0@10:slow=3``, ``node-a/0@30:restore``.

    >>> parse_fault("node-a/0@10:slow=3")
    Fault(device='node-a/0', at_step=10, kind='slow', factor=3.0)
    """
    where = f"--fault {text!r}"
    match = _FAULT_RE.match(text.strip())
    if match is None:
        raise SpecError(f"{where}: expected {FAULT_SYNTAX}, e.g. node-a/0@10:slow=3")
    device, step, kind, factor = match.group("device", "step", "kind", "factor")
    kind = kind.lower()
    _check_device(where, device, known_ids)
    if not step.isdigit():
        raise SpecError(f"{where}: STEP must be an integer >= 0, got {step!r}")
    if kind not in FAULT_KINDS:
        raise SpecError(
            f"{where}: unknown kind {kind!r}; allowed: crash, lost, slow=FACTOR, restore"
        )
    if kind != "slow":
        if factor is not None:
            raise SpecError(f"{where}: only slow takes =FACTOR, not {kind}")
        return Fault(device=device, at_step=int(step), kind=cast(FaultKind, kind))
    try:
        value = float(factor) if factor is not None else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise SpecError(f"{where}: slow needs =FACTOR, a number > 0, e.g. slow=3, got {factor!r}")
    return Fault(device=device, at_step=int(step), kind="slow", factor=value)


class FaultSchedule:
    """The faults of one run, asked step by step.

    Faults of one device at the same step apply in the order they were given.

    >>> s = FaultSchedule([parse_fault("a/0@10:slow=3"), parse_fault("a/0@30:restore")])
    >>> s.slowdown("a/0", 9), s.slowdown("a/0", 10), s.slowdown("a/0", 30)
    (1.0, 3.0, 1.0)

    A fault at step ``N`` takes effect at the start of step ``N``: step ``N`` is
    the first step it touches.
    """

    def __init__(self, faults: Iterable[Fault]) -> None:
        # stable sort: the given order decides between faults of one step
        self.faults: tuple[Fault, ...] = tuple(sorted(faults, key=lambda f: f.at_step))

    def __bool__(self) -> bool:
        return bool(self.faults)

    def firing(self, step: int) -> tuple[Fault, ...]:
        """Faults that take effect at the start of ``step``."""
        return tuple(f for f in self.faults if f.at_step == step)

    def crashes(self, step: int) -> tuple[str, ...]:
        """Devices whose process dies during ``step``."""
        return tuple(f.device for f in self.firing(step) if f.kind == "crash")

    def slowdown(self, device: str, step: int) -> float:
        """Factor by which ``device`` is slower at ``step`` (1.0: its profiled speed)."""
        factor = 1.0
        for f in self.faults:
            if f.at_step > step:
                break
            if f.device != device:
                continue
            if f.kind == "slow" and f.factor is not None:
                factor = f.factor
            elif f.kind == "restore":
                factor = 1.0
        return factor

    def slowdowns(self, step: int) -> dict[str, float]:
        """Every device slowed (or sped up) at ``step``, with its factor."""
        devices = dict.fromkeys(f.device for f in self.faults if f.kind == "slow")
        out = {d: self.slowdown(d, step) for d in devices}
        return {d: factor for d, factor in out.items() if factor != 1.0}

    def lost(self, step: int) -> frozenset[str]:
        """Devices gone at ``step``: lost at or before it and not restored since."""
        gone: set[str] = set()
        for f in self.faults:
            if f.at_step > step:
                break
            if f.kind == "lost":
                gone.add(f.device)
            elif f.kind == "restore":
                gone.discard(f.device)
        return frozenset(gone)
