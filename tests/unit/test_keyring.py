"""The sealed-payload envelope (``cyclone.Keyring``): what is sealed and how, opening,
re-sealing in place, and the errors of a bad keyring or a missing key."""

from __future__ import annotations

import base64
import json
import sys

import msgspec
import pytest

import cyclone
from cyclone._model.keyring import MARKER, redacted, reveal, shown

A = cyclone.Keyring.generate_key()
B = cyclone.Keyring.generate_key()


def ring(*ids: str) -> cyclone.Keyring:
    keys = {"a": A, "b": B}
    return cyclone.Keyring({i: keys[i] for i in ids}, current=ids[0])


@pytest.mark.parametrize(
    "text",
    ['{"number":"42-42","n":1}', '"a-string"', "12.5", "true", '{"nested":[1,{"x":"y"}]}'],
)
def test_a_value_round_trips_and_leaves_no_plaintext(text: str) -> None:
    keyring = ring("a")
    sealed = keyring.seal(text)
    envelope = json.loads(sealed)
    assert set(envelope) == {MARKER, "data"} and envelope[MARKER] == "a"
    # Probes hold a "-", which base64 ciphertext never does.
    assert "42-42" not in sealed and "a-string" not in sealed
    assert keyring.open(sealed) == text
    assert keyring.seal(text) != sealed  # a fresh nonce each time


def test_null_stays_and_a_list_is_sealed_item_by_item() -> None:
    keyring = ring("a")
    assert keyring.seal("null") == "null"
    sealed = json.loads(keyring.seal('[1,[2,3],null,{"k":"v"}]'))
    assert len(sealed) == 4 and sealed[2] is None
    assert all(item[MARKER] == "a" for i, item in enumerate(sealed) if i != 2)
    assert json.loads(keyring.open(json.dumps(sealed))) == [1, [2, 3], None, {"k": "v"}]
    # A batch of job inputs: each input sealed as one value (a list input item by item).
    batch = json.loads(keyring.seal_each('[[1,2],"x"]'))
    assert isinstance(batch[0], list) and batch[1][MARKER] == "a"


def test_envelopes_are_opened_wherever_they_sit() -> None:
    keyring = ring("a")
    settled = {"items": [{"value": json.loads(keyring.seal('"v"'))}, {"error": "e"}]}
    assert json.loads(keyring.open(json.dumps(settled))) == {
        "items": [{"value": "v"}, {"error": "e"}]
    }


def test_plain_text_passes_through_unchanged() -> None:
    text = '{"written":"before sealing"}'
    assert ring("a").open(text) is text
    assert reveal(None, text) is text


def test_a_missing_key_raises_or_is_redacted() -> None:
    sealed = ring("a").seal('{"x":1}')
    with pytest.raises(cyclone.KeyringError, match=r"sealed with key 'a'.*add that key"):
        ring("b").open(sealed)
    with pytest.raises(cyclone.KeyringError, match=r"no keyring.*CYCLONE_KEYS"):
        reveal(None, sealed)
    assert shown(ring("b"), sealed) == json.dumps(redacted("a")) == '"<encrypted with key a>"'
    record = json.dumps({"type": "ValueError", "message": json.loads(sealed)})
    assert json.loads(shown(None, record)) == {
        "type": "ValueError",
        "message": "<encrypted with key a>",
    }


def test_tampering_is_refused() -> None:
    keyring = cyclone.Keyring({"a": A, "b": A}, current="a")  # the same key under two ids
    envelope = json.loads(keyring.seal('{"x":1}'))
    relabelled = {**envelope, MARKER: "b"}  # the key id is the associated data
    with pytest.raises(cyclone.KeyringError, match="does not open"):
        keyring.open(json.dumps(relabelled))
    data = bytearray(base64.b64decode(envelope["data"]))
    data[-1] ^= 1
    flipped = {**envelope, "data": base64.b64encode(bytes(data)).decode()}
    with pytest.raises(cyclone.KeyringError, match="does not open"):
        keyring.open(json.dumps(flipped))


def test_reseal_moves_values_to_the_current_key_in_place() -> None:
    old = ring("a")
    record = {
        "type": "ValueError",
        "message": json.loads(old.seal('"secret"')),
        "items": [json.loads(old.seal("1")), 2],
    }
    both = ring("b", "a")
    resealed = json.loads(both.reseal(json.dumps(record)))
    assert resealed["type"] == "ValueError" and resealed["items"][1] == 2
    assert resealed["message"][MARKER] == "b" and resealed["items"][0][MARKER] == "b"
    assert json.loads(ring("b").open(json.dumps(resealed)))["message"] == "secret"
    current = both.seal('"x"')
    assert json.loads(both.reseal(current)) == json.loads(current)  # left as it is


def test_keys_from_a_string_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    keyring = cyclone.Keyring.from_string(f"b={B}, a={A}")
    assert (keyring.current, keyring.key_ids) == ("b", ["a", "b"])
    assert A not in repr(keyring) and B not in repr(keyring)
    monkeypatch.setenv("CYCLONE_KEYS", f"a={A}")
    assert cyclone.Keyring.from_env().current == "a"
    monkeypatch.delenv("CYCLONE_KEYS")
    with pytest.raises(cyclone.KeyringError, match="CYCLONE_KEYS is not set"):
        cyclone.Keyring.from_env()
    raw = base64.b64decode(A)
    assert (
        cyclone.Keyring({"raw": raw}, current="raw").open(
            cyclone.Keyring({"raw": A}, current="raw").seal("1")
        )
        == "1"
    )


@pytest.mark.parametrize(
    ("keys", "current", "error", "match"),
    [
        ({}, "a", cyclone.InvalidOptionError, "at least one key"),
        ({"a": A}, "b", cyclone.InvalidOptionError, "not one of the keyring's ids"),
        ({"bad id": A}, "bad id", cyclone.InvalidNameError, "letters, digits"),
        ({'"q"': A}, '"q"', cyclone.InvalidNameError, "letters, digits"),
        ({"a": b"short"}, "a", cyclone.InvalidOptionError, "must be 32 bytes"),
        ({"a": "not base64!"}, "a", cyclone.InvalidOptionError, "not base64"),
        ({"a": base64.b64encode(b"x" * 16).decode()}, "a", cyclone.InvalidOptionError, "32"),
    ],
)
def test_a_bad_keyring_is_refused(
    keys: dict[str, bytes | str], current: str, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        cyclone.Keyring(keys, current=current)


def test_a_bad_keyring_string_says_its_form() -> None:
    with pytest.raises(cyclone.InvalidOptionError, match="'id=base64key,id=base64key'"):
        cyclone.Keyring.from_string("just-a-key")


def test_without_cryptography_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.ciphers.aead", None)
    with pytest.raises(cyclone.KeyringError, match=r"cyclone-pg\[crypto\]"):
        ring("a")


def test_sealed_text_is_jsonb_storable_json() -> None:
    sealed = ring("a").seal('{"x":"\\u00e9"}')
    assert msgspec.json.decode(sealed)[MARKER] == "a"
