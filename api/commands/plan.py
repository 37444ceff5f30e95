"""``hetsched plan``: plan a split of the global batch, offline and in milliseconds.

    hetsched plan --cluster deploy/clusters/mixed-lab.yaml --model gpt2-small --global-batch 64
    hetsched plan --profile profile.json --global-batch 64 --strategy proportional --json

With ``--cluster`` the profile is analytic (GPU catalogue × model preset: a
roofline at each GPU's sustained share of peak, or ``--efficiency`` for all);
with ``--profile`` it is a measured (or saved) profile. The default output is
a table with the predicted step time against the ``even`` and
``proportional`` baselines; ``--json`` prints the plan document of
DESIGN.md and nothing else. Only ``scheduler/`` is imported: no torch, no ray.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from api.commands.common import add_command, cluster_help, model_help
from api.core.clusters import cluster_argument
from scheduler.cost.profile import DEFAULT_EFFICIENCY, Profile, analytic_profile, load_profile
from scheduler.errors import HetschedError
from scheduler.hardware.cluster import load_cluster
from scheduler.hardware.precision import JOB_PRECISIONS
from scheduler.models.hf_config import resolve_model
from scheduler.models.presets import PRESETS
from scheduler.planning.plan import Plan
from scheduler.planning.planner import STRATEGIES, make_plan
from scheduler.units import format_bytes

BAR_WIDTH = 20


def add_parser(subparsers: Any) -> None:
    parser = add_command(subparsers, "plan", run)
    parser.add_argument(
        "--cluster", metavar="FILE", type=cluster_argument, help=cluster_help("; needs --model")
    )
    parser.add_argument(
        "--model", metavar="PRESET", help=model_help("with --cluster, a model preset")
    )
    parser.add_argument("--profile", metavar="FILE", help="measured or saved profile (JSON)")
    parser.add_argument(
        "--global-batch", type=int, required=True, metavar="N", help="samples per step (>= 1)"
    )
    parser.add_argument(
        "--strategy", choices=STRATEGIES, default="auto", help="planner (default: %(default)s)"
    )
    parser.add_argument(
        "--efficiency",
        type=float,
        metavar="F",
        help="with --cluster: share of peak FLOP/s every device reaches "
        f"(e.g. {DEFAULT_EFFICIENCY}; default: each GPU's sustained rate from published "
        "measurements, far below peak for 70 W cards)",
    )
    parser.add_argument(
        "--precision",
        choices=JOB_PRECISIONS,
        help="what the job computes in: with --cluster, each device's compute rate and "
        "activation memory are that precision's (auto: bf16 where supported, fp16 on "
        "V100/T4-class, fp32 otherwise); with --profile, only the plan's label (the figures "
        "are as measured). Default: fp32, as a job's",
    )
    parser.add_argument("--json", action="store_true", help="print the plan JSON only")


def _load_profile(args: argparse.Namespace) -> tuple[Profile, str]:
    """The profile the user asked for, and a one-line description of it."""
    if args.cluster and args.profile:
        raise HetschedError("--cluster and --profile: give one of them, not both")
    if args.profile:
        if args.model or args.efficiency is not None:
            flag = "--model" if args.model else "--efficiency"
            raise HetschedError(f"{flag}: only with --cluster (a profile carries its own figures)")
        profile = load_profile(args.profile)
        if args.precision is not None:
            profile = profile.at_precision(args.precision)
        return profile, f"{profile.source} profile {Path(args.profile).name}"
    if not args.cluster:
        raise HetschedError("give --cluster FILE --model PRESET, or --profile FILE")
    if not args.model:
        raise HetschedError(f"--model: required with --cluster; known: {', '.join(PRESETS)}")
    efficiency = args.efficiency
    if efficiency is not None and not 0 < efficiency <= 1:  # nan fails both
        raise HetschedError(f"--efficiency: must be in (0, 1], got {efficiency:g}")
    cluster = load_cluster(args.cluster)
    profile = analytic_profile(
        cluster, resolve_model(args.model), efficiency=efficiency, precision=args.precision
    )
    shares = "each GPU's sustained share" if efficiency is None else f"{efficiency:.0%}"
    precision = args.precision or "fp32"  # what a job trains in unless it asks
    return profile, f"cluster {cluster.name}, analytic roofline in {precision} at {shares} of peak"


def run(args: argparse.Namespace) -> int:
    profile, source = _load_profile(args)
    if args.global_batch < 1:
        raise HetschedError(f"--global-batch: must be >= 1, got {args.global_batch}")
    plan = make_plan(profile, args.global_batch, args.strategy)
    if args.json:
        print(plan.to_json())
    else:
        print(render(plan, profile, source=source))
    return 0


# --- the table ----------------------------------------------------------------


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> str:
    """Columns padded to their widest cell; indices in ``right`` align right.

    Plain text on purpose, not ``rich``: the same bytes on a terminal, in a
    pipe and in CI logs (rich wraps or truncates to the terminal width and
    adds colour codes), ``--json`` serves scripts, and a 12-line function
    does not justify a dependency for every control-plane install.
    """
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        padded = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(padded).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])


def _seconds(value: float) -> str:
    return f"{value * 1e3:.1f} ms" if value < 1 else f"{value:.3f} s"


def _bar(fraction: float) -> str:
    full, empty = ("█", "░") if _unicode_ok() else ("#", ".")
    filled = round(fraction * BAR_WIDTH)
    return full * filled + empty * (BAR_WIDTH - filled)


def _unicode_ok() -> bool:
    try:
        "█░".encode(sys.stdout.encoding or "ascii")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def render(plan: Plan, profile: Profile, *, source: str) -> str:
    """The human-readable plan: devices, exclusions, then the comparison."""
    has_layers = any(d.layers is not None for d in plan.devices)
    recomputes = any(d.recompute != "none" for d in plan.devices)
    sharded = any(d.shard is not None for d in plan.devices)
    groups = sharded and any(d.shard_group is not None for d in plan.devices)
    headers = ["DEVICE", "TYPE", "SAMPLES", "MICRO", "ACCUM", "BUSY", "MEMORY (USE/CAPACITY)"]
    if has_layers:
        headers[2:2] = ["PIPE", "STAGE", "LAYERS"]
    if recomputes:
        headers.insert(headers.index("BUSY"), "RECOMPUTE")
    if sharded:
        headers[headers.index("BUSY") : headers.index("BUSY")] = ["GROUP"] * groups + ["SHARD"]
    mixed = any(d.precision != "fp32" for d in plan.devices)
    if mixed:
        headers.insert(headers.index("BUSY"), "PRECISION")
    headers.append("SHARE OF BATCH")
    rows = []
    for d in plan.devices:
        device = profile.device(d.id)
        capacity = device.capacity_bytes
        memory = f"{format_bytes(d.peak_bytes)} / {format_bytes(capacity)}"
        memory += f" ({d.peak_bytes / capacity:.0%})" if capacity else ""
        share = d.samples / plan.global_batch
        row = [d.id, device.type, str(d.samples), str(d.micro_batch), str(d.accum_steps)]
        if has_layers:
            pipe = "" if d.pipeline is None else str(d.pipeline)
            stage = "" if d.stage is None else str(d.stage)
            layers = "" if d.layers is None else f"[{d.layers[0]},{d.layers[1]})"
            row[2:2] = [pipe, stage, layers]
        if recomputes:
            row.append(d.recompute)
        if sharded:
            group = [] if not groups else ["" if d.shard_group is None else str(d.shard_group)]
            row += [*group, "" if d.shard is None else f"{d.shard:.1%}"]
        if mixed:
            row.append(d.precision)
        row += [_seconds(d.busy_s), memory, f"{_bar(share)} {share:5.1%}"]
        rows.append(row)
    right = {
        i for i, h in enumerate(headers) if h in {"SAMPLES", "MICRO", "ACCUM", "BUSY", "SHARD"}
    }
    lines = [
        f"{plan.strategy} plan for {profile.model}: global batch {plan.global_batch} on "
        f"{len(profile.devices)} device{'' if len(profile.devices) == 1 else 's'} ({source})",
        "",
        format_table(headers, rows, right),
    ]
    if plan.excluded:
        lines += ["", "Excluded:"]
        width = max(len(e.id) for e in plan.excluded)
        lines += [f"  {e.id.ljust(width)}  {e.reason}" for e in plan.excluded]
    lines += ["", *_summary(plan)]
    lines += [f"Note: {note}" for note in plan.notes]
    return "\n".join(lines)


def _rate(samples_per_s: float) -> str:
    """One decimal, or three significant digits below 10 (a 7B model runs under one a second)."""
    return f"{samples_per_s:,.1f}" if samples_per_s >= 10 else f"{samples_per_s:.3g}"


def _summary(plan: Plan) -> list[str]:
    comm = "unhidden collectives" if plan.strategy == "fsdp" else "all-reduce"
    out = [
        f"Predicted step {_seconds(plan.predicted_step_s)} (compute {_seconds(plan.compute_s)}"
        f" + {comm} {_seconds(plan.comm_s)}): {_rate(plan.predicted_samples_per_s)} samples/s"
    ]
    others = {k: b for k, b in plan.baselines.items() if k != plan.strategy}
    if not others:
        return out
    width = max(len(k) for k in others)
    for name, base in others.items():
        speedup = base.predicted_step_s / plan.predicted_step_s if plan.predicted_step_s else 0
        if abs(speedup - 1) < 0.005:
            verdict = "same speed"
        elif speedup > 1:
            verdict = f"{speedup:.2f}x faster"
        else:  # "0.35x slower" would read as 35 % slower; say how many times slower
            verdict = f"{1 / speedup:.2f}x slower" if speedup > 0 else "slower"
        out.append(
            f"  vs {name.ljust(width)}  {_seconds(base.predicted_step_s):>9}  "
            f"{_rate(base.predicted_samples_per_s):>12} samples/s  {plan.strategy}: {verdict}"
        )
    return out
