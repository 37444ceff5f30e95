"""The worked examples in ``scheduler/``'s docstrings (``>>>``) are true: each module's
examples run as doctests, so an example a reader copies gives what it shows."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import scheduler

MODULES = sorted(
    m.name for m in pkgutil.walk_packages(scheduler.__path__, prefix="scheduler.") if not m.ispkg
)


@pytest.mark.parametrize("name", MODULES)
def test_the_docstring_examples_hold(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"


def test_examples_are_found() -> None:
    found = sum(
        doctest.testmod(importlib.import_module(n), report=False).attempted for n in MODULES
    )
    assert found >= 20
