"""For tests of desk-run checks: a folder the sandboxed check may write in, and proof from
outside the sandbox that what a check started is gone."""

from __future__ import annotations

import time
from pathlib import Path

from awl.desk import sandbox


def check_folder(tmp_path: Path, name: str = "run") -> Path:
    """A folder to run a check in directly (``run_check``), handed to the user the check
    runs as, as the desk does with its copy of a workspace."""
    folder = tmp_path / name
    folder.mkdir()
    sandbox.prepare_copy(folder)
    return folder


def assert_stopped(beat: Path, settle: float = 1.0) -> None:
    """``beat`` (a file a process of the check kept appending to) no longer grows: every
    process that wrote it is gone."""
    assert beat.exists() and beat.stat().st_size > 0, f"nothing ever wrote {beat}"
    deadline = time.monotonic() + settle
    size = beat.stat().st_size
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = beat.stat().st_size if beat.exists() else 0
        if now == size:
            break
        size = now
    time.sleep(0.5)
    assert (beat.stat().st_size if beat.exists() else 0) == size, f"{beat} still grows"

