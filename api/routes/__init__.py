"""One router per resource; :data:`api_router` gathers those served under ``/api/v1``."""

from fastapi import APIRouter

from api.routes import audit, cluster, datasets, jobs, options, plans, profiles, schedule, users

api_router = APIRouter()
for module in (cluster, profiles, plans, jobs, options, datasets, schedule, audit):
    api_router.include_router(module.router)
api_router.include_router(users.users)
api_router.include_router(users.projects)
