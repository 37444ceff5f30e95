"""The check the planner tests share for user errors: raised typed, and one line."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


def one_line_error(error: type[Exception], fn: Callable[..., object], *args: Any) -> str:
    """The message of the ``error`` that ``fn(*args)`` raises, checked to be one line."""
    with pytest.raises(error) as info:
        fn(*args)
    message = str(info.value)
    assert "\n" not in message, "errors are one line"
    return message
