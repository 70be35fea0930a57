"""Payload encoding and decoding with msgspec, cached per type.

Inputs and outputs are stored as ``jsonb``. They travel to PostgreSQL as JSON text cast to
``jsonb`` in SQL, so a caller's connection with its own type codecs never changes them.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Sequence
from typing import Any

import msgspec

from cyclone._errors import InvalidInputError, PayloadTooLargeError

DEFAULT_PAYLOAD_LIMIT = 1 << 20
_encoder = msgspec.json.Encoder()

# jsonb cannot store the NUL character; an escaped backslash before "u0000" is not one.
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


@functools.cache
def _decoder(tp: Any) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(tp)


@functools.cache
def _is_instance_type(tp: Any) -> bool:
    return isinstance(tp, type) and (issubclass(tp, msgspec.Struct) or dataclasses.is_dataclass(tp))


def _check_types(values: Sequence[object], tp: Any, what: str) -> None:
    if _is_instance_type(tp):
        for value in values:
            if not isinstance(value, tp):
                raise InvalidInputError(
                    f"{what} must be a {tp.__name__}, not {type(value).__name__}"
                )
    elif tp is not Any and tp is not object:
        try:  # one conversion for the whole batch
            msgspec.convert(values, list[tp], strict=True)
        except msgspec.ValidationError as exc:
            raise InvalidInputError(f"{what} does not match {tp!r}: {exc}") from exc


def encode_many(values: Sequence[object], tp: Any, *, what: str, limit: int) -> list[str]:
    """Encode each value (declared as ``tp``) to JSON text, checking type, NUL and size."""
    _check_types(values, tp, what)
    encode = _encoder.encode
    try:
        data = [encode(value) for value in values]
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidInputError(f"{what} cannot be encoded as JSON: {exc}") from exc
    for item in data:
        if b"\\u0000" in item and _NUL_ESCAPE.search(item):
            raise InvalidInputError(f"{what} contains a NUL character, which jsonb cannot store")
        if len(item) > limit:
            raise PayloadTooLargeError(what, len(item), limit)
    return [item.decode("utf-8") for item in data]


def encode(value: object, tp: Any, *, what: str, limit: int) -> str:
    """Encode one value; see :func:`encode_many`."""
    return encode_many([value], tp, what=what, limit=limit)[0]


def decode(text: str | bytes, tp: Any) -> Any:
    """Decode stored JSON text as ``tp``; msgspec validates while it decodes."""
    return _decoder(tp).decode(text)


def encode_plain(value: object) -> str:
    """Encode an internal value (errors, graphs) to JSON text."""
    return _encoder.encode(value).decode("utf-8")
