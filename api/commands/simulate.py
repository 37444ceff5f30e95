"""``hetsched simulate``: train on a local simulated mixed cluster and compare strategies.

    hetsched simulate                                   # the bundled local-sim cluster
    hetsched simulate --strategies dp,even --steps 20 --global-batch 64
    hetsched simulate --cluster my-mix.yaml --model gpt-tiny --json > run.json

Starts a local Ray whose simulated devices are paced to their GPUs' speed and
memory-capped (DESIGN.md, "Simulated devices"), profiles them (cached), plans
every strategy and trains each for ``--steps`` steps from the same seed. It
reports per strategy the measured step time (median after the first step)
and samples/s against the prediction, per-device busy and wait time, the loss
at every step and the validation loss on the corpus's held-out split where it
was evaluated (``--val-every``; by default ten times over runs of 20 steps or
more); then the ideal (sum over devices of each one's best solo
samples/s, from the profile) and the speed-up of dp over even. Progress goes
to stderr; ``--json`` prints one JSON object to stdout and nothing else.

When the host is too busy for the simulated devices to keep their GPUs' pace
(other CPU-bound processes; :mod:`workers.devices.contention`), one warning
line says so, the JSON's ``host`` says which devices lagged, and the figures
that measure the host rather than the GPUs are marked ``host-bound``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from api.commands.common import add_cache_arguments, add_cluster_argument, add_command, model_help
from api.commands.plan import format_table
from api.core.settings import DEFAULT_CLUSTER
from api.schemas.plans import OptimizerSpec
from api.services import check_simulated_fit
from scheduler.cost.profile import Profile
from scheduler.errors import HetschedError
from scheduler.hardware.cluster import Cluster, load_cluster, with_faults
from scheduler.hardware.faults import FaultSchedule, parse_fault
from scheduler.hardware.precision import JOB_PRECISIONS, device_precisions
from scheduler.models.hf_config import resolve_model
from scheduler.models.presets import ModelPreset, check_trainable
from scheduler.planning.plan import DP_STRATEGIES
from scheduler.planning.planner import STRATEGIES
from scheduler.units import format_bytes

if TYPE_CHECKING:  # the workers (torch, Ray) load when a simulation starts
    from workers.session import CheckpointInfo, RunBuilder, TrainJob, Validation, WorkerPool

DEFAULT_STRATEGIES = "auto,even"
BAR_WIDTH = 24
CHECKPOINT_EVERY = 5
"""Steps between the checkpoints a simulated run recovers and re-plans from."""


def add_parser(subparsers: Any) -> None:
    parser = add_command(subparsers, "simulate", run)
    add_cluster_argument(parser, "; default: the bundled local-sim.yaml", default=DEFAULT_CLUSTER)
    parser.add_argument(
        "--model",
        metavar="PRESET",
        help=model_help("model preset (default gpt-tiny, or --init-from's)"),
    )
    parser.add_argument(
        "--init-from",
        metavar="DIR",
        type=Path,
        help="start every run from this Hugging Face model directory's weights (GPT-2, Llama)",
    )
    parser.add_argument(
        "--val-every",
        type=int,
        metavar="N",
        help="steps between validation-loss evaluations, and after the last step "
        "(default: a tenth of the run for 20 steps or more, else none; 0: none)",
    )
    parser.add_argument(
        "--val-batches",
        type=int,
        default=1,
        metavar="N",
        help="validation samples per evaluation, in global batches (default %(default)s)",
    )
    parser.add_argument(
        "--global-batch",
        type=int,
        default=64,
        metavar="N",
        help="samples per step (default %(default)s)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=10,
        metavar="N",
        help="training steps per strategy (default %(default)s)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, metavar="N", help="model and data seed (default %(default)s)"
    )
    parser.add_argument(
        "--strategies",
        default=DEFAULT_STRATEGIES,
        metavar="LIST",
        help=f"comma-separated, from {','.join(STRATEGIES)} (default %(default)s)",
    )
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="inject a fault, repeatable: DEVICE@STEP:KIND with KIND crash, lost, "
        "slow=FACTOR or restore (e.g. node-a/0@10:slow=3); adds to the spec's simulation.faults",
    )
    parser.add_argument(
        "--precision",
        choices=JOB_PRECISIONS,
        default="fp32",
        help="compute precision: bf16/fp16 with fp32 master weights (fp16 with dynamic loss "
        "scaling), or auto per device type (default %(default)s)",
    )
    parser.add_argument(
        "--no-replan",
        action="store_true",
        help="keep each run's first plan when a device's speed changes",
    )
    add_cache_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object only")


def parse_strategies(text: str) -> list[str]:
    names = [s.strip().lower() for s in text.split(",") if s.strip()]
    if not names:
        raise HetschedError(f"--strategies: give at least one of {','.join(STRATEGIES)}")
    for name in names:
        if name not in STRATEGIES:
            raise HetschedError(
                f"--strategies: unknown strategy {name!r}; allowed: {', '.join(STRATEGIES)}"
            )
    return list(dict.fromkeys(names))


def ideal_samples_per_s(profile: Profile) -> float:
    """Sum over devices of each device's best solo rate: its largest micro-batch, back to back."""
    total = 0.0
    for d in profile.devices:
        m = d.max_micro_batch()
        if m >= 1:
            total += m / (d.fixed_s + m * d.per_sample_s)
    return total


