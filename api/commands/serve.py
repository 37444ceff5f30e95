"""``hetsched serve``: the control plane, REST API and dashboard under uvicorn.

    hetsched serve                          local Ray running deploy/clusters/local-sim.yaml
                                            (simulated devices), SQLite in ./.hetsched
    hetsched serve --cluster my.yaml        simulate another cluster spec
    hetsched serve --ray-address HOST:6379  attach to a real Ray cluster and use its GPUs
    hetsched serve --ray-address HOST:6379 --cluster my.yaml
                                            simulate my.yaml's devices on the Ray nodes it
                                            names (each spec node's ray_node, or its name)
    hetsched serve --db postgresql+psycopg://user@db/hetsched
    hetsched serve --policy fifo            first come, first served (default: goodput)

Flags override the ``HETSCHED_*`` environment variables of :class:`api.core.settings.Settings`.
One service per data directory and database: a second ``serve`` on either stops at
once with one line saying which process holds it (:mod:`api.core.lock`).
A Ray cluster with token authentication (``ray start`` turns it on) needs its
token in ``RAY_AUTH_TOKEN`` (or a file named by ``RAY_AUTH_TOKEN_PATH``, or
``~/.ray/auth_token``); without it, or with a wrong one, ``serve`` stops at
once with one line saying so.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import socket
import sys
from pathlib import Path
from typing import Any

from api.commands.common import add_command
from api.core.clusters import cluster_argument
from scheduler.errors import HetschedError
from scheduler.hardware.cluster import load_cluster
from scheduler.policy.types import POLICIES

SWITCH_INTERVAL_S = 0.001
"""How long a thread of the service that wants the interpreter lock waits for the busy
event loop to hand it over (Python's default: 5 ms). Every training step's answer to
``GET /jobs/{id}`` is read in a worker thread while fifty polls wait on it: at 5 ms
those reads took a median 8-9 ms and a 90th percentile of 27-34 ms, at 1 ms 6-8 ms and
17-18 ms (timed around the reads during tests/benchmarks/test_api_throughput.py, load
10-16)."""


def add_parser(subparsers: Any) -> None:
    parser = add_command(subparsers, "serve", run)
    parser.add_argument(
        "--cluster",
        type=cluster_argument,
        help="cluster spec to simulate, or a bundled one's name: on a local Ray, or with "
        "--ray-address on the Ray nodes the spec names",
    )
    parser.add_argument(
        "--ray-address",
        help="attach to this Ray cluster: its GPUs, or the simulated devices of --cluster "
        "(token: RAY_AUTH_TOKEN)",
    )
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default 8000)")
    parser.add_argument("--db", help="SQLAlchemy URL (default sqlite in the data directory)")
    parser.add_argument(
        "--data-dir", type=Path, help="database, profile cache and datasets (default ./.hetsched)"
    )
    parser.add_argument("--num-cpus", type=int, help="CPUs for the embedded local Ray")
    parser.add_argument(
        "--policy",
        choices=POLICIES,
        help="scheduling policy: fifo (arrival order, whole cluster), fair, or goodput "
        "(default; HETSCHED_POLICY)",
    )
    parser.add_argument(
        "--round-s", type=float, help="seconds between scheduling rounds (default 30)"
    )
    parser.add_argument(
        "--insecure-no-token",
        action="store_true",
        help="allow a non-loopback --host without HETSCHED_API_TOKEN "
        "(anyone who can reach it may submit, stop and delete jobs)",
    )


def settings_from_args(args: argparse.Namespace) -> Any:
    from pydantic import ValidationError

    from api.core.settings import Settings

    overrides = {
        "cluster": args.cluster,
        "ray_address": args.ray_address,
        "host": args.host,
        "port": args.port,
        "db_url": args.db,
        "data_dir": args.data_dir,
        "ray_num_cpus": args.num_cpus,
        "policy": args.policy,
        "round_s": args.round_s,
    }
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise HetschedError(f"{field}: {first['msg']}") from None


def _check_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise HetschedError(
                f"--port: cannot listen on {host}:{port} ({exc.strerror}); "
                "choose another with --port"
            ) from None


def is_loopback(host: str) -> bool:
    """``localhost`` and 127.0.0.0/8 or ::1 addresses; any other name or address is not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name may resolve to anything


def check_exposure(host: str, *, token: str | None, insecure_no_token: bool) -> None:
    """Refuse to open the mutating API to the network without a token, unless told to."""
    if token is None and not insecure_no_token and not is_loopback(host):
        raise HetschedError(
            f"--host: {host} is reachable from the network but HETSCHED_API_TOKEN is not "
            "set, so anyone could submit, stop and delete jobs; set the token or pass "
            "--insecure-no-token"
        )


def run(args: argparse.Namespace) -> int:
    from api.core.lock import ServiceLock

    settings = settings_from_args(args)
    check_exposure(settings.host, token=settings.token, insecure_no_token=args.insecure_no_token)
    # Held until the process ends (the kernel drops it even on kill -9): a second service on
    # this data directory or database stops here, before it reads a job or touches Ray.
    with ServiceLock(settings):
        return _serve(settings)


def _serve(settings: Any) -> int:
    import uvicorn

    from api.app import create_app
    from api.core.http import OneSendHttpProtocol

    if not settings.ray_address:
        load_cluster(settings.cluster_file)  # a bad spec is a one-line error, not a dead service
    else:
        from api.services import check_external_ray

        check_external_ray(settings)  # no token, a refused one, a missing node: one line
    _check_port_free(settings.host, settings.port)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    host = "localhost" if settings.host in ("0.0.0.0", "::") else settings.host
    where = f"local simulation of {settings.cluster_file.name}"
    if settings.ray_address:
        simulating = f" simulating {settings.cluster_file.name}" if settings.cluster else ""
        where = f"Ray at {settings.ray_address}{simulating}"
    print(f"hetsched: control plane on {where}; data in {settings.data_dir.resolve()}")
    print("hetsched: starting (database, Ray, workers) ...", flush=True)

    class Server(uvicorn.Server):
        """Gives the dashboard's address once it answers: after the app's startup and
        the bind, so the first request a user makes from it is not refused."""

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                address = f"http://{host}:{settings.port}/"
                print(f"hetsched: dashboard at {address}  (API docs at /docs)", flush=True)

    # No access log: at this log level uvicorn never printed it, yet built its line's
    # fields for every request (fifty dashboards polling: thousands a second).
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,
        http=OneSendHttpProtocol,
    )
    server = Server(config)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    return 0 if server.started else 1
