"""The synchronous ways to hold a transaction, behind one small interface for the tests:
a psycopg connection, a SQLAlchemy Session on psycopg, and Django's connection in atomic()."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import psycopg
import psycopg_pool
import sqlalchemy as sa
from sqlalchemy.orm import Session

import cyclone.sync


class Style:
    """How one integration begins, nests and writes in a transaction."""

    name = ""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.pool = psycopg_pool.ConnectionPool(dsn, min_size=1, max_size=4, open=True)
        self.client = cyclone.sync.Client(self.pool)

    def transaction(self) -> contextlib.AbstractContextManager[Any]:
        raise NotImplementedError

    def savepoint(self, tx: Any) -> contextlib.AbstractContextManager[Any]:
        raise NotImplementedError

    def insert_order(self, tx: Any, ref: str) -> None:
        raise NotImplementedError

    def outside(self) -> Any:
        """Something of this style that is not in a transaction."""
        raise NotImplementedError

    def thread_done(self) -> None:
        """Close what a thread of its own opened."""

    def close(self) -> None:
        self.pool.close()


class Psycopg(Style):
    name = "psycopg"

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.conns: list[psycopg.Connection[Any]] = []

    def _conn(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(self.dsn, autocommit=True)
        self.conns.append(conn)
        return conn

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Any]:
        with self.client.transaction(self._conn()) as ttx:
            yield ttx

    def savepoint(self, tx: Any) -> contextlib.AbstractContextManager[Any]:
        return tx.transaction()  # type: ignore[no-any-return]

    def insert_order(self, tx: Any, ref: str) -> None:
        tx.execute("INSERT INTO public.orders (ref) VALUES (%s)", (ref,))

    def outside(self) -> Any:
        return self._conn()

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        super().close()


class SqlAlchemy(Style):
    name = "sqlalchemy"

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.engine = sa.create_engine(dsn.replace("postgresql://", "postgresql+psycopg://", 1))

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Any]:
        with Session(self.engine) as session, session.begin():
            yield session

    def savepoint(self, tx: Any) -> contextlib.AbstractContextManager[Any]:
        return tx.begin_nested()  # type: ignore[no-any-return]

    def insert_order(self, tx: Any, ref: str) -> None:
        tx.execute(sa.text("INSERT INTO public.orders (ref) VALUES (:ref)"), {"ref": ref})

    def outside(self) -> Any:
        return Session(self.engine)

    def close(self) -> None:
        self.engine.dispose()
        super().close()


_SQLITE = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
_django_ready = False


def configure_django(dsn: str) -> None:
    """Set Django up with the example app's settings (once per process), its default
    database pointed at ``dsn``, plus a SQLite database ``lite`` for the refusal test."""
    global _django_ready
    import django
    from django.db import connections

    if not _django_ready:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_app.settings")
        django.setup()
        filled = connections.configure_settings({"default": {}, "lite": dict(_SQLITE)})
        connections.settings["lite"] = filled["lite"]
        _django_ready = True
    url = urlsplit(dsn)
    database = {
        "NAME": url.path.lstrip("/"),
        "USER": url.username or "",
        "PASSWORD": url.password or "",
        "HOST": url.hostname or "",
        "PORT": str(url.port or ""),
    }
    connections.close_all()
    connections.settings["default"].update(database)
    connections["default"].settings_dict.update(database)


class Django(Style):
    name = "django"

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        configure_django(dsn)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Any]:
        from django.db import connection, transaction

        with transaction.atomic():
            yield connection

    def savepoint(self, tx: Any) -> contextlib.AbstractContextManager[Any]:
        from django.db import transaction

        return transaction.atomic()

    def insert_order(self, tx: Any, ref: str) -> None:
        with tx.cursor() as cur:
            cur.execute("INSERT INTO public.orders (ref) VALUES (%s)", [ref])

    def outside(self) -> Any:
        from django.db import connection

        return connection

    def thread_done(self) -> None:
        from django.db import connections

        connections.close_all()

    def close(self) -> None:
        self.thread_done()
        super().close()


STYLES = [Psycopg, SqlAlchemy, Django]
