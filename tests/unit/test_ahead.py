"""How far a queue claims ahead (``cyclone._worker.ahead``): nothing before a first handler ran or
once handlers are long, else no more than the slots run in AHEAD_SPAN, within the caps."""

from __future__ import annotations

from cyclone._worker import ahead as _ahead
from cyclone._worker.ahead import Pace, most_ahead


def test_nothing_ahead_before_a_first_handler_or_once_handlers_are_long() -> None:
    pace = Pace()
    assert pace.ahead(4) == 0
    pace.timed(_ahead.AHEAD_BELOW)
    assert pace.ahead(4) == 0


def test_the_span_bounds_what_short_handlers_claim_ahead() -> None:
    pace = Pace()
    pace.timed(0.002)  # 2 ms handlers, 4 slots: 4 x AHEAD_SPAN / 2 ms of them ahead
    assert pace.ahead(4) == int(4 * _ahead.AHEAD_SPAN / 0.002) == 10
    assert pace.ahead(4) < most_ahead(4)


def test_no_op_handlers_claim_ahead_up_to_the_caps() -> None:
    pace = Pace()
    pace.timed(0.00003)
    assert pace.ahead(4) == most_ahead(4) == 4 * _ahead.AHEAD_PER_SLOT
    assert pace.ahead(64) == most_ahead(64) == _ahead.AHEAD_UPTO - 64
    assert most_ahead(_ahead.AHEAD_UPTO) == 0


def test_the_mean_moves_a_tenth_of_the_way_to_each_new_time() -> None:
    pace = Pace()
    pace.timed(0.001)
    pace.timed(0.011)
    assert pace.mean is not None and abs(pace.mean - 0.002) < 1e-12
