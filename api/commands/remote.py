"""``hetsched cluster|schedule|datasets|upload``: a running control plane's devices, its
scheduling round and its datasets, through :class:`hetsched.Client`.

    hetsched cluster                  devices, their status and the job on each
    hetsched schedule                 the policy's latest round: who holds what, who waits, why
    hetsched datasets                 what jobs may name as --dataset
    hetsched upload notes.txt         store a dataset in the server's data directory
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from api.commands.client import add_service_arguments, connect, show
from api.commands.common import add_command
from api.commands.plan import format_table
from api.schemas.cluster import ClusterPublic
from api.schemas.datasets import DatasetPublic
from api.schemas.schedule import SchedulePublic


def add_parser(subparsers: Any) -> None:
    for name, runner in (
        ("cluster", run_cluster),
        ("schedule", run_schedule),
        ("datasets", run_datasets),
    ):
        add_service_arguments(add_command(subparsers, name, runner))
    upload = add_command(subparsers, "upload", run_upload)
    upload.add_argument("file", type=Path, metavar="FILE")
    upload.add_argument("--name", help="the name on the server (default the file's)")
    add_service_arguments(upload)


CLUSTER_HEADER = ["DEVICE", "TYPE", "MEMORY", "STATUS", "JOB", "SAMPLES/S"]


def print_cluster(cluster: ClusterPublic) -> None:
    where = "simulated" if cluster.simulated else f"Ray at {cluster.ray_address}"
    state = "available" if cluster.available else f"unavailable ({cluster.message})"
    print(f"cluster {cluster.name} ({where}): {state}, {cluster.num_devices} devices")
    rows = [
        [
            d.id,
            d.type,
            f"{d.memory_gb:g} GB",
            d.status,
            d.job_id or "-",
            f"{d.measured.samples_per_s:.1f}" if d.measured else "-",
        ]
        for node in cluster.nodes
        for d in node.devices
    ]
    print(
        format_table(["DEVICE", "TYPE", "MEMORY", "STATUS", "JOB", "SAMPLES/S"], rows, right={2, 5})
    )


def print_schedule(schedule: SchedulePublic) -> None:
    decided = f"decided {schedule.decided_at:%H:%M:%S}" if schedule.decided_at else "no round yet"
    print(f"policy {schedule.policy}, a round every {schedule.round_s:g} s, {decided}")
    if not schedule.jobs:
        print("no running or waiting jobs")
        return
    rows = [
        [j.id, j.name, j.status, ",".join(j.devices) or "-", f"{j.priority:g}", j.reason[:70]]
        for j in schedule.jobs
    ]
    print(format_table(["ID", "NAME", "STATUS", "DEVICES", "PRIORITY", "REASON"], rows, right={4}))


def describe(d: DatasetPublic) -> str:
    what = f"{d.kind}, {d.size_bytes:,} bytes"
    if d.num_tokens is not None:
        what += f", {d.num_tokens:,} tokens"
    if d.problem:
        what += f"; cannot train: {d.problem}"
    return f"{d.name} ({what})"


def run_cluster(args: argparse.Namespace) -> int:
    with connect(args) as client:
        return show(args, client.cluster(), print_cluster)


def run_schedule(args: argparse.Namespace) -> int:
    with connect(args) as client:
        return show(args, client.schedule(), print_schedule)


def run_datasets(args: argparse.Namespace) -> int:
    with connect(args) as client:
        data = client.datasets()
    if args.json:
        print(json.dumps([d.model_dump(mode="json") for d in data], indent=2))
    else:
        for d in data:
            print(describe(d))
    return 0


def run_upload(args: argparse.Namespace) -> int:
    with connect(args) as client:
        dataset = client.upload(args.file, name=args.name)
    return show(args, dataset, lambda d: print(f"uploaded {describe(d)}"))
