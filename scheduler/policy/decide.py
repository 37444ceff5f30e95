"""Which devices each job holds: the ``fifo``, ``fair`` and ``goodput`` policies.

:func:`decide` is the entry point; the executor and the cluster simulator call it
on every arrival, completion or failure and every ``round_s``, keeping one
:class:`~scheduler.policy.rates.PlannedRates` per cluster so rates are cached
between decisions. Fair shares follow Gavel (Narayanan et al., OSDI 2020).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scheduler.hardware.cluster import Cluster
from scheduler.policy.configs import ClusterClasses, candidates, equal_share_rate, single_rates
from scheduler.policy.fifo import decide_fifo
from scheduler.policy.place import place
from scheduler.policy.rates import Config, DeviceClass, PlannedRates, RateFn, job_rate
from scheduler.policy.solve import Option, solve, water_fill
from scheduler.policy.types import (
    POLICIES,
    Allocation,
    JobDemand,
    PolicyError,
    PolicyName,
    PolicySettings,
)

WAIT = Option(config=Config.make({}, multi_node=False), value=0.0, normalised=0.0)
"""``goodput``'s option for a waiting job to keep waiting."""


@dataclass(frozen=True, kw_only=True, slots=True)
class _JobView:
    """A job with what the policies derive from the cluster for it."""

    job: JobDemand
    singles: dict[DeviceClass, float]
    """One-device rate per class it may use and fits, fastest first."""
    held: tuple[str, ...]
    """Held devices still in the cluster."""
    equal_rate: float
    """Rate on an equal share of the cluster (capped at its max_devices)."""
    urgency: float
    """``goodput``'s admission order: priority × aging / remaining time on an equal share."""
    max_wait_s: float
    """How long it may wait before it goes first: ``max_wait_s``, or its remaining time on
    an equal share when that is longer (bounded slowdown)."""

    @property
    def starving(self) -> bool:
        """It has waited past :attr:`max_wait_s`: it goes first."""
        return self.job.waiting_s >= self.max_wait_s


def decide(
    cluster: Cluster,
    jobs: Sequence[JobDemand],
    *,
    policy: str = "goodput",
    rates: RateFn | None = None,
    settings: PolicySettings | None = None,
) -> Allocation:
    """Allocate ``cluster``'s devices to ``jobs`` under ``policy``, with one reason per job.

    - ``fifo``: jobs in arrival order; a waiting job needs its
      ``max_devices`` (all devices it may use when it names none) free at once,
      otherwise it waits and reserves the free ones, so later jobs cannot starve
      it. Running jobs are never moved.
    - ``fair``: running jobs and then waiting ones in arrival order are admitted
      while their ``min_devices`` still fit; the admitted jobs share the cluster
      by weighted max-min of their normalised rates (a job's rate over its rate on
      an equal share of the cluster, Gavel).
    - ``goodput`` (default): least average job completion time with bounded
      waiting (Sia's objective, Jayaram Subramanya et al., SOSP'23). Running jobs
      stay admitted and keep at least ``fairness_floor`` (half) of the max-min level
      that ``fair``'s water-filling reaches among them; a waiting job may start or
      keep waiting. Each configuration is worth its normalised rate times the job's
      remaining time on an equal share to the power ``-srpt_power`` (a lean towards
      shortest-remaining-time-first that still values devices by how much they
      speed a job up: a T4 goes to the job it slows least), times the job's priority
      and aging (``1 + waited / aging_s``). A move is discounted by the job's
      restart time (recorded per job, else ``reallocation_s``) over the time it keeps
      the new devices, at most ``move_horizon_s``, plus ``move_penalty``, so jobs do
      not thrash. A job that has waited ``max_wait_s``, or as long as it takes to run
      on an equal share when that is longer, goes first and nothing is slipped past
      it. ``objective="throughput"`` is the previous form: the total normalised rate,
      every job that fits running. Measured on the sweep of
      tests/benchmarks/test_policy_sweep.py; the pure greedy rule (power 1) spread
      short jobs wide while long ones starved (p99 24 % worse than ``fair``).

    What is exact and what is heuristic: the choice of one configuration per
    admitted job under per-class capacities is an integer program solved exactly
    by HiGHS (:mod:`scheduler.policy.solve`; on its time limit the best found is
    used and the decision says so). Admission (greedy, in the order above), the
    max-min level the floor refers to (water-filling), the candidate
    configurations (:mod:`scheduler.policy.configs`), the single-node assumption
    for one-class configurations that fit on a node, and the placement on device
    ids (:mod:`scheduler.policy.place`) are heuristics.
    No job waits longer than ``max_wait_s``, or its own remaining time on an equal share
    when that is longer (bounded slowdown), behind later arrivals: past it, it goes first
    and nothing is slipped past it.
    """
    if policy not in POLICIES:
        raise PolicyError(f"policy: unknown {policy!r}; allowed: {', '.join(POLICIES)}")
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise PolicyError(f"jobs: name {dup!r} appears twice")
    settings = settings or PolicySettings()
    rate_fn: RateFn = rates if rates is not None else PlannedRates.for_cluster(cluster)
    classes = ClusterClasses.of(cluster)
    views = _views(cluster, classes, jobs, rate_fn, settings)
    if policy == "fifo":
        return decide_fifo(cluster, classes, jobs, rate_fn, {v.job.name: v.singles for v in views})
    return _decide_shared(cluster, classes, views, rate_fn, settings, policy)


