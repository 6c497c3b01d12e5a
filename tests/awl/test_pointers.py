"""JSON pointers (RFC 6901): written by one function and read by one."""

from __future__ import annotations

from typing import Any

import pytest

from awl.documents.pointers import pointer, resolve_pointer

RESULT: dict[str, Any] = {
    "structuredContent": {"number": 7, "a/b": {"~x": [10, 20]}, "~1": "tilde-one", "/": 0},
    "isError": False,
}


def test_pointers_address_the_wire_form() -> None:
    """A JSON pointer reads a result as the wire carries it, with RFC 6901 escapes."""
    assert resolve_pointer(RESULT, "/structuredContent/number") == 7
    assert resolve_pointer(RESULT, "/structuredContent/a~1b/~0x/1") == 20
    assert resolve_pointer(RESULT, "") == RESULT
    for bad in ("/structured_content/number", "/structuredContent/a~1b/~0x/2",
                "/structuredContent/a~1b/~0x/01", "structuredContent"):
        with pytest.raises(KeyError):
            resolve_pointer(RESULT, bad)


def test_a_pointer_escapes_tilde_then_slash() -> None:
    """``~`` is written ``~0`` and ``/`` is written ``~1``; no parts is the whole document."""
    assert pointer() == ""
    assert pointer("a/b", "~x", 0) == "/a~1b/~0x/0"
    assert pointer("~1") == "/~01"
    assert pointer("/") == "/~1"


def test_what_a_pointer_names_is_read_back() -> None:
    """Reading unescapes ``~1`` before ``~0``: ``~01`` is the key ``~1``, not ``/``."""
    assert resolve_pointer(RESULT, "/structuredContent/~01") == "tilde-one"
    assert resolve_pointer(RESULT, "/structuredContent/~1") == 0
    for path in (("structuredContent", "a/b", "~x", 0), ("structuredContent", "~1"),
                 ("structuredContent", "/")):
        value: Any = RESULT
        for part in path:
            value = value[part]
        assert resolve_pointer(RESULT, pointer(*path)) == value


def test_an_array_index_is_ascii_digits_only() -> None:
    """A digit that is not 0-9 (a superscript one) names nothing; it does not crash."""
    for bad in ("/structuredContent/a~1b/~0x/\u00b9", "/structuredContent/a~1b/~0x/-1",
                "/structuredContent/a~1b/~0x/\u0661"):
        with pytest.raises(KeyError):
            resolve_pointer(RESULT, bad)
