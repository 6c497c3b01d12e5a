"""What the command modules share, below the dispatcher (:mod:`awl.cli`), which imports
them all: so they never import the package itself."""

from __future__ import annotations

import argparse

from awl.documents.errors import AWLError

__all__ = ["STORE_HELP", "CLIError", "add_store_option"]

STORE_HELP = ("the desk's store: a SQLite file, sqlite:///PATH, memory: or "
              "postgresql://USER@HOST/DB (default: $AWL_STORE, else desk.sqlite3 in the home)")
"""The help of ``--store``, which every command that opens a desk takes."""


def add_store_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Add ``--store URL`` to a command that opens a desk (read as ``args.store``)."""
    parser.add_argument("--store", metavar="URL", help=STORE_HELP)


class CLIError(AWLError):
    """A user error the CLI prints as one line before exiting with ``exit_code``."""

    code = "BAD_REQUEST"

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code
