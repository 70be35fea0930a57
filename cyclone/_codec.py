"""Payload encoding and decoding with msgspec, cached per type.

Inputs and outputs are stored as ``jsonb``. They travel to PostgreSQL as JSON text cast to
``jsonb`` in SQL, so a caller's connection with its own type codecs never changes them.

What JSON or ``jsonb`` cannot carry is refused before anything is written: a NUL character
(``jsonb`` refuses it), a lone surrogate (not UTF-8), nesting deeper than msgspec's recursion
limit (about 1000 levels, below PostgreSQL's own), and NaN or infinite floats (msgspec would
write ``null``, silently changing the value). Integers of any size are kept exactly
(``jsonb`` stores them as ``numeric``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Sequence
from typing import Any

import msgspec

from cyclone._errors import InvalidInputError, PayloadTooLargeError

DEFAULT_PAYLOAD_LIMIT = 1 << 20
_encoder = msgspec.json.Encoder()

# jsonb cannot store the NUL character; an escaped backslash before "u0000" is not one.
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
# What a Python str can hold and jsonb cannot: NUL, and lone surrogates (not UTF-8).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_CUT = " [...] "


@functools.cache
def _decoder(tp: Any) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(tp)


@functools.cache
def _is_instance_type(tp: Any) -> bool:
    return isinstance(tp, type) and (issubclass(tp, msgspec.Struct) or dataclasses.is_dataclass(tp))


def _check_types(values: Sequence[object], tp: Any, what: str) -> None:
    if tp is type(None) and all(value is None for value in values):
        return  # a handler that returns nothing: the usual output, valid as it is
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


def _encoded_array(values: Sequence[object], tp: Any, what: str, limit: int) -> bytes:
    """``values`` (each declared as ``tp``) as one JSON array, checked for type, NUL, NaN and
    each value's size; one encoder call for the whole batch."""
    _check_types(values, tp, what)
    try:
        data = _encoder.encode(values if isinstance(values, list) else list(values))
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidInputError(f"{what} cannot be encoded as JSON: {exc}") from exc
    except RecursionError:
        raise InvalidInputError(f"{what} is nested too deeply to encode as JSON") from None
    # An escape cannot run across values: each string of the array closes before a comma.
    if b"\\u0000" in data and _NUL_ESCAPE.search(data):
        raise InvalidInputError(f"{what} contains a NUL character, which jsonb cannot store")
    # msgspec writes NaN and inf as null (values all None, a handler's usual output, have none).
    if b"null" in data and any(v is not None for v in values) and _has_non_finite(values):
        raise InvalidInputError(f"{what} contains a NaN or infinite float, which JSON cannot carry")
    if len(data) > limit:  # the batch is larger than one value may be: look at each
        for item in msgspec.json.decode(data, type=list[msgspec.Raw]):
            if len(item) > limit:
                raise PayloadTooLargeError(what, len(item), limit)
    return data


def encode_array(values: Sequence[object], tp: Any, *, what: str, limit: int) -> str:
    """Encode the values (each declared as ``tp``) as the text of one JSON array, checking
    type, NUL and each value's size; the statement splits it (``jsonb_array_elements``)."""
    return _encoded_array(values, tp, what, limit).decode("utf-8")


def _has_non_finite(value: object) -> bool:
    stack = [msgspec.to_builtins(value)]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


def encode(value: object, tp: Any, *, what: str, limit: int) -> str:
    """Encode one value to JSON text; the checks of :func:`encode_array`."""
    return _encoded_array([value], tp, what, limit)[1:-1].decode("utf-8")


def decode(text: str | bytes, tp: Any) -> Any:
    """Decode stored JSON text as ``tp``; msgspec validates while it decodes."""
    return _decoder(tp).decode(text)


def encode_plain(value: object) -> str:
    """Encode an internal value (errors, graphs) to JSON text."""
    return _encoder.encode(value).decode("utf-8")


def storable_text(text: str, limit: int) -> str:
    """``text`` as ``jsonb`` can store it, at most ``limit`` characters: NUL and lone
    surrogates become U+FFFD, and a longer text keeps its start and its end (a traceback's
    first frames and its last line), joined by `` [...] ``."""
    text = _UNSTORABLE.sub("\ufffd", text)
    if len(text) > limit:
        head = (limit - len(_CUT)) // 2
        text = text[:head] + _CUT + text[len(text) - (limit - len(_CUT) - head) :]
    return text
