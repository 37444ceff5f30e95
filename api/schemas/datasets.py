"""Datasets in the server's data directory, as ``GET`` and ``POST /datasets`` show them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class DatasetPublic(BaseModel):
    name: str
    kind: Literal["bytes", "tokens", "sidecar", "tokenizer"]
    size_bytes: int
    num_tokens: int | None = None
    vocab_size: int | None = None
    tokenizer: str | None = None
    problem: str | None = None
    """Why a listed file cannot train (a ``.bin`` without its sidecar, say)."""


class DatasetListed(DatasetPublic):
    owner: str
    """Who uploaded it (files placed by hand: the admin)."""
    project: str
    """Whose members may train on it and delete it."""


class DatasetsPublic(BaseModel):
    data: list[DatasetListed]
    count: int