def _views(
    cluster: Cluster,
    classes: ClusterClasses,
    jobs: Sequence[JobDemand],
    rate_fn: RateFn,
    settings: PolicySettings,
) -> list[_JobView]:
    present = set(cluster.ids)
    views = []
    num_active = max(1, len(jobs))
    for job in jobs:
        allowed = [c for c in classes.ids if _allowed(job, c)]
        rate = job_rate(rate_fn, model=job.model, global_batch=job.global_batch)
        singles = single_rates(classes, allowed, rate)
        share = classes.num_devices / num_active
        if job.max_devices is not None:
            share = min(share, job.max_devices)
        equal_rate = equal_share_rate(classes, singles, max(share, job.min_devices))
        remaining_s = job.samples_left / equal_rate if equal_rate > 0 else math.inf
        aging = 1 + job.waiting_s / settings.aging_s if settings.aging_s > 0 else 1.0
        urgency = job.priority * aging / max(remaining_s, 1.0)
        # Bounded slowdown (Feitelson et al., JSSPP 1997): a job waits no longer than it
        # runs, beyond the absolute bound; an absolute bound alone turns a queue of long
        # jobs into first-come-first-served.
        max_wait_s = max(settings.max_wait_s, remaining_s if math.isfinite(remaining_s) else 0)
        views.append(
            _JobView(
                job=job,
                singles=singles,
                # Devices gone from the cluster, or that cannot hold its model, do not count.
                held=tuple(i for i in job.held if i in present and classes.class_of[i] in singles),
                equal_rate=equal_rate,
                urgency=urgency,
                max_wait_s=max_wait_s,
            )
        )
    return views


def _allowed(job: JobDemand, device_class: DeviceClass) -> bool:
    if job.device_types is None:
        return True
    return device_class.type.lower() in {t.strip().lower() for t in job.device_types}


def _admission_order(views: list[_JobView], policy: PolicyName) -> list[_JobView]:
    running = sorted((v for v in views if v.held), key=lambda v: (v.job.arrival_s, v.job.name))
    waiting = [v for v in views if not v.held]
    starving = sorted(
        (v for v in waiting if v.starving),
        key=lambda v: (-v.job.waiting_s, v.job.name),
    )
    rest = [v for v in waiting if not v.starving]
    if policy == "fair":
        rest.sort(key=lambda v: (v.job.arrival_s, v.job.name))
    else:
        rest.sort(key=lambda v: (-v.urgency, v.job.arrival_s, v.job.name))
    return [*running, *starving, *rest]


