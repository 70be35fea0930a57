"""The ``cyclone`` command: migrate, run a worker, inspect and steer runs, purge, stats.

Every command takes the connection options (``--dsn`` or ``CYCLONE_DATABASE_URL``,
``--schema``, ``--statement-cache-size``, ``--no-notify``, ``--listen-dsn``) before or after
its name. Listings take ``--json`` for scripts. Bad input, an unreachable or unmigrated
database prints one line on stderr and exits with status 1 (2 for usage errors), never a
traceback; ``cyclone worker`` waits for an unreachable database instead.

The group and what every command shares are in ``_common``; each module after it adds one
family of commands to ``main`` when imported: ``_worker`` (dev-db, migrate, worker),
``_runs`` (runs, purge), ``_queues`` (stats, queues), ``_schedules``, ``_dashboard``,
``_keys`` (the keyring's keys: count, rotate). ``CYCLONE_KEYS``, when set, is the keyring
of every command's client.
"""

try:
    import click  # noqa: F401
    import rich  # noqa: F401
except ImportError as exc:
    # One line on stderr and status 1, never a traceback, from the console script too.
    raise SystemExit("the cyclone command needs its extra: pip install 'cyclone-pg[cli]'") from exc

# Imported for the commands each adds to main.
from cyclone.cli import _dashboard, _keys, _queues, _runs, _schedules, _worker  # noqa: F401
from cyclone.cli._common import main

__all__ = ["main"]
