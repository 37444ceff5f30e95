"""``hetsched submit|jobs|status|stop``: talk to a running control plane over REST.

    hetsched submit --name demo --model gpt-tiny --global-batch 32 --steps 20
    hetsched jobs [--state RUNNING]
    hetsched status JOB_ID
    hetsched stop JOB_ID

``--url`` (default ``$HETSCHED_URL`` or http://127.0.0.1:8000) picks the server;
the bearer token comes from ``$HETSCHED_API_TOKEN``. ``--json`` prints the
server's JSON instead of a table.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from scheduler.errors import HetschedError
from scheduler.hardware.precision import JOB_PRECISIONS

DEFAULT_URL = "http://127.0.0.1:8000"
STATES = ("PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=os.environ.get("HETSCHED_URL", DEFAULT_URL),
        help="control plane address (default $HETSCHED_URL or %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print the JSON answer")


def add_parser(subparsers: Any) -> None:
    submit = subparsers.add_parser("submit", help="submit a training job to the control plane")
    submit.add_argument("--name", default="job")
    submit.add_argument("--model", default="gpt-tiny", help="model preset (default gpt-tiny)")
    submit.add_argument(
        "--dataset",
        default="default",
        help="'default' or a file name in the server's data directory",
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
    submit.add_argument("--devices", help="comma-separated device ids (default: all)")
    submit.add_argument("--submission-id", help="idempotency key: resubmitting returns the job")
    _common(submit)
    submit.set_defaults(run=run_submit)

    jobs = subparsers.add_parser("jobs", help="list the control plane's jobs")
    jobs.add_argument("--state", choices=STATES)
    jobs.add_argument("--limit", type=int, default=50)
    _common(jobs)
    jobs.set_defaults(run=run_jobs)

    for name, helptext, runner in (
        ("status", "show one job", run_status),
        ("stop", "stop a job", run_stop),
    ):
        sub = subparsers.add_parser(name, help=helptext)
        sub.add_argument("job_id", metavar="ID")
        _common(sub)
        sub.set_defaults(run=runner)


def request(args: argparse.Namespace, method: str, path: str, **kwargs: Any) -> Any:
    """One call to the API; connection and HTTP errors become one-line HetschedErrors."""
    import httpx

    headers = {}
    token = os.environ.get("HETSCHED_API_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    url = args.url.rstrip("/") + "/api/v1" + path
    try:
        response = httpx.request(method, url, headers=headers, timeout=30.0, **kwargs)
    except httpx.ConnectError:
        raise HetschedError(
            f"cannot reach the control plane at {args.url} "
            "(is `hetsched serve` running? set --url or HETSCHED_URL)"
        ) from None
    except httpx.HTTPError as exc:
        raise HetschedError(f"{args.url}: {type(exc).__name__}: {exc}") from None
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text.strip() or response.reason_phrase
        raise HetschedError(f"{response.status_code}: {detail}")
    return response.json()


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    return "\n".join(lines)


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds else "-"


def _job_row(job: dict[str, Any]) -> list[str]:
    rate = job.get("samples_per_s")
    return [
        job["id"],
        job["name"],
        job["state"],
        f"{job['steps_done']}/{job['steps']}",
        f"{job['last_loss']:.4f}" if job.get("last_loss") is not None else "-",
        f"{rate:.1f}" if rate else "-",
        job.get("message", "")[:60],
    ]


JOB_HEADER = ["ID", "NAME", "STATE", "STEPS", "LOSS", "SAMPLES/S", "MESSAGE"]


def _show(
    args: argparse.Namespace, doc: dict[str, Any], summary: Callable[[dict[str, Any]], None]
) -> int:
    """Print ``doc`` as JSON with ``--json``, else as ``summary`` writes it; exit 0."""
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        summary(doc)
    return 0


def _print_job(job: dict[str, Any]) -> None:
    spec = job["spec"]
    model = spec["model"] if isinstance(spec["model"], str) else job["model_name"]
    print(f"job {job['id']} ({job['name']}): {job['state']}")
    if job.get("message"):
        print(f"  message:   {job['message']}")
    print(
        f"  model:     {model}, global batch {spec['global_batch']}, strategy "
        f"{spec['strategy']}, seed {spec['seed']}"
    )
    print(
        f"  progress:  {job['steps_done']}/{job['steps']} steps"
        + (f", loss {job['last_loss']:.4f}" if job.get("last_loss") is not None else "")
    )
    print(
        f"  step time: predicted {_ms(job.get('predicted_step_s'))}, measured "
        f"{_ms(job.get('measured_step_s'))}"
        + (f" ({job['samples_per_s']:.1f} samples/s)" if job.get("samples_per_s") else "")
    )
    for key in ("created_at", "started_at", "ended_at"):
        if job.get(key):
            print(f"  {key.replace('_at', ''):<10} {job[key]}")
    plan = job.get("plan")
    if plan:
        rows = [
            [
                d["id"],
                str(d["samples"]),
                str(d["micro_batch"]),
                str(d["accum_steps"]),
                _ms(d["busy_s"]),
                f"{d['peak_bytes'] / 1e6:.1f} MB",
            ]
            for d in plan["devices"]
        ]
        print(_table(rows, ["DEVICE", "SAMPLES", "MICRO", "ACCUM", "BUSY", "PEAK"]))


def run_submit(args: argparse.Namespace) -> int:
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
    if args.submission_id:
        body["submission_id"] = args.submission_id
    job = request(args, "POST", "/jobs", json=body)
    return _show(args, job, lambda j: print(f"submitted job {j['id']} ({j['name']}): {j['state']}"))


def run_jobs(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"limit": args.limit}
    if args.state:
        params["state"] = args.state
    page = request(args, "GET", "/jobs", params=params)
    if args.json:
        print(json.dumps(page, indent=2))
    elif not page["data"]:
        print("no jobs")
    else:
        print(_table([_job_row(j) for j in page["data"]], JOB_HEADER))
        if page["count"] > len(page["data"]):
            print(f"({len(page['data'])} of {page['count']} shown; use --limit)")
    return 0


def run_status(args: argparse.Namespace) -> int:
    return _show(args, request(args, "GET", f"/jobs/{quote(args.job_id, safe='')}"), _print_job)


def run_stop(args: argparse.Namespace) -> int:
    job = request(args, "POST", f"/jobs/{quote(args.job_id, safe='')}/stop")
    return _show(args, job, lambda j: print(f"job {j['id']}: {j['state']} ({j['message']})"))