def _minimum(
    view: _JobView, free: dict[DeviceClass, int], classes: ClusterClasses
) -> Config | None:
    """The job's smallest configuration within ``free``: from what it holds, else one class.

    What it holds counts only while ``free`` still has it: a job ahead of it that held
    too few usable devices for its own minimum may have been given some of them.
    """
    need = view.job.min_devices
    if view.held and len(view.held) >= need:
        counts: dict[DeviceClass, int] = {}
        for i in view.held[:need]:
            counts[classes.class_of[i]] = counts.get(classes.class_of[i], 0) + 1
        if all(n <= free.get(c, 0) for c, n in counts.items()):
            return classes.config(counts)
    usable = [c for c in view.singles if free.get(c, 0) > 0]
    single = [c for c in usable if free[c] >= need]
    if single:
        return classes.config({max(single, key=lambda c: free[c]): need})
    counts = {}
    for c in sorted(usable, key=lambda c: -free[c]):
        take = min(free[c], need)
        counts[c] = take
        need -= take
        if need == 0:
            return classes.config(counts)
    return None


@dataclass(kw_only=True, slots=True)
class _Admission:
    """Who runs for sure (each with its minimum), who may run or keep waiting, who waits."""

    admitted: list[tuple[_JobView, Config]]
    optional: list[_JobView]
    """``goodput``'s waiting jobs that the program may start or leave waiting."""
    waits: dict[str, str]
    """Why each job that surely waits does."""


def _decide_shared(
    cluster: Cluster,
    classes: ClusterClasses,
    views: list[_JobView],
    rate_fn: RateFn,
    settings: PolicySettings,
    policy: PolicyName,
) -> Allocation:
    admission = _admit(classes, views, settings, policy)
    admitted, optional = admission.admitted, admission.optional
    memo: dict[tuple[object, ...], list[Config]] = {}
    options = [_options(classes, v, m, rate_fn, settings, policy, memo) for v, m in admitted]
    capacity = {c: len(ids) for c, ids in classes.ids.items()}
    weights = [v.job.priority for v, _ in admitted]
    if policy == "goodput" and options:
        options = _fairness_floor(options, capacity, weights, settings.fairness_floor)
    # A job that may keep waiting: its first option is to wait (no devices, no value).
    options += [
        [WAIT, *_options(classes, v, None, rate_fn, settings, policy, memo)] for v in optional
    ]
    solution = solve(
        options,
        capacity,
        max_min=policy == "fair",
        weights=[*weights, *(v.job.priority for v in optional)],
        time_limit_s=settings.solver_time_limit_s,
        node_limit=settings.solver_node_limit,
    )
    everyone = [*(v for v, _ in admitted), *optional]
    if solution.choice is None:
        # Nothing found in time: every admitted job its minimum (feasible by admission).
        chosen = {v.job.name: m for v, m in admitted}
        how = f"heuristic: admitted jobs at their minimum ({solution.note})"
    else:
        chosen = {
            v.job.name: opts[k].config
            for v, opts, k in zip(everyone, options, solution.choice, strict=True)
            if opts[k].config.num_devices > 0
        }
        kind = "exact" if solution.exact else "heuristic"
        how = (
            f"{kind}: configuration per job by integer program ({solution.note}); "
            "heuristic: admission order, candidate configurations, placement"
        )
    _fill_idle(chosen, capacity, list(zip(optional, options[len(admitted) :], strict=True)))
    waits = admission.waits
    for v in optional:
        if v.job.name not in chosen:
            own = ", as long as it takes to run" if v.max_wait_s > settings.max_wait_s else ""
            waits[v.job.name] = (
                "waits: jobs with less remaining time go first; it starts within "
                f"{_hours(v.max_wait_s)} of waiting at the latest{own}"
            )
    devices = place(cluster, chosen, {v.job.name: v.held for v in everyone})
    return _allocation(policy, classes, views, devices, waits, rate_fn, how)


def _hours(seconds: float) -> str:
    """``4 h``, ``1.5 h``, ``1,180 h``."""
    hours = seconds / 3600
    return f"{hours:,.0f} h" if hours >= 10 else f"{hours:.2g} h"


