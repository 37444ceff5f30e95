"""``hetsched cluster-sim``: replay a job trace on a cluster under scheduling policies.

    hetsched cluster-sim --cluster deploy/clusters/hetero-64.yaml \\
        --trace deploy/traces/example.csv --policy fifo,fair,goodput [--json] [--chart jct.png] \\
        [--bound]
    hetsched cluster-sim --generate 200 --rate 6 --seed 0 [-o trace.csv]
    hetsched cluster-sim --trace gavel.trace --trace-format gavel [-o trace.csv]

The first form runs :func:`scheduler.clustersim.simulator.simulate` once per policy (no
training, the cost model only) and prints a table of average, median and 99th
percentile job completion time, makespan, utilisation and slowest decision;
``--json`` prints one JSON object and nothing else; ``--chart`` writes a PNG
of every job's completion time per policy (needs matplotlib: the ``plot``
extra); ``--bound`` adds the lower bounds of :mod:`scheduler.clustersim.bound`, the
average JCT no policy can beat on this trace and cluster, and the best schedule
:mod:`scheduler.clustersim.offline` finds knowing the whole trace in advance, paying for
its restarts as the replays do (and, beside it, with restarts free): the best possible
average lies between the bound and that schedule. The second form writes a
generated trace (CSV, see :mod:`scheduler.clustersim.trace`) to ``-o`` or stdout.
``--trace-format gavel|sia`` reads a public trace (Gavel's ``.trace``, Sia's workload
CSV) and converts each job into a transformer job of the same duration
(:mod:`scheduler.clustersim.imports`); without ``--cluster`` the third form writes the
converted trace.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from api.commands.common import add_cluster_argument, add_command, check_output, write_text
from api.commands.plan import format_table
from scheduler.clustersim.bound import alone_avg_jct_s, shared_avg_jct_s
from scheduler.clustersim.imports import TRACE_FORMATS, load_any
from scheduler.clustersim.offline import best_found_schedules, within_p99
from scheduler.clustersim.simulator import (
    SimResult,
    SimSettings,
    check_runnable,
    replay_policy,
    simulate,
)
from scheduler.clustersim.trace import TraceJob, generate_trace, trace_to_csv
from scheduler.errors import HetschedError
from scheduler.hardware.cluster import Cluster, load_cluster
from scheduler.policy.rates import PlannedRates
from scheduler.policy.types import DEFAULT_POLICY, POLICIES, PolicyName

DEFAULTS = SimSettings()
DEFAULT_RATE = 6.0
"""``--generate``'s mean arrivals per hour."""
CHART_SUFFIXES = (".png", ".pdf", ".svg")


def add_parser(subparsers: Any) -> None:
    parser = add_command(subparsers, "cluster-sim", run)
    add_cluster_argument(parser)
    parser.add_argument("--trace", metavar="FILE", type=Path, help="job trace (CSV)")
    parser.add_argument(
        "--trace-format",
        default="csv",
        metavar="FORMAT",
        help=f"format of --trace: {', '.join(TRACE_FORMATS)} (gavel, sia: public traces, "
        "converted to transformer jobs of the same duration; default %(default)s)",
    )
    parser.add_argument(
        "--policy",
        default=",".join(POLICIES),
        metavar="LIST",
        help=f"comma-separated policies from {', '.join(POLICIES)} (default: all; "
        f"the service runs {DEFAULT_POLICY})",
    )
    parser.add_argument(
        "--round-s",
        type=float,
        default=DEFAULTS.round_s,
        metavar="S",
        help="seconds between scheduling rounds (default %(default)g)",
    )
    parser.add_argument(
        "--reallocation-s",
        type=float,
        default=DEFAULTS.reallocation_s,
        metavar="S",
        help="checkpoint + restart time when a running job's devices change (default %(default)g)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    parser.add_argument(
        "--bound",
        action="store_true",
        help="also print the average JCT no policy beats and the best schedule found knowing "
        "the trace, and where its p99 is worse than fair's, the best found that keeps fair's "
        "(seconds to minutes)",
    )
    parser.add_argument(
        "--chart", metavar="PNG", type=Path, help="write a chart of JCTs per policy"
    )
    parser.add_argument(
        "--generate", type=int, metavar="N", help="write a generated trace of N jobs instead"
    )
    parser.add_argument(
        "--rate",
        type=float,
        metavar="JOBS_PER_HOUR",
        help=f"with --generate: mean arrivals per hour (default {DEFAULT_RATE:g})",
    )
    parser.add_argument("--seed", type=int, help="with --generate (default 0)")
    parser.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        type=Path,
        help="with --generate, or --trace in another format without --cluster: the CSV",
    )


