"""``hetsched submit|jobs|status|stop|delete|logs|wait``: a running control plane's jobs,
through :class:`hetsched.Client`.

    hetsched submit --name demo --model gpt-tiny --global-batch 32 --steps 20 [--wait]
    hetsched jobs [--state RUNNING]
    hetsched status JOB_ID
    hetsched logs JOB_ID [-f]
    hetsched wait JOB_ID [--timeout 600]     exit 0: SUCCEEDED, 1: FAILED or STOPPED
    hetsched stop JOB_ID
    hetsched delete JOB_ID

``--url`` (default ``$HETSCHED_URL`` or http://127.0.0.1:8000) picks the server; the
bearer token comes from ``$HETSCHED_TOKEN`` (a user's) or ``$HETSCHED_API_TOKEN``.
``--json`` prints the server's JSON instead of a table.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from api.commands.common import add_command
from api.commands.plan import format_table
from api.schemas.jobs import JobPublic, LogLine
from api.states import JobState
from hetsched import Client, JobFailed, Retry
from hetsched.calls import DEFAULT_URL
from scheduler.errors import HetschedError
from scheduler.hardware.precision import JOB_PRECISIONS

STATES = tuple(JobState)
CLI_RETRY = Retry(attempts=3, backoff_s=0.25)
"""A command gives up on an unreachable service after about a second."""


def add_service_arguments(parser: argparse.ArgumentParser) -> None:
    """``--url`` and ``--json``, for every command that talks to a service."""
    parser.add_argument(
        "--url",
        default=os.environ.get("HETSCHED_URL", DEFAULT_URL),
        help="control plane address (default $HETSCHED_URL or %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print the JSON answer")


def connect(args: argparse.Namespace) -> Client:
    return Client(args.url, retry=CLI_RETRY)


def add_parser(subparsers: Any) -> None:
    submit = add_command(subparsers, "submit", run_submit)
    add_job_fields(submit)
    submit.add_argument(
        "--wait",
        action="store_true",
        help="print the job's log until it ends; exit 0 if it SUCCEEDED, 1 if not",
    )
    add_service_arguments(submit)

    jobs = add_command(subparsers, "jobs", run_jobs)
    jobs.add_argument("--state", choices=STATES)
    jobs.add_argument("--limit", type=int, default=50)
    add_service_arguments(jobs)

    logs = add_command(subparsers, "logs", run_logs)
    logs.add_argument("-f", "--follow", action="store_true", help="until the job ends")
    wait = add_command(subparsers, "wait", run_wait)
    wait.add_argument("--timeout", type=float, metavar="S", help="give up after S seconds")
    status = add_command(subparsers, "status", run_status)
    stop = add_command(subparsers, "stop", run_stop)
    delete = add_command(subparsers, "delete", run_delete)
    for parser in (status, stop, delete, logs, wait):
        parser.add_argument("job_id", metavar="ID")
        add_service_arguments(parser)


def add_job_fields(submit: argparse.ArgumentParser) -> None:
    """What a job is (:class:`api.schemas.jobs.JobCreate`); the server checks the values."""
    submit.add_argument("--name", default="job")
    submit.add_argument("--model", default="gpt-tiny", help="model preset (default gpt-tiny)")
    submit.add_argument(
        "--dataset",
        default="default",
        help="'default' or a file name in the server's data directory (see hetsched upload)",
    )
    submit.add_argument("--global-batch", type=int, default=32)
    submit.add_argument("--steps", type=int, default=20)
    submit.add_argument("--strategy", default="auto", help="auto, dp, pp, hybrid, even, ...")
    submit.add_argument("--lr", type=float, default=3e-3)
    submit.add_argument("--weight-decay", type=float, default=0.0)
    submit.add_argument("--seed", type=int, default=0)
    submit.add_argument(
        "--precision",
        choices=JOB_PRECISIONS,
        default="fp32",
        help="fp32, bf16, fp16 (loss-scaled) or auto per device type (default %(default)s)",
    )
    submit.add_argument("--devices", help="comma-separated device ids (default: the policy's)")
    submit.add_argument("--priority", type=float, help="weight under fair and goodput (default 1)")
    submit.add_argument("--min-devices", type=int, help="wait until this many are free")
    submit.add_argument("--max-devices", type=int, help="never more devices than this")
    submit.add_argument("--checkpoint-every", type=int, metavar="STEPS")
    submit.add_argument("--val-every", type=int, metavar="STEPS", help="0: never evaluate")
    submit.add_argument("--max-failures", type=int, help="recoveries before it fails (default 3)")
    submit.add_argument(
        "--init-from", metavar="REF", help="JOB_ID, JOB_ID@STEP or hf:DIR (in the data dir)"
    )
    submit.add_argument(
        "--no-replan",
        dest="replan",
        action="store_const",
        const=False,
        help="do not re-plan when a device's speed changes (default: the service's)",
    )
    submit.add_argument("--submission-id", help="idempotency key: resubmitting returns the job")


OPTIONAL_FIELDS = (
    "priority",
    "min_devices",
    "max_devices",
    "checkpoint_every",
    "val_every",
    "max_failures",
    "init_from",
    "replan",
    "submission_id",
)


def job_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The submission's fields; those not given are left to the server's defaults."""
    body: dict[str, Any] = {
        "name": args.name,
        "model": args.model,
        "dataset": args.dataset,
        "global_batch": args.global_batch,
        "steps": args.steps,
        "strategy": args.strategy,
        "optimizer": {"lr": args.lr, "weight_decay": args.weight_decay},
        "seed": args.seed,
        "precision": args.precision,
    }
    if args.devices:
        body["devices"] = [d.strip() for d in args.devices.split(",") if d.strip()]
    for name in OPTIONAL_FIELDS:
        if getattr(args, name) is not None:
            body[name] = getattr(args, name)
    return body


