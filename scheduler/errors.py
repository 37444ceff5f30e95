"""Typed errors of the planning core.

Every message is one line a user can act on: it names the field or device and
gives the numbers or allowed values. The command line and the API turn these
into exit code 2 and HTTP 422/409 respectively, never into tracebacks.
"""


class HetschedError(ValueError):
    """Base class of every user-facing error hetsched raises."""


class SpecError(HetschedError):
    """A cluster spec (YAML) is unreadable or invalid."""


class ProfileError(HetschedError):
    """A profile (JSON) is unreadable or inconsistent."""


class PlanError(HetschedError):
    """No feasible plan exists for the request (bad batch, nothing fits)."""