class Progress:
    """A progress bar on stderr (redrawn in place on a terminal, one line per run otherwise)."""

    def __init__(self, enabled: bool = True) -> None:
        self.tty = sys.stderr.isatty()
        self.enabled = enabled

    def say(self, text: str) -> None:
        if self.enabled:
            print(text, file=sys.stderr, flush=True)

    def step(self, label: str, done: int, total: int, detail: str) -> None:
        if not self.enabled or not (self.tty or done == total):
            return
        filled = round(done / total * BAR_WIDTH) if total else BAR_WIDTH
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        end = "\n" if done == total else ""
        print(
            f"\r  {label:<12} [{bar}] {done}/{total}  {detail}",
            end=end,
            file=sys.stderr,
            flush=True,
        )


def _check_args(args: argparse.Namespace) -> None:
    if args.global_batch < 1:
        raise HetschedError(f"--global-batch: must be >= 1, got {args.global_batch}")
    if args.steps < 1:
        raise HetschedError(f"--steps: must be >= 1, got {args.steps}")
    if args.seed < 0:
        raise HetschedError(f"--seed: must be >= 0, got {args.seed}")
    if args.val_every is not None and args.val_every < 0:
        raise HetschedError(f"--val-every: must be >= 0, got {args.val_every}")
    if args.val_batches < 1:
        raise HetschedError(f"--val-batches: must be >= 1, got {args.val_batches}")
    if args.init_from is not None and not args.init_from.is_dir():
        raise HetschedError(f"--init-from: no directory {args.init_from}")


def simulate(
    job: TrainJob,
    *,
    global_batch: int,
    strategies: list[str],
    refresh: bool,
    progress: Progress,
    replan: bool = True,
    val_every: int | None = None,
    val_batches: int = 1,
    init_from: Path | None = None,
    precision: str = "fp32",
) -> dict[str, Any]:
    """Profile, plan and train ``job`` with each strategy; the JSON document of the command.

    The cluster's ``simulation.faults`` are injected into every run; each run
    checkpoints into a temporary directory, so it survives crashes and lost
    devices and, with ``replan``, follows speed changes (:mod:`workers.run.job`).
    ``init_from``: a Hugging Face directory every run starts from. ``precision``:
    what every run computes in (``auto``: per device type).
    """
    from workers.session import RunBuilder, default_cache_dir, default_validation

    job = replace(job, cache_dir=job.cache_dir or default_cache_dir())  # profile and runs alike
    cluster, steps = job.cluster, job.steps
    validation = default_validation(steps, every=val_every, batches=val_batches)
    with (
        _warm_pool(cluster, progress) as pool,
        tempfile.TemporaryDirectory(prefix="hetsched-init-") as start_dir,
    ):
        restore = _hf_start(init_from, job.model, start_dir)
        profile = _profile(job, strategies, refresh=refresh, pool=pool, progress=progress)
        first = RunBuilder(
            job=job,
            profile=profile.at_precision(precision),
            strategy=strategies[0],
            global_batch=global_batch,
        )
        runs = [
            _train(
                replace(first, strategy=strategy),
                pool=pool,
                progress=progress,
                follow_speed=replan,
                validation=validation,
                restore=restore,
            )
            for strategy in strategies
        ]
        pace = _pace_check(job, profile, runs)
        for r in runs:
            r["trusted"] = not pace.untrusted(r["strategy"])
        return {
            "cluster": cluster.name,
            "model": job.model.name,
            "global_batch": global_batch,
            "steps": steps,
            "seed": job.seed,
            "precision": precision,
            "profile": profile.to_dict(),
            "ideal_samples_per_s": ideal_samples_per_s(profile),
            "runs": runs,
            "speedup_vs_even": _speedup_vs_even(runs),
            "host": pace.to_dict(),
        }


