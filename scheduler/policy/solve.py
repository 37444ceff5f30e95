"""The exact part of ``fair`` and ``goodput``: an integer program over (job, configuration).

Formulated in :func:`solve`; solved by HiGHS through :func:`scipy.optimize.milp`.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.optimize import Bounds, LinearConstraint, milp  # type: ignore[import-untyped]
from scipy.sparse import coo_array  # type: ignore[import-untyped]

from scheduler.policy.rates import Config, DeviceClass

FAIR_EPSILON = 1e-3
"""Weight of the secondary objective of ``fair`` (values scaled to at most 1)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Option:
    """One candidate: a configuration with what it is worth to its job."""

    config: Config
    value: float
    """``goodput``'s objective term (and ``fair``'s tie-break)."""
    normalised: float
    """Rate over the job's equal-share rate (``fair``'s constraint)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Solution:
    choice: tuple[int, ...] | None
    """Index of the chosen option per job; ``None`` when infeasible or nothing found."""
    exact: bool
    """HiGHS proved the choice optimal among the candidates."""
    note: str


def solve(
    options: Sequence[Sequence[Option]],
    capacity: dict[DeviceClass, int],
    *,
    max_min: bool,
    weights: Sequence[float],
    time_limit_s: float,
    node_limit: int,
) -> Solution:
    """Choose one option per job; ``weights`` are ``fair``'s ``w_j``.

    The first option of every job must be its admission minimum: together they fit.

    Variables ``x[j,c] ∈ {0,1}``: job ``j`` gets configuration ``c``. Constraints:
    each admitted job gets exactly one of its configurations (``Σ_c x[j,c] = 1``)
    and no class is over-used (``Σ_{j,c} count_c(t)·x[j,c] ≤ N_t`` per class ``t``).

    - ``goodput`` maximises ``Σ value[j,c]·x[j,c]`` (the values come from the policy;
      Sia, Jayaram Subramanya et al., SOSP'23, solves the same shape of problem).
    - ``fair`` maximises ``τ`` subject to ``Σ_c nr[j,c]·x[j,c] ≥ τ·w_j`` for every job
      (weighted max-min of normalised rates, Gavel's fairness policy, Narayanan et
      al., OSDI'20, in integer form), plus ``ε·Σ value`` so that among max-min
      optimal allocations it keeps jobs where they are and leaves nothing idle
      that would help.

    Within the candidate configurations the answer is optimal when HiGHS reports
    so; on its time limit the best allocation found is used and the result says so.
    """
    num_jobs = len(options)
    if num_jobs == 0:
        return Solution(choice=(), exact=True, note="no job to place")
    start: tuple[int, ...] | None = None
    tau_floor = 0.0
    if max_min:
        start = water_fill(options, capacity, weights)
        tau_floor = min(options[j][k].normalised / weights[j] for j, k in enumerate(start))
    flat = [(j, k, o) for j, opts in enumerate(options) for k, o in enumerate(opts)]
    num_x = len(flat)
    num_vars = num_x + (1 if max_min else 0)
    rows, per_job = _constraints(flat, capacity, num_jobs, weights if max_min else None)
    integrality = np.ones(num_vars)
    upper_bounds = np.ones(num_vars)
    lower_bounds = np.zeros(num_vars)
    if max_min:
        integrality[num_x] = 0
        upper_bounds[num_x] = np.inf
        lower_bounds[num_x] = tau_floor  # never worse than water-filling
    result = milp(
        _cost(flat, num_jobs, max_min=max_min),
        constraints=rows.constraint(num_vars),
        integrality=integrality,
        bounds=Bounds(lower_bounds, upper_bounds),
        options={"time_limit": time_limit_s, "node_limit": node_limit, "disp": False},
    )
    if result.x is None:
        if start is not None:
            note = "water-filling; HiGHS found nothing better within its limits"
            return Solution(choice=start, exact=False, note=note)
        return Solution(choice=None, exact=False, note=f"HiGHS: {result.message}")
    x = result.x
    choice = tuple(flat[max(vs, key=lambda v: x[v])][1] for vs in per_job)
    exact = bool(result.status == 0)
    gap = getattr(result, "mip_gap", None)
    note = (
        "HiGHS: optimal"
        if exact
        else f"HiGHS: {result.message.rstrip('.')}, best found (gap {gap})"
    )
    return Solution(choice=choice, exact=exact, note=note)


_Flat = list[tuple[int, int, Option]]
"""Every (job, option index, option), one per variable ``x[j,c]``, in variable order."""


def _cost(flat: _Flat, num_jobs: int, *, max_min: bool) -> npt.NDArray[np.float64]:
    """The objective to minimise: ``−Σ value·x`` (scaled), and ``−τ`` for ``fair``."""
    cost = np.zeros(len(flat) + (1 if max_min else 0))
    top = max((abs(o.value) for _, _, o in flat), default=1.0) or 1.0
    # fair: the whole secondary term stays below FAIR_EPSILON, so it only breaks ties of τ.
    scale = FAIR_EPSILON / num_jobs if max_min else 1.0
    for v, (_, _, o) in enumerate(flat):
        cost[v] = -(o.value / top) * scale
    if max_min:
        cost[len(flat)] = -1.0
    return cost


class _Rows:
    """A sparse constraint matrix built one row ``lo ≤ Σ val·x[col] ≤ hi`` at a time."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.lower: list[float] = []
        self.upper: list[float] = []

    def add(self, entries: list[tuple[int, float]], lo: float, hi: float) -> None:
        r = len(self.lower)
        for col, val in entries:
            self.rows.append(r)
            self.cols.append(col)
            self.vals.append(val)
        self.lower.append(lo)
        self.upper.append(hi)

    def constraint(self, num_vars: int) -> LinearConstraint:
        shape = (len(self.lower), num_vars)
        matrix = coo_array((self.vals, (self.rows, self.cols)), shape=shape).tocsr()
        return LinearConstraint(matrix, np.array(self.lower), np.array(self.upper))


def _constraints(
    flat: _Flat,
    capacity: dict[DeviceClass, int],
    num_jobs: int,
    weights: Sequence[float] | None,
) -> tuple[_Rows, list[list[int]]]:
    """One configuration per job, no class over-used, and with ``weights`` (``fair``)
    every job's normalised rate at least ``τ·w_j``; also each job's variables."""
    classes = {c: i for i, c in enumerate(capacity)}
    rows = _Rows()
    per_job: list[list[int]] = [[] for _ in range(num_jobs)]
    per_class: list[list[tuple[int, float]]] = [[] for _ in classes]
    for v, (j, _, o) in enumerate(flat):
        per_job[j].append(v)
        for c, n in o.config.parts:
            per_class[classes[c]].append((v, float(n)))
    for j in range(num_jobs):
        rows.add([(v, 1.0) for v in per_job[j]], 1.0, 1.0)
    for c, i in classes.items():
        if per_class[i]:
            rows.add(per_class[i], -np.inf, float(capacity[c]))
    if weights is not None:
        tau = len(flat)
        for j in range(num_jobs):
            entries = [(v, flat[v][2].normalised) for v in per_job[j]]
            rows.add([*entries, (tau, -weights[j])], 0.0, np.inf)
    return rows, per_job


def water_fill(
    options: Sequence[Sequence[Option]], capacity: dict[DeviceClass, int], weights: Sequence[float]
) -> tuple[int, ...]:
    """Progressive filling (the textbook max-min algorithm) over discrete options.

    Every job starts at its first option (its admission minimum); the job with
    the lowest weighted normalised rate moves to the fitting option that raises
    it with the fewest extra devices, until the lowest cannot move; it is then
    frozen and the next lowest goes on. Heuristic (exact for divisible
    resources); :func:`solve` uses it as the floor ``fair``'s program must beat.
    """
    free = dict(capacity)
    current = [0] * len(options)
    for opts in options:
        for c, n in opts[0].config.parts:
            free[c] -= n
    heap = [(opts[0].normalised / weights[j], j) for j, opts in enumerate(options)]
    heapq.heapify(heap)
    while heap:
        level, j = heapq.heappop(heap)
        now = options[j][current[j]]
        best: tuple[int, float, int] | None = None
        for k, o in enumerate(options[j]):
            if o.normalised <= now.normalised:
                continue
            delta = {c: n for c, n in o.config.parts}
            for c, n in now.config.parts:
                delta[c] = delta.get(c, 0) - n
            if any(n > free[c] for c, n in delta.items()):
                continue
            key = (sum(delta.values()), -o.normalised, k)
            if best is None or key < best:
                best = key
        if best is None:
            continue  # frozen at its level
        new = options[j][best[2]]
        for c, n in now.config.parts:
            free[c] += n
        for c, n in new.config.parts:
            free[c] -= n
        current[j] = best[2]
        heapq.heappush(heap, (new.normalised / weights[j], j))
    return tuple(current)
