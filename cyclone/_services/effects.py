"""What a committed transition announces: :class:`Effects`, the value every transition in
``transitions`` and ``graph`` returns and the publisher turns into NOTIFYs after commit."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from cyclone._services.notifier import queue_payload, run_payloads

# The wakeup of every worker's timer (a schedule changed, a node went to sleep). Not a valid
# queue name, so no worker's producer mistakes it for its queue's.
SCHEDULES_WAKEUP = "@schedules"


@dataclass(slots=True)
class Effects:
    """What a committed transition should announce: queues with new work, runs that ended."""

    queues: set[str] = field(default_factory=set)
    ended: set[uuid.UUID] = field(default_factory=set)
    # Runs that ended and are (or may be) child runs, whose parent nodes end_children settles
    # before the transition commits: not announced.
    children: set[uuid.UUID] = field(default_factory=set)

    @classmethod
    def ending(cls, run_id: uuid.UUID) -> Effects:
        """The effects of a run that ended outside node_advance (failed or cancelled), which
        may be a child run."""
        return cls(ended={run_id}, children={run_id})

    def merge(self, other: Effects) -> None:
        """Add ``other``'s announcements to these."""
        self.queues |= other.queues
        self.ended |= other.ended
        self.children |= other.children

    def merged(self, other: Effects) -> Effects:
        """These announcements with ``other``'s added."""
        self.merge(other)
        return self

    def payloads(self) -> list[str]:
        """NOTIFY payloads for these announcements."""
        return [queue_payload(q) for q in sorted(self.queues)] + run_payloads(self.ended)
