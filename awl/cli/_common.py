"""What the command modules share, below the dispatcher (:mod:`awl.cli`), which imports
them all: so they never import the package itself."""

from __future__ import annotations

__all__ = ["CLIError"]


class CLIError(Exception):
    """A user error the CLI prints as one line before exiting with ``code``."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code
