"""Cluster specs the planner tests share, as parsed YAML documents."""

from __future__ import annotations

from typing import Any

MIXED: dict[str, Any] = {
    "name": "mixed",
    "nodes": [
        {"name": "big", "devices": [{"type": "A100-80GB", "count": 2}]},
        {
            "name": "small",
            "devices": [{"type": "T4-16GB", "count": 2}, {"type": "L4-24GB", "count": 2}],
        },
    ],
}
"""Two A100s on one node; two T4s and two L4s on another, which cannot hold the
largest GPT-2 whole."""
