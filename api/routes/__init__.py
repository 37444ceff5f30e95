"""One router per resource; :data:`api_router` gathers those served under ``/api/v1``."""

from fastapi import APIRouter

from api.routes import cluster, datasets, jobs, options, plans, profiles, schedule

api_router = APIRouter()
for module in (cluster, profiles, plans, jobs, options, datasets, schedule):
    api_router.include_router(module.router)
