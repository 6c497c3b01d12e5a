"""JSON pointers (RFC 6901): the one place that writes them and reads them.

A pointer is ``""`` (the whole document) or ``/`` followed by reference tokens joined by
``/``; in a token ``~`` is written ``~0`` and ``/`` is written ``~1``. Findings, refusals
and configuration errors name where they are with :func:`pointer`; the commit reads the
part of an earlier result that a ``$ref`` placeholder names with :func:`resolve_pointer`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["pointer", "resolve_pointer"]


def pointer(*parts: str | int) -> str:
    """The JSON pointer of a path: ``pointer("a/b", 0) == "/a~1b/0"``; ``""`` for no parts."""
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in parts)


def resolve_pointer(document: Any, text: str) -> Any:
    """The value the JSON pointer ``text`` names in ``document``.

    An array index is a whole number without leading zeros, below the array's length.

    Raises:
        KeyError: The pointer is malformed or names nothing.
    """
    if text == "":
        return document
    if not text.startswith("/"):
        raise KeyError(text)
    here = document
    for raw in text[1:].split("/"):
        # ~1 first, so "~01" reads as "~1" (RFC 6901 section 4).
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(here, dict):
            if token not in here:
                raise KeyError(text)
            here = here[token]
        elif isinstance(here, list):
            whole = token.isascii() and token.isdigit()
            if not whole or (len(token) > 1 and token[0] == "0"):
                raise KeyError(text)
            index = int(token)
            if index >= len(here):
                raise KeyError(text)
            here = here[index]
        else:
            raise KeyError(text)
    return here
