"""The JSON the REST API speaks (``/api/v1``): one module of pydantic models per resource.

Imports api.states and scheduler/ only; conversion from scheduler dataclasses lives in api.views.
"""
