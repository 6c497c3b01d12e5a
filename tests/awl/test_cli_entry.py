"""The ``awl`` command's entry point (``awl.cli.main``), as the installed ``awl`` script runs it:
a Ctrl-C while the command is still loading its modules ends it as quietly as one later."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = Path(sys.executable).with_name("awl")
"""The script the installer wrote for ``[project.scripts]``: ``from awl.cli import main``."""

OURS = (f"{ROOT / 'awl'}{os.sep}", f"{ROOT / 'gateway'}{os.sep}")


def _sigint_as_by_default() -> None:
    # A shell's background job ignores SIGINT, and its children inherit that: undo it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupted(args: list[str], delay: float) -> tuple[int, str]:
    """Run the ``awl`` script with ``args``, send SIGINT after ``delay`` seconds; its exit
    status and stderr."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([str(LAUNCHER), *args], env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               preexec_fn=_sigint_as_by_default)
    try:
        time.sleep(delay)
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, err.decode("utf-8", "replace")


def _pythons_own_start(err: str) -> bool:
    """A traceback from before any code of ours ran: the interpreter importing ``site``, or
    the script the installer wrote importing ``re`` (no frame of ours; out of our hands)."""
    return "Traceback" in err and "Exception ignored" not in err and not any(
        where in err for where in OURS)


@pytest.mark.slow
def test_ctrl_c_while_the_command_loads_exits_130_without_a_traceback(tmp_path: Path) -> None:
    """SIGINT in the command's first 0.3 s, while its modules were importing, printed a
    traceback: `awl.cli` imported every command (and `import awl` the documents layer) before
    `main` could catch it. Now `main` itself loads them, holding SIGINT meanwhile, and ends
    the command with 130 as it does for a Ctrl-C later on; a command done first exits 0. A
    SIGINT before Python has its handler kills the process with it (-2; a shell shows 130)."""
    if not LAUNCHER.exists():
        pytest.skip(f"no installed awl script next to {sys.executable}")
    commands = [["--help"], ["notify", "list", "--home", str(tmp_path)]]
    runs = 20
    seen: list[tuple[float, int, str]] = []
    for i in range(runs):
        delay = 0.3 * i / (runs - 1)
        code, err = _interrupted(commands[i % 2], delay)
        seen.append((delay, code, err))
    ours = [(d, c, e) for d, c, e in seen if not _pythons_own_start(e)]
    wrong = [(d, c, e) for d, c, e in ours if "Traceback" in e or "Exception ignored" in e
             or c not in (0, 130, -signal.SIGINT)]
    assert not wrong, "\n\n".join(f"after {d:.3f} s: exit {c}\n{e}" for d, c, e in wrong)
    assert any(c == 130 for _, c, _ in ours), [c for _, c, _ in seen]


def test_version_is_printed_from_its_one_home(tmp_path: Path) -> None:
    """`awl --version` prints the release, the one the package metadata carries (hatchling
    reads awl/_version.py) and the gateway introduces itself with; it makes no desk."""
    from importlib.metadata import version

    import awl
    from gateway._upstream import CLIENT_INFO

    done = subprocess.run([sys.executable, "-m", "awl", "--version"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "AWL_HOME": str(tmp_path / "home"),
                               "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"awl {awl.__version__} (distribution awl-gateway; Python ")
    assert version("awl-gateway") == awl.__version__ == CLIENT_INFO.version
    assert not (tmp_path / "home").exists()
