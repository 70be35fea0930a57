"""The core finds an integration's adapter by the library of the object it is given, through
the ``cyclone.adapters`` entry points, and loads it only when such an object is met."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any

import pytest

from cyclone._enqueue import adapters


def test_an_adapter_is_found_for_a_subclass_of_a_librarys_type() -> None:
    from sqlalchemy.ext.asyncio import AsyncSession
    from sqlalchemy.orm import Session

    class AppSession(AsyncSession):  # defined here, in a module outside sqlalchemy
        pass

    found = adapters.adapter_for(AppSession.__new__(AppSession))
    assert found is not None and found is adapters.adapter_for(Session.__new__(Session))
    assert type(found).__module__ == "cyclone.integrations.sqlalchemy"


def test_no_adapter_for_an_object_of_no_known_library() -> None:
    assert adapters.adapter_for(object()) is None
    assert adapters.adapter_for("a str") is None


def test_a_registered_adapter_answers_for_its_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adapters, "_adapters", {})
    monkeypatch.setattr(adapters, "_looked_up", set())
    mine = adapters.Adapter()
    adapters.register("tests", mine)
    assert adapters.adapter_for(pytest.MonkeyPatch()) is None  # _pytest's, not ours
    assert adapters.adapter_for(Marker()) is mine


class Marker:
    """An object whose type lives in the ``tests`` package."""


def test_the_core_imports_no_integration_until_it_meets_one_of_their_objects() -> None:
    code = (
        "import sys, cyclone, cyclone.sync, cyclone.web\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('cyclone.integrations', "
        "'sqlalchemy', 'django')))\n"
        "print(loaded)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_a_second_thread_waits_for_the_first_ones_load(monkeypatch: pytest.MonkeyPatch) -> None:
    # The synchronous client's threads can meet a library's first objects at once: the one
    # that comes second must get the adapter, not None while the first one still loads it.
    monkeypatch.setattr(adapters, "_adapters", {})
    monkeypatch.setattr(adapters, "_looked_up", set())
    mine, loading, release = adapters.Adapter(), threading.Event(), threading.Event()

    class Entry:
        def load(self) -> adapters.Adapter:
            loading.set()
            assert release.wait(30)
            return mine

    def entry_points(**selection: Any) -> list[Entry]:
        return [Entry()] if selection["name"] == "tests" else []

    monkeypatch.setattr(adapters.importlib.metadata, "entry_points", entry_points)
    found: dict[str, adapters.Adapter | None] = {}

    def look(who: str) -> None:
        found[who] = adapters.adapter_for(Marker())

    first = threading.Thread(target=look, args=("first",))
    first.start()
    assert loading.wait(30)
    second = threading.Thread(target=look, args=("second",))
    second.start()
    second.join(1.0)  # without the lock it is back by now, with None
    release.set()
    first.join(30)
    second.join(30)
    assert found == {"first": mine, "second": mine}