def _pace_check(job: TrainJob, profile: Profile, runs: list[dict[str, Any]]) -> Any:
    """Whether the devices kept their pace: in the profile, and in each data-parallel run
    that kept its first plan (its devices' busy time against the plan's)."""
    from workers.profiler import simulation_pace

    judged = []
    for r in runs:
        if r["plan"]["strategy"] not in DP_STRATEGIES or r["replans"] or r["recoveries"]:
            continue
        planned = {d["id"]: d["busy_s"] for d in r["plan"]["devices"]}
        busy = [
            (d["id"], d["busy_s"], planned[d["id"]]) for d in r["devices"] if d["id"] in planned
        ]
        judged.append((r["strategy"], busy))
    return simulation_pace(job.cluster, job.model, profile, runs=judged, cache_dir=job.cache_dir)


@contextmanager
def _warm_pool(cluster: Cluster, progress: Progress) -> Iterator[WorkerPool]:
    """Local Ray and one warm worker per device, for the profile and every strategy's run."""
    from workers.session import WorkerPool, start_local_ray

    progress.say(
        f"starting local Ray with {len(cluster.devices)} simulated devices ({cluster.name})"
    )
    start_local_ray(cluster, num_cpus=max(2, os.cpu_count() or 2))
    pool = WorkerPool(cluster, simulated=True)
    try:
        yield pool
    finally:
        pool.shutdown()


def _hf_start(init_from: Path | None, preset: ModelPreset, uri: str) -> CheckpointInfo | None:
    """``--init-from``'s weights as the checkpoint every run starts from (None: fresh)."""
    from workers.session import start_from_hf

    if init_from is None:
        return None
    manifest = {"init_from": str(init_from)}
    return start_from_hf(init_from, model=preset, ref=f"hf:{init_from}", uri=uri, manifest=manifest)


def _profile(
    job: TrainJob,
    strategies: list[str],
    *,
    refresh: bool,
    pool: WorkerPool,
    progress: Progress,
) -> Profile:
    from workers.session import profile_cluster

    begin = time.perf_counter()
    progress.say("profiling (cached after the first run)...")
    # Per-layer figures only matter to the pipeline planners; skip them otherwise.
    wants_layers = any(s not in DP_STRATEGIES for s in strategies)
    profile = profile_cluster(
        job.cluster,
        job.model,
        cache_dir=job.cache_dir,
        refresh=refresh,
        layers="auto" if wants_layers else None,
        pool=pool,
    )
    progress.say(f"profiled in {time.perf_counter() - begin:.1f} s")
    return profile


def _speedup_vs_even(runs: list[dict[str, Any]]) -> float | None:
    """The first other strategy's measured samples/s over even's (dp, or auto, ...)."""
    by_name = {r["strategy"]: r for r in runs}
    best = next((r for r in runs if r["strategy"] != "even"), None)
    if best is None or "even" not in by_name:
        return None
    return best["measured_samples_per_s"] / by_name["even"]["measured_samples_per_s"]


