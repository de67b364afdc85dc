"""A frozen dataclass made without its ``__init__``, for the few made on every request.

A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__`` (~1.5 k
instructions a field); ``made`` fills the instance's dict at once. The caller gives every
field, so the object is the one ``__init__`` makes (no ``__post_init__`` runs: use it only for
classes without one). tests/test_results_made.py and tests/test_tracing.py compare the two.
"""

from __future__ import annotations

from typing import Any, TypeVar

__all__ = ["made"]

_T = TypeVar("_T")


def made(cls: type[_T], fields: dict[str, Any]) -> _T:
    """``cls(**fields)`` of a frozen dataclass given every one of its fields."""
    instance = object.__new__(cls)
    instance.__dict__.update(fields)
    return instance
