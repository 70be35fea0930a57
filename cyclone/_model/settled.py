"""The outcome of one item of a map node that settles all its items.

Without ``from __future__ import annotations``: the class is exported under ``cyclone``, and
msgspec reads its field types from the class itself rather than resolving names in a module.
"""

from typing import Any, Generic, TypeVar

import msgspec

T = TypeVar("T")


class Settled(msgspec.Struct, Generic[T], frozen=True):
    """One item's outcome in a map node that settles all its items (``settle=True``): its
    output as ``value``, or, when its last attempt failed, that attempt's error record as
    ``error`` (``type``, ``message``, ``attempt``, ``traceback``, ``at``)."""

    value: T | None = None
    error: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        """Whether the item completed (then ``value`` is its output)."""
        return self.error is None
