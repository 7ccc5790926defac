"""Key rules: one validator, shared by every store."""

from __future__ import annotations

import pytest

from gradientmail.errors import InvalidKey
from gradientmail.mailbox import validate_key
from gradientmail.mailbox.keys import MAX_KEY_LENGTH, MAX_SEGMENT_LENGTH, is_valid_key, validate_prefix

GOOD = [
    "manifest.json",
    "fragments/0000/rounds/0000000004.json",
    "leases/learners/node-1.json",
    "a=b/c_d/E.F-9",
    ".hidden",
    "..dots",
    "a/" * 10 + "z",
    "x" * MAX_SEGMENT_LENGTH,
]

BAD = {
    "": "is empty",
    "../x": "'..' segment",
    "a/../b": "'..' segment",
    ".": "'.' segment",
    "./a": "'.' segment",
    "/abs": "starts with '/'",
    "a/": "ends with '/'",
    "a//b": "empty segment",
    "a\\b": "backslash",
    "a b": "' '",
    "a\nb": "'\\n'",
    "a:b": "':'",
    "tilde~": "'~'",
    "naïve": "'ï'",
    "x" * (MAX_SEGMENT_LENGTH + 1): "segment longer",
    "/".join(["y" * 100] * 6): "characters long",
}


@pytest.mark.parametrize("key", GOOD)
def test_good_keys(key: str) -> None:
    assert validate_key(key) == key
    assert is_valid_key(key)


@pytest.mark.parametrize("key, problem", BAD.items(), ids=list(range(len(BAD))))
def test_bad_keys_name_the_key_and_the_problem(key: str, problem: str) -> None:
    """INV-7: path-like and malformed keys are refused with the key and the problem."""
    with pytest.raises(InvalidKey) as caught:
        validate_key(key)
    assert problem in str(caught.value)
    assert repr(key)[:30] in str(caught.value)
    assert not is_valid_key(key)


def test_non_str_keys() -> None:
    """INV-7: keys of the wrong type are refused."""
    for key in (b"bytes", None, 3, ["a"]):
        with pytest.raises(InvalidKey, match="must be a str"):
            validate_key(key)  # type: ignore[arg-type]


def test_limits_leave_room_for_prefixes_and_temp_names() -> None:
    assert MAX_KEY_LENGTH <= 512
    assert MAX_SEGMENT_LENGTH + len(".~tmp.") + 32 < 255


@pytest.mark.parametrize("prefix", ["", "a", "a/", "fragments/0000/rounds/", "leases/learners/node"])
def test_good_prefixes(prefix: str) -> None:
    assert validate_prefix(prefix) == prefix


@pytest.mark.parametrize("prefix", ["/", "/a", "a//", "../", "a b", "a\\", "a//b/"])
def test_bad_prefixes(prefix: str) -> None:
    """INV-7: path-like list prefixes are refused."""
    with pytest.raises(InvalidKey, match="prefix"):
        validate_prefix(prefix)
