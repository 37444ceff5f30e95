"""``/api/v1/audit``: who submitted, stopped and deleted what, injected which fault, and
changed which user or project; newest first, for admins."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import ADMIN_ONLY, AdminDep, StoreDep
from api.schemas.users import ACTION_PATTERN, AuditEntryPublic, AuditPublic

router = APIRouter(prefix="/audit", tags=["audit"])


@router.get("", response_model=AuditPublic, responses=ADMIN_ONLY)
def read_audit(
    store: StoreDep,
    _principal: AdminDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
    action: Annotated[str | None, Query(max_length=32, pattern=ACTION_PATTERN)] = None,
) -> AuditPublic:
    """The audit log, newest first; ``action`` (``job.delete``, say): only those."""
    records, count = store.accounts.audit_log(limit=limit, offset=offset, action=action)
    data = [AuditEntryPublic.model_validate(r, from_attributes=True) for r in records]
    return AuditPublic(data=data, count=count)
