"""What the command modules share, below the dispatcher (:mod:`awl.cli`), which imports
them all: so they never import the package itself."""

from __future__ import annotations

from awl.documents.errors import AWLError

__all__ = ["CLIError"]


class CLIError(AWLError):
    """A user error the CLI prints as one line before exiting with ``exit_code``."""

    code = "BAD_REQUEST"

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code
