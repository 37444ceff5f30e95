"""``hetsched profile``: measure a cluster's devices for a model and write the profile.

    hetsched profile --cluster deploy/clusters/local-sim.yaml --model gpt-tiny -o profile.json
    hetsched profile --ray-address auto --model gpt2-small -o profile.json   # real GPUs
    hetsched plan --profile profile.json --global-batch 64

Without ``--ray-address`` the cluster's devices are simulated on this machine
(DESIGN.md, "Simulated devices"); with it, hetsched attaches to that Ray
cluster and measures its GPUs (``--cluster`` is then optional). Figures are
cached per device type, model and pacing, so a second run is instant unless
``--refresh``. Without ``-o`` the profile JSON goes to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from api.commands.common import add_cache_arguments, add_cluster_argument, add_command, model_help
from api.commands.plan import format_table
from scheduler.cost.profile import Profile
from scheduler.errors import HetschedError
from scheduler.hardware.cluster import load_cluster
from scheduler.models.hf_config import resolve_model
from scheduler.models.presets import check_trainable


def add_parser(subparsers: Any) -> None:
    parser = add_command(subparsers, "profile", run)
    add_cluster_argument(parser, "; required unless --ray-address")
    parser.add_argument("--model", metavar="PRESET", required=True, help=model_help("model preset"))
    parser.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        type=Path,
        help="write the profile JSON here (default: stdout)",
    )
    add_cache_arguments(parser)
    parser.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="profile the GPUs of this Ray cluster instead of simulating",
    )


def run(args: argparse.Namespace) -> int:
    preset = resolve_model(args.model)
    check_trainable(preset)  # before starting Ray: a family the runtimes cannot build
    if args.cluster is None and args.ray_address is None:
        raise HetschedError("--cluster: required (or --ray-address to profile real GPUs)")
    cluster = load_cluster(args.cluster) if args.cluster is not None else None
    with contextlib.redirect_stdout(sys.stderr):
        from workers.devices.calibration import default_cache_dir
        from workers.session import connect_ray, profile_cluster, start_local_ray

        simulated = args.ray_address is None
        if simulated:
            assert cluster is not None
            start_local_ray(cluster)
        else:
            found = connect_ray(args.ray_address)
            cluster = cluster if cluster is not None else found
        print(
            f"profiling {len(cluster.devices)} devices of {cluster.name} for {preset.name}...",
            file=sys.stderr,
        )
        begin = time.perf_counter()
        profile = profile_cluster(
            cluster,
            preset,
            cache_dir=args.cache_dir or default_cache_dir(),
            refresh=args.refresh,
            simulated=simulated,
        )
        print(f"done in {time.perf_counter() - begin:.1f} s", file=sys.stderr)
    text = json.dumps(profile.to_dict(), indent=2) + "\n"
    if args.output is None:
        sys.stdout.write(text)
        return 0
    try:
        args.output.write_text(text)
    except OSError as exc:
        raise HetschedError(f"--output: cannot write {args.output}: {exc.strerror or exc}") from exc
    print(render(profile))
    print(f"\nwrote {args.output}")
    return 0


def render(profile: Profile) -> str:
    rows = []
    for d in profile.devices:
        m = d.max_micro_batch()
        rate = m / (d.fixed_s + m * d.per_sample_s) if m else 0.0
        rows.append(
            [
                d.id,
                d.type,
                f"{d.fixed_s * 1e3:.1f} ms",
                f"{d.per_sample_s * 1e3:.2f} ms",
                f"{d.static_bytes / 1e6:.1f} MB",
                f"{d.per_sample_bytes / 1e6:.2f} MB",
                f"{d.capacity_bytes / 1e6:.1f} MB",
                str(m),
                f"{rate:.1f}",
            ]
        )
    table = format_table(
        [
            "device",
            "type",
            "fixed",
            "per sample",
            "model states",
            "act/sample",
            "capacity",
            "max micro",
            "samples/s",
        ],
        rows,
        right={2, 3, 4, 5, 6, 7, 8},
    )
    links = profile.links
    own = ""
    for name, node in links.nodes:
        figures = {"intra-node": node.intra_node_gbps, "inter-node": node.inter_node_gbps}
        given = ", ".join(f"{k} {v:g}" for k, v in figures.items() if v is not None)
        own += f", {name}'s own: {given} Gbit/s"
    return (
        f"profile of {profile.model} ({profile.source})\n{table}\n"
        f"links: intra-node {links.intra_node_gbps:g} Gbit/s, "
        f"inter-node {links.inter_node_gbps:g} Gbit/s{own}; "
        f"gradients {profile.gradient_bytes / 1e6:.1f} MB per step"
    )
