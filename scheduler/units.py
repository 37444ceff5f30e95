"""Byte amounts as messages and tables print them.

Decimal units, as users read memory in error messages; every room formats
bytes through :func:`format_bytes` so the same amount reads the same in a
planner error, an out-of-memory error and an API answer.
"""

from __future__ import annotations

GB = 1e9
MB = 1e6


def format_bytes(num_bytes: float) -> str:
    """``2.1 GB`` from a gigabyte up, ``171.8 MB`` below (three digits, not ``0.2 GB``).

    >>> format_bytes(2_100_000_000)
    '2.1 GB'
    >>> format_bytes(171_800_000)
    '171.8 MB'
    """
    if abs(num_bytes) >= GB:
        return f"{num_bytes / GB:.1f} GB"
    return f"{num_bytes / MB:.1f} MB"
