"""``/api/v1/datasets``: upload datasets into the server's data directory, and list them.

    POST /api/v1/datasets?name=notes.bin.json   the sidecar first (application/json body)
    POST /api/v1/datasets?name=notes.bin        then the token ids (raw body)
    POST /api/v1/datasets?name=book.txt         or a text file (byte tokens)
    GET  /api/v1/datasets                       what jobs may name as ``dataset``

An upload never replaces or loses a file, and a failed one leaves nothing
(:func:`upload_dataset`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
from pathlib import Path

from fastapi import APIRouter, HTTPException, Query, Request, status

from api.accounts import (
    LEGACY_DATASET,
    DatasetOwner,
    Principal,
    may,
    may_use_dataset,
    visible_projects,
)
from api.deps import (
    UNAUTHORIZED,
    ActorDep,
    Auth,
    ReadAuth,
    ReaderDep,
    StateDep,
    check_project,
    errors,
)
from api.schemas.datasets import DatasetListed, DatasetPublic, DatasetsPublic
from api.schemas.service import Message
from api.schemas.users import ACCOUNT_PATTERN
from api.services import list_datasets
from scheduler.errors import HetschedError
from workers.data.datafile import (
    DEFAULT_CORPUS,
    check_token_ids,
    describe_file,
    parse_sidecar,
    sidecar_path,
)

router = APIRouter(prefix="/datasets", tags=["datasets"])

UPLOAD_SUFFIXES = (".bin.json", ".tokenizer.json", ".txt", ".bin")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
NAME_PATTERN = (
    r"^[A-Za-z0-9][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*\.(txt|bin|bin\.json|tokenizer\.json)$"
)
"""What ``_check_name`` allows, as the API document states it (no ``..``, a dataset suffix)."""
_CHUNK_BYTES = 1 << 20


def _describe(name: str, path: Path) -> DatasetPublic:
    size = path.stat().st_size
    if name.endswith(".bin.json"):
        return DatasetPublic(name=name, kind="sidecar", size_bytes=size)
    if name.endswith(".tokenizer.json"):
        return DatasetPublic(name=name, kind="tokenizer", size_bytes=size)
    try:
        info = describe_file(path)
    except HetschedError as exc:
        return DatasetPublic(
            name=name, kind="tokens", size_bytes=size, problem=str(exc).removeprefix("dataset: ")
        )
    return DatasetPublic(
        name=name,
        kind=info.kind,
        size_bytes=size,
        num_tokens=info.num_tokens,
        vocab_size=info.vocab_size,
        tokenizer=info.tokenizer,
    )


@router.get("", response_model=DatasetsPublic, dependencies=[ReadAuth], responses=UNAUTHORIZED)
def read_datasets(state: StateDep, principal: ReaderDep) -> DatasetsPublic:
    """Every dataset the caller's jobs may name; ``default`` is the bundled corpus."""
    root = state.settings.data_dir.resolve()
    owners = state.store.accounts.datasets()
    visible = visible_projects(principal)
    data = []
    for name in list_datasets(root):
        owner, project = LEGACY_DATASET
        if name in owners:  # uploaded; the others are the operator's, everyone's to read
            owner, project = owners[name].owner, owners[name].project
            if visible is not None and project not in visible:
                continue
        described = _describe(name, DEFAULT_CORPUS if name == "default" else root / name)
        data.append(DatasetListed(**described.model_dump(), owner=owner, project=project))
    return DatasetsPublic(data=data, count=len(data))


def _bad(detail: str, code: int = status.HTTP_422_UNPROCESSABLE_CONTENT) -> HTTPException:
    return HTTPException(code, detail)


def _check_name(name: str) -> None:
    if not _NAME.fullmatch(name) or ".." in name:
        raise _bad(
            f"name: {name[:60]!r} is not a plain file name (letters, digits, '._-', "
            "no path separators, no '..', at most 128 characters)"
        )
    if not name.endswith(UPLOAD_SUFFIXES):
        raise _bad(f"name: {name!r} must end in one of {', '.join(UPLOAD_SUFFIXES)}")


def _check_content(name: str, part: Path, root: Path) -> None:
    """Refuse a file that could not serve as what its name says (422)."""
    try:
        if name.endswith(".bin.json"):
            parse_sidecar(json.loads(part.read_text()), where=name)
        elif name.endswith(".tokenizer.json"):
            if not isinstance(json.loads(part.read_text()), dict):
                raise _bad(f"{name}: a tokenizer file must hold a JSON object")
        elif name.endswith(".bin"):
            sidecar = sidecar_path(root / name)
            if not sidecar.is_file():
                raise _bad(f"{name}: upload its sidecar {sidecar.name} first")
            os.link(sidecar, sidecar_path(part))  # the checks read the sidecar beside the data
            try:
                check_token_ids(part)
            finally:
                sidecar_path(part).unlink()
        elif part.stat().st_size == 0:
            raise _bad(f"{name}: the file is empty")
    except HetschedError as exc:  # before ValueError, which it is
        detail = str(exc).removeprefix("dataset: ").replace(part.name, name)
        raise _bad(f"{name}: {detail}" if not detail.startswith(name) else detail) from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise _bad(f"{name}: not valid JSON: {exc}") from exc
    except RecursionError as exc:  # json's C decoder gives up on deep nesting
        raise _bad(f"{name}: JSON nested too deeply to be a sidecar or tokenizer") from exc