def _admit(
    classes: ClusterClasses,
    views: list[_JobView],
    settings: PolicySettings,
    policy: PolicyName,
) -> _Admission:
    """Walk the admission order: each job is admitted at its minimum while it fits,
    left optional (``goodput``: the program decides), or kept waiting with a reason."""
    free = {c: len(ids) for c, ids in classes.ids.items()}
    out = _Admission(admitted=[], optional=[], waits={})
    blocked_by: str | None = None
    jct = policy == "goodput" and settings.objective == "jct"
    for view in _admission_order(views, policy):
        job = view.job
        if not view.singles:
            out.waits[job.name] = "cannot run: its model fits no device it may use in this cluster"
            continue
        if jct and not view.held and not view.starving and not blocked_by:
            # It may run or keep waiting: the program decides, shortest remaining first.
            out.optional.append(view)
            continue
        minimum = None if blocked_by else _minimum(view, free, classes)
        if minimum is None:
            if blocked_by:
                out.waits[job.name] = f"waits: {blocked_by} has waited longest and goes first"
            else:
                out.waits[job.name] = (
                    f"waits: its minimum of {job.min_devices} device(s) does not fit beside "
                    f"the {len(out.admitted)} job(s) ahead of it"
                )
            if view.starving and not blocked_by:
                blocked_by = job.name
            continue
        for c, n in minimum.parts:
            free[c] -= n
        out.admitted.append((view, minimum))
    return out


def _options(
    classes: ClusterClasses,
    view: _JobView,
    minimum: Config | None,
    rate_fn: RateFn,
    settings: PolicySettings,
    policy: PolicyName,
    memo: dict[tuple[object, ...], list[Config]],
) -> list[Option]:
    """The job's candidate configurations (``minimum`` first), each with its value."""
    job = view.job

    rate = job_rate(rate_fn, model=job.model, global_batch=job.global_batch)

    hi = job.max_devices if job.max_devices is not None else classes.num_devices
    current = classes.config_of(view.held) if view.held else None
    within = current is not None and job.min_devices <= current.num_devices <= hi
    extra = ([minimum] if minimum is not None else []) + (
        [current] if current is not None and within else []
    )
    cap = max(job.min_devices, math.ceil(settings.size_cap_share * _share_devices(view, classes)))
    hi = min(hi, job.global_batch, cap)
    key = (job.model, job.global_batch, job.min_devices, hi, tuple(view.singles))
    base = memo.get(key)
    if base is None:
        # Jobs of one shape share their candidates: computed once per decision.
        base = candidates(
            classes=classes,
            singles=view.singles,
            lo=job.min_devices,
            hi=hi,
            rate=rate,
            min_gain=settings.min_gain,
        )
        memo[key] = base
    configs = list(dict.fromkeys([*extra, *base]))
    jct = policy == "goodput" and settings.objective == "jct"
    restart_s = settings.reallocation_s if job.restart_s is None else job.restart_s
    # jct: a waiting job's claim grows the longer it waits (aging), so none starves.
    aging = 1 + job.waiting_s / settings.aging_s if settings.aging_s > 0 else 1.0
    out = []
    for config in configs:
        r = rate(config)
        if r <= 0:
            continue
        normalised = r / view.equal_rate if view.equal_rate > 0 else 0.0
        keep = 1.0
        if current is not None and config != current:
            # A move pays its restart out of the time it keeps the new devices, plus a
            # margin: the job's remaining time, at most move_horizon_s under jct.
            horizon_s = job.samples_left / r
            if jct:
                horizon_s = min(horizon_s, settings.move_horizon_s)
            keep = (1 - settings.move_penalty) * horizon_s / (horizon_s + restart_s)
        if jct:
            # Share of its remaining work done per second: least remaining time first.
            remaining_s = job.samples_left / view.equal_rate if view.equal_rate > 0 else math.inf
            lean = max(remaining_s, 1.0) ** -settings.srpt_power
            value = job.priority * aging * keep * normalised * lean
        elif policy == "goodput":
            value = job.priority * keep * normalised
        else:
            value = keep * normalised  # fair's tie-break: keep jobs where they are
        out.append(Option(config=config, value=value, normalised=normalised))
    return out


