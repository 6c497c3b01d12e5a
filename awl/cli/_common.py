"""What the command modules share, below the dispatcher (:mod:`awl.cli._main`), which
imports them all: so they never import it, nor the package (whose ``main`` loads it)."""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from awl.documents.checks import load_document
from awl.documents.errors import AWLError, BadRequest, NotFound
from awl.documents.limits import MAX_DOCUMENT_BYTES, show_value
from awl.passes import MAX_TOKEN_BYTES
from awl.store.urls import shown_url

__all__ = [
    "ACTOR_ENV",
    "MAX_SECONDS",
    "STORE_HELP",
    "CLIError",
    "acting",
    "add_json_option",
    "add_store_option",
    "check_address",
    "check_seconds",
    "named_actor",
    "naming_the_desk",
    "read_document",
    "read_pass_file",
    "read_stdin",
    "stdin_text",
]

ACTOR_ENV = "AWL_ACTOR"
"""Who acts when a command's ``--as`` is left out: every command that takes ``--as`` reads it."""

MAX_SECONDS = 365 * 24 * 3600.0
"""The longest wait a flag in seconds takes (a year, as the gateway config's timeouts)."""

_HOST_NAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_.])?")
"""A host name an address may give (``localhost``, ``desk.internal``): no spaces, no URL."""

STORE_HELP = ("the desk's store: a SQLite file, sqlite:///PATH, memory: or "
              "postgresql://USER@HOST/DB (default: $AWL_STORE, else desk.sqlite3 in the home)")
"""The help of ``--store``, which every command that opens a desk takes."""


def add_json_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                    what: str = "print the output") -> None:
    """``--json``, worded alike on every command: ``what`` says what is printed (``"print
    one array of results"``), and the help ends "as JSON instead of text"."""
    parser.add_argument("--json", action="store_true", help=f"{what} as JSON instead of text")


def add_store_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Add ``--store URL`` to a command that opens a desk (read as ``args.store``)."""
    parser.add_argument("--store", metavar="URL", help=STORE_HELP)


def named_actor(given: str | None) -> str | None:
    """Who a command acts as or for: ``--as`` when given, else ``$AWL_ACTOR``, else None."""
    return given or os.environ.get(ACTOR_ENV) or None


def acting(given: str | None) -> str:
    """:func:`named_actor` for a command that needs someone: naming nobody is one line
    saying how to name someone."""
    actor = named_actor(given)
    if actor is None:
        raise CLIError(f"who is acting? pass --as PRINCIPAL (for example --as human:ana) or set "
                       f"{ACTOR_ENV}")
    return actor


def desk_name(store: Any) -> str:
    """Where a store keeps the desk, as a person reads it (a URL without its password)."""
    path = getattr(store, "path", None)
    if path is not None:
        return str(path)
    url = getattr(store, "url", None)
    return shown_url(url) if isinstance(url, str) else type(store).__name__


@contextlib.contextmanager
def naming_the_desk(store: Any) -> Iterator[None]:
    """A NOT_FOUND raised inside says which desk was read, so a wrong ``--home`` (or
    ``$AWL_HOME``, ``--store``) shows as such rather than as a missing order."""
    try:
        yield
    except NotFound as exc:
        raise NotFound(f"{exc.message} on the desk at {desk_name(store)}; check --home, "
                       "$AWL_HOME or --store if it lives elsewhere") from None


def read_stdin() -> bytes:
    """A document given as ``-``: at most one byte more than a document may hold, so the
    reader sees it is too big (DOC-17) instead of filling memory from an endless pipe."""
    return sys.stdin.buffer.read(MAX_DOCUMENT_BYTES + 1)


def read_document(name: str) -> Any:
    """The document a command is given as ``name``: the JSON in that file, or on stdin for
    ``-`` (:func:`read_stdin`), read strictly and within a document's limits by
    :func:`~awl.documents.checks.load_document` (a DocumentError when it cannot be)."""
    if name == "-":
        return load_document(read_stdin())
    return load_document(Path(name))


def read_pass_file(path: str) -> str:
    """The pass token in the file ``path`` (given as ``--pass-file``): its text, stripped.

    Refused in one line when the file cannot be read (missing, not this user's to read,
    not UTF-8) or does not hold one token: nothing, white space inside it, or more than a
    token's bytes."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(MAX_TOKEN_BYTES + 1025)
    except (OSError, UnicodeDecodeError) as exc:
        raise CLIError(f"cannot read the pass file {show_value(path)} "
                       f"({getattr(exc, 'strerror', None) or exc})") from None
    token = text.strip()
    if not token or len(text) > MAX_TOKEN_BYTES + 1024 or len(token.split()) != 1:
        raise CLIError(f"the pass file {show_value(path)} must hold one pass token, as "
                       "`awl pass issue` printed it")
    return token