def _train(
    builder: RunBuilder,
    *,
    pool: WorkerPool,
    progress: Progress,
    follow_speed: bool,
    validation: Validation | None,
    restore: CheckpointInfo | None,
) -> dict[str, Any]:
    """One strategy's run, checkpointing into a temporary directory; its entry of ``runs``."""
    from workers.session import Checkpointing, Recorder

    strategy, steps = builder.strategy, builder.job.steps
    plan = builder.plan()
    hooks = Recorder(
        watch=lambda m: progress.step(
            strategy, m.step + 1, steps, f"step {m.step_s:.2f} s  loss {m.loss:.3f}"
        )
    )
    progress.step(strategy, 0, steps, "starting actors")
    faults = builder.job.cluster.simulation.faults
    with tempfile.TemporaryDirectory(prefix="hetsched-simulate-") as checkpoints:
        config = builder.config(
            checkpointing=Checkpointing(root=checkpoints, every_steps=CHECKPOINT_EVERY),
            validation=validation,
            max_failures=len(faults),
            follow_speed=follow_speed,
            faults=FaultSchedule(faults),
        )
        result = builder.train(plan, pool=pool, config=config, hooks=hooks, restore=restore)
    after_first = result.step_times_s[1:] or result.step_times_s
    measured = statistics.median(after_first)
    return {
        "strategy": strategy,
        "plan": plan.to_dict(),
        "predicted_step_s": plan.predicted_step_s,
        "measured_step_s": measured,
        "measured_samples_per_s": builder.global_batch / measured,
        "losses": result.losses,
        "val_losses": [result.val_losses.get(step) for step in range(steps)],
        "step_times_s": result.step_times_s,
        "replans": [d.to_dict() for d in hooks.replans],
        "recoveries": [r.to_dict() for r in hooks.recoveries],
        "devices": [d.to_dict() for d in result.devices],
    }


def run(args: argparse.Namespace) -> int:
    _check_args(args)
    strategies = parse_strategies(args.strategies)
    cluster = load_cluster(args.cluster)
    cluster = with_faults(cluster, [parse_fault(text, cluster.ids) for text in args.fault])
    preset = resolve_model(
        args.model or (f"hf:{args.init_from}" if args.init_from is not None else "gpt-tiny")
    )
    check_trainable(preset)  # before starting Ray: a family the runtimes cannot build
    check_simulated_fit(cluster, preset, cluster.ids)  # any memory_scale: fits, or one line
    device_precisions(cluster.devices, args.precision)  # every device runs it, or one line
    progress = Progress()
    # Keep stdout for the result alone: anything a library prints goes to stderr.
    with contextlib.redirect_stdout(sys.stderr):
        from workers.session import TrainJob  # torch and Ray load here

        job = TrainJob(
            cluster=cluster,
            model=preset,
            steps=args.steps,
            seed=args.seed,
            optimizer=OptimizerSpec().runtime(),  # a job's defaults: the service's curve
            cache_dir=args.cache_dir,
        )
        doc = simulate(
            job,
            global_batch=args.global_batch,
            strategies=strategies,
            refresh=args.refresh,
            progress=progress,
            replan=not args.no_replan,
            val_every=args.val_every,
            val_batches=args.val_batches,
            init_from=args.init_from,
            precision=args.precision,
        )
    warning = doc["host"]["warning"]
    if args.json:
        if warning:
            progress.say(f"warning: {warning}")
        print(json.dumps(doc))
    else:
        print(render(doc))
    return 0


# --- the table ----------------------------------------------------------------


def _s(value: float) -> str:
    return f"{value * 1e3:.0f} ms" if value < 1 else f"{value:.2f} s"


STRATEGY_COLUMNS = [
    "strategy",
    "predicted step",
    "measured step",
    "error",
    "samples/s",
    "of ideal",
    "loss",
    "val loss",
]
DEVICE_COLUMNS = [
    "strategy",
    "device",
    "samples",
    "micro x accum",
    "planned busy",
    "busy",
    "wait",
    "peak mem",
]
UNPLANNED = {"samples": 0, "micro_batch": 0, "accum_steps": 0, "busy_s": 0.0}
"""A device that ran but is not in the first plan (a re-plan or a recovery took it)."""


