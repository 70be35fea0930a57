"""``manage.py cyclone_worker``: a Cyclone worker for the tasks of a ``CycloneBackend``."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from cyclone._worker.worker import DEFAULT_CONCURRENCY
from cyclone.integrations.django.worker import backend_named, dsn_of, serve

TARGET = "cyclone.integrations.django.worker:SERVED"


class Command(BaseCommand):
    """Run ``cyclone worker`` on the backend's database for every task it finds."""

    help = (
        "Run a Cyclone worker for the tasks of a CycloneBackend (the tasks modules of the "
        "installed apps and the backend's OPTIONS MODULES) until SIGINT or SIGTERM."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--backend", default="default", help="The TASKS alias.")
        parser.add_argument(
            "--queues",
            help="Queues and their concurrency, orders=16,default=4 (default: each queue "
            f"of the backend's QUEUES, or of its tasks, {DEFAULT_CONCURRENCY} each).",
        )
        parser.add_argument(
            "--threads", type=int, help="Most plain def tasks at once (default: one per slot)."
        )
        parser.add_argument("--poll-interval", type=float)
        parser.add_argument("--shutdown-timeout", type=float)
        parser.add_argument("--wait-for-migrations", action="store_true")
        parser.add_argument("--metrics-port", type=int)
        parser.add_argument(
            "--dsn", help="The database's URL (default: built from the backend's DATABASES entry)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        import click

        from cyclone.cli import main

        try:
            backend = backend_named(options["backend"])
        except (TypeError, ImproperlyConfigured) as exc:  # another backend, or no such alias
            raise CommandError(str(exc)) from None
        steps = serve(backend)
        if not steps:
            raise CommandError(
                f"no task uses the backend {backend.alias!r}: define them in a tasks module "
                "of an installed app, or list their modules in its OPTIONS MODULES"
            )
        queues = options["queues"] or ",".join(
            f"{q}={DEFAULT_CONCURRENCY}" for q in sorted(backend.queues or {s.queue for s in steps})
        )
        argv = [
            "--dsn",
            options["dsn"] or dsn_of(backend),
            "--schema",
            backend.schema,
            "worker",
            TARGET,
        ]
        argv += ["--queues", queues]
        for name in ("threads", "poll_interval", "shutdown_timeout", "metrics_port"):
            if options[name] is not None:
                argv += [f"--{name.replace('_', '-')}", str(options[name])]
        if options["wait_for_migrations"]:
            argv.append("--wait-for-migrations")
        names = ", ".join(s.name for s in steps)
        self.stderr.write(f"cyclone: serving {len(steps)} tasks of {backend.alias!r}: {names}")
        try:
            main.main(argv, prog_name="manage.py cyclone_worker", standalone_mode=False)
        except click.ClickException as exc:
            raise CommandError(exc.format_message()) from None
