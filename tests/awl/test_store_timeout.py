"""``AWL_STORE_TIMEOUT`` bounds a command's wait on its store; it and ``AWL_PG_POOL_SIZE``
are refused in one line when they are no number in range (each command runs as its own
process). The PostgreSQL side is in ``test_postgres_refusals.py``."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # the awl command as a process


def _awl(tmp_path: Path, *args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("AWL_DEBUG", "AWL_STORE", "AWL_STORE_TIMEOUT", "AWL_PG_POOL_SIZE")}
    env.update(PYTHONPATH=str(ROOT), AWL_HOME=str(tmp_path / "home"), **settings)
    return subprocess.run([sys.executable, "-m", "awl", *args], cwd=str(ROOT), env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_write_waiting_for_another_writer_gives_up_at_the_store_timeout(
        tmp_path: Path) -> None:
    """Another process holds the SQLite desk's write lock: a write waits AWL_STORE_TIMEOUT,
    then fails in one line, nothing written."""
    made = _awl(tmp_path, "token", "issue", "ana")
    assert made.returncode == 0, made.stderr
    holder = sqlite3.connect(tmp_path / "home" / "desk.sqlite3", isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        began = time.monotonic()
        done = _awl(tmp_path, "token", "issue", "bob", AWL_STORE_TIMEOUT="1")
        took = time.monotonic() - began
    finally:
        holder.close()
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "stayed busy for 1 s" in done.stderr and "nothing was written" in done.stderr
    assert "Traceback" not in done.stderr and took < 6, (took, done.stderr)
    listed = _awl(tmp_path, "token", "list")
    assert "ana" in listed.stdout and "bob" not in listed.stdout, listed.stdout


@pytest.mark.parametrize(("name", "value", "said"), [
    ("AWL_STORE_TIMEOUT", "soon", "is not a number of seconds from 0.1 to 3600"),
    ("AWL_STORE_TIMEOUT", "nan", "is not a number of seconds"),
    ("AWL_STORE_TIMEOUT", "0", "is not a number of seconds"),
    ("AWL_PG_POOL_SIZE", "0", "is not a whole number from 1 to 1000"),
    ("AWL_PG_POOL_SIZE", "8.5", "is not a whole number"),
])
def test_a_store_setting_out_of_range_is_one_line(tmp_path: Path, name: str, value: str,
                                                  said: str) -> None:
    store = ("postgresql://awl@127.0.0.1:1/awl" if name == "AWL_PG_POOL_SIZE"
             else str(tmp_path / "desk.sqlite3"))
    done = _awl(tmp_path, "order", "list", "--store", store, **{name: value})
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert f"{name}={value!r} {said}" in done.stderr, done.stderr
