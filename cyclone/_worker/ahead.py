"""How far a queue claims ahead of its free slots: the pace of its handlers (a moving mean of
their time, kept per queue by each worker) and the allowance that follows from it. The rules
are in the docstring of ``producer.py``, under "Claiming ahead", and ``slots.py`` keeps
the attempts claimed ahead."""

from __future__ import annotations

# Claiming ahead while the mean handler time of the queue is below this many seconds: a task
# claimed ahead waits for a slot a few times that long.
AHEAD_BELOW = 0.01
# Tasks held in all, slots included, at most; ahead per slot at most; and the seconds of
# handlers (at the mean) claimed ahead at most. No-op jobs drained 1.25 times as fast at
# c16 with 15 per slot as with 7, and 1.05 at c200 and 1.04 at c64 up to 512 as up to 256.
# The span covers a few claim round trips: two workers of 4 slots sharing bursts of 40 jobs
# of 2 ms ran each burst in 17 to 19 ms with 5 ms, against 33 ms with 50 ms (one worker
# took every burst whole) and 21 ms with nothing ahead; no-op drains are bound by the
# other two limits either way.
AHEAD_UPTO = 512
AHEAD_PER_SLOT = 15
AHEAD_SPAN = 0.005
# Weight of the latest handler time in the mean (an exponentially weighted one).
_WEIGHT = 0.1


def most_ahead(slots: int) -> int:
    """The most tasks a queue of ``slots`` slots claims ahead."""
    return max(0, min(AHEAD_PER_SLOT * slots, AHEAD_UPTO - slots))


class Pace:
    """The recent mean time of one queue's handlers, and what it allows to claim ahead."""

    __slots__ = ("mean",)

    def __init__(self) -> None:
        self.mean: float | None = None  # seconds per handler, once one ran

    def timed(self, seconds: float) -> None:
        """A handler of this queue took ``seconds`` (with its input and output)."""
        mean = self.mean
        self.mean = seconds if mean is None else mean + _WEIGHT * (seconds - mean)

    def ahead(self, slots: int) -> int:
        """How many tasks a queue of ``slots`` slots may claim ahead at this pace: none
        before a first handler ran or once the mean reaches AHEAD_BELOW; else no more than
        its slots run in AHEAD_SPAN, about the longest a task claimed ahead waits."""
        mean = self.mean
        if mean is None or mean >= AHEAD_BELOW:
            return 0
        return min(most_ahead(slots), int(slots * AHEAD_SPAN / max(mean, 1e-6)))
