"""The ``awl`` command.

Each group of subcommands lives in its own module with a ``register(subparsers)`` function
that adds its parsers and sets ``func`` on them; ``func(args) -> int`` is the exit code.
Errors the user can cause are raised as :class:`awl.AWLError` (or ``CLIError``) and printed
as one line, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from awl._errors import AWLError

# Modules that add subcommands, in the order they appear in --help.
_COMMAND_MODULES = (
    "awl.cli._validate",
    "awl.cli._desk",
    "awl.cli._pass",
    "awl.cli._gateway",
    "awl.cli._effects",
    "awl.cli._serve",
)


class CLIError(Exception):
    """A user error the CLI prints as one line before exiting with ``code``."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every installed command group."""
    parser = argparse.ArgumentParser(
        prog="awl",
        description="Work Orders, Work Reports, Delegation Passes and the MCP gateway.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue  # that command group is not built yet
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``awl`` command; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        code: int = func(args)
    except CLIError as exc:
        print(f"awl: {exc}", file=sys.stderr)
        return exc.code
    except AWLError as exc:
        print(f"awl: {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    raise SystemExit(main())
