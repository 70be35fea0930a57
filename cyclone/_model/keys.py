"""Key rules shared by ``submit_once`` keys and ``unique=`` keys, and the rules of the names
stored as values (kinds, workflows, nodes).

Checked in Python before any SQL runs, so a bad key or name never reaches the database.
"""

from __future__ import annotations

from cyclone._model.errors import InvalidKeyError, InvalidNameError

MAX_KEY_BYTES = 256
MAX_NAME_CHARS = 200


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


def validate_name(name: object, *, what: str) -> str:
    """Return ``name`` if it is a kind, workflow or node name that can be stored: a non-empty
    str of at most 200 characters, without NUL or lone surrogates; else raise
    :class:`InvalidNameError`. Any other character is fine: names travel as parameters."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
        raise InvalidNameError(
            f"{what} must be a non-empty str of at most {MAX_NAME_CHARS} characters, got {name!r}"
        )
    try:
        validate_key(name, what=what)
    except InvalidKeyError as exc:
        raise InvalidNameError(str(exc)) from None
    return name
