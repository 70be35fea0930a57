"""The dashboard's option checks raise typed Cyclone errors (still TypeError / ValueError)."""

from __future__ import annotations

import pytest

import cyclone
import cyclone.web
from cyclone.testing.plugin import CycloneEnv


def test_option_errors_are_typed(cyclone_env: CycloneEnv) -> None:
    client = cyclone_env.client
    with pytest.raises(cyclone.InvalidInputError, match=r"needs a cyclone\.Client"):
        cyclone.web.dashboard(object())  # type: ignore[arg-type]
    with pytest.raises(cyclone.InvalidInputError, match="authorize must be a callable"):
        cyclone.web.dashboard(client, authorize=1)  # type: ignore[arg-type]
    with pytest.raises(cyclone.InvalidInputError, match="read_only must be"):
        cyclone.web.dashboard(client, read_only="yes")  # type: ignore[arg-type]
    with pytest.raises(cyclone.InvalidOptionError, match="at least 16 bytes"):
        cyclone.web.dashboard(client, secret="short")
    with pytest.raises(cyclone.InvalidOptionError, match="page_size must be"):
        cyclone.web.dashboard(client, page_size=501)
