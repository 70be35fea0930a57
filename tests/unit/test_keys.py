"""Key rules, property-based: exactly the valid keys pass, everything else is InvalidKeyError."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import cyclone
from cyclone._model.keys import MAX_KEY_BYTES, validate_key


def is_valid(key: str) -> bool:
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        return False
    return 0 < size <= MAX_KEY_BYTES and "\x00" not in key


# Text including lone surrogates and NULs, short and long.
keys = st.text(alphabet=st.characters(codec=None), max_size=300) | st.text(
    alphabet=st.sampled_from(["a", "é", "\x00", "\ud800", "😀"]), max_size=140
)


@given(keys)
def test_validate_key_accepts_exactly_the_valid_keys(key: str) -> None:
    if is_valid(key):
        assert validate_key(key) == key
    else:
        with pytest.raises(cyclone.InvalidKeyError):
            validate_key(key)


@given(st.integers() | st.binary() | st.none() | st.lists(st.text()))
def test_non_strings_are_refused(key: object) -> None:
    with pytest.raises(cyclone.InvalidKeyError):
        validate_key(key)


def test_limit_is_in_bytes_not_characters() -> None:
    assert validate_key("a" * 256)
    assert validate_key("é" * 128)  # 256 bytes
    with pytest.raises(cyclone.InvalidKeyError, match="257 bytes"):
        validate_key("é" * 128 + "a")


def test_invalid_key_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        validate_key("")
