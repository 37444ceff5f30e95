"""What runs jobs on the service: the executor's scheduling rounds and one job's runner.

May import api.core, api.store, api.services and workers/; never api.routes.
"""