def render(doc: dict[str, Any]) -> str:
    """The command's table: per strategy, per device, and the losses per step."""
    ideal = doc["ideal_samples_per_s"]
    lines = [
        f"hetsched simulate: cluster {doc['cluster']}, model {doc['model']}, "
        f"global batch {doc['global_batch']}, {doc['steps']} steps, seed {doc['seed']}",
        f"ideal {ideal:.1f} samples/s (each device's best solo rate, summed)",
        *([f"warning: {doc['host']['warning']}"] if doc.get("host", {}).get("warning") else []),
        "",
        format_table(
            STRATEGY_COLUMNS, [_strategy_row(r, ideal) for r in doc["runs"]], right={1, 2, 3, 4, 5}
        ),
    ]
    if doc["speedup_vs_even"] is not None:
        best = next(r for r in doc["runs"] if r["strategy"] != "even")
        name = best["strategy"]
        if best["plan"]["strategy"] != name:  # auto: say what it chose
            name += f" ({best['plan']['strategy']})"
        even = next(r for r in doc["runs"] if r["strategy"] == "even")
        if best.get("trusted", True) and even.get("trusted", True):
            speedup = f"{doc['speedup_vs_even']:.2f}x the samples/s of even (measured)"
        else:
            speedup = "not compared with even: host-bound (see the warning)"
        lines += ["", f"{name} is {speedup}"]
    lines += ["", "per device (medians over the steps after the first):"]
    rows = [row for r in doc["runs"] for row in _device_rows(r)]
    lines.append(format_table(DEVICE_COLUMNS, rows, right={2, 4, 5, 6, 7}))
    return "\n".join(lines + _event_lines(doc["runs"]) + _loss_lines(doc["runs"]))


def _event_lines(runs: list[dict[str, Any]]) -> list[str]:
    """What a fault or a speed change made each run do (the JSON's recoveries and replans)."""
    lines = []
    for r in runs:
        for rec in r["recoveries"]:
            lines.append(
                f"  {r['strategy']:<12} recovered from {rec['error']} at step "
                f"{rec['failed_step']}: lost {', '.join(rec['lost']) or 'none'}, resumed at step "
                f"{rec['resumed_step']} ({rec['steps_redone']} redone) in {rec['recover_s']:.1f} s"
            )
        for d in r["replans"]:
            verb = "re-planned" if d["switch"] else "kept its plan"
            lines.append(f"  {r['strategy']:<12} {verb} at step {d['step']}: {d['reason']}")
    return ["", "recoveries and re-plans:", *lines] if lines else []


def _strategy_row(r: dict[str, Any], ideal: float) -> list[str]:
    error = (r["measured_step_s"] - r["predicted_step_s"]) / r["predicted_step_s"]
    trusted = r.get("trusted", True)  # else the host's pace, not the GPUs': not compared
    return [
        r["strategy"],
        _s(r["predicted_step_s"]),
        _s(r["measured_step_s"]),
        f"{error:+.0%}" if trusted else "host-bound",
        f"{r['measured_samples_per_s']:.1f}",
        (f"{r['measured_samples_per_s'] / ideal:.0%}" if trusted else "host-bound")
        if ideal
        else "-",
        f"{r['losses'][0]:.3f} -> {r['losses'][-1]:.3f}",
        _val_summary(r.get("val_losses") or []),
    ]


def _device_rows(r: dict[str, Any]) -> list[list[str]]:
    planned = {d["id"]: d for d in r["plan"]["devices"]}
    rows = []
    for d in r["devices"]:
        p = planned.get(d["id"], UNPLANNED)
        rows.append(
            [
                r["strategy"],
                d["id"],
                str(p["samples"]),
                f"{p['micro_batch']}x{p['accum_steps']}",
                _s(p["busy_s"]),
                _s(d["busy_s"]),
                _s(d["wait_s"]),
                format_bytes(d["peak_bytes"]),
            ]
        )
    return rows


def _loss_lines(runs: list[dict[str, Any]]) -> list[str]:
    lines = ["", "loss per step:"]
    for r in runs:
        lines.append(f"  {r['strategy']:<12} " + " ".join(f"{x:.3f}" for x in r["losses"]))
    if any(v is not None for r in runs for v in r.get("val_losses") or []):
        lines += ["", "validation loss (held-out split) after step:"]
        for r in runs:
            evaluated = [(i, v) for i, v in enumerate(r["val_losses"]) if v is not None]
            lines.append(
                f"  {r['strategy']:<12} " + " ".join(f"{i}: {v:.3f}" for i, v in evaluated)
            )
    return lines


def _val_summary(val_losses: list[float | None]) -> str:
    evaluated = [v for v in val_losses if v is not None]
    if not evaluated:
        return "-"
    return (
        f"{evaluated[0]:.3f} -> {evaluated[-1]:.3f}"
        if len(evaluated) > 1
        else f"{evaluated[0]:.3f}"
    )