def stdin_text(what: str) -> str:
    """A token or pass given as ``-``, read as bytes and decoded here: ``sys.stdin`` decodes
    strictly under most UTF-8 locales, and its UnicodeDecodeError would be a traceback."""
    try:
        return read_stdin().decode("utf-8")
    except UnicodeDecodeError:
        raise CLIError(f"{what} on stdin is not UTF-8 text; give it as printed") from None


class CLIError(AWLError):
    """A user error the CLI prints as one line before exiting with ``exit_code``."""

    code = "BAD_REQUEST"

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def check_seconds(value: float | None, *, flag: str, zero: bool = False,
                  unit: float = 1.0) -> None:
    """Refuse a flag's number of seconds (of ``unit`` seconds each: 3600 for hours) unless
    it is above 0 (or 0 itself with ``zero``) and at most a year; None (left out) passes.
    ``nan``, ``inf`` and negatives are refused, since a deadline computed from them either
    fails deep inside or has already passed (an effect sent with it would end ``unknown``)."""
    if value is None:
        return
    above = value >= 0 if zero else value > 0  # False for nan, as the test below is
    if not above or not value * unit <= MAX_SECONDS:
        lowest = "from 0" if zero else "above 0"
        most = f"{MAX_SECONDS / unit:.0f}"
        what = "hours" if unit == 3600 else "seconds"
        raise CLIError(f"{flag} takes a number of {what} {lowest} and at most {most} (a "
                       f"year), not {value:g}")


def check_address(text: str, *, flag: str, allow_remote: bool,
                  example: str = "127.0.0.1:8765") -> tuple[str, int]:
    """``HOST:PORT`` given to ``flag`` (``--listen``, ``--http``) as ``(host, port)``; a bare
    ``PORT`` is 127.0.0.1's, ``[::1]:PORT`` an IPv6 one.

    Checked before a command opens the desk or listens, and refused in one line (CLIError,
    exit 2 as a usage error) that names the flag, says what is wrong and what to write: not
    ``HOST:PORT`` with a port from 0 to 65535, a URL instead of an address, a host that is
    no name or IP address, or an address other machines can reach without ``--allow-remote``.
    """
    from awl.mcp.transport import is_loopback

    given = show_value(shown_url(text))
    if "/" in text:
        write = example
        with contextlib.suppress(ValueError):
            bare = urlsplit(text).netloc if "://" in text else text.partition("/")[0]
            bare = bare.rpartition("@")[2]  # never a password back on the screen
            if bare and "/" not in bare and _split(bare) is not None:
                write = bare
        raise CLIError(f"{flag} {given} is a URL, not HOST:PORT; write {write} (no http:// "
                       "and no path)")
    address = _split(text)
    if address is None:
        raise CLIError(f"{flag} {given} is not HOST:PORT with a port from 0 to 65535; write "
                       f"for example {example} (port 0 picks a free one)")
    host, port = address
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if _HOST_NAME.fullmatch(host) is None:
            raise CLIError(f"{flag} {given} names no host: {show_value(host)} is neither a "
                           f"host name nor an IP address; write for example {example}") from None
    if not allow_remote and not is_loopback(host):
        raise CLIError(f"{flag} {given} is not a loopback address, so other machines could "
                       f"connect; write 127.0.0.1:{port} to serve this machine only, or add "
                       "--allow-remote to accept them")
    return host, port


def _split(text: str) -> tuple[str, int] | None:
    from awl.mcp.transport import parse_address

    try:
        return parse_address(text)
    except BadRequest:
        return None
