"""The ``awl`` command's dispatcher, loaded by :func:`awl.cli.main` when the command runs.

Each group of subcommands lives in its own module with a ``register(subparsers)`` function
that adds its parsers and sets ``func`` on them; ``func(args) -> int`` is the exit code.
Errors the user can cause are raised as :class:`awl.AWLError` (or ``CLIError``) and printed
as one line, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections.abc import Sequence

from awl._version import __version__
from awl.cli import (
    _connect,
    _desk,
    _effects,
    _gateway,
    _notify,
    _pass,
    _serve,
    _store,
    _validate,
    _web,
)
from awl.cli._common import CLIError
from awl.documents.errors import AWLError, print_debug
from awl.documents.limits import check_text, show_value

__all__ = ["build_parser", "run"]

# Modules that add subcommands, in the order they appear in --help.
_COMMAND_MODULES = (_validate, _desk, _pass, _gateway, _connect, _effects, _serve, _web, _store,
                    _notify)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every installed command group."""
    parser = argparse.ArgumentParser(
        prog="awl",
        description="Work Orders, Work Reports, Delegation Passes and the MCP gateway.",
    )
    parser.add_argument("--version", action="version", version=f"awl {__version__} "
                        f"(distribution awl-gateway; Python {platform.python_version()})",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _COMMAND_MODULES:
        module.register(sub)
    return parser


def run(argv: Sequence[str] | None = None) -> int:
    """Run the ``awl`` command; returns the exit code.

    Every failure the user can cause ends here as one line on stderr: an argument that is
    not UTF-8 (DOC-13), an :class:`AWLError`, a reader that went away (``awl ... | head``);
    so does one nobody foresaw (a store that refuses a value or lost a table), as
    ``INTERNAL``. With ``AWL_DEBUG=1`` the line comes after its traceback.
    A Ctrl-C goes on to :func:`awl.cli.main`, which ends the command quietly.
    """
    words = sys.argv[1:] if argv is None else list(argv)
    try:
        _check_words(words)
        parser = build_parser()
        args = parser.parse_args(words)
        func = getattr(args, "func", None)
        if func is None:
            parser.print_help()
            return 2
        _check_propagators()
        code: int = func(args)
        sys.stdout.flush()
    except CLIError as exc:
        print_debug(exc, sys.stderr)
        print(f"awl: {exc}", file=sys.stderr)
        return exc.exit_code
    except AWLError as exc:
        print_debug(exc, sys.stderr)
        print(f"awl: {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return _reader_gone()
    except OSError as exc:  # the file system said no (a name too long, a full disk, ...)
        print_debug(exc, sys.stderr)
        name = f" {show_value(os.fsdecode(exc.filename))}" if exc.filename else ""
        print(f"awl: cannot use{name}: {exc.strerror or exc}; check the path and try again",
              file=sys.stderr)
        return 1
    except Exception as exc:  # a store or a bug failed under us: one line still (SEC-4)
        print_debug(exc, sys.stderr)
        print(f"awl: {_unexpected(exc)}", file=sys.stderr)
        return 1
    return code


def _check_propagators() -> None:
    """Refuse an ``OTEL_PROPAGATORS`` naming a propagator this installation lacks, in one
    line: the MCP SDK loads them all when it is imported, whether telemetry is on or not,
    and a name it cannot find stopped every command that serves with Python's ValueError."""
    configured = os.environ.get("OTEL_PROPAGATORS")
    if not configured:
        return
    names = [name.strip() for name in configured.split(",")]
    if any(name.lower() == "none" for name in names):
        return  # no propagator at all: nothing is looked up
    from importlib.metadata import entry_points

    known = {ep.name for ep in entry_points(group="opentelemetry_propagator")}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise CLIError(
            f"OTEL_PROPAGATORS names {', '.join(show_value(n) for n in unknown)}, which no "
            f"installed package provides (installed: {', '.join(sorted(known)) or 'none'}); "
            "fix the list, or unset OTEL_PROPAGATORS for the default")


def _unexpected(exc: Exception) -> str:
    """The line for a failure the command did not foresee (a database that refused a value
    or lost a table, a bug): its type and the first line of what it said, as the desk
    server answers one (INTERNAL), and that a write may or may not have happened."""
    said = " ".join(str(exc).split("\n", 1)[0].split())
    said = said if len(said) <= 300 else said[:299] + "…"
    return (f"INTERNAL: the command failed unexpectedly ({type(exc).__name__}"
            f"{': ' + said if said else ''}); anything it was writing may or may not have "
            "been written: look before you try again")


def _check_words(words: Sequence[str]) -> None:
    """Refuse an argument that is not UTF-8 (Python hands it over as lone surrogates)."""
    for i, word in enumerate(words):
        after = f" (after {words[i - 1]!r})" if i and words[i - 1].isprintable() else ""
        check_text(word, name=f"argument {i + 1}{after}")


def _reader_gone() -> int:
    # Whoever read our output stopped (``| head -c 1``): not an error of ours. Point stdout
    # at /dev/null so the interpreter's last flush at exit finds nowhere to fail.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return 141  # what a shell reports for a process ended by SIGPIPE