def show(args: argparse.Namespace, doc: BaseModel, summary: Callable[[Any], None]) -> int:
    """Print ``doc`` as JSON with ``--json``, else as ``summary`` writes it; exit 0."""
    if args.json:
        print(doc.model_dump_json(indent=2))
    else:
        summary(doc)
    return 0


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds else "-"


def _job_row(job: JobPublic) -> list[str]:
    rate = job.samples_per_s
    return [
        job.id,
        job.name,
        job.state.value,
        f"{job.steps_done}/{job.steps}",
        f"{job.last_loss:.4f}" if job.last_loss is not None else "-",
        f"{rate:.1f}" if rate else "-",
        job.message[:60],
    ]


JOB_HEADER = ["ID", "NAME", "STATE", "STEPS", "LOSS", "SAMPLES/S", "MESSAGE"]
PLAN_HEADER = ["DEVICE", "SAMPLES", "MICRO", "ACCUM", "BUSY", "PEAK"]


def print_job(job: JobPublic) -> None:
    spec = job.spec
    model = spec.model if isinstance(spec.model, str) else job.model_name
    print(f"job {job.id} ({job.name}): {job.state.value}")
    if job.message:
        print(f"  message:   {job.message}")
    print(
        f"  model:     {model}, global batch {spec.global_batch}, strategy "
        f"{spec.strategy}, seed {spec.seed}"
    )
    print(
        f"  progress:  {job.steps_done}/{job.steps} steps done"
        + (f", loss {job.last_loss:.4f}" if job.last_loss is not None else "")
    )
    print(
        f"  step time: predicted {_ms(job.predicted_step_s)}, measured "
        f"{_ms(job.measured_step_s)}"
        + (f" ({job.samples_per_s:.1f} samples/s)" if job.samples_per_s else "")
    )
    for key in ("created_at", "started_at", "ended_at"):
        if getattr(job, key):
            print(f"  {key.replace('_at', ''):<10} {getattr(job, key)}")
    for event in job.events:
        print(f"  {event.kind:<10} at step {event.step}")
    if job.plan:
        rows = [
            [
                d.id,
                str(d.samples),
                str(d.micro_batch),
                str(d.accum_steps),
                _ms(d.busy_s),
                f"{d.peak_bytes / 1e6:.1f} MB",
            ]
            for d in job.plan.devices
        ]
        print(format_table(PLAN_HEADER, rows, right={1, 2, 3, 4, 5}))


def print_line(line: LogLine, *, as_json: bool = False) -> None:
    if as_json:
        print(line.model_dump_json(), flush=True)
    else:
        print(f"{line.time:%Y-%m-%d %H:%M:%S} {line.level:<7} {line.message}", flush=True)


def follow_to_end(client: Client, job_id: str, *, as_json: bool) -> None:
    """Print the job's log lines as they come, until it ends."""
    for event in client.follow(job_id):
        if isinstance(event, LogLine):
            print_line(event, as_json=as_json)


def ended(client: Client, job_id: str, *, timeout_s: float | None, as_json: bool) -> int:
    """Wait for the job; say how it ended; 0 if it SUCCEEDED, 1 if it FAILED or STOPPED."""
    try:
        job, code = client.wait(job_id, timeout_s=timeout_s), 0
    except JobFailed as failed:
        job, code = failed.job, 1
    if as_json:
        print(job.model_dump_json(indent=2))
    else:
        print(
            f"job {job.id} ({job.name}): {job.state.value}"
            + (f": {job.message}" if job.message else "")
        )
    return code


def run_submit(args: argparse.Namespace) -> int:
    with connect(args) as client:
        job = client.submit(job_fields(args))
        if not args.wait:
            return show(args, job, lambda j: print(f"submitted job {j.id} ({j.name}): {j.state}"))
        print(f"submitted job {job.id} ({job.name}): {job.state}", flush=True)
        follow_to_end(client, job.id, as_json=False)
        return ended(client, job.id, timeout_s=None, as_json=args.json)


def run_jobs(args: argparse.Namespace) -> int:
    with connect(args) as client:
        page = client.list(state=args.state, limit=args.limit)
    if args.json:
        print(page.model_dump_json(indent=2))
    elif not page.data:
        print("no jobs")
    else:
        print(format_table(JOB_HEADER, [_job_row(j) for j in page.data], right=set()))
        if page.count > len(page.data):
            print(f"({len(page.data)} of {page.count} shown; use --limit)")
    return 0


def run_status(args: argparse.Namespace) -> int:
    with connect(args) as client:
        return show(args, client.get(args.job_id), print_job)


def run_stop(args: argparse.Namespace) -> int:
    with connect(args) as client:
        job = client.stop(args.job_id)
    return show(args, job, lambda j: print(f"job {j.id}: {j.state} ({j.message})"))


def run_delete(args: argparse.Namespace) -> int:
    with connect(args) as client:
        message = client.delete(args.job_id)
    print(json.dumps({"message": message}) if args.json else message)
    return 0


def run_logs(args: argparse.Namespace) -> int:
    with connect(args) as client:
        if args.follow:
            follow_to_end(client, args.job_id, as_json=args.json)
        else:
            for line in client.logs(args.job_id):
                print_line(line, as_json=args.json)
    return 0


def run_wait(args: argparse.Namespace) -> int:
    if args.timeout is not None and args.timeout <= 0:
        raise HetschedError(f"--timeout: must be > 0 seconds, got {args.timeout:g}")
    with connect(args) as client:
        return ended(client, args.job_id, timeout_s=args.timeout, as_json=args.json)