def _policies(text: str) -> list[PolicyName]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise HetschedError(f"--policy: give one or more of {', '.join(POLICIES)}")
    out: list[PolicyName] = []
    for name in names:
        match = [p for p in POLICIES if p == name]
        if not match:
            raise HetschedError(f"--policy: unknown {name!r}; allowed: {', '.join(POLICIES)}")
        out.append(match[0])
    return list(dict.fromkeys(out))


def run(args: argparse.Namespace) -> int:
    # Paths first: a wrong one is an error now, not after minutes of replay.
    if args.output is not None:
        check_output("-o/--output", args.output)
    if args.chart is not None:
        check_output("--chart", args.chart, suffixes=CHART_SUFFIXES)
    if args.generate is not None:
        if args.cluster or args.trace or args.json or args.chart or args.bound:
            raise HetschedError("--generate: writes a trace; run it without --cluster/--trace")
        rate = DEFAULT_RATE if args.rate is None else args.rate
        seed = 0 if args.seed is None else args.seed
        return _write(generate_trace(args.generate, jobs_per_hour=rate, seed=seed), args.output)
    for flag, value in (("--rate", args.rate), ("--seed", args.seed)):
        if value is not None:
            raise HetschedError(f"{flag}: only with --generate N, which it shapes")
    if args.bound and not args.cluster:
        raise HetschedError("--bound: a bound is for a trace on a cluster; give --cluster FILE")
    if args.trace and not args.cluster and args.trace_format != "csv":
        return _write(load_any(args.trace, args.trace_format), args.output)
    if not args.cluster or not args.trace:
        raise HetschedError("give --cluster FILE and --trace FILE, or --generate N")
    if args.output is not None:
        raise HetschedError(
            "-o/--output: writes a trace, with --generate N or with --trace FILE in another "
            "format and no --cluster; a replay prints its report (--json for JSON)"
        )
    policies = _policies(args.policy)
    if args.chart:
        _pyplot()  # before minutes of simulation, not after
    cluster = load_cluster(args.cluster)
    trace = load_any(args.trace, args.trace_format)
    # Checked here to name the flags as typed (SimSettings names its own fields).
    if not (args.round_s > 0 and math.isfinite(args.round_s)):
        raise HetschedError(f"--round-s: must be a number of seconds > 0, got {args.round_s:g}")
    if not (args.reallocation_s >= 0 and math.isfinite(args.reallocation_s)):
        raise HetschedError(
            f"--reallocation-s: must be a number of seconds >= 0, got {args.reallocation_s:g}"
        )
    settings = SimSettings(
        round_s=args.round_s,
        reallocation_s=args.reallocation_s,
        policy=replay_policy(reallocation_s=args.reallocation_s),
    )
    rates = PlannedRates.for_cluster(cluster)
    check_runnable(cluster, trace, rates, round_s=settings.round_s)  # before any progress line
    results = []
    with _stdout_to_stderr():
        for policy in policies:
            if not args.json:
                print(f"simulating {policy} ...", file=sys.stderr)
            results.append(simulate(cluster, trace, policy=policy, settings=settings, rates=rates))
        bounds = None
        if args.bound:
            if not args.json:
                print(
                    f"bounding the average JCT of {len(trace)} jobs (a linear program and a "
                    "search; seconds to a few minutes) ...",
                    file=sys.stderr,
                )
            bounds = _bounds(cluster, trace, rates, results, settings.reallocation_s)
    if args.json:
        print(json.dumps(report(cluster, args.trace, trace, results, bounds)))
    else:
        print(render(cluster, args.trace, trace, results, bounds))
    if args.chart:
        write_chart(results, args.chart)
    return 0


