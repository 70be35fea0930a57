"""``cyclone keys count|rotate``: what each key of the keyring seals, and rotation to the
current key (docs/encryption.md). The keyring comes from ``CYCLONE_KEYS``, as for every
command: ``id=base64key,...``, the current key first."""

from __future__ import annotations

import click

from cyclone._client import Client
from cyclone.cli._common import Listing, command, console, print_json, subgroup, with_client


@subgroup
def keys() -> None:
    """See and rotate the keys that seal payloads (the keyring is CYCLONE_KEYS)."""


@command(keys, "count")
@click.option("--json", "as_json", is_flag=True)
def keys_count(ctx: click.Context, as_json: bool) -> None:
    """How many stored values each key id seals."""

    async def go(client: Client) -> dict[str, int]:
        return await client.keys.count()

    counts = with_client(ctx, go)
    if as_json:
        print_json(counts)
        return
    listing = Listing("key id", "sealed values")
    for key_id, n in counts.items():
        listing.add(key_id, str(n))
    listing.print()


@command(keys, "rotate")
@click.option("--batch", type=click.IntRange(min=1), default=500, show_default=True)
def keys_rotate(ctx: click.Context, batch: int) -> None:
    """Re-seal every value sealed with an older key under the current key of CYCLONE_KEYS,
    in short transactions (safe while workers run); then print what each key still seals."""

    async def go(client: Client) -> tuple[int, dict[str, int]]:
        rotated = await client.keys.rotate(batch=batch)
        return rotated, await client.keys.count()

    rotated, counts = with_client(ctx, go)
    left = ", ".join(f"{k}: {n}" for k, n in counts.items()) or "nothing sealed"
    console.print(f"re-sealed {rotated} rows; sealed values per key: {left}", markup=False)
