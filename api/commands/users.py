"""``hetsched users|projects|audit``: an admin manages who may use a shared service.

    hetsched projects create vision --max-devices 4 --max-queued 20 --max-priority 5 --weight 2
    hetsched projects set vision --max-devices 8
    hetsched projects list
    hetsched users create alice --project vision     prints alice's token, once
    hetsched users list
    hetsched users revoke alice
    hetsched audit [--action job.delete]

(``add`` is another name for ``create``.) They talk to the running service through
:class:`hetsched.Client` (``--url``, ``$HETSCHED_URL``) with the admin's token
(``$HETSCHED_API_TOKEN``), as ``submit`` and ``stop`` do, rather than
opening the data directory's database: the service is the one owner of its store
(its database may be PostgreSQL on another host), it applies a new quota at its
next scheduling round, and it records in its audit log who made each change.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from api.commands.client import add_service_arguments, connect, show
from api.commands.common import add_command
from api.commands.plan import format_table
from api.schemas.users import AuditPublic, ProjectPublic, UserCreated, UserPublic
from scheduler.errors import HetschedError

QUOTAS = ("weight", "max_devices", "max_queued", "max_priority", "storage_bytes")
CREATE = {"aliases": ["add"]}
"""``create`` is also ``add``, the name the first releases of these commands used."""


def add_parser(subparsers: Any) -> None:
    users = add_command(subparsers, "users")
    verbs = users.add_subparsers(dest="verb", metavar="VERB", required=True)
    create = verbs.add_parser("create", help="a user, and their token (shown once)", **CREATE)
    create.add_argument("name")
    create.add_argument(
        "--project",
        action="append",
        default=[],
        metavar="P",
        help="a project the user belongs to (repeat for several)",
    )
    create.add_argument("--admin", action="store_true", help="the user may do everything")
    create.set_defaults(run=run_users_create)
    listing = verbs.add_parser("list", help="every user, their projects and status")
    listing.set_defaults(run=run_users_list)
    revoke = verbs.add_parser("revoke", help="the user's token stops working at once")
    revoke.add_argument("name")
    revoke.set_defaults(run=run_users_revoke)
    for verb in (create, listing, revoke):
        add_service_arguments(verb)

    projects = add_command(subparsers, "projects")
    verbs = projects.add_subparsers(dest="verb", metavar="VERB", required=True)
    create = verbs.add_parser("create", help="a project with its quotas", **CREATE)
    change = verbs.add_parser("set", help="change a project's quotas (0 for none: lift it)")
    for verb in (create, change):
        verb.add_argument("name")
        _quota_arguments(verb)
    create.set_defaults(run=run_projects_create)
    change.set_defaults(run=run_projects_set)
    listing = verbs.add_parser("list", help="projects and their quotas")
    listing.set_defaults(run=run_projects_list)
    for verb in (create, change, listing):
        add_service_arguments(verb)

    audit = add_command(subparsers, "audit", run_audit)
    audit.add_argument("--action", help="only these, e.g. job.delete, device.fail, user.add")
    audit.add_argument("--limit", type=int, default=50)
    add_service_arguments(audit)


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


def _print_json(items: Sequence[UserPublic | ProjectPublic]) -> None:
    print(json.dumps([item.model_dump(mode="json") for item in items], indent=2))


def run_users_create(args: argparse.Namespace) -> int:
    with connect(args) as client:
        user = client.create_user(args.name, projects=args.project, is_admin=args.admin)

    def summary(made: UserCreated) -> None:
        role = "admin" if made.is_admin else "user"
        print(f"{role} {made.name} in {', '.join(made.projects) or 'no project'}")
        print(f"token (shown once; give it to {made.name} as HETSCHED_TOKEN):")
        print(made.token)

    return show(args, user, summary)


def run_users_list(args: argparse.Namespace) -> int:
    with connect(args) as client:
        users = client.users()
    if args.json:
        _print_json(users)
        return 0
    rows = [
        [
            u.name,
            "admin" if u.is_admin else "user",
            ", ".join(u.projects) or "-",
            "revoked" if u.revoked_at else "active",
        ]
        for u in users
    ]
    print(format_table(["NAME", "ROLE", "PROJECTS", "STATUS"], rows, right=set()))
    return 0


def run_users_revoke(args: argparse.Namespace) -> int:
    with connect(args) as client:
        user = client.revoke_user(args.name)
    return show(args, user, lambda u: print(f"user {u.name}: token revoked"))


def run_projects_create(args: argparse.Namespace) -> int:
    with connect(args) as client:
        project = client.create_project(args.name, **_quotas(args, lift_zero=False))
    return show(args, project, lambda p: _print_projects([p]))


def run_projects_set(args: argparse.Namespace) -> int:
    changes = _quotas(args, lift_zero=True)
    if not changes:
        flags = ", ".join(f"--{q.replace('_', '-')}" for q in QUOTAS)
        raise HetschedError(f"projects set {args.name}: give at least one of {flags}")
    with connect(args) as client:
        project = client.update_project(args.name, **changes)
    return show(args, project, lambda p: _print_projects([p]))


def run_projects_list(args: argparse.Namespace) -> int:
    with connect(args) as client:
        projects = client.projects()
    if args.json:
        _print_json(projects)
    else:
        _print_projects(projects)
    return 0


def _print_projects(projects: Sequence[ProjectPublic]) -> None:
    rows = [[p.name, *(_limit(getattr(p, k)) for k in QUOTAS)] for p in projects]
    right = set(range(1, len(QUOTAS) + 1))
    print(format_table(["NAME", *(q.upper() for q in QUOTAS)], rows, right=right))


def run_audit(args: argparse.Namespace) -> int:
    with connect(args) as client:
        page = client.audit(action=args.action, limit=args.limit)
    return show(args, page, _print_audit)


def _print_audit(page: AuditPublic) -> None:
    if not page.data:
        print("no entries")
        return
    rows = [
        [f"{e.time:%Y-%m-%d %H:%M:%S}", e.actor, e.action, e.target, e.project or "-", e.detail]
        for e in page.data
    ]
    print(format_table(["TIME", "ACTOR", "ACTION", "TARGET", "PROJECT", "DETAIL"], rows, set()))
    if page.count > len(page.data):
        print(f"({len(page.data)} of {page.count} shown; use --limit)")
