"""The queues a tracked transaction woke: published after its commit, never inside it."""

from __future__ import annotations

from collections.abc import Iterator


class Wakeups:
    """The distinct queue names that got claimable work in a tracked transaction.

    Supports ``len``, ``bool``, iteration and ``in``. Publishing clears it.
    """

    __slots__ = ("_queues",)

    def __init__(self) -> None:
        self._queues: set[str] = set()

    def __len__(self) -> int:
        return len(self._queues)

    def __bool__(self) -> bool:
        return bool(self._queues)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._queues))

    def __contains__(self, queue: object) -> bool:
        return queue in self._queues

    def __repr__(self) -> str:
        return f"Wakeups({sorted(self._queues)!r})"

    def add(self, queue: str) -> None:
        """Record that ``queue`` gets claimable work (once its transaction committed)."""
        self._queues.add(queue)

    def take(self) -> set[str]:
        """Return the queue names and clear them (so a second publish sends nothing)."""
        queues, self._queues = self._queues, set()
        return queues
