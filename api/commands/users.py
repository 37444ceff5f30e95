"""``hetsched users|projects|audit``: an admin manages who may use a shared service.

    hetsched projects add vision --max-devices 4 --max-queued 20 --max-priority 5 --weight 2
    hetsched projects set vision --max-devices 8
    hetsched projects list
    hetsched users add alice --project vision     prints alice's token, once
    hetsched users list
    hetsched users revoke alice
    hetsched audit [--action job.delete]

They talk to the running service over HTTP (``--url``, ``$HETSCHED_URL``) with the
admin's token (``$HETSCHED_API_TOKEN``), as ``submit`` and ``stop`` do, rather than
opening the data directory's database: the service is the one owner of its store
(its database may be PostgreSQL on another host), it applies a new quota at its
next scheduling round, and it records in its audit log who made each change.
"""

from __future__ import annotations

import argparse
import json
from typing import Any
from urllib.parse import quote

from api.commands.client import _common, _table, request
from scheduler.errors import HetschedError

QUOTAS = ("weight", "max_devices", "max_queued", "max_priority", "storage_bytes")


def add_parser(subparsers: Any) -> None:
    users = subparsers.add_parser("users", help="add, list and revoke users (admins)")
    verbs = users.add_subparsers(dest="verb", metavar="VERB", required=True)
    add = verbs.add_parser("add", help="add a user and print their token (shown once)")
    add.add_argument("name")
    add.add_argument(
        "--project",
        action="append",
        default=[],
        metavar="P",
        help="a project the user belongs to (repeat for several)",
    )
    add.add_argument("--admin", action="store_true", help="the user may do everything")
    add.set_defaults(run=run_users_add)
    listing = verbs.add_parser("list", help="every user, their projects and status")
    listing.set_defaults(run=run_users_list)
    revoke = verbs.add_parser("revoke", help="the user's token stops working at once")
    revoke.add_argument("name")
    revoke.set_defaults(run=run_users_revoke)
    for verb in (add, listing, revoke):
        _common(verb)

    projects = subparsers.add_parser("projects", help="add, change and list projects (admins)")
    verbs = projects.add_subparsers(dest="verb", metavar="VERB", required=True)
    add = verbs.add_parser("add", help="add a project with its quotas")
    change = verbs.add_parser("set", help="change a project's quotas (0 for none: lift it)")
    for verb in (add, change):
        verb.add_argument("name")
        _quota_arguments(verb)
        _common(verb)
    add.set_defaults(run=run_projects_add)
    change.set_defaults(run=run_projects_set)
    listing = verbs.add_parser("list", help="projects and their quotas")
    listing.set_defaults(run=run_projects_list)
    _common(listing)

    audit = subparsers.add_parser("audit", help="who did what, newest first (admins)")
    audit.add_argument("--action", help="only these, e.g. job.delete, device.fail, user.add")
    audit.add_argument("--limit", type=int, default=50)
    audit.set_defaults(run=run_audit)
    _common(audit)


def _quota_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--weight", type=float, help="share of the cluster against other projects")
    parser.add_argument("--max-devices", type=int, metavar="N", help="most devices held at once")
    parser.add_argument("--max-queued", type=int, metavar="N", help="most jobs waiting at once")
    parser.add_argument("--max-priority", type=float, metavar="P", help="highest job priority")
    parser.add_argument("--storage-bytes", type=int, metavar="N", help="most bytes of uploads")


def _quotas(args: argparse.Namespace, *, lift_zero: bool) -> dict[str, Any]:
    given = {k: getattr(args, k) for k in QUOTAS if getattr(args, k) is not None}
    if lift_zero:  # `projects set NAME --max-devices 0`: no limit any more
        given = {k: (None if v == 0 and k != "weight" else v) for k, v in given.items()}
    return given


def _limit(value: Any) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def run_users_add(args: argparse.Namespace) -> int:
    body = {"name": args.name, "projects": args.project, "is_admin": args.admin}
    user = request(args, "POST", "/users", json=body)
    if args.json:
        print(json.dumps(user, indent=2))
        return 0
    role = "admin" if user["is_admin"] else "user"
    print(f"{role} {user['name']} in {', '.join(user['projects']) or 'no project'}")
    print(f"token (shown once; give it to {user['name']} as HETSCHED_API_TOKEN):")
    print(user["token"])
    return 0


def run_users_list(args: argparse.Namespace) -> int:
    page = request(args, "GET", "/users")
    if args.json:
        print(json.dumps(page, indent=2))
        return 0
    rows = [
        [
            u["name"],
            "admin" if u["is_admin"] else "user",
            ", ".join(u["projects"]) or "-",
            "revoked" if u.get("revoked_at") else "active",
        ]
        for u in page["data"]
    ]
    print(_table(rows, ["NAME", "ROLE", "PROJECTS", "STATUS"]))
    return 0


def run_users_revoke(args: argparse.Namespace) -> int:
    user = request(args, "POST", f"/users/{quote(args.name, safe='')}/revoke")
    if args.json:
        print(json.dumps(user, indent=2))
    else:
        print(f"user {user['name']}: token revoked")
    return 0


def run_projects_add(args: argparse.Namespace) -> int:
    project = request(
        args, "POST", "/projects", json={"name": args.name, **_quotas(args, lift_zero=False)}
    )
    return _print_projects(args, [project], doc=project)


def run_projects_set(args: argparse.Namespace) -> int:
    changes = _quotas(args, lift_zero=True)
    if not changes:
        flags = ", ".join(f"--{q.replace('_', '-')}" for q in QUOTAS)
        raise HetschedError(f"projects set {args.name}: give at least one of {flags}")
    path = f"/projects/{quote(args.name, safe='')}"
    project = request(args, "PATCH", path, json=changes)
    return _print_projects(args, [project], doc=project)


def run_projects_list(args: argparse.Namespace) -> int:
    page = request(args, "GET", "/projects")
    return _print_projects(args, page["data"], doc=page)


def _print_projects(args: argparse.Namespace, projects: list[dict[str, Any]], *, doc: Any) -> int:
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    rows = [[p["name"], *(_limit(p.get(k)) for k in QUOTAS)] for p in projects]
    print(_table(rows, ["NAME", *(q.upper() for q in QUOTAS)]))
    return 0


def run_audit(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"limit": args.limit}
    if args.action:
        params["action"] = args.action
    page = request(args, "GET", "/audit", params=params)
    if args.json:
        print(json.dumps(page, indent=2))
        return 0
    rows = [
        [e["time"][:19], e["actor"], e["action"], e["target"], e["project"] or "-", e["detail"]]
        for e in page["data"]
    ]
    print(_table(rows, ["TIME", "ACTOR", "ACTION", "TARGET", "PROJECT", "DETAIL"]))
    return 0