def _fill_idle(
    chosen: dict[str, Config],
    capacity: dict[DeviceClass, int],
    optional: list[tuple[_JobView, list[Option]]],
) -> None:
    """Start waiting jobs on devices the solver left idle, most urgent first, each on its
    most valuable option that fits: on its time limit HiGHS can return an allocation
    that keeps a job waiting beside free devices, which the optimum never does."""
    free = dict(capacity)
    for config in chosen.values():
        for c, n in config.parts:
            free[c] -= n
    waiting = [(v, opts) for v, opts in optional if v.job.name not in chosen]
    for view, opts in sorted(waiting, key=lambda vo: -vo[0].urgency):
        fits = [o for o in opts if o.value > 0 and all(n <= free[c] for c, n in o.config.parts)]
        if fits:
            best = max(fits, key=lambda o: o.value)
            chosen[view.job.name] = best.config
            for c, n in best.config.parts:
                free[c] -= n


def _fairness_floor(
    options: list[list[Option]],
    capacity: dict[DeviceClass, int],
    weights: list[float],
    floor: float,
) -> list[list[Option]]:
    """Each job's options that keep it at ``floor`` of the max-min level water-filling reaches.

    The water-filling allocation itself always stays in, so the floor never makes
    the program infeasible.
    """
    start = water_fill(options, capacity, weights)
    level = min(opts[k].normalised / w for opts, k, w in zip(options, start, weights, strict=True))
    return [
        [
            o
            for k, o in enumerate(opts)
            if k == start[j] or o.normalised >= floor * level * weights[j]
        ]
        for j, opts in enumerate(options)
    ]


def _share_devices(view: _JobView, classes: ClusterClasses) -> float:
    """The job's equal share in devices (what its equal_rate was computed on)."""
    total = sum(classes.capacity(c) / classes.num_devices * r for c, r in view.singles.items())
    return view.equal_rate / total if total > 0 else 1.0


def _allocation(
    policy: PolicyName,
    classes: ClusterClasses,
    views: list[_JobView],
    devices: dict[str, tuple[str, ...]],
    waits: dict[str, str],
    rate_fn: RateFn,
    how: str,
) -> Allocation:
    out_devices: dict[str, tuple[str, ...]] = {}
    out_rates: dict[str, float] = {}
    reasons: dict[str, str] = {}
    for view in views:
        job = view.job
        ids = devices.get(job.name, ())
        out_devices[job.name] = ids
        if not ids:
            out_rates[job.name] = 0.0
            reasons[job.name] = waits.get(job.name, "waits")
            continue
        config = classes.config_of(ids)
        r = rate_fn(model=job.model, global_batch=job.global_batch, config=config)
        out_rates[job.name] = r
        reasons[job.name] = explain(policy, view, config, r, ids, classes)
    return Allocation(
        policy=policy, devices=out_devices, samples_per_s=out_rates, reasons=reasons, solver=how
    )


def explain(
    policy: PolicyName,
    view: _JobView,
    config: Config,
    rate: float,
    ids: Sequence[str],
    classes: ClusterClasses,
) -> str:
    """One line: what the job got and why."""
    nodes = len({i.split("/")[0] for i in ids})
    where = f"{config.describe()} on {nodes} node{'s' if nodes > 1 else ''}"
    share = f"{rate / view.equal_rate:.2f}x its equal-share rate" if view.equal_rate > 0 else ""
    moved = ""
    if view.held:
        kept = len(set(view.held) & set(ids))
        moved = (
            "kept its devices"
            if kept == len(ids) == len(view.held)
            else (f"re-allocated (kept {kept} of {len(view.held)} devices)")
        )
    else:
        moved = "started"
    why = {
        "fair": "max-min share of normalised rates",
        "goodput": "least remaining time first, above the fairness floor",
        "fifo": "first in line",
    }[policy]
    return f"{where}, {rate:,.1f} samples/s ({share}); {moved}; {why}"
