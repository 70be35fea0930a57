"""``cyclone dashboard``: the web dashboard (cyclone.web) served by uvicorn."""

from __future__ import annotations

import socket

import click

from cyclone._client import Client
from cyclone.cli._common import Failure, main, with_client


@main.command()
@click.option("--bind", default="127.0.0.1:8080", show_default=True, help="HOST:PORT to listen on.")
@click.option("--read-only", is_flag=True, help="No actions, even on a loopback address.")
@click.option("--title", default="Cyclone", show_default=True, help="The pages' title.")
@click.pass_context
def dashboard(ctx: click.Context, bind: str, read_only: bool, title: str) -> None:
    """Serve the web dashboard (needs cyclone-pg[web]) until SIGINT or SIGTERM.

    Actions (retry, cancel, signal) are served only on a loopback address: elsewhere the
    dashboard is read-only, as this command has no authentication. To act from other
    machines, mount cyclone.web.dashboard in your own app behind its auth.
    """
    try:
        import uvicorn

        from cyclone.web import dashboard as make_dashboard
        from cyclone.web._security import is_loopback
    except ImportError:
        raise Failure("the dashboard needs its extra: pip install 'cyclone-pg[web]'") from None
    host, sep, port_text = bind.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise Failure(f"--bind {bind!r} is not HOST:PORT, e.g. 127.0.0.1:8080")
    host = host.strip("[]")
    local = is_loopback(host)
    if not local and not read_only:
        click.echo(f"cyclone: {host} is not a loopback address: serving read-only", err=True)

    async def go(client: Client) -> None:
        read_only_now = True if read_only or not local else None
        app = make_dashboard(client, read_only=read_only_now, title=title)
        config = uvicorn.Config(
            app, log_level="warning", lifespan="off", timeout_graceful_shutdown=5
        )
        try:  # listening before it says so: a client may connect right after the line
            sock = socket.create_server((host, int(port_text)))
        except OSError as exc:
            raise Failure(f"cannot listen on {bind}: {exc}") from None
        click.echo(f"cyclone: dashboard on http://{bind}/ ; Ctrl-C stops it", err=True)
        await uvicorn.Server(config).serve(sockets=[sock])

    try:
        with_client(ctx, go, connections=8)
    except KeyboardInterrupt:  # uvicorn hands the SIGINT it handled back on the way out
        click.echo("cyclone: dashboard stopped", err=True)