def _bounds(
    cluster: Cluster,
    trace: list[TraceJob],
    rates: PlannedRates,
    results: list[SimResult],
    reallocation_s: float,
) -> dict[str, float]:
    """Both lower bounds on average JCT, the shared one over the replays' span, and the
    best schedule found paying for its restarts as the replays do (``reallocation_s``, or
    a job's own ``restart_s``), with the one found with restarts free beside it. Where
    ``fair`` was replayed and that schedule's p99 is worse than ``fair``'s, also the best
    found with its p99 held at ``fair``'s (the ``p99_capped_*`` keys): the lowest average
    leaves the longest jobs for last, and a user asking whether the tail must suffer for
    the average gets both."""
    horizon_s = max(r.makespan_s for r in results) + min(j.arrival_s for j in trace)
    fair = next((r for r in results if r.policy == "fair"), None)
    found = best_found_schedules(
        trace,
        cluster,
        rates,
        reallocation_s=reallocation_s,
        p99_cap_s=None if fair is None else fair.p99_jct_s,
    )
    out = {
        "alone_avg_jct_s": alone_avg_jct_s(trace, cluster, rates),
        "shared_avg_jct_s": shared_avg_jct_s(trace, cluster, rates, horizon_s=horizon_s),
        "best_found_avg_jct_s": found.charged.avg_jct_s,
        "best_found_p99_jct_s": found.charged.p99_jct_s,
        "reallocation_s": reallocation_s,
        "free_avg_jct_s": found.free.avg_jct_s,
        "free_p99_jct_s": found.free.p99_jct_s,
    }
    if fair is not None and found.capped is not found.charged:
        out["p99_capped_cap_s"] = fair.p99_jct_s
        out["p99_capped_avg_jct_s"] = found.capped.avg_jct_s
        out["p99_capped_p99_jct_s"] = found.capped.p99_jct_s
    return out


