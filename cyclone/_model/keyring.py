"""Sealed payloads: :class:`Keyring`, AES-256-GCM over the JSON text of inputs and outputs.

A payload is sealed after it is encoded and opened before it is decoded, always as JSON text,
so this module is the one place that knows the stored form. A sealed value is still ``jsonb``:

    {"$cyclone.sealed": "<key id>", "data": "<base64 of nonce (12 bytes) + ciphertext + tag>"}

The key id is the associated data, so an envelope cannot be relabelled with another key's id.
``null`` stays ``null`` (it says nothing), and a list is sealed item by item (``[envelope,
...]``), so the statements that split a list into map items (``jsonb_array_elements``) and
gather item outputs into a list work on sealed payloads unchanged; a list's length stays
visible. Opening walks a value for envelopes wherever they sit (a map's list of item
outputs, a settled item's ``{"value": envelope}``, an attempt's error message), and returns
text that holds none: plain text, written before sealing was turned on, passes through.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from cyclone._model.errors import InvalidNameError, InvalidOptionError, KeyringError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

MARKER = "$cyclone.sealed"
# What any sealed text contains, however jsonb spaced it: its absence means nothing to open.
_MARKER_TEXT = f'"{MARKER}"'
_NONCE = 12
KEY_BYTES = 32
_KEY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_encoder = msgspec.json.Encoder()
_raw_list = msgspec.json.Decoder(list[msgspec.Raw])
_any = msgspec.json.Decoder()
EXTRA = "pip install 'cyclone-pg[crypto]'"
CONFIGURE = (
    "give the client the keyring that holds it: cyclone.Client(pool, "
    "cipher=cyclone.Keyring.from_env()) with CYCLONE_KEYS set"
)


def _aesgcm(key: bytes) -> AESGCM:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise KeyringError(f"encrypted payloads need the cryptography package: {EXTRA}") from None
    return AESGCM(key)


def redacted(key_id: str) -> str:
    """What a reader without the key shows in place of a value sealed with ``key_id``."""
    return f"<encrypted with key {key_id}>"


class Keyring:
    """The keys that seal and open payloads at rest (``cyclone.Client(pool, cipher=...)``):
    ``current`` seals every write, all of them open reads, so an older key stays until
    ``client.keys.rotate()`` has re-sealed what it holds (docs/encryption.md).

    ``keys`` maps a key id (letters, digits, ``.``, ``_``, ``-``; at most 64 characters) to a
    32-byte key, as bytes or as the base64 text :meth:`generate_key` gives. Key ids are
    stored beside each sealed value, in the clear: never reuse an id for another key.
    """

    __slots__ = ("_ciphers", "current")

    def __init__(self, keys: Mapping[str, bytes | str], *, current: str) -> None:
        if not isinstance(keys, Mapping) or not keys:
            raise InvalidOptionError("a Keyring needs at least one key: {key_id: key}")
        self._ciphers: dict[str, AESGCM] = {}
        for key_id, key in keys.items():
            self._ciphers[_checked_id(key_id)] = _aesgcm(_key_bytes(key_id, key))
        if current not in self._ciphers:
            raise InvalidOptionError(
                f"current={current!r} is not one of the keyring's ids {sorted(self._ciphers)}"
            )
        self.current = current
        """The id of the key that seals every write."""

    def __repr__(self) -> str:  # never the keys themselves
        return f"<cyclone.Keyring current={self.current!r} ids={sorted(self._ciphers)}>"

    @property
    def key_ids(self) -> list[str]:
        """The ids of every key this keyring opens, sorted."""
        return sorted(self._ciphers)

    @staticmethod
    def generate_key() -> str:
        """A new random 256-bit key as base64 text, for :class:`Keyring` or ``CYCLONE_KEYS``."""
        return base64.b64encode(os.urandom(KEY_BYTES)).decode("ascii")

    @classmethod
    def from_string(cls, text: str) -> Keyring:
        """A keyring from ``"id=base64key,id=base64key"``; the first key is the current one.
        (The form of ``CYCLONE_KEYS``.)"""
        keys: dict[str, str] = {}
        for part in text.split(","):
            key_id, sep, key = part.strip().partition("=")
            if not sep:
                raise InvalidOptionError(
                    "a keyring string is 'id=base64key,id=base64key' (first: current), with "
                    f"keys from cyclone.Keyring.generate_key(); got an entry without '=': "
                    f"{key_id[:16]!r}"
                )
            keys[key_id.strip()] = key.strip()
        first = text.split(",", 1)[0].partition("=")[0].strip()
        return cls(keys, current=first)

    @classmethod
    def from_env(cls, name: str = "CYCLONE_KEYS") -> Keyring:
        """A keyring from the environment variable ``name`` (see :meth:`from_string`)."""
        text = os.environ.get(name)
        if not text:
            raise KeyringError(
                f"the environment variable {name} is not set: set it to 'id=key' with a key "
                "from cyclone.Keyring.generate_key() (more keys after commas, current first)"
            )
        return cls.from_string(text)

    # Internal: the insert path, the worker and the readers seal and open JSON text.

    def seal(self, text: str) -> str:
        if text[0] == "[":
            items = _raw_list.decode(text)
            return "[" + ",".join(self._seal_one(bytes(item)) for item in items) + "]"
        return self._seal_one(text.encode("utf-8"))

    # A JSON array of separate payloads (a batch of job inputs), each sealed.
    def seal_each(self, text: str) -> str:
        return "[" + ",".join(self.seal(bytes(i).decode()) for i in _raw_list.decode(text)) + "]"

    def _seal_one(self, data: bytes) -> str:
        if data == b"null":
            return "null"
        nonce = os.urandom(_NONCE)
        key_id = self.current
        sealed = self._ciphers[key_id].encrypt(nonce, data, key_id.encode("ascii"))
        b64 = base64.b64encode(nonce + sealed).decode("ascii")
        return f'{{"{MARKER}":"{key_id}","data":"{b64}"}}'

    # ``text`` with each value sealed with another key sealed again with the current one, in
    # place: the structure around the values (an error record's clear fields, a map's list)
    # stays as it is.
    def reseal(self, text: str) -> str:
        if not is_sealed(text):
            return text
        return _encoder.encode(self._resealed(_any.decode(text))).decode("utf-8")

    def _resealed(self, value: Any) -> Any:
        if isinstance(value, dict):
            if _is_envelope(value):
                if value[MARKER] == self.current:
                    return value
                data = self.open_envelope(value, redact=False)
                assert data is not None  # without redact, a missing key raises
                return _any.decode(self._seal_one(data))
            return {k: self._resealed(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._resealed(v) for v in value]
        return value

    def open(self, text: str, *, redact: bool = False) -> str:
        return reveal(self, text, redact=redact)

    def open_envelope(self, envelope: dict[str, Any], redact: bool) -> bytes | None:
        key_id = envelope[MARKER]
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            if redact:
                return None
            raise KeyringError(
                f"a payload is sealed with key {key_id!r}, which this client's keyring "
                f"({sorted(self._ciphers)}) does not hold: add that key to the keyring"
            )
        return _decrypt(cipher, key_id, envelope)


def _decrypt(cipher: AESGCM, key_id: str, envelope: dict[str, Any]) -> bytes:
    from cryptography.exceptions import InvalidTag

    try:
        blob = base64.b64decode(envelope["data"], validate=True)
        return cipher.decrypt(blob[:_NONCE], blob[_NONCE:], key_id.encode("ascii"))
    except (InvalidTag, KeyError, TypeError, binascii.Error) as exc:
        raise KeyringError(
            f"a payload sealed with key {key_id!r} does not open with this keyring's key of "
            "that id: the id names another key here than where it was sealed"
        ) from exc


def is_sealed(text: str) -> bool:
    """Whether stored JSON ``text`` may hold a sealed value."""
    return _MARKER_TEXT in text


def sealed(keyring: Keyring | None, text: str) -> str:
    """``text`` (encoded JSON) as it is stored: sealed with ``keyring``, plain without one."""
    return text if keyring is None else keyring.seal(text)


def reveal(keyring: Keyring | None, text: str, *, redact: bool = False) -> str:
    """``text`` (stored JSON) with every sealed value opened. Without ``keyring``, or
    without a value's key, raises :class:`KeyringError`, or with ``redact`` puts
    :func:`redacted` text in its place (for the dashboard and the CLI)."""
    if _MARKER_TEXT not in text:  # plain, as every payload is without a keyring
        return text
    value = _any.decode(text)
    if _is_envelope(value):
        data = _opened(keyring, value, redact)
        if isinstance(data, bytes):
            return data.decode("utf-8")
        return _encoder.encode(data).decode("utf-8")
    return _encoder.encode(_walk(keyring, value, redact)).decode("utf-8")


def shown(keyring: Keyring | None, text: str) -> str:
    """Stored JSON as a reader (``run.info()``, the dashboard, the CLI) shows it: sealed
    values opened, or without their key replaced by :func:`redacted` text."""
    return reveal(keyring, text, redact=True)


def _is_envelope(value: object) -> bool:
    return isinstance(value, dict) and isinstance(value.get(MARKER), str)


def _opened(keyring: Keyring | None, envelope: dict[str, Any], redact: bool) -> bytes | str:
    if keyring is not None:
        data = keyring.open_envelope(envelope, redact)
        return redacted(envelope[MARKER]) if data is None else data
    if redact:
        return redacted(envelope[MARKER])
    raise KeyringError(
        f"a payload is sealed with key {envelope[MARKER]!r} and this client has no keyring: "
        + CONFIGURE
    )


def _walk(keyring: Keyring | None, value: Any, redact: bool) -> Any:
    if isinstance(value, dict):
        if _is_envelope(value):
            data = _opened(keyring, value, redact)
            return _any.decode(data) if isinstance(data, bytes) else data
        return {k: _walk(keyring, v, redact) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(keyring, v, redact) for v in value]
    return value


def checked_keyring(cipher: object) -> Keyring | None:
    """A client's ``cipher=`` argument, checked."""
    if cipher is not None and not isinstance(cipher, Keyring):
        raise InvalidOptionError(
            f"cipher must be a cyclone.Keyring or None, got {type(cipher).__name__}"
        )
    return cipher


def _checked_id(key_id: object) -> str:
    if not isinstance(key_id, str) or not _KEY_ID.fullmatch(key_id):
        raise InvalidNameError(
            f"key id {key_id!r} must be 1 to 64 letters, digits, '.', '_' or '-', starting "
            "with a letter or digit (a date such as '2026-12' works well)"
        )
    return key_id


def _key_bytes(key_id: str, key: object) -> bytes:
    if isinstance(key, str):
        try:
            key = base64.b64decode(key, validate=True)
        except binascii.Error:
            raise InvalidOptionError(
                f"key {key_id!r} is not base64 text: use cyclone.Keyring.generate_key()"
            ) from None
    if not isinstance(key, bytes) or len(key) != KEY_BYTES:
        size = len(key) if isinstance(key, bytes) else type(key).__name__
        raise InvalidOptionError(
            f"key {key_id!r} must be {KEY_BYTES} bytes (AES-256), got {size}: use "
            "cyclone.Keyring.generate_key()"
        )
    return key
