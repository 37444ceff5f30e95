"""Detecting that a device got slower or faster mid-job, robustly.

:class:`SpeedMonitor` reads each step's measured busy times against the job's
profile and reports a device's new speed only once it stands out of the noise.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from scheduler.cost.profile import Profile
from scheduler.planning.plan import DevicePlan, Plan
from scheduler.replan.livecost import live_profile, predicted_busy_s

MAD_TO_SIGMA = 1.4826
"""``1.4826 × median absolute deviation`` estimates the standard deviation of Gaussian noise."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SpeedSettings:
    """How sure the monitor must be before it says a device changed speed."""

    warmup_steps: int = 2
    """Observations ignored at the start and after a device's work changes."""
    calibration_steps: int = 8
    """Ratios that set a device's first level before any change can be reported."""
    window_steps: int = 5
    """Consecutive out-of-band steps needed to report a change (the hysteresis)."""
    threshold: float = 0.10
    """Smallest relative change reported (0.10: 10 % slower or faster)."""
    noise_multiple: float = 2.0
    """A change must also exceed this many noise sigmas (robust spread of the ratios):
    on a host whose step times wobble more than the threshold, the band widens."""
    regime_steps: int = 64
    """Most recent in-band ratios the level and spread are taken over."""

    def __post_init__(self) -> None:
        for name in ("warmup_steps", "calibration_steps", "window_steps", "regime_steps"):
            value = getattr(self, name)
            minimum = 0 if name == "warmup_steps" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"{name}: must be an integer >= {minimum}, got {value!r}")
        if self.regime_steps < self.calibration_steps:
            raise ValueError(
                f"regime_steps: must be >= calibration_steps ({self.calibration_steps}), "
                f"got {self.regime_steps}"
            )
        if not 0 < self.threshold < 1:
            raise ValueError(f"threshold: must be in (0, 1), got {self.threshold!r}")
        if not self.noise_multiple >= 0:
            raise ValueError(f"noise_multiple: must be >= 0, got {self.noise_multiple!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class SpeedChange:
    """One device's new speed, relative to its profiled one."""

    step: int
    """Step at which the change was confirmed."""
    device: str
    factor: float
    """How many times slower than profiled the device now runs (1.0: as profiled)."""
    previous_factor: float
    fixed_s: float
    """The device's new ``fixed_s`` (profiled × factor)."""
    per_sample_s: float
    """The device's new ``per_sample_s`` (profiled × factor)."""

    @property
    def kind(self) -> str:
        return "slower" if self.factor > self.previous_factor else "faster"

    def describe(self) -> str:
        """``node-a/0 3.02× slower (was 1.00×)``."""
        return (
            f"{self.device} {self.factor:.2f}× profiled time "
            f"({self.kind}; was {self.previous_factor:.2f}×)"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class SpeedReport:
    """What :meth:`SpeedMonitor.observe` returns when some device changed."""

    step: int
    changes: tuple[SpeedChange, ...]
    profile: Profile
    """The live profile: the base profile with every changed device's times scaled."""


class _Track:
    """The detector's state for one device (see :class:`SpeedMonitor`)."""

    __slots__ = ("direction", "factor", "reference", "regime", "run", "skip", "spread", "work")

    def __init__(self, settings: SpeedSettings) -> None:
        self.factor = 1.0
        self.reference: float | None = None
        self.spread: float | None = None
        self.regime: deque[float] = deque(maxlen=settings.regime_steps)
        self.run: list[float] = []
        self.direction = 0
        self.skip = settings.warmup_steps
        self.work: tuple[Any, ...] | None = None

    def level(self) -> float:
        return statistics.median(self.regime)

    def own_spread(self) -> float:
        level = self.level()
        mad = statistics.median(abs(r / level - 1) for r in self.regime)
        # one standard error up (MAD's relative error is about 1.16/sqrt(n)): few
        # samples must not make the band narrower than the noise
        return MAD_TO_SIGMA * mad * (1 + 1.16 / math.sqrt(len(self.regime)))


def _work(entry: DevicePlan) -> tuple[Any, ...]:
    return (entry.samples, entry.micro_batch, entry.accum_steps, entry.layers, entry.stage)


class SpeedMonitor:
    """Per-device speed estimates with hysteresis: owns each device's track of ratios,
    level and reference, and the live profile they imply.

    Each step the job driver hands :meth:`SpeedMonitor.observe` the plan it ran
    and every device's measured busy time. Per device the monitor keeps the ratio
    ``r = measured / predicted``, the prediction taken from the job's *base*
    profile (:func:`scheduler.replan.livecost.predicted_busy_s`), so ``r`` does not
    depend on which plan ran: a device that runs three times slower reads ``r``
    three times its usual level whatever its share of the batch.

    The detector, per device (settings in :class:`SpeedSettings`):

    1. **Warm-up.** The first ``warmup_steps`` observations of a device, and the
       first ones after its work changed (a re-plan gave it other samples or
       micro-batches: new shapes, new caches), are ignored.
    2. **Level.** The next ``calibration_steps`` ratios set the device's *level*:
       the median of its *regime*, every in-band ratio since the last change
       (median: one slow step moves it by at most one rank). The first regime's
       level is the *reference*, the ratio the device shows at its profiled speed;
       any systematic error of the prediction (DESIGN.md: about 10% fast) cancels
       in ``level / reference``.
    3. **Band.** A ratio is *out of band* when it differs from the level by at
       least ``max(threshold, noise_multiple × spread)`` in one direction, where
       ``spread`` is the robust relative spread ``1.4826 × MAD`` (the Gaussian
       sigma for Gaussian noise) raised by one standard error of that estimate
       (``1.16/√n``, so few samples never make the band narrow), pooled over the
       devices (the larger of the device's own and the devices' median): a
       device is only said to have changed when the change stands out of the
       noise its host shows.
    4. **Hysteresis.** A change is reported only after ``window_steps``
       consecutive out-of-band ratios in the same direction: one slow step, or
       noise that crosses the band now and then, never reports, and a device that
       alternates never reports either. The ratios of an interrupted run are
       outliers and are dropped: they move neither the level nor the band.
    5. **Report.** The new factor is the median of the last half of that run over
       the reference (a factor within the band of 1.0 snaps back to exactly 1.0:
       the device is back at its profiled speed), and the run's last half becomes
       the new regime, so reporting again needs a further sustained move of at
       least the band: no oscillation.

    Measured with the simulated driver of tests/scheduler/test_replan.py (the
    plan's prediction under the true speed × 1.08 × noise): a 3× slow-down is
    reported exactly once, ``window_steps − 1`` steps after the first slow step,
    and its restore once, back to exactly 1.0 (200 of 200 seeds with ±5 % and
    ±15 % uniform noise, 197 of 200 with 8 % Gaussian noise); no report in 100
    steps on steady clusters (0 of 1,600 runs: two clusters, uniform ±5 % and
    ±15 %, Gaussian 5 % and 8 %; tests/benchmarks/test_replan_detector.py).
    Under ±5 % noise a 1.3× change is reported in 4 steps every time; under
    ±15 % noise 2× always is, 1.5× in 4 of 5 seeds, smaller changes rarely: they
    do not stand out of such noise step by step.

    >>> monitor = SpeedMonitor(profile)                            # doctest: +SKIP
    >>> report = monitor.observe(step, plan, {"node-a/0": 0.41})   # doctest: +SKIP
    >>> report.profile if report else monitor.profile              # doctest: +SKIP
    """

    def __init__(self, profile: Profile, settings: SpeedSettings | None = None) -> None:
        self.base = profile
        """The profile the job started from; factors are relative to it."""
        self.settings = settings or SpeedSettings()
        self._tracks: dict[str, _Track] = {}

    @property
    def factors(self) -> dict[str, float]:
        """Every device whose accepted factor is not 1.0."""
        return {d: t.factor for d, t in self._tracks.items() if t.factor != 1.0}

    @property
    def profile(self) -> Profile:
        """The live profile: the base profile with the accepted factors applied."""
        return live_profile(self.base, self.factors)

    def observe(
        self, step: int, plan: Plan, measured_busy_s: Mapping[str, float]
    ) -> SpeedReport | None:
        """Feed step ``step``: the plan that ran and each device's measured busy seconds.

        Devices the plan gives no samples, and devices missing from
        ``measured_busy_s`` or with a non-positive or non-finite time, are skipped.
        Returns a report when at least one device's speed changed, else ``None``.
        """
        entries = [
            e
            for e in plan.active
            if math.isfinite(measured_busy_s.get(e.id, math.nan)) and measured_busy_s[e.id] > 0
        ]
        if not entries:
            return None
        predicted = predicted_busy_s(plan, self.base)
        ratios: dict[str, float] = {}
        for entry in entries:
            track = self._tracks.setdefault(entry.id, _Track(self.settings))
            work = _work(entry)
            if work != track.work:
                track.work = work
                track.skip = max(track.skip, self.settings.warmup_steps)
                track.run.clear()
            if track.skip > 0:
                track.skip -= 1
            elif predicted[entry.id] > 0:
                ratios[entry.id] = measured_busy_s[entry.id] / predicted[entry.id]
        pooled = self._pooled_spread()
        changes = [
            change
            for device, ratio in ratios.items()
            if (change := self._update(step, device, ratio, pooled)) is not None
        ]
        if not changes:
            return None
        return SpeedReport(step=step, changes=tuple(changes), profile=self.profile)

    def _pooled_spread(self) -> float:
        spreads = [t.spread for t in self._tracks.values() if t.spread is not None]
        return statistics.median(spreads) if spreads else 0.0

    def _update(self, step: int, device: str, ratio: float, pooled: float) -> SpeedChange | None:
        s = self.settings
        track = self._tracks[device]
        if track.reference is None and len(track.regime) < s.calibration_steps:
            track.regime.append(ratio)
            if len(track.regime) == s.calibration_steps:
                track.reference = track.level()
                track.spread = track.own_spread()
            return None
        level = track.level()
        band = max(s.threshold, s.noise_multiple * max(track.spread or 0.0, pooled))
        deviation = ratio / level - 1
        direction = 1 if deviation >= band else -1 if deviation <= -band else 0
        if direction == 0 or (track.run and direction != track.direction):
            track.run = []  # outliers: kept out of the regime, so they move neither level nor band
        if direction == 0:
            track.regime.append(ratio)
            self._refresh(track)
            return None
        track.run.append(ratio)
        track.direction = direction
        if len(track.run) < s.window_steps:
            return None
        return self._accept(step, device, track, band)

    def _refresh(self, track: _Track) -> None:
        """Refine the spread (and, before any change, the reference) from the regime."""
        if len(track.regime) >= self.settings.calibration_steps:
            track.spread = track.own_spread()
            if track.factor == 1.0 and track.reference is not None:
                track.reference = track.level()

    def _accept(self, step: int, device: str, track: _Track, band: float) -> SpeedChange | None:
        assert track.reference is not None  # calibrated before any run starts
        recent = track.run[-math.ceil(self.settings.window_steps / 2) :]
        factor = statistics.median(recent) / track.reference
        if abs(factor - 1) < band:
            factor = 1.0  # back at its profiled speed
        previous = track.factor
        track.regime.clear()
        track.regime.extend(recent)
        track.run = []
        if abs(factor / previous - 1) < self.settings.threshold:
            return None  # the level moved back within the band of the accepted factor
        track.factor = factor
        base = self.base.device(device)
        return SpeedChange(
            step=step,
            device=device,
            factor=factor,
            previous_factor=previous,
            fixed_s=base.fixed_s * factor,
            per_sample_s=base.per_sample_s * factor,
        )
