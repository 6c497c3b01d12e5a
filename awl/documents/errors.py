"""The one exception tree of the library.

::

    AWLError
    ├── DocumentError          input is not a readable document (not JSON, too large, too deep)
    ├── ValidationFailed       a document or operation has `invalid` findings (``.findings``)
    ├── NotFound               no such order, report, call, effect or pass
    ├── Forbidden              the actor may not do this (``.actor``, ``.action``)
    ├── InvalidTransition      the order's state does not allow the action (``.state``, ``.action``)
    ├── Conflict               someone else wrote first (``.expected_seq``, ``.actual_seq``)
    ├── BadRequest             arguments that are wrong for a reason no finding covers
    ├── StoreUnavailable       the store is out of reach, refuses us, or is from a newer version
    └── PassError              a Delegation Pass was refused (``.reason``: a stable code)

Every error carries its data in attributes; the message is for people.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Sequence
from typing import TextIO

from awl.documents.findings import Finding

DEBUG_ENV = "AWL_DEBUG"
"""Set to anything but empty or ``0``: every failure printed as one line (a command's, a
gateway's or a server's) is preceded by its traceback, the driver's own error included."""


def debugging() -> bool:
    """Whether :data:`DEBUG_ENV` asks for tracebacks beside the one-line errors."""
    return os.environ.get(DEBUG_ENV, "").strip() not in ("", "0")


def print_debug(exc: BaseException, file: TextIO) -> None:
    """Print ``exc``'s traceback to ``file`` when :func:`debugging`, with the error it was
    raised from even when the one line hid it (``raise ... from None``); else nothing."""
    if not debugging():
        return
    error: BaseException | None = exc
    seen: set[int] = set()
    while error is not None and id(error) not in seen:  # what `from None` kept out of the line
        seen.add(id(error))
        error.__suppress_context__ = False
        error = error.__cause__ or error.__context__
    traceback.print_exception(exc, file=file)


class AWLError(Exception):
    """Root of every error this library raises on purpose."""

    code = "AWL_ERROR"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class DocumentError(AWLError):
    """The input is not a document we can read at all (not JSON, too big, too deep)."""

    code = "BAD_REQUEST"


class ValidationFailed(AWLError):
    """A document or an operation has ``invalid`` findings; they are in ``findings``."""

    code = "VALIDATION_FAILED"

    def __init__(self, message: str, *, findings: Sequence[Finding]) -> None:
        super().__init__(message)
        self.findings = tuple(findings)


class NotFound(AWLError):
    """The thing named does not exist."""

    code = "NOT_FOUND"


class Forbidden(AWLError):
    """The actor may not perform the action."""

    code = "FORBIDDEN"

    def __init__(self, message: str, *, actor: str, action: str) -> None:
        super().__init__(message)
        self.actor = actor
        self.action = action


class InvalidTransition(AWLError):
    """The order's current state does not allow the action."""

    code = "INVALID_TRANSITION"

    def __init__(self, message: str, *, state: str, action: str) -> None:
        super().__init__(message)
        self.state = state
        self.action = action


class Conflict(AWLError):
    """Another writer changed the order first; nothing was written. Read again and retry."""

    code = "CONFLICT"

    def __init__(self, message: str, *, expected_seq: int | None = None,
                 actual_seq: int | None = None) -> None:
        super().__init__(message)
        self.expected_seq = expected_seq
        self.actual_seq = actual_seq


class BadRequest(AWLError):
    """The arguments are wrong in a way no numbered check describes."""

    code = "BAD_REQUEST"


class StoreUnavailable(AWLError):
    """The desk's store cannot be opened or used: its file or server is out of reach, the
    credentials are refused, or it was made by a newer version. Nothing was written."""

    code = "STORE_UNAVAILABLE"


class PassError(AWLError):
    """A Delegation Pass was refused. ``reason`` is a stable code such as ``expired``."""

    code = "FORBIDDEN"

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason
