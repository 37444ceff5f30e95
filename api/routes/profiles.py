"""``/api/v1/profiles``: the profiles measured so far (DESIGN.md "Profile" documents)."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import StoreDep
from api.schemas.profiles import ProfilesPublic
from api.views import profile_public

router = APIRouter(prefix="/profiles", tags=["profiles"])


@router.get("", response_model=ProfilesPublic)
def list_profiles(store: StoreDep) -> ProfilesPublic:
    """Newest first."""
    records = store.profiles()
    return ProfilesPublic(data=[profile_public(r) for r in records], count=len(records))
