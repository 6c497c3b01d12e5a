"""What the command modules share, below the dispatcher (:mod:`awl.cli._main`), which
imports them all: so they never import it, nor the package (whose ``main`` loads it)."""

from __future__ import annotations

import argparse
import sys

from awl.documents.errors import AWLError
from awl.documents.limits import MAX_DOCUMENT_BYTES

__all__ = ["MAX_SECONDS", "STORE_HELP", "CLIError", "add_store_option", "check_seconds",
           "read_stdin", "stdin_text"]

MAX_SECONDS = 365 * 24 * 3600.0
"""The longest wait a flag in seconds takes (a year, as the gateway config's timeouts)."""

STORE_HELP = ("the desk's store: a SQLite file, sqlite:///PATH, memory: or "
              "postgresql://USER@HOST/DB (default: $AWL_STORE, else desk.sqlite3 in the home)")
"""The help of ``--store``, which every command that opens a desk takes."""


def add_store_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Add ``--store URL`` to a command that opens a desk (read as ``args.store``)."""
    parser.add_argument("--store", metavar="URL", help=STORE_HELP)


def read_stdin() -> bytes:
    """A document given as ``-``: at most one byte more than a document may hold, so the
    reader sees it is too big (DOC-17) instead of filling memory from an endless pipe."""
    return sys.stdin.buffer.read(MAX_DOCUMENT_BYTES + 1)


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