@router.post(
    "",
    response_model=DatasetPublic,
    status_code=status.HTTP_201_CREATED,
    dependencies=[Auth],
    responses={
        **UNAUTHORIZED,
        **errors({409: "A file of that name exists", 413: "Larger than HETSCHED_MAX_UPLOAD_BYTES"}),
    },
    # The body is the file itself, streamed: documented here, read from the request.
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    },
)
async def upload_dataset(
    request: Request,
    state: StateDep,
    principal: ActorDep,
    name: str = Query(
        min_length=5,
        max_length=128,
        pattern=NAME_PATTERN,
        description="file name: NAME.txt, NAME.bin, NAME.bin.json, NAME.tokenizer.json",
    ),
    project: str | None = Query(
        default=None,
        max_length=64,
        pattern=ACCOUNT_PATTERN,
        description="The project it belongs to and counts against (storage_bytes); "
        "default the uploader's.",
    ),
) -> DatasetPublic:
    """Store the request body as ``name`` in the data directory.

    The body is the file itself, streamed to a hidden temporary file inside the data
    directory and counted against ``HETSCHED_MAX_UPLOAD_BYTES`` (413 past it). A name
    is one plain file name (letters, digits, ``._-``; no path separator, no ``..``)
    ending in ``.txt``, ``.bin``, ``.bin.json`` or ``.tokenizer.json``. The file is
    checked (a sidecar parses, a ``.bin`` has its sidecar and holds whole tokens below
    its vocabulary, a tokenizer is JSON) and only then linked under its name, which
    fails if the name exists (409). The project's ``storage_bytes`` quota counts it
    (413 past what is left).
    """
    _check_name(name)
    owned = _upload_project(state, principal, project)
    limit, over = _upload_limit(state, owned)
    root = state.settings.data_dir.resolve()
    final = root / name
    if final.exists():
        raise _bad(f"name: {name!r} exists; uploads never replace a file", status.HTTP_409_CONFLICT)
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise _bad(
            f"body: {int(declared):,} bytes exceed {over or f'the upload limit of {limit:,}'}",
            status.HTTP_413_CONTENT_TOO_LARGE,
        )
    root.mkdir(parents=True, exist_ok=True)
    part = root / f".upload-{secrets.token_hex(8)}.part"
    try:
        size = 0
        with part.open("wb") as out:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise _bad(
                        f"body: more than {over or f'the upload limit of {limit:,} bytes'}",
                        status.HTTP_413_CONTENT_TOO_LARGE,
                    )
                out.write(chunk)
        _check_content(name, part, root)
        try:
            os.link(part, final)  # fails if the name appeared meanwhile: nothing is replaced
        except FileExistsError as exc:
            raise _bad(
                f"name: {name!r} exists; uploads never replace a file", status.HTTP_409_CONFLICT
            ) from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            part.unlink()
    owner = DatasetOwner(name=name, owner=principal.name or "", project=owned, size_bytes=size)
    state.store.accounts.add_dataset(owner)
    state.store.accounts.audit(
        principal, "dataset.upload", name, project=owned, detail=f"{size} bytes"
    )
    return _describe(name, final)


def _upload_project(state: StateDep, principal: Principal, project: str | None) -> str:
    name = project or principal.default_project
    check_project(principal, name, known=state.store.accounts.project(name) is not None)
    return name


def _upload_limit(state: StateDep, project: str) -> tuple[int, str | None]:
    """The most bytes this upload may have; and, when the project's storage quota is what
    binds (not the service's upload limit), that quota in words."""
    limit = state.settings.max_upload_bytes
    quota = state.store.accounts.project(project)
    if quota is None or quota.storage_bytes is None:
        return limit, None
    used = state.store.accounts.storage_used().get(project, 0)
    left = max(0, quota.storage_bytes - used)
    if left >= limit:
        return limit, None
    return left, (
        f"the {left:,} bytes left of project {project}'s storage quota ({used:,} of its "
        f"storage_bytes {quota.storage_bytes:,} used); delete a dataset or ask an admin"
    )


@router.delete(
    "/{name}",
    response_model=Message,
    responses={
        **UNAUTHORIZED,
        **errors(
            {404: "No such dataset (or another project's)", 409: "An unfinished job trains on it"}
        ),
    },
)
def delete_dataset(name: str, state: StateDep, principal: ActorDep) -> Message:
    """Delete an uploaded dataset file, unless an unfinished job trains on it (409); a
    sidecar goes only after its ``.bin``."""
    root = state.settings.data_dir.resolve()
    path = root / name
    owner = state.store.accounts.dataset(name)
    missing = not _NAME.fullmatch(name) or ".." in name or not path.is_file()
    if missing or not may_use_dataset(principal, owner, "act"):
        raise _bad(f"name: no dataset {name[:60]!r}", status.HTTP_404_NOT_FOUND)
    trained = name.removesuffix(".json") if name.endswith(".bin.json") else name
    if trained != name and (root / trained).is_file():
        raise _bad(f"name: {name} is the sidecar of {trained}; delete that first", 409)
    users = [j for j in state.store.unfinished() if j.spec.dataset == trained]
    if users:
        shown = users[0].id if may(principal, users[0].project, "read") else "of another project"
        raise _bad(
            f"name: {name} is in use by unfinished job {shown}; delete it when that ends", 409
        )
    path.unlink()
    state.store.accounts.forget_dataset(name)
    state.store.accounts.audit(principal, "dataset.delete", name, project=owner.project)
    return Message(message=f"dataset {name} deleted")
