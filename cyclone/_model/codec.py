"""Payload encoding and decoding with msgspec, cached per type.

Inputs and outputs are stored as ``jsonb``. They travel to PostgreSQL as JSON text cast to
``jsonb`` in SQL, so a caller's connection with its own type codecs never changes them.

What JSON or ``jsonb`` cannot carry is refused before anything is written: a NUL character
(``jsonb`` refuses it), a lone surrogate (not UTF-8), nesting deeper than msgspec's recursion
limit (about 1000 levels, below PostgreSQL's own), and NaN or infinite floats (msgspec would
write ``null``, silently changing the value). Integers of any size are kept exactly
(``jsonb`` stores them as ``numeric``).

A declared type is checked when it is declared (:func:`check_type`): one that msgspec
encodes only through a hook (an ``asyncpg.Pool``, any plain class) is refused there, rather
than at each enqueue. Messages name types as their users write them (:func:`type_name`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from collections.abc import Sequence
from typing import Any

import msgspec
import msgspec.inspect

from cyclone._model.errors import InvalidInputError, PayloadTooLargeError

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


def type_name(tp: Any) -> str:
    """``tp`` as its user writes it: ``int``, ``list[str]``, ``int | None``, ``myapp.Order``
    (a class by its module and qualified name, a builtin by its name alone)."""
    if tp is None or tp is type(None):
        return "None"
    if tp is Any:
        return "Any"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union or origin is types.UnionType:
        return " | ".join(type_name(arg) for arg in args)
    if origin is typing.Literal:
        return f"Literal[{', '.join(repr(arg) for arg in args)}]"
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is not None:
        return f"{type_name(origin)}[{_names(args)}]" if args else type_name(origin)
    if isinstance(tp, type):
        module = tp.__module__
        return (
            tp.__qualname__ if module in ("builtins", "__main__") else f"{module}.{tp.__qualname__}"
        )
    return repr(tp).removeprefix("typing.")


def _names(args: Sequence[Any]) -> str:
    """A generic's arguments, as ``type_name`` writes them (``Callable``'s list, ``...``)."""
    names = []
    for arg in args:
        if arg is Ellipsis:
            names.append("...")
        elif isinstance(arg, list):  # Callable[[int, str], ...]
            names.append(f"[{_names(arg)}]")
        else:
            names.append(type_name(arg))
    return ", ".join(names)


# What a declared type may be made of: what msgspec encodes to JSON and decodes from it.
SUPPORTED_TYPES = (
    "builtins (int, float, str, bool, None, list, dict, tuple), datetime, uuid.UUID, "
    "Decimal, enums, Literal, unions, TypedDicts, dataclasses or msgspec.Struct classes"
)


def check_type(tp: Any, *, what: str) -> None:
    """Refuse a declared input or output type that msgspec cannot encode and decode as JSON
    (``what`` names it: ``input of step 'x'``), when it is declared rather than at each
    enqueue. ``Any`` and ``object`` take any JSON value."""
    try:
        unsupported = _custom_type(msgspec.inspect.type_info(tp))
    except (TypeError, ValueError, NameError) as exc:  # msgspec cannot read the annotation
        raise InvalidInputError(
            f"{what} is declared as {type_name(tp)}, which msgspec cannot use ({exc}): "
            f"use {SUPPORTED_TYPES}"
        ) from exc
    if unsupported is not None:
        within = "" if unsupported is tp else f" (it holds {type_name(unsupported)})"
        raise InvalidInputError(
            f"{what} is declared as {type_name(tp)}{within}, which msgspec cannot encode as "
            f"JSON, the form inputs and outputs are stored in: use {SUPPORTED_TYPES}, and "
            "pass what the handler needs to find an object (an id, a name) rather than the "
            "object"
        )


def _custom_type(info: msgspec.inspect.Type) -> Any:
    """The first class in a type's tree that msgspec encodes only through a hook (which
    Cyclone does not install), or None; ``object`` stands for any value and is allowed."""
    stack: list[object] = [info]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in seen:  # a recursive type (a Struct whose field is a list of itself)
            continue
        seen.add(id(node))
        if isinstance(node, msgspec.inspect.CustomType):
            if node.cls is not object:
                return node.cls
        elif isinstance(node, tuple):
            stack.extend(node)
        elif isinstance(node, msgspec.Struct):  # a Type or a Field: look at what it holds
            stack.extend(getattr(node, name) for name in node.__struct_fields__)
    return None


def _mismatch(what: str, tp: Any, values: Sequence[object], exc: msgspec.ValidationError) -> str:
    """msgspec's complaint about ``values`` (converted as ``list[tp]``) in the caller's words:
    the value's own path rather than the batch's (``$[0].cents`` is ``cents``), and the
    Python type of a value that is not the declared one."""
    text = str(exc)
    found = re.fullmatch(r"(.*) - at `\$\[(\d+)\](.*)`", text, re.DOTALL)
    if found is None:  # not the shape msgspec gives: say it as it is
        return f"{what} must be {type_name(tp)}: {text}"
    detail, index, path = found[1], int(found[2]), found[3].removeprefix(".")
    if len(values) > 1:
        what = f"{what} at index {index}"
    if not path and detail.startswith("Expected `") and ", got `" in detail:
        detail = f"got {type_name(type(values[index]))}"
    else:
        detail = detail[:1].lower() + detail[1:] + (f" at `{path}`" if path else "")
    return f"{what} must be {type_name(tp)}: {detail}"


def accepts(value: object, tp: Any) -> bool:
    """Whether ``value`` is a valid ``tp``, as an enqueue checks it."""
    try:
        _check_types([value], tp, "value")
    except InvalidInputError:
        return False
    return True


def check(value: object, tp: Any, *, what: str) -> None:
    """Raise :class:`InvalidInputError` unless ``value`` is a valid ``tp`` (``what`` names it
    in the message)."""
    _check_types([value], tp, what)


def _check_types(values: Sequence[object], tp: Any, what: str) -> None:
    if tp is type(None) and all(value is None for value in values):
        return  # a handler that returns nothing: the usual output, valid as it is
    if _is_instance_type(tp):
        for index, value in enumerate(values):
            if not isinstance(value, tp):
                at = f" at index {index}" if len(values) > 1 else ""
                raise InvalidInputError(
                    f"{what}{at} must be {type_name(tp)}: got {type_name(type(value))}"
                )
    elif tp is not Any and tp is not object:
        try:  # one conversion for the whole batch
            msgspec.convert(values, list[tp], strict=True)
        except msgspec.ValidationError as exc:
            raise InvalidInputError(_mismatch(what, tp, values, exc)) from exc


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
