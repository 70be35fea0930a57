"""Run ids: version-7 UUIDs, ascending within a batch and over time, unique across batches."""

from __future__ import annotations

import time
import uuid

from cyclone._model.ids import uuid7, uuid7_many


def test_ids_are_version_7_with_the_current_time() -> None:
    before = time.time_ns() // 1_000_000
    ids = uuid7_many(1_000)
    after = time.time_ns() // 1_000_000
    for i in ids:
        assert isinstance(i, uuid.UUID)
        assert (i.version, i.variant) == (7, uuid.RFC_4122)
        assert before <= i.int >> 80 <= after
    # Equal to and hashed like the standard library's UUID of the same value.
    twin = uuid.UUID(str(ids[0]))
    assert twin == ids[0] and hash(twin) == hash(ids[0])


def test_ids_ascend_in_the_order_asked_for() -> None:
    ids = uuid7_many(10_000)
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


def test_batches_of_one_millisecond_do_not_collide() -> None:
    seen: set[uuid.UUID] = set()
    for _ in range(2_000):  # many batches drawn within the same few milliseconds
        batch = uuid7_many(50)
        assert seen.isdisjoint(batch)
        seen.update(batch)
    assert uuid7() not in seen
