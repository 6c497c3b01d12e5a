"""What every part of the pass code shares: the format's constants, canonical
base64url, strict JSON and reading a time.
"""

from __future__ import annotations

import base64
import re
from typing import Any

from awl.documents.checks import load_document
from awl.documents.errors import PassError
from awl.documents.limits import show_value

__all__ = [
    "ALGORITHM",
    "DEFAULT_AUDIENCE",
    "DEFAULT_ISSUER",
    "MAX_CHAIN",
    "MAX_TOKEN_BYTES",
    "PASS_SPEC",
    "PASS_TYPE",
    "b64decode",
    "b64encode",
    "json_object",
    "refuse",
    "shown",
]

ALGORITHM = "EdDSA"
"""The only signature algorithm a pass may use; anything else is refused before any key is used."""
PASS_SPEC = "awl/delegation-pass@0.3"
"""What this implementation writes in ``spec``."""
PASS_TYPE = "awl-pass+jwt"
"""The ``typ`` header of every pass, so no other JWT the same key signs can pass for one."""
DEFAULT_ISSUER = "awl:desk"
"""``iss`` of the passes a desk signs."""
DEFAULT_AUDIENCE = "awl:gateway"
"""``aud`` of a worker's pass when none is asked for."""
MAX_CHAIN = 8
"""Most links in a chain (the worker's pass counts as one)."""
MAX_TOKEN_BYTES = 64 * 1024
"""Tokens longer than this are refused unread."""


_B64URL = re.compile(r"[A-Za-z0-9_-]*")


def b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64decode(text: str) -> bytes:
    """The bytes of canonical unpadded base64url text (DP-11), else ValueError.

    Canonical: the base64url alphabet only, no padding, and the unused low bits of the last
    character zero, so each byte string has exactly one spelling and a token cannot be
    respelt (``T==``, another last character) into one that still verifies.
    """
    if not isinstance(text, str) or _B64URL.fullmatch(text) is None or len(text) % 4 == 1:
        raise ValueError("not canonical unpadded base64url")
    data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if b64encode(data) != text:
        raise ValueError("not canonical base64url (the last character's unused bits are set)")
    return data


def json_object(data: bytes) -> dict[str, Any]:
    # Strict reading (no duplicate names, no NaN): two readers of one token must never see
    # different values for the same name.
    value = load_document(data, max_bytes=MAX_TOKEN_BYTES)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def shown(value: Any, limit: int = 130) -> str:
    """A value from a token for a refusal message: ASCII only, and short.

    Refusals travel in HTTP headers (``WWW-Authenticate``), which carry Latin-1 at most, and
    must stay one short line whatever a token holds. A kid (at most 128 characters) is
    shown whole.
    """
    if isinstance(value, str):
        text = ascii(value[:limit])
        if len(value) <= limit and len(text) <= limit + 2:
            return text
        return f"{text[:limit]}... ({len(value)} characters)"
    text = show_value(value).replace("\u2026", "...")
    return text.encode("ascii", "backslashreplace").decode("ascii")


def refuse(reason: str, message: str) -> PassError:
    """The error a verifier refuses a pass with: ``reason`` is one of
    :data:`~awl.passes.verify.REASONS`.

    The message is made one line of ASCII (other characters escaped), as it may be sent in
    an HTTP header."""
    line = " ".join(message.replace("\u2026", "...").splitlines())
    return PassError(line.encode("ascii", "backslashreplace").decode("ascii"), reason=reason)
