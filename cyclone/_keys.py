"""Key rules shared by ``submit_once`` keys and ``unique=`` keys.

Checked in Python before any SQL runs, so a bad key never reaches the database.
"""

from __future__ import annotations

from cyclone._errors import InvalidKeyError

MAX_KEY_BYTES = 256


def validate_key(key: object, *, what: str = "key") -> str:
    """Return ``key`` if it follows the rules, else raise :class:`InvalidKeyError`."""
    if not isinstance(key, str):
        raise InvalidKeyError(f"{what} must be a str, not {type(key).__name__}")
    if not key:
        raise InvalidKeyError(f"{what} must not be empty")
    if "\x00" in key:
        raise InvalidKeyError(f"{what} must not contain NUL")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        # Only lone surrogates fail to encode: Python str can hold them, UTF-8 cannot.
        raise InvalidKeyError(f"{what} must be valid UTF-8 (it has a lone surrogate)") from None
    if size > MAX_KEY_BYTES:
        raise InvalidKeyError(f"{what} is {size} bytes in UTF-8, over {MAX_KEY_BYTES}")
    return key
