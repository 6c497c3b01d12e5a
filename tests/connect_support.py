"""Shared by the ``awl connect`` tests: ``awl gateway --http`` as a real subprocess, and the
bridge's command line.

:func:`http_gateway` starts the gateway for an order on 127.0.0.1 (port 0), waits for the
line that names its URL, and stops it afterwards; :func:`connect_command` is the command a
stdio MCP client starts to reach it with a pass file.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def http_gateway(order_id: str, config: Path, home: Path, *, python: str = sys.executable,
                 env: Mapping[str, str] | None = None, port: int = 0,
                 errlog: Path | None = None) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``awl gateway --order ID --config FILE --home HOME --http 127.0.0.1:PORT`` running;
    yields its MCP URL and the process. Its stderr after the URL line goes to ``errlog``."""
    command = [python, "-m", "awl", "gateway", "--order", order_id, "--config", str(config),
               "--home", str(home), "--http", f"127.0.0.1:{port}"]
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               env={"PYTHONPATH": str(ROOT), "PATH": os.environ["PATH"],
                                    **(env or {})})
    assert process.stderr is not None
    drain: threading.Thread | None = None
    try:
        said = b""
        while b" on http" not in said:
            line = process.stderr.readline()
            assert line, f"awl gateway --http exited: {said.decode(errors='replace')}"
            said += line
        url = said.decode().rsplit(" on ", 1)[1].strip()
        drain = _drain(process, errlog)  # never left to fill the pipe, blocking the gateway
        yield url, process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if drain is not None:
            drain.join(10)
        process.stderr.close()


def _drain(process: subprocess.Popen[bytes], errlog: Path | None) -> threading.Thread:
    def copy() -> None:
        assert process.stderr is not None
        with open(errlog if errlog is not None else os.devnull, "ab") as out:
            for line in process.stderr:
                out.write(line)
                out.flush()

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread


def connect_command(url: str, pass_file: Path, *, python: str = sys.executable
                    ) -> Sequence[str]:
    """The bridge a stdio client starts: ``python -m awl connect URL --pass-file F``."""
    return [python, "-m", "awl", "connect", url, "--pass-file", str(pass_file)]