def _write(jobs: list[TraceJob], output: Path | None) -> int:
    """A trace as CSV to ``output`` or stdout."""
    text = trace_to_csv(jobs)
    if output:
        write_text("-o/--output", output, text)
        print(f"wrote {len(jobs)} jobs to {output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


@contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send what native code writes to file descriptor 1 (HiGHS may print a line) to
    stderr while the replay runs, so ``--json`` prints the JSON and nothing else."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def report(
    cluster: Cluster,
    path: Path,
    trace: list[TraceJob],
    results: list[SimResult],
    bounds: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The ``--json`` document (``lower_bound`` and ``best_found`` with ``--bound``)."""
    out: dict[str, Any] = {
        "cluster": {"name": cluster.name, "num_devices": len(cluster.devices)},
        "trace": {"path": str(path), "num_jobs": len(trace)},
        "policies": [r.to_dict() for r in results],
    }
    if bounds is not None:
        out["lower_bound"] = {
            "alone_avg_jct_s": bounds["alone_avg_jct_s"],
            "shared_avg_jct_s": bounds["shared_avg_jct_s"],
            "avg_jct_s": bounds["shared_avg_jct_s"],
        }
        out["best_found"] = {
            "avg_jct_s": bounds["best_found_avg_jct_s"],
            "p99_jct_s": bounds["best_found_p99_jct_s"],
            "reallocation_s": bounds["reallocation_s"],
        }
        out["best_found_restarts_free"] = {
            "avg_jct_s": bounds["free_avg_jct_s"],
            "p99_jct_s": bounds["free_p99_jct_s"],
        }
        if "p99_capped_cap_s" in bounds:
            out["best_found_p99_capped"] = {
                "p99_cap_s": bounds["p99_capped_cap_s"],
                "avg_jct_s": bounds["p99_capped_avg_jct_s"],
                "p99_jct_s": bounds["p99_capped_p99_jct_s"],
                "meets_cap": _meets_cap(bounds),
            }
    return out


def _meets_cap(bounds: dict[str, float]) -> bool:
    return within_p99(bounds["p99_capped_p99_jct_s"], bounds["p99_capped_cap_s"])


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def render(
    cluster: Cluster,
    path: Path,
    trace: list[TraceJob],
    results: list[SimResult],
    bounds: dict[str, float] | None = None,
) -> str:
    headers = [
        "POLICY",
        "AVG JCT",
        "P50 JCT",
        "P99 JCT",
        "MAKESPAN",
        "UTILISATION",
        "MOVES",
        "SLOWEST DECISION",
    ]
    rows = [
        [
            r.policy,
            _hours(r.avg_jct_s),
            _hours(r.p50_jct_s),
            _hours(r.p99_jct_s),
            _hours(r.makespan_s),
            f"{r.utilization:.0%}",
            str(r.num_reallocations),
            f"{r.decision_s_max * 1e3:.0f} ms",
        ]
        for r in results
    ]
    lines = [
        f"{len(trace)} jobs of {path.name} on {cluster.name} ({len(cluster.devices)} devices)",
        "",
        format_table(headers, rows, right=set(range(1, len(headers)))),
    ]
    base = next((r for r in results if r.policy == "fifo"), None)
    if base is not None:
        for r in results:
            if r is not base and base.avg_jct_s > 0:
                change = 1 - r.avg_jct_s / base.avg_jct_s
                word = "lower" if change >= 0 else "higher"
                lines.append(f"{r.policy}: average JCT {abs(change):.0%} {word} than fifo")
    if bounds is not None:
        lines.append(
            f"no policy averages below {_hours(bounds['shared_avg_jct_s'])} here (every job "
            f"alone on its best allocation: {_hours(bounds['alone_avg_jct_s'])})"
        )
        free = (
            ""
            if bounds["free_avg_jct_s"] == bounds["best_found_avg_jct_s"]
            else f"; {_hours(bounds['free_avg_jct_s'])} with restarts free"
        )
        lines.append(
            f"the best schedule found knowing the whole trace, paying for its restarts as the "
            f"replays do, averages {_hours(bounds['best_found_avg_jct_s'])} (p99 "
            f"{_hours(bounds['best_found_p99_jct_s'])}{free}): the best possible lies between"
        )
        if "p99_capped_cap_s" in bounds:
            cap = _hours(bounds["p99_capped_cap_s"])
            found = (
                f"averages {_hours(bounds['p99_capped_avg_jct_s'])} (p99 "
                f"{_hours(bounds['p99_capped_p99_jct_s'])})"
            )
            lines.append(
                f"with its p99 held at fair's ({cap}), the best schedule found {found}"
                if _meets_cap(bounds)
                else f"no schedule found keeps its p99 at fair's ({cap}); the nearest {found}"
            )
    return "\n".join(lines)


def _pyplot() -> Any:
    """matplotlib's pyplot on a file backend; a one-line error when it is not installed."""
    try:
        import matplotlib  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        raise HetschedError(
            "--chart: needs matplotlib; install it with: pip install 'hetsched[plot]'"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]

    return plt


def write_chart(results: list[SimResult], path: Path) -> None:
    """A PNG: every job's completion time per policy (box plot, mean marked)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.boxplot([[j / 3600 for j in r.jcts_s] for r in results], showmeans=True)
    ax.set_xticks(range(1, len(results) + 1), [r.policy for r in results])
    ax.set_ylabel("job completion time (hours)")
    ax.set_yscale("log")
    ax.set_title("Job completion time per policy (triangle: mean)")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        raise HetschedError(f"--chart: cannot write {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
    print(f"wrote {path}", file=sys.stderr)
