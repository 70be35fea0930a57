"""What ``async with`` means for Cyclone's objects that open and close (the client, the
worker, a tracked transaction): one definition of the protocol, each object saying what
opening and closing do."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class AsyncResource:
    """``async with obj:`` begins ``obj`` (``_begin``) and ends it on the way out
    (``_end``), told whether the block raised."""

    async def _begin(self) -> None:
        """Nothing to do on entering unless a subclass says so."""

    async def _end(self, failed: bool) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self._begin()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._end(failed=exc_type is not None)
