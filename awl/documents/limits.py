"""Input limits (SPEC section 3.5): what any door of the desk, gateway or CLI will hold.

Every value that comes from outside (a document, a tool call's arguments, a config file, a CLI
argument, an upstream answer) passes one of these checks before anything else reads it, so a
value that cannot be held faithfully is refused with one clear message instead of crashing a
later layer (SQLite, ``datetime``, ``json.dumps``, a regular expression engine).

- :func:`loads` reads JSON text strictly; :func:`check_json_value` checks data already read.
- :func:`check_integer` checks an integer argument that is stored or compared as a number.
- :func:`check_text` checks one string (a CLI argument, a name).
- :func:`check_instant` and :func:`check_epoch` keep dates within years 1 to 9999.
- :func:`read_regular_file` reads a file only when it is a regular one (a FIFO would block).

This module imports only :mod:`awl.documents.errors`: every other layer may use it.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from awl.documents.errors import BadRequest, DocumentError
from awl.documents.pointers import pointer

__all__ = [
    "INT64_MAX",
    "MAX_CONTENT_BLOCKS",
    "MAX_DEPTH",
    "MAX_DOCUMENT_BYTES",
    "MAX_EPOCH",
    "MAX_INT_DIGITS",
    "MAX_QUESTION_PAGE",
    "MAX_YEAR",
    "MIN_EPOCH",
    "MIN_YEAR",
    "QUESTION_PAGE",
    "check_amounts",
    "check_epoch",
    "check_instant",
    "check_integer",
    "check_json_value",
    "check_text",
    "escapes_nothing",
    "is_finite_number",
    "loads",
    "read_regular_file",
    "show_value",
]

MAX_DOCUMENT_BYTES = 8 * 1024 * 1024
"""[DOC-1] Largest document (or JSON value from any door), in bytes of UTF-8 JSON."""
MAX_DEPTH = 64
"""[DOC-1] Deepest nesting of arrays and objects."""
MAX_INT_DIGITS = 4000
"""[DOC-12] Most decimal digits of an integer held exactly inside JSON data."""
INT64_MAX = 2**63 - 1
"""[DOC-12] Largest integer argument the desk stores or compares as a number (SQLite's)."""
MIN_YEAR = 1
MAX_YEAR = 9999
"""[DOC-14] Years of every date, as written and in UTC."""
MIN_EPOCH = int(datetime(MIN_YEAR, 1, 1, tzinfo=UTC).timestamp())
"""[DOC-14] Earliest time in seconds since the epoch (0001-01-01T00:00:00Z)."""
MAX_EPOCH = int(datetime(MAX_YEAR, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp())
"""[DOC-14] Latest time in seconds since the epoch (9999-12-31T23:59:59Z)."""
MAX_CONTENT_BLOCKS = 1000
QUESTION_PAGE = 50
"""[BIND-20] Questions on a page of the question queue when the caller names no limit."""
MAX_QUESTION_PAGE = 200
"""[BIND-20] Most questions on one page of the question queue."""
"""[DOC-15] Most content blocks of one upstream answer the gateway passes on."""

_DEPTH_CEILING = 512  # beyond this the recursive walk itself would be at risk
_MAX_INT_BITS = math.ceil(MAX_INT_DIGITS * math.log2(10))
_SURROGATE = re.compile("[\ud800-\udfff]")


def _size(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB" if n % (1024 * 1024) == 0 else f"{n} bytes"


def _show(value: str, limit: int = 60) -> str:
    return repr(value if len(value) <= limit else value[:limit] + "…")


def show_value(value: Any) -> str:
    """A short description of any value for a message: ``repr`` cut to 40 characters for
    scalars, the size of an array or object (their ``repr`` may be huge, deep or raise), and
    the digit count of a long integer (``repr`` of one over 4,300 digits raises)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    if isinstance(value, Mapping):
        return f"an object of {len(value)} member(s)"
    if isinstance(value, list | tuple):
        return f"an array of {len(value)} item(s)"
    if isinstance(value, str | bytes | int | float | None):
        text = repr(value[:41] if isinstance(value, str | bytes) else value)
        return text if len(text) <= 40 else text[:40] + "…"
    return f"a {type(value).__name__} value"


# --------------------------------------------------------------------------- JSON text

def loads(text: str, *, where: str = "document", max_depth: int = MAX_DEPTH,
          max_bytes: int = MAX_DOCUMENT_BYTES) -> Any:
    """Read JSON text strictly and check the data (:func:`check_json_value`).

    Refused: invalid JSON, duplicate member names, ``NaN``/``Infinity``, numbers that overflow
    a double (``1e400``), integers longer than :data:`MAX_INT_DIGITS`, lone surrogates,
    nesting deeper than ``max_depth`` and text longer than ``max_bytes``.

    Args:
        text: the JSON text (a leading byte-order mark is ignored).
        where: what the text is, for the message (``"document"``, ``"the config file"``).

    Raises:
        DocumentError: one message naming the problem.
    """
    if len(text) > max_bytes:  # every character is at least one UTF-8 byte
        raise DocumentError(f"{where} is larger than {_size(max_bytes)}; "
                            "split it or raise the limit")
    text = text.removeprefix("\ufeff")  # editors add a byte-order mark; it carries nothing
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant,
                          parse_float=_finite_float, parse_int=_held_int)
    except json.JSONDecodeError as exc:
        raise DocumentError(f"{where} is not valid JSON: {exc.msg} (line {exc.lineno}, column "
                            f"{exc.colno})") from None
    except RecursionError:
        raise DocumentError(f"{where} nests deeper than {max_depth} levels") from None
    except ValueError as exc:  # raised by the hooks below
        raise DocumentError(f"{where}: {str(exc).splitlines()[0]}") from None
    return check_json_value(data, where=where, max_depth=max_depth, max_bytes=max_bytes)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {_show(key)} in an object; keep only one")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number; write a finite number or null")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {_show(text, 40)} is too large to hold (beyond ±1.8e308)")
    return value


def _held_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {digits} digits is longer than the "
                         f"{MAX_INT_DIGITS} digits held")
    return int(text)


# --------------------------------------------------------------------------- JSON data

def escapes_nothing(text: str) -> bool:
    """Whether ``text`` goes into a JSON string as it is (printable ASCII with no quote or
    backslash), so its encoding is ``"`` + text + ``"`` and takes ``len(text)`` bytes."""
    return text.isascii() and text.isprintable() and '"' not in text and "\\" not in text


def check_json_value(value: Any, *, where: str = "document", max_depth: int = MAX_DEPTH,
                     max_bytes: int = MAX_DOCUMENT_BYTES) -> Any:
    """A plain-JSON copy of ``value`` (tuples as lists), once every limit is checked.

    Args:
        value: data from any door (already parsed JSON, or Python values meant as JSON).
        where: what it is, for the message (``"document"``, ``"the arguments"``).
        max_depth: the deepest nesting of arrays and objects accepted.
        max_bytes: about the largest JSON encoding accepted.

    Raises:
        DocumentError: it holds something JSON cannot hold faithfully (bytes, NaN or an
            infinity, an integer of more than :data:`MAX_INT_DIGITS` digits, non-string keys,
            lone surrogates, other objects), nests deeper than ``max_depth``, or is larger
            than about ``max_bytes``.
    """
    if not 1 <= max_depth <= _DEPTH_CEILING:
        raise ValueError(f"max_depth must be between 1 and {_DEPTH_CEILING}")
    return _Walker(where, max_depth, max_bytes).copy(value, 1, ())


class _Walker:
    """Copies JSON-like data while counting depth and approximate size."""

    def __init__(self, where: str, max_depth: int, max_bytes: int) -> None:
        self.where = where
        self.max_depth = max_depth
        self.max_bytes = max_bytes
        self.size = 0

    def _grow(self, n: int) -> None:
        self.size += n
        if self.size > self.max_bytes:
            raise DocumentError(f"{self.where} is larger than {_size(self.max_bytes)}; "
                                "split it or raise the limit")

    def _refuse(self, what: str, path: tuple[str | int, ...]) -> DocumentError:
        at = _show(pointer(*path), 80) if path else "the top"
        return DocumentError(f"{self.where} is not valid JSON data: {what} at {at}")

    def copy(self, value: Any, depth: int, path: tuple[str | int, ...]) -> Any:
        # Strings and plain dicts first: most of what a call's arguments hold.
        if isinstance(value, str):
            self._grow(len(value) + 2)
            if _SURROGATE.search(value):
                raise self._refuse("a string with a lone surrogate", path)
            return str(value)
        if type(value) is dict:
            return self._object(value, depth, path)
        if value is None or isinstance(value, bool):
            self._grow(5)
            return value
        if isinstance(value, int):
            if value.bit_length() > _MAX_INT_BITS:
                raise self._refuse(f"an integer longer than {MAX_INT_DIGITS} digits", path)
            self._grow(8)
            return int(value)
        if isinstance(value, float):
            if not math.isfinite(value):
                raise self._refuse(f"{value!r}, which is not a finite JSON number,", path)
            self._grow(8)
            return float(value)
        if isinstance(value, Mapping):
            return self._object(value, depth, path)
        if isinstance(value, list | tuple):
            self._open(depth)
            return [self.copy(item, depth + 1, (*path, i)) for i, item in enumerate(value)]
        raise self._refuse(f"a {type(value).__name__} value", path)

    def _open(self, depth: int) -> None:
        """Count an array or object opened at ``depth``."""
        if depth > self.max_depth:
            raise DocumentError(f"{self.where} nests deeper than {self.max_depth} levels")
        self._grow(2)

    def _object(self, value: Mapping[Any, Any], depth: int,
                path: tuple[str | int, ...]) -> dict[str, Any]:
        self._open(depth)
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise self._refuse(f"a {type(key).__name__} key", path)
            if _SURROGATE.search(key):
                raise self._refuse("a key with a lone surrogate", path)
            self._grow(len(key) + 3)
            out[str(key)] = self.copy(item, depth + 1, (*path, key))
        return out


# --------------------------------------------------------------------------- single values

def check_integer(value: Any, *, name: str, minimum: int = 0,
                  maximum: int = INT64_MAX) -> int:
    """An integer argument, as an ``int``: ``5`` and ``5.0`` are the same value (DOC-5).

    Args:
        value: the argument as given (int, or a float with no fractional part).
        name: the argument's name, for the message.
        minimum, maximum: the accepted range, within the signed 64-bit range by default.

    Raises:
        BadRequest: a bool, a string, a fraction, a non-finite float, or out of range.
    """
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise BadRequest(f"{name} must be a whole number from {minimum} to {maximum}, "
                         f"not {show_value(value)}")
    return int(value)


def is_finite_number(value: Any) -> bool:
    """``value`` is an int or float (never a bool) that a double holds finitely."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer beyond the double range
        return False


def check_amounts(value: Any, *, name: str) -> Mapping[str, int | float] | None:
    """None, or a mapping of unit names to finite numbers (what is left of a budget).

    Raises:
        BadRequest: anything else.
    """
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and is_finite_number(v) for k, v in value.items()):
        raise BadRequest(f"{name} must map budget units to finite numbers, e.g. "
                         f"{{'usd': 1.5}}, not {show_value(value)}")
    return value


def check_text(value: str, *, name: str) -> str:
    """A string that is valid Unicode (no lone surrogates), as it is.

    Command-line arguments that are not UTF-8 reach Python as lone surrogates, so this is also
    the check for them.

    Raises:
        BadRequest: the string holds a lone surrogate (or undecodable bytes).
    """
    if _SURROGATE.search(value):
        raise BadRequest(f"{name} is not valid UTF-8 text; write it in UTF-8")
    return value


def check_instant(moment: datetime, *, name: str = "the time") -> datetime:
    """An aware datetime whose year is within 1 to 9999 both as written and in UTC.

    Raises:
        ValueError: outside the range (the models turn it into the schema rule's finding).
    """
    try:
        in_utc = moment.astimezone(UTC)
    except (OverflowError, ValueError):
        in_utc = None
    if in_utc is None or not MIN_YEAR <= in_utc.year <= MAX_YEAR:
        raise ValueError(f"{name} is outside years {MIN_YEAR} to {MAX_YEAR} in UTC; "
                         "give a date within them")
    return moment


def check_epoch(value: Any, *, name: str) -> int | float:
    """A time in seconds since the epoch within :data:`MIN_EPOCH` to :data:`MAX_EPOCH`.

    Raises:
        BadRequest: not a finite number (a bool is not one), or outside the range.
    """
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not (isinstance(value, int) or math.isfinite(value))
            or not MIN_EPOCH <= value <= MAX_EPOCH):
        raise BadRequest(f"{name} must be seconds since the epoch from {MIN_EPOCH} to "
                         f"{MAX_EPOCH} (years {MIN_YEAR} to {MAX_YEAR}), not "
                         f"{show_value(value)}")
    return value


# --------------------------------------------------------------------------- files

def read_regular_file(path: str | os.PathLike[str], *, max_bytes: int = MAX_DOCUMENT_BYTES,
                      what: str = "file") -> bytes:
    """Up to ``max_bytes + 1`` bytes of a regular file (DOC-17), so the caller sees it is too big.

    It is opened without blocking and checked before a byte is read, so a FIFO, a device or a
    folder is refused at once instead of hanging the reader.

    Raises:
        DocumentError: it cannot be opened or is not a regular file (one line naming it).
    """
    name = os.fsdecode(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise DocumentError(f"cannot read {what} {name!r}: {exc.strerror or exc}; check the path "
                            "and its permissions") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                    else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                    else "a socket" if stat.S_ISSOCK(mode) else "something else")
            raise DocumentError(f"cannot read {what} {name!r}: it is {kind}, not a regular "
                                "file; give the path of a file")
        chunks: list[bytes] = []
        left = max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise DocumentError(f"cannot read {what} {name!r}: {exc.strerror or exc}; check the path "
                            "and its permissions") from None
    finally:
        os.close(fd)
