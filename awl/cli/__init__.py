"""The ``awl`` command: :func:`main` is its entry point (``awl = "awl.cli:main"``).

The commands live in :mod:`awl.cli._main` and the modules it loads. This module imports
nothing when it loads, and ``import awl`` next to nothing, so that all the loading (most of
the command's first 0.3 s) happens inside :func:`main`, where a Ctrl-C ends the command as
quietly as one during its work: exit 130, no traceback.
"""

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the ``awl`` command (``argv``: its words, default ``sys.argv[1:]``); returns the
    exit code, 130 after a Ctrl-C (SIGINT) whether the command was still loading or at
    work, as a shell reports a command it interrupted."""
    try:
        if not _load_commands():
            return 130
        from awl.cli._main import run

        return run(argv)
    except KeyboardInterrupt:
        return 130


def _load_commands() -> bool:
    """Import the commands; False if a Ctrl-C came meanwhile.

    While they load, SIGINT only notes that it came: a KeyboardInterrupt raised then may land
    in a callback of the import system, which Python prints as ignored and carries on. A
    SIGINT that is not Python's default (ignored in a background job, or a handler of the
    caller's) is left as it is, as it is outside the main thread.
    """
    import signal

    came: list[int] = []
    held = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if held:
        try:
            signal.signal(signal.SIGINT, lambda signum, _frame: came.append(signum))
        except ValueError:  # not the main thread
            held = False
    try:
        import awl.cli._main  # noqa: F401
    finally:
        if held:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    return not came
